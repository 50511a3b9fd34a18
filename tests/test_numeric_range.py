"""Finite rewards and advantages at the edges of the float range give finite, correct
results: group statistics and loss sums are computed on exactly rescaled values."""

from __future__ import annotations

from decimal import Decimal, localcontext

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import examples

import ktae
from ktae.core.baselines import GRPO_EPS, group_mean_std

F32_MAX = torch.finfo(torch.float32).max


def _decimal_baseline(rewards, name: str) -> list[float]:
    """One group's advantages from the docs/method.md §2 formulas in 60-digit decimal arithmetic."""
    with localcontext() as ctx:
        ctx.prec = 60
        r = [Decimal(float(x)) for x in rewards]
        n = len(r)
        mean = sum(r) / n
        if name == "grpo":
            std = (sum((x - mean) ** 2 for x in r) / (n - 1)).sqrt()
            return [float((x - mean) / (std + Decimal(GRPO_EPS))) for x in r]
        if name == "drgrpo":
            return [float(x - mean) for x in r]
        return [float(x - (sum(r) - x) / (n - 1)) for x in r]


def _adv(name, rewards, dtype):
    return ktae.compute_advantages(name, rewards=torch.tensor(rewards, dtype=dtype),
                                   group=[0] * len(rewards))


def test_grpo_float32_large_rewards_are_not_flattened_to_zero():
    out = _adv("grpo", [1e20, 0.0, 1e20, 0.0], torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([1, -1, 1, -1.0]) * 0.75 ** 0.5)


@pytest.mark.parametrize("dtype, rewards", [
    (torch.float32, [3e38, -3e38, 3e38, 0.0]),
    (torch.float32, [F32_MAX, -F32_MAX, 1.0, 2.0]),
    (torch.float32, [1e-45, 0.0, 3e-45, 0.0]),  # subnormal rewards: eps dominates, A ~ 0
    (torch.float64, [1.7e308, -1.7e308, 1.7e308, 0.0]),
    (torch.float64, [1e300, 1e-300, -1e300, 5e299]),
])
def test_grpo_extreme_rewards_match_exact_arithmetic(dtype, rewards):
    out = _adv("grpo", rewards, dtype)
    assert out.dtype == dtype and torch.isfinite(out).all()
    expected = torch.tensor(_decimal_baseline(torch.tensor(rewards, dtype=dtype).tolist(),
                                              "grpo"), dtype=dtype)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["drgrpo", "rloo"])
def test_difference_baselines_large_rewards(name):
    # representable differences: exact
    rewards = [1e38, 1e38, 3e38, 0.0]
    out = _adv(name, rewards, torch.float32)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.tensor(_decimal_baseline(
        torch.tensor(rewards).tolist(), name)), rtol=1e-6, atol=0)
    # differences beyond float32's range: a clear error, not -inf; float64 computes them
    with pytest.raises(ValueError, match=r"rewards: the .* advantage .* float32 range"):
        _adv(name, [3e38, -3e38, 3e38, 0.0], torch.float32)
    out64 = _adv(name, [3e38, -3e38, 3e38, 0.0], torch.float64)
    torch.testing.assert_close(out64, torch.tensor(_decimal_baseline(
        [3e38, -3e38, 3e38, 0.0], name), dtype=torch.float64), rtol=1e-12, atol=0)


def test_group_mean_std_is_finite_where_representable():
    gid = torch.zeros(4, dtype=torch.long)
    mean, std = group_mean_std(torch.tensor([1e20, 0.0, 1e20, 0.0]), gid, 1)
    torch.testing.assert_close(mean, torch.full((4,), 5e19))
    torch.testing.assert_close(std, torch.full((4,), 1e20 / 3 ** 0.5))
    _, std = group_mean_std(torch.tensor([3e38, -3e38]), torch.zeros(2, dtype=torch.long), 1)
    assert torch.isinf(std).all()  # 4.2e38 is beyond float32: documented


@settings(**examples(200))
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1,
                max_size=8), st.sampled_from([torch.float32, torch.float64]))
def test_grpo_is_finite_and_bounded_for_any_finite_rewards(values, dtype):
    """In a group of n > 1, |A| <= (n - 1) / sqrt(n) (unbiased std); a group of one keeps
    its reward / (1 + eps)."""
    groups = [i % 2 for i in range(len(values))]
    rewards = torch.tensor(values, dtype=dtype)
    out = ktae.compute_advantages("grpo", rewards=rewards, group=groups)
    assert torch.isfinite(out).all()
    for g in (0, 1):
        rows = [i for i, x in enumerate(groups) if x == g]
        n = len(rows)
        if n > 1:
            assert out[rows].abs().max() <= (n - 1) / n ** 0.5 + 1e-5
        elif n == 1:
            assert out[rows[0]] == rewards[rows[0]] / (1 + torch.tensor(GRPO_EPS, dtype=dtype))


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean",
                                         "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("adv", [[3e38, 3e38], [-3e38, -3e38], [3e38, -3e38]])
def test_policy_loss_with_huge_advantages_is_finite(aggregation, adv):
    lp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, metrics = ktae.policy_loss(lp, lp.detach(), torch.tensor(adv), mask,
                                     aggregation=aggregation, max_response_length=3)
    loss.backward()
    # ratio 1: the loss is minus the aggregated advantage, computed here in float64
    a = torch.tensor(adv, dtype=torch.float64)[:, None].expand(2, 3)
    m = mask.bool()
    if aggregation == "token-mean":
        expected = -a[m].mean()
    elif aggregation == "seq-mean-token-mean":
        expected = -torch.stack([a[i][m[i]].mean() for i in range(2)]).mean()
    else:
        expected = -(torch.where(m, a, 0).sum(1) / 3).mean()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    tol = 1e-6 * 3e38  # float32 rounding of terms of size 3e38
    torch.testing.assert_close(loss.double(), expected, rtol=0, atol=tol)
    assert metrics["pg_loss"] == pytest.approx(float(expected), abs=tol)


def test_policy_loss_sum_norm_beyond_the_range_is_inf():
    """Documented limit: a token sum over a small divisor can exceed the dtype's range."""
    lp = torch.zeros(1, 4)
    loss, _ = ktae.policy_loss(lp, lp, torch.tensor([-3e38]), torch.ones(1, 4),
                               aggregation="seq-mean-token-sum-norm", max_response_length=1)
    assert loss.item() == float("inf")
