"""Sequence-level baselines (SPEC section 1): one advantage per response.

All functions take dense group ids ``gid[B]`` (see :func:`ktae.core.groups.group_index`)
and rewards ``[B]`` and return ``[B]``; they are single vectorised passes
(``index_add`` over groups), with no Python loop over groups.
"""

from __future__ import annotations

import torch

GRPO_EPS = 1e-6


def group_mean_std(rewards: torch.Tensor, gid: torch.Tensor, num_groups: int):
    """Per-response group mean and unbiased (n-1) std, each ``[B]``.

    A group of size 1 gets mean 0 and std 1 (verl's convention), so its response keeps
    its raw reward as advantage (divided by ``1 + eps``).
    """
    n = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device)
    n.index_add_(0, gid, torch.ones_like(rewards))
    total = torch.zeros_like(n).index_add_(0, gid, rewards)
    mean = total / n.clamp_min(1)
    dev = rewards - mean[gid]
    ss = torch.zeros_like(n).index_add_(0, gid, dev * dev)
    std = (ss / (n - 1).clamp_min(1)).sqrt()
    single = n <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[gid], std[gid]


def grpo_advantages(rewards: torch.Tensor, gid: torch.Tensor, num_groups: int,
                    eps: float = GRPO_EPS) -> torch.Tensor:
    """GRPO (DeepSeekMath): ``A_i = (R_i - mean_g R) / (std_g R + eps)``, std unbiased."""
    mean, std = group_mean_std(rewards, gid, num_groups)
    return (rewards - mean) / (std + eps)


def drgrpo_advantages(rewards: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Dr.GRPO: ``A_i = R_i - mean_g R`` (no division by the std)."""
    mean, _ = group_mean_std(rewards, gid, num_groups)
    return rewards - mean


def rloo_advantages(rewards: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """RLOO: ``A_i = R_i - mean of the other G-1 rewards``; 0 in a group of size 1."""
    n = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device)
    n.index_add_(0, gid, torch.ones_like(rewards))
    total = torch.zeros_like(n).index_add_(0, gid, rewards)
    g = n[gid]
    loo_mean = (total[gid] - rewards) / (g - 1).clamp_min(1)
    return torch.where(g > 1, rewards - loo_mean, torch.zeros_like(rewards))


SEQUENCE_BASELINES = {
    "grpo": grpo_advantages,
    "drgrpo": drgrpo_advantages,
    "rloo": rloo_advantages,
}
