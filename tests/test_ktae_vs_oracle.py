"""Vectorised KTAE against the slow reference implementations of tests/oracle.py.

- exact mode (docs/method.md §3) vs :func:`oracle.exact_ktae`: max abs difference <= 1e-6, and the
  diagnostic table row by row vs :func:`oracle.exact_token_stats`;
- reference mode (docs/method.md §4) vs :func:`oracle.runtime_ktae`: max abs difference <= 1e-5,
  on small adversarial batches and on bigger realistic ones.

Batches (tests/oracle.py ``random_batch``): small vocabularies so tokens are shared,
uneven groups of 1-8 with non-contiguous int or string labels, empty responses, a class
whose responses are all empty, tokens found only in padding, binary or continuous rewards.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import (
    FLOAT_FIELDS,
    QWEN_EOS_ID,
    batch_specs,
    dense_group_index,
    exact_ktae,
    exact_token_stats,
    examples,
    random_batch,
    runtime_ktae,
    single_thread,  # noqa: F401  (autouse fixture)
)

import ktae


@st.composite
def ktae_options(draw, batch_size: int):
    """Random exact-mode options; ``{}`` (all defaults) a fifth of the time."""
    if draw(st.integers(0, 4)) == 0:
        return {}
    hs = [draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) for _ in range(3)]
    if hs[0] + hs[1] == 0:
        hs[draw(st.integers(0, 1))] = 1.0
    opts = dict(base=draw(st.sampled_from(["grpo", "drgrpo", "rloo"])),
                h1=hs[0], h2=hs[1], h3=hs[2],
                k1=draw(st.sampled_from([0.5, 1.2, 2.0, 3.0])),
                b=draw(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0])),
                top=draw(st.sampled_from([0.5, 1.0, 2.0])),
                variant=draw(st.sampled_from(["runtime", "paper"])))
    if draw(st.integers(0, 2)) == 0:
        opts["apply"] = draw(st.sampled_from(["all", "wrong", "right"]))
    rule = draw(st.sampled_from(["default", "threshold", "explicit"]))
    if rule == "threshold":
        opts["reward_threshold"] = draw(st.sampled_from([-0.2, 0.3, 0.5]))
    elif rule == "explicit":
        opts["correct"] = np.array(draw(st.lists(st.booleans(), min_size=batch_size,
                                                 max_size=batch_size)))
    return opts


def with_ignored(opts: dict, token_ids: np.ndarray, mask: np.ndarray, pick: int) -> dict:
    """Ignore up to two ids actually present in the batch (chosen by ``pick``)."""
    present = sorted(set(token_ids[mask.astype(bool)].tolist()))
    if not present or pick == 0:
        return opts
    ids = [present[pick % len(present)], present[(pick * 7) % len(present)]][: 1 + pick % 2]
    return {**opts, "ignore_token_ids": ids}


def oracle_options(opts: dict) -> dict:
    """The library's options as the oracle takes them (``mode`` dropped)."""
    return {k: v for k, v in opts.items() if k != "mode"}


