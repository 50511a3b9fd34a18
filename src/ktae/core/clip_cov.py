"""Clip-Cov: detach the gradient of a few random high-covariance tokens.

Cui et al. (2025), "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv 2505.22617 (Clip-Cov). Source read: verl's
``verl/trainer/ppo/core_algos.py: compute_policy_loss_clip_cov`` (``loss_mode=clip_cov``,
main at commit b178a3c, adapted there from the authors' PRIME-RL/Entropy-Mechanism-of-RL
fork). Over the real tokens of the (micro-)batch, with the current policy's detached
log-probs ``logp`` and ``r = exp(logp - old_logp)``::

    cov_t      = (A_t - mean(A)) * (logp_t - mean(logp))          (means over real tokens)
    clipped_t  = -A_t * clip(r_t, 1 - eps_low, 1 + eps_high) > -A_t * r_t
    candidates = real tokens, not clipped, with clip_cov_lb < cov_t < clip_cov_ub
    n          = max(floor(clip_cov_ratio * #real tokens), 1)
    chosen     = n random candidates (all of them if fewer)
    loss_t     = max(-A_t r_t, -A_t clip(r_t, ...)) * (0 if chosen else 1)

with verl's defaults ``clip_cov_ratio = 0.0002``, ``clip_cov_lb = 1``, ``clip_cov_ub = 5``.
A chosen token's loss is multiplied by 0: it contributes no gradient and still counts in
the token mean (verl aggregates with the response mask). Here that is weight 0 with the
token kept in ``loss_mask``. ``clip_low``/``clip_high`` are the loss's clip range, which
verl reads from the actor config (``clip_ratio_low``/``clip_ratio_high``, default 0.2):
set them to the range the trainer uses. The random choice draws ``torch.randperm`` over
the candidates in row-major order from the caller's generator, as verl does from the
global one.
"""

from __future__ import annotations

import torch

from ktae.core.calibration_rules import CALIBRATIONS, RuleResult, masked_mean, require
from ktae.core.policy_loss import LOG_RATIO_CLAMP, check_number

CLIP_COV_RATIO = 0.0002
CLIP_COV_LB = 1.0
CLIP_COV_UB = 5.0
CLIP_RANGE = 0.2


def token_covariance(adv: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor
                     ) -> torch.Tensor:
    """``[B, T]``: ``(A - mean A) * (logp - mean logp)``, means over the real tokens (the
    per-token covariance terms of Clip-Cov and KL-Cov); 0 on padding."""
    lp = logprobs.to(adv.dtype)
    n = mask.sum().clamp_min(1)
    centred_adv = adv - torch.where(mask, adv, 0).sum() / n
    centred_lp = lp - torch.where(mask, lp, 0).sum() / n
    return torch.where(mask, centred_adv * centred_lp, 0)


def clipped_by_ratio(adv, logprobs, old_logprobs, mask, clip_low: float, clip_high: float):
    """bool ``[B, T]``: the real tokens whose clipped surrogate exceeds the unclipped one
    (verl's ``clip_by_origin``: the clip takes their gradient already)."""
    log_ratio = torch.where(mask, logprobs - old_logprobs, 0).clamp(-LOG_RATIO_CLAMP,
                                                                   LOG_RATIO_CLAMP)
    ratio = log_ratio.exp().to(adv.dtype)
    return mask & (-adv * ratio.clamp(1 - clip_low, 1 + clip_high) > -adv * ratio)


@CALIBRATIONS.register("clip-cov", needs=("old_logprobs",))
def clip_cov(adv, *, logprobs, entropies=None, old_logprobs, mask, generator=None,
             clip_cov_ratio: float = CLIP_COV_RATIO, clip_cov_lb: float = CLIP_COV_LB,
             clip_cov_ub: float = CLIP_COV_UB, clip_low: float = CLIP_RANGE,
             clip_high: float = CLIP_RANGE) -> RuleResult:
    """Clip-Cov (see the module docstring): the chosen tokens get weight 0 and stay in
    ``loss_mask``. Options: ``clip_cov_ratio`` in (0, 1] (0.0002), ``clip_cov_lb`` and
    ``clip_cov_ub`` (1, 5), ``clip_low`` in [0, 1) and ``clip_high`` >= 0 (0.2, the loss's
    clip range). ``flagged`` marks the chosen tokens; metric ``candidate_fraction``."""
    ratio = check_number(clip_cov_ratio, "clip_cov_ratio", low=0, high=1, low_open=True)
    lb = check_number(clip_cov_lb, "clip_cov_lb")
    ub = check_number(clip_cov_ub, "clip_cov_ub")
    clip_low = check_number(clip_low, "clip_low", low=0, high=1, high_open=True)
    clip_high = check_number(clip_high, "clip_high", low=0)
    old = require(old_logprobs, "old_logprobs", "clip-cov",
                  "the rollout policy's [B, T] log-probs, for the ratio's clip test; pass the "
                  "current log-probs when the batch is on-policy")
    cov = token_covariance(adv, logprobs, mask)
    clipped = clipped_by_ratio(adv, logprobs, old, mask, clip_low, clip_high)
    candidates = mask & ~clipped & (cov > lb) & (cov < ub)
    where = candidates.flatten().nonzero().squeeze(1)
    n = max(int(ratio * int(mask.sum())), 1)
    chosen = torch.zeros_like(mask).flatten()
    if where.numel():
        perm = torch.randperm(where.numel(), generator=generator, device="cpu")
        chosen[where[perm[:n].to(where.device)]] = True
    chosen = chosen.view_as(mask)
    weights = torch.where(chosen, 0, mask.to(adv.dtype))
    return RuleResult(weights, chosen, None,
                      {"candidate_fraction": masked_mean(candidates.to(adv.dtype), mask)})
