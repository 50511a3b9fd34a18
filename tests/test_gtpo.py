"""GTPO token advantages (docs/method.md §6) against a slow per-group loop, degenerate
groups, and the estimator interface it extends (``entropies``, option validation)."""

from __future__ import annotations

import math

import pytest
import torch

import ktae
from ktae.core.advantages import estimator_needs_entropies
from ktae.core.gtpo import gtpo_token_rewards


def gtpo_oracle(rewards, correct, group, H, mask, *, a1=1.0, a2=0.1, eps=1e-8,
                normalize="group"):
    """docs/method.md §6 read literally: loops over groups, positions and responses (Python floats)."""
    B, T = len(rewards), len(mask[0])
    shaped = [[0.0] * T for _ in range(B)]
    members: dict = {}
    for i, g in enumerate(group):
        members.setdefault(g, []).append(i)
    for rows in members.values():
        for t in range(T):
            pos = [k for k in rows if correct[k] and mask[k][t]]
            neg = [k for k in rows if not correct[k] and mask[k][t]]
            d_t, h_t = len(pos), len(neg)
            sum_h = sum(H[k][t] for k in pos)
            sum_inv = sum(1.0 / H[k][t] for k in neg)
            for i in pos:
                shaped[i][t] = a1 * rewards[i] + a2 * d_t * H[i][t] / (sum_h + eps)
            for j in neg:
                shaped[j][t] = -a1 - a2 * h_t * (1.0 / H[j][t]) / (sum_inv + eps)
    buckets: dict = {}
    for i in range(B):
        key = (group[i] if normalize == "group" else None, bool(correct[i]))
        buckets.setdefault(key, []).extend((i, t) for t in range(T) if mask[i][t])
    adv = [[0.0] * T for _ in range(B)]
    for cells in buckets.values():
        if not cells:  # responses without real tokens
            continue
        values = [shaped[i][t] for i, t in cells]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        for i, t in cells:
            adv[i][t] = (shaped[i][t] - mean) / (std + 1e-6)
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(shaped, dtype=torch.float64)


def random_batch(seed: int, *, continuous: bool = False):
    """Uneven, non-contiguous groups of right-padded responses; strictly positive entropies."""
    g = torch.Generator().manual_seed(seed)
    B = int(torch.randint(4, 14, (1,), generator=g))
    T = int(torch.randint(1, 12, (1,), generator=g))
    P = int(torch.randint(1, 4, (1,), generator=g))
    group = torch.randint(0, P, (B,), generator=g) * 7 + 3  # arbitrary labels
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    H = 0.05 + 3 * torch.rand(B, T, generator=g, dtype=torch.float64)
    H = torch.where(mask, H, 99.0)  # garbage on padding must not matter
    if continuous:
        rewards = torch.randn(B, generator=g, dtype=torch.float64)
    else:
        rewards = (torch.rand(B, generator=g) < 0.5).double()
    return rewards, group, H, mask


def run_oracle(rewards, group, H, mask, correct=None, **kw):
    correct = (rewards > 0) if correct is None else correct
    return gtpo_oracle(rewards.tolist(), correct.tolist(), group.tolist(), H.tolist(),
                       mask.tolist(), **kw)


@pytest.mark.parametrize("seed", range(25))
def test_gtpo_matches_the_slow_per_group_loop(seed):
    rewards, group, H, mask = random_batch(seed, continuous=seed % 3 == 0)
    for normalize in ("group", "batch"):
        out = ktae.compute_advantages("gtpo", rewards=rewards, group=group, mask=mask,
                                      entropies=H, normalize=normalize)
        expected, _ = run_oracle(rewards, group, H, mask, normalize=normalize)
        assert out.dtype == torch.float64 and out.shape == mask.shape
        torch.testing.assert_close(out, expected, rtol=1e-7, atol=1e-7)
        assert (out[~mask] == 0).all()


def test_gtpo_options_against_the_loop():
    rewards, group, H, mask = random_batch(100)
    correct = torch.rand(len(rewards), generator=torch.Generator().manual_seed(1)) < 0.5
    out = ktae.compute_advantages("gtpo", rewards=rewards, group=group, mask=mask,
                                  entropies=H, correct=correct, a1=0.5, a2=0.7, eps=1e-3)
    expected, _ = run_oracle(rewards, group, H, mask, correct=correct, a1=0.5, a2=0.7,
                             eps=1e-3)
    torch.testing.assert_close(out, expected, rtol=1e-7, atol=1e-7)
    thr = ktae.compute_advantages("gtpo", rewards=rewards, group=group, mask=mask,
                                  entropies=H, reward_threshold=0.5)
    torch.testing.assert_close(thr, run_oracle(rewards, group, H, mask,
                                               correct=rewards > 0.5)[0], rtol=1e-7, atol=1e-7)


def test_gtpo_shaped_rewards_by_hand():
    # one group: two correct responses (lengths 2 and 1), two incorrect (lengths 2 and 2)
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    H = torch.tensor([[3.0, 1.0], [1.0, 0.0], [2.0, 4.0], [1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]], dtype=torch.bool)
    gid = torch.zeros(4, dtype=torch.long)
    r = gtpo_token_rewards(rewards, rewards > 0, gid, 1, H, mask, eps=0.0 + 1e-300)
    # t = 0: d = 2, shares 3/4 and 1/4; t = 1: d = 1, share 1
    assert r[0].tolist() == pytest.approx([1 + 0.1 * 2 * 0.75, 1 + 0.1 * 1 * 1.0])
    assert r[1, 0].item() == pytest.approx(1 + 0.1 * 2 * 0.25) and r[1, 1] == 0
    # incorrect: t = 0: 1/H = 1/2, 1 -> shares 1/3, 2/3; t = 1: 1/4, 1 -> 1/5, 4/5
    assert r[2].tolist() == pytest.approx([-1 - 0.1 * 2 / 3, -1 - 0.1 * 2 / 5])
    assert r[3].tolist() == pytest.approx([-1 - 0.1 * 4 / 3, -1 - 0.1 * 8 / 5])


