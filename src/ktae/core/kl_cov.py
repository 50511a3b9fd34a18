"""KL-Cov: a KL penalty on the tokens of highest covariance.

Cui et al. (2025), "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv 2505.22617 (KL-Cov). Source read: verl's
``verl/trainer/ppo/core_algos.py: compute_policy_loss_kl_cov`` (``loss_mode=kl_cov``, main
at commit b178a3c, adapted from the authors' PRIME-RL/Entropy-Mechanism-of-RL fork). Over
the real tokens, with ``r = exp(logp - old_logp)`` and the covariance terms
``cov_t = (A_t - mean A) * (logp_t - mean logp)`` (:func:`ktae.core.clip_cov.token_covariance`)::

    k      = max(1, floor(kl_cov_ratio * #real tokens))
    S      = the k real tokens of largest cov_t
    loss_t = -A_t r_t + ppo_kl_coef * |logp_t - old_logp_t|     t in S
    loss_t = -A_t r_t                                            otherwise

with verl's defaults ``kl_cov_ratio = 0.0002`` and ``ppo_kl_coef = 1``. verl's loss has no
PPO clip, on any token, and neither has ktae's by default: the rule's result says so
(``CalibrationResult.ppo_clip = False``) and the loss reads it (:func:`ktae.policy_loss`'s
``ppo_clip``, the trainer, the verl plugin), so that every token's surrogate is ``-A_t r_t``.
The option ``clip=true`` keeps the loss's clip range (and dual clip) on every token
instead, an earlier reading of the method kept as a variant (``kl-cov@clip=true``).

How it maps onto the calibration harness. The penalty is not a factor of the advantage:
it adds ``coef * sign(logp - old_logp)`` to the gradient of ``loss_t`` with respect to
``logp_t``. The calibration runs at loss time on the current ``logp``, so it can add that
gradient as an advantage offset (the harness's ``RuleResult.offsets``)::

    A'_t = A_t - ppo_kl_coef * sign(logp_t - old_logp_t) / r_t     t in S

since ``d(-A'_t r_t)/d logp_t = -A_t r_t + coef * sign(logp_t - old_logp_t)``, the same
gradient as verl's ``loss_t``. One difference remains, stated for users: the loss *value*
is not verl's (a selected token's loss is ``-A_t r_t + coef * sign(d_t)`` instead of
``-A_t r_t + coef * |d_t|``, ``d_t = logp_t - old_logp_t``: the same gradient, another
constant). On-policy (one update per batch, ``logp = old_logp``) the penalty's gradient
is 0, in verl (the gradient of ``|x|`` at 0) and here, and without a clip the loss is the
plain surrogate. Ties in ``cov`` are broken by position (verl's ``torch.topk`` leaves them
unspecified).
"""

from __future__ import annotations

import torch

from ktae.core.calibration_rules import CALIBRATIONS, RuleResult, masked_mean, require, select_extreme
from ktae.core.clip_cov import token_covariance
from ktae.core.policy_loss import LOG_RATIO_CLAMP, check_number

KL_COV_RATIO = 0.0002
PPO_KL_COEF = 1.0


@CALIBRATIONS.register("kl-cov", needs=("old_logprobs",))
def kl_cov(adv, *, logprobs, entropies=None, old_logprobs, mask, generator=None,
           kl_cov_ratio: float = KL_COV_RATIO, ppo_kl_coef: float = PPO_KL_COEF,
           clip: bool = False) -> RuleResult:
    """KL-Cov (see the module docstring): the ``k`` highest-covariance tokens get the
    offset ``-ppo_kl_coef * sign(logp - old_logp) / r``, and the loss has no PPO clip.
    Options ``kl_cov_ratio`` in (0, 1] (0.0002), ``ppo_kl_coef >= 0`` (1), ``clip``
    (false; true keeps the loss's clip). ``flagged`` marks the selected tokens; metric
    ``abs_kl``: the mean ``|logp - old_logp|`` over real tokens (verl's ``ppo_kl``)."""
    ratio = check_number(kl_cov_ratio, "kl_cov_ratio", low=0, high=1, low_open=True)
    coef = check_number(ppo_kl_coef, "ppo_kl_coef", low=0)
    if not isinstance(clip, bool):
        raise ValueError(f"clip: expected true or false, got {clip!r}")
    old = require(old_logprobs, "old_logprobs", "kl-cov",
                  "the rollout policy's [B, T] log-probs, for the KL penalty; pass the "
                  "current log-probs when the batch is on-policy")
    n = int(mask.sum())
    chosen = select_extreme(token_covariance(adv, logprobs, mask), mask,
                            max(1, int(n * ratio)) if n else 0)
    log_ratio = torch.where(mask, logprobs - old, 0).to(adv.dtype)
    inv_ratio = (-log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).exp()
    offsets = torch.where(chosen, -coef * log_ratio.sign() * inv_ratio, 0)
    return RuleResult(mask.to(adv.dtype), chosen, None,
                      {"abs_kl": masked_mean(log_ratio.abs(), mask)}, offsets, ppo_clip=clip)
