"""The TACO paper's baselines (Table 1) as calibration rules (docs/method.md §9).

Each is written from its own authors' description and, where released, their code:

* ``"adv-reweight"`` (Yang et al., 2025, AR-Lopti): ``A <- (w * p_old + 1 - w) * A`` on
  every real token, ``p_old = exp(old_logp)`` the rollout (old) policy's probability of
  the sampled token (as the AR-Lopti code and the TACO fork use it), ``w = 0.1``.
* ``"forking-tokens"`` (Wang et al., 2025, "Beyond the 80/20 Rule"): only the
  ``top_fraction = 0.2`` highest-entropy real tokens of the batch stay in the loss. The
  authors' code (a verl fork: ``core_algos.py: get_global_entropy_top_mask``, used in
  ``dp_actor.py`` / ``compute_policy_loss_vanilla``) keeps ``max(1, ceil(0.2 n))`` tokens
  of the micro-batch by the current policy's entropy and aggregates the surrogate with
  the loss mask ``response_mask * entropy_top_mask``, so the token-mean runs over the
  kept tokens only; this rule returns that mask as ``loss_mask``.
* ``"stapo"`` (Liu et al., 2026): candidates are the positive-advantage real tokens;
  ``tau_h`` is the ``entropy_quantile``-quantile of the candidates' entropies (0.2, as
  the TACO paper states; the TACO fork defaults to 0.1); a candidate with
  ``p < prob_threshold = 0.002`` and ``H < tau_h`` is silenced: removed from
  ``loss_mask``, so the token-mean runs over the surviving tokens.

``p`` and ``H`` are the current policy's (detached) probability of the sampled token and
entropy, except for ``adv-reweight`` (old policy). "The batch" is the ``[B, T]`` passed
in (the trainer passes each micro-batch, as the authors' code does). Removed tokens get
weight 0 as well, so their calibrated advantage is 0.
"""

from __future__ import annotations

import torch

from ktae.core.calibration_rules import (
    CALIBRATIONS,
    RuleResult,
    fraction_count,
    linear_quantile,
    masked_mean,
    require,
    require_entropies,
    select_extreme,
)
from ktae.core.policy_loss import check_number

ADV_REWEIGHT_W = 0.1
FORKING_TOP_FRACTION = 0.2
STAPO_PROB_THRESHOLD = 0.002
STAPO_ENTROPY_QUANTILE = 0.2


def _fraction(value, name: str, *, low_open: bool = False) -> float:
    return check_number(value, name, low=0, high=1, low_open=low_open)


@CALIBRATIONS.register("adv-reweight", needs=("old_logprobs",))
def adv_reweight(adv, *, logprobs, entropies=None, old_logprobs, mask, generator=None,
                 w: float = ADV_REWEIGHT_W) -> RuleResult:
    """Advantage reweighting: ``A <- (w * p_old + (1 - w)) * A`` for every real token.

    Option ``w`` in [0, 1] (0.1). Needs ``old_logprobs`` (pass ``logprobs`` when the batch
    is on-policy). ``flagged`` marks the real tokens whose weight is below 1.
    """
    w = _fraction(w, "w")
    old = require(old_logprobs, "old_logprobs", "adv-reweight",
                  "the rollout policy's [B, T] log-probs of the sampled tokens; pass the "
                  "current log-probs when the batch is on-policy")
    weights = torch.where(mask, w * old.exp().to(adv.dtype) + (1 - w), 0)
    return RuleResult(weights, mask & (weights < 1), None,
                      {"mean_weight": masked_mean(weights, mask)})


@CALIBRATIONS.register("forking-tokens", needs=("entropies",))
def forking_tokens(adv, *, logprobs, entropies, old_logprobs=None, mask, generator=None,
                   top_fraction: float = FORKING_TOP_FRACTION) -> RuleResult:
    """Forking tokens: only the ``max(1, ceil(top_fraction * n))`` highest-entropy real
    tokens of the batch stay in the loss (``loss_mask``); the rest are removed.

    Option ``top_fraction`` in (0, 1] (0.2). ``flagged`` marks the removed tokens. Ties
    are broken by position.
    """
    top_fraction = _fraction(top_fraction, "top_fraction", low_open=True)
    entropies = require_entropies(entropies, "forking-tokens")
    n = int(mask.sum())
    keep = select_extreme(entropies, mask, max(1, fraction_count(top_fraction, n)))
    threshold = entropies[keep].min() if n else entropies.new_zeros(())
    return RuleResult(keep.to(adv.dtype), mask & ~keep, keep,
                      {"entropy_threshold": threshold.to(torch.float64)})


@CALIBRATIONS.register("stapo", needs=("entropies",))
def stapo(adv, *, logprobs, entropies, old_logprobs=None, mask, generator=None,
          prob_threshold: float = STAPO_PROB_THRESHOLD,
          entropy_quantile: float = STAPO_ENTROPY_QUANTILE) -> RuleResult:
    """STAPO: silence (remove from the loss) positive-advantage tokens with
    ``p < prob_threshold`` and ``H < tau_h``, ``tau_h`` the ``entropy_quantile``-quantile
    of the positive-advantage tokens' entropies (linear interpolation).

    Options ``prob_threshold`` in [0, 1] (0.002), ``entropy_quantile`` in [0, 1] (0.2;
    the TACO fork uses 0.1). Metric ``entropy_threshold``: ``tau_h`` (0 when no token has
    a positive advantage, which silences nothing).
    """
    prob_threshold = _fraction(prob_threshold, "prob_threshold")
    entropy_quantile = _fraction(entropy_quantile, "entropy_quantile")
    entropies = require_entropies(entropies, "stapo")
    candidates = (adv > 0) & mask
    if candidates.any():
        tau = linear_quantile(entropies[candidates], entropy_quantile)
    else:
        tau = torch.zeros((), dtype=torch.float64, device=adv.device)
    silenced = candidates & (logprobs.exp() < prob_threshold) & (entropies < tau)
    keep = mask & ~silenced
    return RuleResult(keep.to(adv.dtype), silenced, keep, {"entropy_threshold": tau})
