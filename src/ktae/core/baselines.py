"""Sequence-level baselines (docs/method.md §2): one advantage per response.

All functions take dense group ids ``gid[B]`` (see :func:`ktae.core.groups.group_index`)
and rewards ``[B]`` and return ``[B]`` in the rewards' dtype; they are single vectorised
passes (``index_add`` over groups), with no Python loop over groups.

Range: each group's rewards are divided by a power of two near their largest magnitude
before any sum or square, so a group's statistics never overflow and the scaling is
exact (results are bit-identical to the unscaled formulas whenever those do not
overflow). Any finite rewards therefore give finite, correct GRPO advantages (float32
``[1e20, 0, 1e20, 0]`` gives ``+-0.866``). Dr.GRPO's ``R - mean`` and RLOO's
``R - mean of the others`` are differences of rewards and can exceed the dtype's range
(float32 ``[3e38, -3e38]``); they raise ``ValueError`` naming ``rewards`` then, rather
than return ``inf`` (pass float64 rewards, or rescale them).

Equal rewards: a group of two or more responses whose rewards are equal up to float
rounding (:func:`equal_reward_groups`: ``max_g R - min_g R <= 2**-20 max_g |R|``) gets
advantage 0 from every estimator here. Its rewards hold no preference between its
responses; without the rule a rounding difference (``0.1 + 0.25`` against ``0.35`` in
float32, one ulp) would become a GRPO advantage of order ``ulp / (ulp + eps)`` and an
estimator without an eps in its denominator would blow it up to order 1 or more.
"""

from __future__ import annotations

import torch

GRPO_EPS = 1e-6

#: Rewards of a group are "equal up to rounding" when their spread is at most this times
#: their largest magnitude: 2**-20, i.e. 8 float32 ulps at that magnitude. A float32 sum of
#: k same-sign terms is within about (k - 1) / 2 ulps of the exact sum, so rewards summed
#: from up to ~16 float32 terms (verifier + format + length parts) that are equal in exact
#: arithmetic fall inside it, while any deliberate reward difference (partial credit 1/N,
#: a length penalty) is many orders of magnitude larger. Float32 is the precision rewards
#: usually come in, even when they are passed as float64, so the bound is the same for
#: every dtype. Relative to the magnitude (not absolute) so that it is scale invariant:
#: ``[0, 1e-30]`` is a real difference, ``[1e4, 1e4 + 1e-3]`` is float32 rounding.
EQUAL_REWARDS_RTOL = 2.0**-20


def _group_scale(rewards: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Per-group power of two ``s_g`` with ``max_g |R| / s_g`` in ``[1, 2)`` (1 for an all-zero
    group), as ``[P]``. Dividing by a power of two is exact, and the largest finite float
    is below ``2 * s_g``, so ``2 ** e`` itself never overflows."""
    top = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device)
    top.scatter_reduce_(0, gid, rewards.abs(), reduce="amax", include_self=True)
    _, exponent = torch.frexp(top)  # top = m * 2**e, m in [0.5, 1); e = 0 for top = 0
    exponent = torch.where(top > 0, exponent - 1, torch.zeros_like(exponent))
    return torch.ldexp(torch.ones_like(top), exponent)


def _equal_in_scaled(x: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``[P]`` equal-rewards flags from rewards already scaled per group (``|x| < 2``)."""
    inf = torch.full((num_groups,), torch.inf, dtype=x.dtype, device=x.device)
    lo = inf.scatter_reduce(0, gid, x, reduce="amin", include_self=True)
    hi = (-inf).scatter_reduce(0, gid, x, reduce="amax", include_self=True)
    top = torch.maximum(hi.abs(), lo.abs())
    return (hi - lo) <= EQUAL_REWARDS_RTOL * top


def equal_reward_groups(rewards: torch.Tensor, gid: torch.Tensor, num_groups: int
                        ) -> torch.Tensor:
    """``[P]`` bool: the group's rewards are equal up to float rounding.

    ``max_g R - min_g R <= EQUAL_REWARDS_RTOL * max_g |R|`` (see :data:`EQUAL_REWARDS_RTOL`);
    an all-zero group and a group of one count as equal. Computed on rewards divided by
    a power of two per group (exact), so it never overflows.
    """
    s = _group_scale(rewards, gid, num_groups)[gid]
    return _equal_in_scaled(rewards / s, gid, num_groups)


def _scaled_moments(rewards: torch.Tensor, gid: torch.Tensor, num_groups: int):
    """``(x, n, mean_x, std_x, s)``: rewards ``x = R / s_g`` scaled per group, and per
    response the group size, mean and unbiased std of ``x`` and the scale ``s_g``."""
    s = _group_scale(rewards, gid, num_groups)[gid]
    x = rewards / s
    n = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device)
    n.index_add_(0, gid, torch.ones_like(rewards))
    total = torch.zeros_like(n).index_add_(0, gid, x)
    mean = (total / n.clamp_min(1))[gid]
    dev = x - mean
    ss = torch.zeros_like(n).index_add_(0, gid, dev * dev)
    std = (ss / (n - 1).clamp_min(1)).sqrt()[gid]
    return x, n[gid], mean, std, s