def as_library_inputs(batch: dict, flavour: int) -> dict:
    """Vary the input types: tensors, arrays or lists; int32/int64 ids; bool/int/float
    masks; ``flavour`` in 0..8 picks one of the 9 pairings of ids/mask and group kinds."""
    tok, mask, group = batch["token_ids"], batch["mask"], batch["group"]
    if flavour % 3 == 0:
        tok, mask = torch.from_numpy(tok), torch.from_numpy(mask).bool()
    elif flavour % 3 == 1:
        tok, mask = torch.from_numpy(tok).int(), torch.from_numpy(mask).float()
    if not isinstance(group[0], str):
        group = (torch.tensor(group), np.array(group), group)[flavour // 3]
    return dict(rewards=torch.from_numpy(batch["rewards"]), group=group, token_ids=tok,
                mask=mask)


def check_table(table, batch: dict, opts: dict) -> None:
    """Every row of ``key_token_table`` against ``exact_token_stats``."""
    expect = exact_token_stats(batch["rewards"], batch["group"], batch["token_ids"],
                               batch["mask"], **oracle_options(opts))
    dense = dense_group_index(batch["group"])
    expect = {(dense[g], t): row for (g, t), row in expect.items()}
    rows = table.to_rows()
    got = {(r["group"], r["token"]): r for r in rows}
    assert len(got) == len(rows), "duplicate (group, token) rows"
    assert set(got) == set(expect), (f"missing {sorted(set(expect) - set(got))}, "
                                     f"extra {sorted(set(got) - set(expect))}")
    for key, e in expect.items():
        g = got[key]
        for f in "abcd":
            assert g[f] == e[f], f"{key}: {f} expected {e[f]}, got {g[f]}"
        for f in FLOAT_FIELDS:
            assert math.isfinite(g[f]), f"{key}: {f} is {g[f]}"
            if f == "direction" and math.isnan(e[f]):
                continue  # one-class group: Cohen's h undefined, value is 0
            tol = 1e-9 * max(1.0, abs(e[f]))
            assert abs(g[f] - e[f]) <= tol, (f"group/token {key}, table "
                                             f"{[e[x] for x in 'abcd']}: {f} expected "
                                             f"{e[f]!r}, got {g[f]!r}")


@settings(**examples(150))
@given(spec=batch_specs(), data=st.data())
def test_exact_mode_matches_oracle(spec, data):
    batch = random_batch(**spec)
    B = len(batch["rewards"])
    opts = data.draw(ktae_options(B))
    opts = with_ignored(opts, batch["token_ids"], batch["mask"], data.draw(st.integers(0, 3)))
    if data.draw(st.booleans()):
        opts["mode"] = "exact"
    inputs = as_library_inputs(batch, data.draw(st.integers(0, 8)))
    got = ktae.compute_advantages("ktae", **inputs, **opts)
    expect = exact_ktae(batch["rewards"], batch["group"], batch["token_ids"], batch["mask"],
                        **oracle_options(opts))
    assert got.shape == expect.shape and got.dtype == torch.float64
    got = got.numpy()
    assert np.isfinite(got).all()
    assert (got[batch["mask"] == 0] == 0).all(), "non-zero advantage on padding"
    diff = np.abs(got - expect)
    i, t = np.unravel_index(int(np.argmax(diff)), diff.shape)
    assert diff[i, t] <= 1e-6, (f"response {i} token {t} (id {batch['token_ids'][i, t]}, "
                                f"group {batch['group'][i]}): expected {expect[i, t]!r}, "
                                f"got {got[i, t]!r}; options {opts}")
    table = ktae.key_token_table(**inputs, **opts)
    check_table(table, batch, opts)


@settings(**examples(40))
@given(spec=batch_specs(max_groups=4))
def test_exact_mode_float32_rewards(spec):
    """float32 rewards give float32 advantages that still match the float64 oracle."""
    batch = random_batch(**spec)
    r32 = batch["rewards"].astype(np.float32)
    got = ktae.compute_advantages("ktae", rewards=torch.from_numpy(r32), group=batch["group"],
                                  token_ids=batch["token_ids"], mask=batch["mask"])
    assert got.dtype == torch.float32
    expect = exact_ktae(r32.astype(np.float64), batch["group"], batch["token_ids"],
                        batch["mask"])
    # float32 output: a few ulps of values up to |A| ~ 3.5
    np.testing.assert_allclose(got.numpy(), expect, rtol=0, atol=2e-6)


def test_paper_variant_defaults_follow_spec():
    """``variant="paper"`` without h's uses the paper's h1 = 1, h2 = 2, h3 = 1 (docs/method.md §3)."""
    batch = random_batch(3, sizes=[6, 5], vocab=6, max_len=8)
    got = ktae.compute_advantages("ktae", **batch, variant="paper").numpy()
    expect = exact_ktae(**batch, variant="paper", h1=1.0, h2=2.0, h3=1.0)
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-6)


