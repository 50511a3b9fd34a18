"""Entropy advantage: the advantage plus a bounded, detached entropy bonus.

Cheng et al. (2025), "Reasoning with Exploration: An Entropy Perspective on Reinforcement
Learning for LLMs", arXiv 2506.14758 (its entropy-based advantage)::

    psi(H_t) = min(alpha * H_t.detach(), |A_t| / kappa)
    A'_t     = A_t + psi(H_t)

``H_t`` is the entropy of the policy's next-token distribution at token ``t``, detached
(no gradient flows through it), so the bonus changes how strongly a token is pushed, never
the direction of the update: the clip ``|A_t| / kappa`` keeps the bonus below a fraction of
the advantage's magnitude, so a negative advantage stays negative for ``kappa > 1``, and a
token with ``A_t = 0`` gets no bonus. The entropy is the current policy's at the update, as
the paper's one-line change to the PPO/GRPO loss computes it. Defaults: ``alpha = 0.4``,
``kappa = 2``. The paper released no code; its text is the only source.

As a calibration (:data:`ktae.CALIBRATIONS`, name ``entropy-adv``) it applies to any
estimator's advantages at loss time: ``grpo+entropy-adv``, ``ktae+entropy-adv``.
"""

from __future__ import annotations

import torch

from ktae.core.calibration_rules import CALIBRATIONS, RuleResult, masked_mean, require_entropies
from ktae.core.policy_loss import check_number

ENTROPY_ADV_ALPHA = 0.4
ENTROPY_ADV_KAPPA = 2.0


def entropy_bonus(adv: torch.Tensor, entropies: torch.Tensor, *, alpha: float,
                  kappa: float) -> torch.Tensor:
    """``[B, T]``: ``min(alpha * H, |A| / kappa)``, the paper's ``psi(H_t)``."""
    return torch.minimum(alpha * entropies.to(adv.dtype), adv.abs() / kappa)


@CALIBRATIONS.register("entropy-adv", needs=("entropies",))
def entropy_advantage(adv, *, logprobs, entropies, old_logprobs=None, mask, generator=None,
                      alpha: float = ENTROPY_ADV_ALPHA,
                      kappa: float = ENTROPY_ADV_KAPPA) -> RuleResult:
    """``A <- A + min(alpha * H, |A| / kappa)`` on every real token (weights 1, the bonus
    as the offset). Options ``alpha >= 0`` (0.4) and ``kappa > 0`` (2). ``flagged`` marks
    the tokens that get a non-zero bonus; metric ``mean_bonus``."""
    alpha = check_number(alpha, "alpha", low=0)
    kappa = check_number(kappa, "kappa", low=0, low_open=True)
    entropies = require_entropies(entropies, "entropy-adv")
    bonus = torch.where(mask, entropy_bonus(adv, entropies, alpha=alpha, kappa=kappa), 0)
    return RuleResult(mask.to(adv.dtype), mask & (bonus != 0), None,
                      {"mean_bonus": masked_mean(bonus, mask)}, bonus)