def group_mean_std(rewards: torch.Tensor, gid: torch.Tensor, num_groups: int):
    """Per-response group mean and unbiased (n-1) std, each ``[B]``.

    A group of size 1 gets mean 0 and std 1 (verl's convention), so its response keeps
    its raw reward as advantage (divided by ``1 + eps``). The std is ``inf`` only where
    it exceeds the dtype's range (float32 ``[3e38, -3e38]``).
    """
    _, n, mean, std, s = _scaled_moments(rewards, gid, num_groups)
    single = n <= 1
    return (torch.where(single, torch.zeros_like(mean), mean * s),
            torch.where(single, torch.ones_like(std), std * s))


def grpo_advantages(rewards: torch.Tensor, gid: torch.Tensor, num_groups: int,
                    eps: float = GRPO_EPS) -> torch.Tensor:
    """GRPO (DeepSeekMath): ``A_i = (R_i - mean_g R) / (std_g R + eps)``, std unbiased.

    0 in a group whose rewards are equal up to rounding (:func:`equal_reward_groups`).

    Computed on the scaled rewards as ``(x_i - mean_g x) / (std_g x + eps / s_g)``, which
    is the same quantity and finite for any finite rewards.
    """
    x, n, mean, std, s = _scaled_moments(rewards, gid, num_groups)
    single_group = rewards / (torch.ones_like(rewards) + eps)  # mean 0, std 1
    adv = torch.where(_equal_in_scaled(x, gid, num_groups)[gid], torch.zeros_like(x),
                      (x - mean) / (std + eps / s))
    return torch.where(n <= 1, single_group, adv)


def _checked_difference(diff: torch.Tensor, s: torch.Tensor, name: str) -> torch.Tensor:
    out = diff * s
    if out.numel() and not torch.isfinite(out).all():
        bad = int((~torch.isfinite(out)).nonzero()[0, 0])
        dtype = str(out.dtype).removeprefix("torch.")
        raise ValueError(f"rewards: the {name} advantage of response {bad} exceeds the "
                         f"{dtype} range (rewards differ by more than its largest "
                         "value); pass float64 rewards or rescale them")
    return out


def drgrpo_advantages(rewards: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Dr.GRPO: ``A_i = R_i - mean_g R`` (no division by the std); 0 mean for a group of 1,
    0 in a group whose rewards are equal up to rounding."""
    x, n, mean, _, s = _scaled_moments(rewards, gid, num_groups)
    mean = torch.where(n <= 1, torch.zeros_like(mean), mean)
    diff = torch.where(_equal_in_scaled(x, gid, num_groups)[gid] & (n > 1), torch.zeros_like(x),
                       x - mean)
    return _checked_difference(diff, s, "Dr.GRPO")


def rloo_advantages(rewards: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """RLOO: ``A_i = R_i - mean of the other G-1 rewards``; 0 in a group of size 1 and in
    a group whose rewards are equal up to rounding."""
    s = _group_scale(rewards, gid, num_groups)[gid]
    x = rewards / s
    n = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device)
    n.index_add_(0, gid, torch.ones_like(rewards))
    total = torch.zeros_like(n).index_add_(0, gid, x)
    g = n[gid]
    loo_mean = (total[gid] - x) / (g - 1).clamp_min(1)
    informative = (g > 1) & ~_equal_in_scaled(x, gid, num_groups)[gid]
    diff = torch.where(informative, x - loo_mean, torch.zeros_like(x))
    return _checked_difference(diff, s, "RLOO")


SEQUENCE_BASELINES = {
    "grpo": grpo_advantages,
    "drgrpo": drgrpo_advantages,
    "rloo": rloo_advantages,
}
