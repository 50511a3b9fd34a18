"""Prefix-value credit (ktae.core.prefix_value) against the slow reference written from
its definition (tests/prefix_value_oracle.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prefix_value_oracle import slow_prefix_value_advantages, slow_prefix_values

import ktae
from ktae.core import prefix_value
from ktae.core.groups import group_index


def random_groups(seed: int, *, vocab: int = 3, max_len: int = 6, holes: bool = False):
    """Groups of sizes 1..6 (one-response groups included), few distinct tokens (many
    shared prefixes and ties), empty and identical responses, all-correct and all-wrong
    groups, groups not contiguous, right padding (and holes in the mask if asked)."""
    rng = np.random.default_rng(seed)
    sizes = list(rng.integers(1, 7, size=rng.integers(1, 6)))
    group = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(group)
    B = len(group)
    ids = rng.integers(0, vocab, size=(B, max_len))
    lengths = rng.integers(0, max_len + 1, size=B)
    for i in range(B):  # some responses copy another of their group, whole
        mates = np.flatnonzero(group == group[i])
        if rng.random() < 0.3:
            j = rng.choice(mates)
            ids[i], lengths[i] = ids[j], lengths[j]
    mask = np.arange(max_len)[None, :] < lengths[:, None]
    if holes:
        mask &= rng.random((B, max_len)) < 0.8
    profile = {g: rng.choice(["mixed", "right", "wrong"], p=[0.6, 0.2, 0.2])
               for g in range(len(sizes))}
    correct = np.array([rng.random() < 0.5 if profile[g] == "mixed" else profile[g] == "right"
                        for g in group])
    rewards = correct.astype(np.float64) + 0.1 * rng.integers(0, 2, size=B)
    ids = np.where(mask, ids, 99)  # padding holds an id no real token has
    return rewards, group, ids, mask, correct


def _flat(rows):
    return [x for row in rows for x in row]


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("holes", [False, True])
def test_values_and_credit_match_reference(seed, holes):
    rewards, group, ids, mask, correct = random_groups(seed, holes=holes)
    gid, P = group_index(torch.tensor(group), len(group), torch.device("cpu"))
    values, credit = prefix_value.prefix_values(torch.tensor(ids), torch.tensor(mask),
                                                torch.tensor(correct), gid, P)
    v_ref, d_ref = slow_prefix_values(ids, mask, correct, group)
    m = torch.tensor(mask)
    np.testing.assert_allclose(values[m].numpy(), _flat(v_ref), atol=1e-12)
    np.testing.assert_allclose(credit[m].numpy(), _flat(d_ref), atol=1e-12)
    assert (values[~m] == 0).all() and (credit[~m] == 0).all()


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("apply", ["wrong", "all", "right"])
@pytest.mark.parametrize("weight", [1.0, 0.3, 0.0])
@pytest.mark.parametrize("unit", ["token", "word", "span"])
@pytest.mark.parametrize("total", ["keep", "add"])
def test_advantages_match_reference(seed, apply, weight, unit, total):
    rewards, group, ids, mask, correct = random_groups(seed, holes=seed % 2 == 1)
    rng = np.random.default_rng(seed + 1000)
    starts = rng.random(mask.shape) < 0.4 if unit == "word" else None
    opts = {"word_starts": torch.tensor(starts)} if unit == "word" else {}
    adv = ktae.compute_advantages("prefix-value", rewards=torch.tensor(rewards),
                                  group=torch.tensor(group), token_ids=torch.tensor(ids),
                                  mask=torch.tensor(mask), correct=torch.tensor(correct),
                                  apply=apply, weight=weight, unit=unit, total=total,
                                  **opts)
    ref = slow_prefix_value_advantages(rewards, group, ids, mask, correct, apply=apply,
                                       weight=weight, unit=unit, word_starts=starts,
                                       total=total)
    np.testing.assert_allclose(adv.numpy(), ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_keeps_grpo_total_per_response(seed):
    rewards, group, ids, mask, correct = random_groups(seed)
    kw = dict(rewards=torch.tensor(rewards), group=torch.tensor(group),
              token_ids=torch.tensor(ids), mask=torch.tensor(mask), correct=torch.tensor(correct))
    grpo = ktae.compute_advantages("grpo", **{k: v for k, v in kw.items() if k != "correct"})
    for apply in ("wrong", "all", "right"):
        adv = ktae.compute_advantages("prefix-value", apply=apply, weight=0.7, **kw)
        torch.testing.assert_close(adv.sum(dim=1), grpo.sum(dim=1), rtol=1e-9, atol=1e-9)


def test_added_credit_moves_each_total_by_weight_times_the_advantage():
    n_moved = 0
    for seed in range(10):
        rewards, group, ids, mask, correct = random_groups(seed)
        kw = dict(rewards=torch.tensor(rewards), group=torch.tensor(group),
                  token_ids=torch.tensor(ids), mask=torch.tensor(mask),
                  correct=torch.tensor(correct))
        grpo = ktae.compute_advantages("grpo", **{k: v for k, v in kw.items() if k != "correct"})
        keep = ktae.compute_advantages("prefix-value", apply="all", **kw)
        add = ktae.compute_advantages("prefix-value", apply="all", total="add", weight=0.5, **kw)
        shift = add.sum(dim=1) - grpo.sum(dim=1)
        moved = shift.abs() > 1e-9  # responses whose credit moved
        n_moved += int(moved.sum())
        m = torch.tensor(mask)
        a_i = grpo.sum(dim=1) / m.sum(dim=1).clamp_min(1)  # A_i, on every real token
        torch.testing.assert_close(shift[moved], 0.5 * a_i[moved], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(add[~moved], grpo[~moved], rtol=0, atol=1e-12)
        # the same order of tokens within every response, only a smaller move
        for i in torch.nonzero(moved).flatten().tolist():
            a, b = add[i][m[i]], keep[i][m[i]]
            assert torch.equal(torch.argsort(a, stable=True), torch.argsort(b, stable=True))
    assert n_moved >= 10


def test_wrong_response_credit_lands_where_it_leaves_the_right_ones():
    # one prompt: two right answers "1 2 3", "1 2 4"; a wrong one "1 5 6"
    ids = torch.tensor([[1, 2, 3], [1, 2, 4], [1, 5, 6]])
    rewards = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    adv = ktae.compute_advantages("prefix-value", rewards=rewards, group=[0, 0, 0],
                                  token_ids=ids)
    grpo = ktae.compute_advantages("grpo", rewards=rewards, group=[0, 0, 0], token_ids=ids)
    # the shared first token keeps no blame; the branching token "5" takes all of it
    assert adv[2, 0] == 0 and adv[2, 2] == 0
    torch.testing.assert_close(adv[2, 1], 3 * grpo[2, 0])
    add = ktae.compute_advantages("prefix-value", rewards=rewards, group=[0, 0, 0],
                                  token_ids=ids, total="add")
    torch.testing.assert_close(add[2], grpo[2] * torch.tensor([1.0, 2.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(adv[:2], grpo[:2])  # right answers keep GRPO (apply="wrong")


def test_default_correctness_is_reward_above_threshold():
    ids = torch.tensor([[1, 2], [1, 3], [4, 4]])
    rewards = torch.tensor([0.4, 0.9, 0.0])
    a = ktae.compute_advantages("prefix-value", rewards=rewards, group=[0, 0, 0], token_ids=ids,
                                reward_threshold=0.5, apply="all")
    b = ktae.compute_advantages("prefix-value", rewards=rewards, group=[0, 0, 0], token_ids=ids,
                                correct=torch.tensor([False, True, False]), apply="all")
    torch.testing.assert_close(a, b)
    c = ktae.compute_advantages("prefix-value", rewards=rewards, group=[0, 0, 0], token_ids=ids,
                                apply="all")  # threshold 0: two right answers
    assert not torch.allclose(a, c)


def test_a_hash_collision_is_detected_and_the_keys_recomputed(monkeypatch):
    calls = []
    real = prefix_value._prefix_keys

    def colliding(*args):
        calls.append(1)
        keys = real(*args)
        return torch.zeros_like(keys) if len(calls) == 1 else keys  # first bases: all equal

    monkeypatch.setattr(prefix_value, "_prefix_keys", colliding)
    rewards, group, ids, mask, correct = random_groups(3)
    gid, P = group_index(torch.tensor(group), len(group), torch.device("cpu"))
    _, credit = prefix_value.prefix_values(torch.tensor(ids), torch.tensor(mask),
                                           torch.tensor(correct), gid, P)
    assert len(calls) == 2
    np.testing.assert_allclose(credit[torch.tensor(mask)].numpy(),
                               _flat(slow_prefix_values(ids, mask, correct, group)[1]),
                               atol=1e-12)
    monkeypatch.setattr(prefix_value, "_prefix_keys", lambda *a: torch.zeros_like(real(*a)))
    with pytest.raises(RuntimeError, match="collision"):
        prefix_value.prefix_values(torch.tensor(ids), torch.tensor(mask),
                                   torch.tensor(correct), gid, P)


def test_edge_batches():
    # no real token at all; one response; ids above 2**31
    adv = ktae.compute_advantages("prefix-value", rewards=[1.0, 0.0], group=[0, 0],
                                  token_ids=torch.zeros(2, 3, dtype=torch.long),
                                  mask=torch.zeros(2, 3))
    assert (adv == 0).all()
    one = ktae.compute_advantages("prefix-value", rewards=[0.0], group=[0],
                                  token_ids=torch.tensor([[5, 6]]))
    assert (one == 0).all()
    big = torch.tensor([[2**40, 2**31 - 1], [2**40, 2**31 - 2]])
    adv = ktae.compute_advantages("prefix-value", rewards=[1.0, 0.0], group=[0, 0],
                                  token_ids=big)
    assert adv[1, 0] == 0 and adv[1, 1] < 0


@pytest.mark.parametrize("opts, message", [
    ({"apply": "some"}, "apply: expected one of wrong, all, right"),
    ({"unit": "line"}, "unit: expected one of token, word, span"),
    ({"weight": 1.5}, "weight"),
    ({"unit": "word"}, "word_starts: required by unit='word'"),
    ({"word_starts": torch.ones(2, 2, dtype=torch.bool)}, "word_starts: only used by"),
    ({"base": "ppo"}, "base: expected one of"),
    ({"total": "sum"}, "total: expected one of keep, add, got 'sum'"),
    ({"weigth": 0.5}, "weigth: unknown option for advantage estimator 'prefix-value'"),
])
def test_bad_options_are_one_line_errors(opts, message):
    with pytest.raises(ValueError, match=message) as err:
        ktae.compute_advantages("prefix-value", rewards=[1.0, 0.0], group=[0, 0],
                                token_ids=torch.tensor([[1, 2], [1, 3]]), **opts)
    assert "\n" not in str(err.value)


def test_needs_token_ids():
    with pytest.raises(ValueError, match="token_ids: required"):
        ktae.compute_advantages("prefix-value", rewards=[1.0, 0.0], group=[0, 0],
                                mask=torch.ones(2, 2))


def test_benchmark_script_prints_medians_and_ratios():
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_prefix_value.py"
    out = subprocess.run([sys.executable, str(bench), "--preset", "small", "--repeats", "1",
                          "--threads", "1", "--shared", "0.9"], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    assert "prefixes shared up to 90%" in out
    cells = {}
    for name in ("sort (floor)", "grpo", "prefix-value token", "prefix-value span"):
        line = next(x for x in out.splitlines() if x.startswith(name + " "))
        cells[name] = [float(v) for v in line[len(name):].split()]
    assert cells["sort (floor)"][1] == 1.0
    assert all(seconds > 0 and ratio > 0 for seconds, ratio in cells.values())


@pytest.mark.slow
def test_trainer_runs_prefix_value_with_the_verifiers_verdict(tiny_model, tmp_path):
    """``ktae train --credit prefix-value --estimator-option apply=all``: the advantages
    the loss reads are the estimator's on the trained batch, with ``correct`` from the
    accuracy reward."""
    from test_train_helpers import contains_digit, tiny_config

    from ktae.train.session import train
    from ktae.train.trainer import KTAEGRPOTrainer

    seen = []

    class Spy(KTAEGRPOTrainer):
        def _finish_batch(self, batch, rewards, correct, mode, **kwargs):
            entry = {"rewards": rewards.clone(), "correct": correct.clone(),
                     "ids": batch["completion_ids"].clone(),
                     "mask": batch["ktae_token_mask"].clone()}
            out = super()._finish_batch(batch, rewards, correct, mode, **kwargs)
            entry["advantages"] = out["advantages"].clone()
            seen.append(entry)
            return out

    cfg = tiny_config(tiny_model, tmp_path / "run", credit="prefix-value", max_steps=1,
                      estimator_options={"apply": "all", "weight": 0.5})
    train(cfg, trainer_cls=Spy, reward_funcs=[contains_digit])
    assert seen
    for e in seen:
        B = e["rewards"].numel()
        expected = ktae.compute_advantages(
            "prefix-value", rewards=e["rewards"], group=torch.arange(B) // cfg.num_generations,
            token_ids=e["ids"], mask=e["mask"].bool(), correct=e["correct"], apply="all",
            weight=0.5)
        torch.testing.assert_close(e["advantages"], expected.float() * e["mask"].float())
