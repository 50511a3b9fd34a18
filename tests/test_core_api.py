"""The public advantage API: validation, baselines, dtypes, group ids, chunking, big ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from oracle import exact_ktae, random_batch, single_thread  # noqa: F401

import ktae
from ktae.core.groups import group_index


def _batch(seed=0, B=24, T=12, vocab=9, groups=4):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) < 0.7
    rewards = (torch.rand(B, generator=g) < 0.5).float()
    group = torch.randint(0, groups, (B,), generator=g)
    return dict(rewards=rewards, group=group, token_ids=ids, mask=mask)


# ----------------------------------------------------------------------------- baselines


def test_grpo_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 5.0])
    out = ktae.compute_advantages("grpo", rewards=r, group=[7, 7, 7, 3, 3, 9])
    m, s = 1 / 3, np.std([1, 0, 0], ddof=1)
    expected = [(1 - m) / (s + 1e-6), -m / (s + 1e-6), -m / (s + 1e-6), 0, 0, 5 / (1 + 1e-6)]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float32))


def test_drgrpo_and_rloo_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 4.0])
    torch.testing.assert_close(ktae.compute_advantages("drgrpo", rewards=r, group=[0, 0, 0, 1]),
                               torch.tensor([2 / 3, -1 / 3, -1 / 3, 4.0]))  # singleton: mean 0
    torch.testing.assert_close(ktae.compute_advantages("rloo", rewards=r, group=[0, 0, 0, 1]),
                               torch.tensor([1.0, -0.5, -0.5, 0.0]))


def test_sequence_estimators_broadcast_over_mask():
    kw = _batch()
    for name in ("grpo", "drgrpo", "rloo"):
        seq = ktae.compute_advantages(name, rewards=kw["rewards"], group=kw["group"])
        tok = ktae.compute_advantages(name, **kw)
        assert tok.shape == kw["mask"].shape
        torch.testing.assert_close(tok, seq[:, None] * kw["mask"])


def test_registry_lists_estimators_and_rejects_unknown():
    assert {"grpo", "drgrpo", "rloo", "ktae"} <= set(ktae.ADVANTAGE_ESTIMATORS.names())
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'"):
        ktae.compute_advantages("gae", rewards=[1.0], group=[0])


# ------------------------------------------------------------------------------ group ids


def test_group_ids_dense_in_order_of_first_appearance():
    for group in (["b", "a", "b", "c"], np.array([5, 2, 5, 9]), torch.tensor([5, 2, 5, 9])):
        gid, n = group_index(group, 4, torch.device("cpu"))
        assert n == 3 and gid.tolist() == [0, 1, 0, 2]


def test_string_uids_match_integer_groups():
    kw = _batch(seed=3)
    labels = [f"uid-{int(g)}" for g in kw["group"]]
    a = ktae.compute_advantages("ktae", **kw)
    b = ktae.compute_advantages("ktae", **{**kw, "group": labels})
    torch.testing.assert_close(a, b)


# -------------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("reward_dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dtypes(id_dtype, reward_dtype):
    kw = _batch(seed=1)
    kw["token_ids"] = kw["token_ids"].to(id_dtype)
    kw["rewards"] = kw["rewards"].to(reward_dtype)
    out = ktae.compute_advantages("ktae", **kw)
    assert out.dtype == (torch.float64 if reward_dtype == torch.float64 else torch.float32)
    ref = exact_ktae(kw["rewards"].float(), kw["group"], kw["token_ids"].long(), kw["mask"])
    np.testing.assert_allclose(out.double().numpy(), ref, atol=2e-6)


@pytest.mark.parametrize("vocab", [151_936, 128_256, 256_000])
def test_real_vocabulary_sizes(vocab):
    kw = _batch(seed=2)
    ids = kw["token_ids"] * (vocab // 9) + (vocab - 9 * (vocab // 9))  # spread over [0, vocab)
    assert int(ids.max()) < vocab
    out = ktae.compute_advantages("ktae", **{**kw, "token_ids": ids})
    torch.testing.assert_close(out, ktae.compute_advantages("ktae", **kw))


def test_huge_token_ids_take_the_ranking_path():
    kw = _batch(seed=4)
    ids = kw["token_ids"] * (1 << 52)  # keys would overflow 62 bits: ids get ranked first
    out = ktae.compute_advantages("ktae", **{**kw, "token_ids": ids})
    torch.testing.assert_close(out, ktae.compute_advantages("ktae", **kw))


# ------------------------------------------------------------------------------ chunking


@pytest.mark.parametrize("chunk_tokens", [1, 7, 50, 10_000])
def test_chunking_does_not_change_results(chunk_tokens):
    for seed in range(3):
        kw = _batch(seed=seed, B=40, groups=9)
        full = ktae.compute_advantages("ktae", **kw, chunk_tokens=10**9)
        for mode in ("exact", "reference"):
            a = ktae.compute_advantages("ktae", **kw, mode=mode, chunk_tokens=10**9)
            b = ktae.compute_advantages("ktae", **kw, mode=mode, chunk_tokens=chunk_tokens)
            assert torch.equal(a, b)  # bit for bit (tests/test_ktae_determinism.py)
        assert torch.isfinite(full).all()


def test_chunked_run_matches_oracle_on_a_larger_batch():
    kw = random_batch(11, sizes=[8] * 12, vocab=40, max_len=30)
    out = ktae.compute_advantages("ktae", **kw, chunk_tokens=64)
    np.testing.assert_allclose(out.double().numpy(), exact_ktae(**kw), atol=1e-6)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("change, match", [
    (dict(rewards=torch.tensor([1.0, float("nan")] * 12)), "rewards: contains NaN"),
    (dict(rewards=torch.tensor([1.0, float("inf")] * 12)), "rewards: contains NaN or inf"),
    (dict(rewards=torch.ones(24, 2)), "rewards: expected 1-D"),
    (dict(rewards=torch.ones(0), group=[], token_ids=torch.zeros(0, 3, dtype=torch.long),
          mask=torch.zeros(0, 3)), "rewards: expected at least one response"),
    (dict(group=[0] * 23), "group: expected 24 ids"),
    (dict(group=torch.zeros(24)), "group: expected integer ids"),
    (dict(token_ids=torch.zeros(23, 12, dtype=torch.long)), r"token_ids: expected shape \(24, T\)"),
    (dict(token_ids=torch.zeros(24, 12)), "token_ids: expected integer ids"),
    (dict(token_ids=torch.full((24, 12), -3)), "token_ids: expected non-negative"),
    (dict(mask=torch.ones(24, 11)), r"mask: expected shape \(24, 12\)"),
    (dict(mask=torch.full((24, 12), 2)), "mask: expected values 0 or 1"),
    (dict(mask=torch.full((24, 12), float("nan"))), "mask: expected values 0 or 1"),
])
def test_bad_input_names_the_argument(change, match):
    with pytest.raises(ValueError, match=match):
        ktae.compute_advantages("ktae", **{**_batch(), **change})


@pytest.mark.parametrize("opts, match", [
    (dict(h1=0, h2=0), "h1, h2"),
    (dict(h3=-1), "h3: expected a non-negative"),
    (dict(b=1.5), "b: expected 0 <= b <= 1"),
    (dict(mode="fast"), "mode: expected 'exact' or 'reference'"),
    (dict(variant="v2"), "variant: expected 'runtime' or 'paper'"),
    (dict(base="ppo"), "base: expected one of"),
    (dict(correct=[True] * 3), r"correct: expected shape \(24,\)"),
    (dict(correct=torch.full((24,), 0.5)), "correct: expected booleans"),
    (dict(chunk_tokens=0), "chunk_tokens: expected a positive integer"),
    (dict(mode="reference", correct=[True] * 3), r"correct: expected shape \(24,\)"),
])
def test_bad_options_name_the_option(opts, match):
    with pytest.raises(ValueError, match=match):
        ktae.compute_advantages("ktae", **_batch(), **opts)


def test_negative_ids_in_padding_are_fine():
    kw = _batch()
    ids = kw["token_ids"].masked_fill(~kw["mask"], -100)  # e.g. an ignore index in padding
    torch.testing.assert_close(ktae.compute_advantages("ktae", **{**kw, "token_ids": ids}),
                               ktae.compute_advantages("ktae", **kw))


def test_ktae_requires_token_ids():
    with pytest.raises(ValueError, match="token_ids: required"):
        ktae.compute_advantages("ktae", rewards=[1.0, 0.0], group=[0, 0])


# -------------------------------------------------------------------------- degenerate


def test_degenerate_batches_are_finite_and_documented():
    ids = torch.tensor([[1, 2, 3], [1, 2, 0], [4, 4, 4], [5, 0, 0], [6, 7, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0]])
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0])
    group = [0, 0, 0, 1, 2]  # group 0: a class (incorrect) whose responses are all empty
    out = ktae.compute_advantages("ktae", rewards=rewards, group=group, token_ids=ids, mask=mask)
    assert torch.isfinite(out).all()
    assert (out[mask == 0] == 0).all()
    # singleton groups: base advantage only (mean 0, std 1)
    torch.testing.assert_close(out[3, 0], torch.tensor(1 / (1 + 1e-6)))
    assert out[4, 0] == 0 and out[4, 1] == 0
    table = ktae.key_token_table(rewards=rewards, group=group, token_ids=ids, mask=mask)
    row = table.lookup(0, 1)
    assert row["tf_incorrect"] == 0.0 and row["b"] == 0 and row["a"] == 2
    assert 4 not in table.token.tolist()  # present only in padding
    with pytest.raises(KeyError):
        table.lookup(0, 4)


def test_table_rows_as_dicts():
    kw = _batch(seed=5)
    table = ktae.key_token_table(**kw)
    rows = table.to_rows()
    assert len(rows) == len(table) > 0
    assert set(rows[0]) == {"group", "token", "a", "b", "c", "d", "p_value", "fisher",
                            "info_gain", "tf_correct", "tf_incorrect", "direction", "value"}


def test_table_format_lists_the_strongest_tokens_first():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    ids = torch.tensor([[1, 9, 2], [1, 9, 3], [1, 4, 2], [1, 5, 3]])
    table = ktae.key_token_table(rewards=rewards, group=[0] * 4, token_ids=ids)
    text = table.format(top=3, decode=lambda t: f"<{t}>")
    lines = text.splitlines()
    assert len(lines) == 4 and "value" in lines[0] and "text" in lines[0]
    assert any("'<9>'" in line for line in lines[1:])  # only in correct responses: value 1
    assert "'<1>'" not in text  # in every response: value 0, not among the top 3
