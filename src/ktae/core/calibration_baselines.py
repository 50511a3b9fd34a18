"""TACO's baselines as token weightings (SPEC section 5).

The TACO paper describes each baseline in one line; these are the project's
reconstructions from those descriptions and the cited methods, written as the same kind
of rule as TACO (``rule(adv, *, logprobs, entropies, mask, generator, **options) ->
(weights, flagged)``, see :mod:`ktae.core.calibration_taco`), with ``p = exp(logp)`` the
current policy's (detached) probability of the sampled token and ``H`` its entropy:

* ``"adv-reweight"`` (Yang et al., 2025b): ``A <- (w * p + 1 - w) * A`` on every token,
  ``w = 0.1``, so low-probability tokens weigh less in the update.
* ``"forking-tokens"`` (Wang et al., 2025): only the ``top_fraction = 0.2`` highest-entropy
  real tokens of the batch keep their advantage; the others get 0.
* ``"stapo"`` (Liu et al., 2026a): positive-advantage tokens with
  ``p < prob_threshold = 0.002`` that are also among the ``low_entropy_fraction = 0.2``
  lowest-entropy real tokens of the batch get 0 ("silenced").

Fractions of "the batch" count the real tokens of the ``[B, T]`` tensors passed in:
``k = ceil(fraction * n)`` tokens, which is what a quantile threshold keeps when the
entropies are distinct; ties are broken by position.
"""

from __future__ import annotations

import torch

from ktae.core.calibration_taco import (
    CALIBRATIONS,
    fraction_count,
    require_entropies,
    select_extreme,
)
from ktae.core.policy_loss import check_number

ADV_REWEIGHT_W = 0.1
FORKING_TOP_FRACTION = 0.2
STAPO_PROB_THRESHOLD = 0.002
STAPO_LOW_ENTROPY_FRACTION = 0.2


def _fraction(value, name: str) -> float:
    return check_number(value, name, low=0, high=1)


@CALIBRATIONS.register("adv-reweight")
def adv_reweight(adv, *, logprobs, entropies=None, mask, generator=None,
                 w: float = ADV_REWEIGHT_W):
    """Advantage reweighting: ``A <- (w * p + (1 - w)) * A`` for every real token.

    Option ``w`` in [0, 1] (0.1). ``flagged`` marks the real tokens whose weight is
    below 1 (every token with ``p < 1`` when ``w > 0``).
    """
    w = _fraction(w, "w")
    weights = torch.where(mask, w * logprobs.exp().to(adv.dtype) + (1 - w), 0)
    return weights, mask & (weights < 1)


@CALIBRATIONS.register("forking-tokens")
def forking_tokens(adv, *, logprobs, entropies, mask, generator=None,
                   top_fraction: float = FORKING_TOP_FRACTION):
    """Forking tokens: only the ``ceil(top_fraction * n)`` highest-entropy real tokens
    of the batch keep their advantage (weight 1); the rest get weight 0.

    Option ``top_fraction`` in [0, 1] (0.2). ``flagged`` marks the silenced tokens.
    """
    top_fraction = _fraction(top_fraction, "top_fraction")
    entropies = require_entropies(entropies, "forking-tokens")
    k = fraction_count(top_fraction, int(mask.sum()))
    keep = select_extreme(entropies, mask, k, largest=True)
    return keep.to(adv.dtype), mask & ~keep


@CALIBRATIONS.register("stapo")
def stapo(adv, *, logprobs, entropies, mask, generator=None,
          prob_threshold: float = STAPO_PROB_THRESHOLD,
          low_entropy_fraction: float = STAPO_LOW_ENTROPY_FRACTION):
    """STAPO-style silencing: weight 0 for tokens with ``A > 0``, ``p < prob_threshold``
    and an entropy among the ``ceil(low_entropy_fraction * n)`` lowest of the batch.

    Options ``prob_threshold`` in [0, 1] (0.002), ``low_entropy_fraction`` in [0, 1]
    (0.2). ``flagged`` marks the silenced tokens.
    """
    prob_threshold = _fraction(prob_threshold, "prob_threshold")
    low_entropy_fraction = _fraction(low_entropy_fraction, "low_entropy_fraction")
    entropies = require_entropies(entropies, "stapo")
    k = fraction_count(low_entropy_fraction, int(mask.sum()))
    low_entropy = select_extreme(entropies, mask, k, largest=False)
    flagged = low_entropy & (adv > 0) & (logprobs.exp() < prob_threshold)
    ones = mask.to(adv.dtype)
    return torch.where(flagged, torch.zeros_like(ones), ones), flagged