def test_degenerate_groups_are_finite_and_as_documented():
    # group 0: all correct; group 1: all wrong; group 2: one response; group 3: zero
    # entropies everywhere (mixed); group 4: one zero entropy among the incorrect
    rewards = torch.tensor([1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0], dtype=torch.float64)
    group = torch.tensor([0, 0, 0, 1, 1, 1, 2, 3, 3, 3, 4, 4, 4])
    g = torch.Generator().manual_seed(3)
    H = 0.1 + torch.rand(13, 6, generator=g, dtype=torch.float64)
    H[7:10] = 0.0
    H[11, 2] = 0.0
    mask = torch.ones(13, 6, dtype=torch.bool)
    mask[1, 4:] = False
    adv = ktae.compute_advantages("gtpo", rewards=rewards, group=group, mask=mask,
                                  entropies=H)
    assert torch.isfinite(adv).all()
    for rows in ([0, 1, 2], [3, 4, 5]):  # one polarity: centred on its own mean, not zero
        a = adv[rows][mask[rows]]
        assert a.abs().max() > 0.5 and abs(a.mean().item()) < 1e-9
    assert adv[6].abs().max() < 1e-2  # a single response: (nearly) constant rewards
    assert (adv[7] == 0).all()  # zero entropies in a correct response: share 0, constant
    assert adv[8:10].abs().max() < 1e-6  # zero entropies among incorrect: equal shares
    # the limit of 1/H at H = 0: the zero-entropy token takes the whole incorrect share
    shaped = gtpo_token_rewards(rewards, rewards > 0, torch.tensor(
        [0, 0, 0, 1, 1, 1, 2, 3, 3, 3, 4, 4, 4]), 5, H, mask)
    assert shaped[11, 2].item() == pytest.approx(-1 - 0.1 * 2 * 1.0)
    assert shaped[12, 2].item() == pytest.approx(-1.0)
    assert torch.isfinite(shaped).all()


def test_tiny_and_negative_entropies_and_float32():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    H = torch.tensor([[1e-300, 0.5], [1e-300, 2.0], [5e-324, 1.0], [2.0, 1.0]],
                     dtype=torch.float64)
    mask = torch.ones(4, 2)
    adv = ktae.compute_advantages("gtpo", rewards=rewards, group=[0, 0, 0, 0], mask=mask,
                                  entropies=H)
    assert adv.dtype == torch.float32 and torch.isfinite(adv).all()
    neg = ktae.compute_advantages("gtpo", rewards=rewards, group=[0] * 4, mask=mask,
                                  entropies=torch.tensor([[-1e-7, 0.5], [0.0, 2.0],
                                                          [0.0, 1.0], [2.0, 1.0]]))
    zero = ktae.compute_advantages("gtpo", rewards=rewards, group=[0] * 4, mask=mask,
                                   entropies=torch.tensor([[0.0, 0.5], [0.0, 2.0],
                                                           [0.0, 1.0], [2.0, 1.0]]))
    assert torch.equal(neg, zero)  # rounding below zero counts as 0


def test_estimator_interface():
    assert estimator_needs_entropies("gtpo")
    assert not any(estimator_needs_entropies(n) for n in ("grpo", "drgrpo", "rloo", "ktae"))
    rewards, group, H, mask = random_batch(5)
    # other estimators ignore entropies
    for name in ("grpo", "drgrpo", "rloo"):
        a = ktae.compute_advantages(name, rewards=rewards, group=group, mask=mask)
        b = ktae.compute_advantages(name, rewards=rewards, group=group, mask=mask,
                                    entropies=H)
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_misspelled_option_of_a_baseline(name):
    with pytest.raises(ValueError, match="eps.*no options"):
        ktae.compute_advantages(name, rewards=torch.ones(2), group=[0, 0], eps=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    ({"entropies": None}, "entropies"),
    ({"mask": None}, "token_ids"),
    ({"entropies": torch.ones(3, 3)}, "entropies"),
    ({"entropies": torch.full((3, 2), float("nan"))}, "entropies"),
    ({"normalize": "global"}, "normalize"),
    ({"eps": 0.0}, "eps"),
    ({"a1": float("inf")}, "a1"),
    ({"correct": [True, False]}, "correct"),
    ({"correct": [2, 0, 1]}, "correct"),
    ({"reward_threshold": "x"}, "reward_threshold"),
    ({"alpha1": 1.0}, r"alpha1.*expected correct, reward_threshold, a1, a2, eps, normalize"),
])
def test_gtpo_validation_names_the_argument(kwargs, match):
    args = {"rewards": torch.tensor([1.0, 0.0, 1.0]), "group": [0, 0, 0],
            "mask": torch.ones(3, 2), "entropies": torch.ones(3, 2)}
    args.update(kwargs)
    if args["mask"] is None:
        del args["mask"]
        if args.get("entropies") is not None:
            args["entropies"] = None
    with pytest.raises(ValueError, match=match):
        ktae.compute_advantages("gtpo", **args)


def test_entropies_need_a_mask():
    with pytest.raises(ValueError, match="entropies"):
        ktae.compute_advantages("grpo", rewards=torch.ones(2), group=[0, 0],
                                entropies=torch.ones(2, 3))