def test_table_is_in_group_first_appearance_order():
    batch = dict(rewards=[1.0, 0.0, 1.0, 0.0], group=["z", "a", "a", "z"],
                 token_ids=[[4, 2], [2, 9], [9, 9], [4, 4]], mask=[[1, 1], [1, 1], [1, 0], [1, 1]])
    table = ktae.key_token_table(**batch)
    pairs = {(int(g), int(t)) for g, t in zip(table.group, table.token, strict=True)}
    assert pairs == {(0, 4), (0, 2), (1, 2), (1, 9)}  # "z" is group 0; id 9 of row 2 kept
    check_table(table, {**{k: np.asarray(v) for k, v in batch.items()},
                        "group": batch["group"]}, {})


# ------------------------------------------------------------------------ degenerate input


def test_singleton_group_gets_base_advantage_only():
    tok = np.array([[3, 4, 5], [3, 3, 0], [4, 4, 4]])
    mask = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    rewards = torch.tensor([1.0, 0.0, 0.7], dtype=torch.float64)
    got = ktae.compute_advantages("ktae", rewards=rewards, group=[0, 0, 1], token_ids=tok,
                                  mask=mask).numpy()
    np.testing.assert_allclose(got[2], [0.7 / (1 + 1e-6)] * 3, rtol=1e-12)  # mean 0, std 1
    table = ktae.key_token_table(rewards=rewards, group=[0, 0, 1], token_ids=tok, mask=mask)
    values = {(r["group"], r["token"]): r["value"] for r in table.to_rows()}
    assert values[(1, 4)] == 0.0


@pytest.mark.parametrize("reward", [1.0, 0.0])
def test_one_class_group_gets_zero_values(reward):
    tok = np.array([[3, 4], [5, 4], [3, 3]])
    rewards = torch.full((3,), reward, dtype=torch.float64)
    got = ktae.compute_advantages("ktae", rewards=rewards, group=[7, 7, 7], token_ids=tok)
    assert torch.equal(got, torch.zeros(3, 2, dtype=torch.float64))
    table = ktae.key_token_table(rewards=rewards, group=[7, 7, 7], token_ids=tok)
    assert torch.equal(table.value, torch.zeros_like(table.value))
    for f in FLOAT_FIELDS:
        assert torch.isfinite(getattr(table, f)).all(), f


def test_empty_responses_and_empty_class():
    # the incorrect class of group 0 holds only empty responses: f_F = TF_F = 0
    tok = np.array([[3, 4, 4], [9, 9, 9], [3, 3, 5], [9, 9, 9]])
    mask = np.array([[1, 1, 1], [0, 0, 0], [1, 1, 0], [0, 0, 0]])
    rewards = np.array([1.0, 0.0, 1.0, 0.0])
    got = ktae.compute_advantages("ktae", rewards=rewards, group=[0, 0, 0, 0], token_ids=tok,
                                  mask=mask)
    assert torch.isfinite(got).all()
    assert (got[1] == 0).all() and (got[3] == 0).all()
    np.testing.assert_allclose(got.numpy(), exact_ktae(rewards, [0] * 4, tok, mask), atol=1e-6)
    table = ktae.key_token_table(rewards=rewards, group=[0] * 4, token_ids=tok, mask=mask)
    assert torch.equal(table.tf_incorrect, torch.zeros_like(table.tf_incorrect))
    assert 9 not in table.token.tolist()  # only in padding
    assert (table.tf_correct > 0).all()


def test_batch_of_only_empty_responses():
    tok = np.zeros((3, 4), dtype=np.int64)
    got = ktae.compute_advantages("ktae", rewards=[1.0, 0.0, 1.0], group=[0, 0, 1],
                                  token_ids=tok, mask=np.zeros((3, 4)))
    assert torch.equal(got, torch.zeros(3, 4))
    assert len(ktae.key_token_table(rewards=[1.0, 0.0, 1.0], group=[0, 0, 1], token_ids=tok,
                                    mask=np.zeros((3, 4)))) == 0


# -------------------------------------------------------------------------- reference mode


def check_reference(batch: dict, dtype: torch.dtype = torch.float32, **kw) -> None:
    rewards = torch.from_numpy(batch["rewards"]).to(dtype)
    got = ktae.compute_advantages("ktae", rewards=rewards, group=batch["group"],
                                  token_ids=batch["token_ids"], mask=batch["mask"],
                                  mode="reference", **kw)
    assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    expect = runtime_ktae(batch["rewards"], batch["group"], batch["token_ids"], batch["mask"],
                          **kw)
    got = got.numpy()
    assert np.isfinite(got).all() and (got[batch["mask"] == 0] == 0).all()
    diff = np.abs(got - expect)
    i, t = np.unravel_index(int(np.argmax(diff)), diff.shape)
    assert diff[i, t] <= 1e-5, (f"response {i} token {t} (id {batch['token_ids'][i, t]}, "
                                f"group {batch['group'][i]}): runtime {expect[i, t]!r}, "
                                f"got {got[i, t]!r}")


@settings(**examples(150))
@given(spec=batch_specs(max_size=16), eos=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
def test_reference_mode_matches_runtime_emulation(spec, eos, dtype):
    batch = random_batch(**spec, eos_id=QWEN_EOS_ID if eos else None)
    if dtype == torch.bfloat16:  # the runtime sees the rounded rewards
        batch["rewards"] = torch.from_numpy(batch["rewards"]).to(dtype).double().numpy()
    check_reference(batch, dtype)


@settings(**examples(25))
@given(spec=batch_specs(max_groups=3, vocab=(50, 200), length=(32, 64)),
       g=st.sampled_from([8, 16]))
def test_reference_mode_matches_runtime_on_realistic_batches(spec, g):
    spec = {**spec, "sizes": [g] * len(spec["sizes"]), "empty_class": False,
            "pad_only_token": False}
    check_reference(random_batch(**spec, eos_id=QWEN_EOS_ID))


@pytest.mark.parametrize("apply", ["wrong", "right"])
@pytest.mark.parametrize("ngram", [1, 3])
@pytest.mark.parametrize("seed", range(4))
def test_apply_limits_the_values_to_one_class(apply, ngram, seed):
    """``apply``: the chosen class's tokens get KTAE's values (spans too), the other
    class keeps the base advantage on every token (checked against the oracle and against
    the two estimators it mixes)."""
    batch = random_batch(seed, sizes=[4, 6, 1, 5], vocab=6, max_len=7)
    inputs = as_library_inputs(batch, 0)
    got = ktae.compute_advantages("ktae", **inputs, apply=apply, ngram=ngram).numpy()
    expect = exact_ktae(batch["rewards"], batch["group"], batch["token_ids"], batch["mask"],
                        apply=apply, ngram=ngram)
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-6)
    every = ktae.compute_advantages("ktae", **inputs, ngram=ngram).numpy()
    grpo = ktae.compute_advantages("grpo", **inputs).numpy()
    chosen = (batch["rewards"] > 0) == (apply == "right")
    np.testing.assert_array_equal(got[chosen], every[chosen])
    np.testing.assert_allclose(got[~chosen], grpo[~chosen], rtol=0, atol=1e-12)


def test_apply_in_reference_mode_and_bad_values():
    batch = random_batch(0, sizes=[4, 6], vocab=6, max_len=5)
    inputs = as_library_inputs(batch, 0)
    ref = ktae.compute_advantages("ktae", **inputs, mode="reference").numpy()
    wrong = ktae.compute_advantages("ktae", **inputs, mode="reference", apply="wrong").numpy()
    right = batch["rewards"] > 0
    np.testing.assert_array_equal(wrong[~right], ref[~right])
    assert not np.array_equal(wrong[right], ref[right])
    with pytest.raises(ValueError, match="^apply: expected one of all, wrong, right, got 'none'$"):
        ktae.compute_advantages("ktae", **inputs, apply="none")
    with pytest.raises(ValueError, match="^apply: split='graded' has no right and wrong "):
        ktae.compute_advantages("ktae", **inputs, split="graded", apply="wrong")
