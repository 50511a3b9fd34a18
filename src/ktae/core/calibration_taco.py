"""TACO (Tail-Aware Credit Calibration) and its ablations (docs/method.md §8).

TACO follows the authors' released code (a verl fork: ``core_algos.py:
compute_taco_token_advantages``, applied in ``dp_actor.py`` before the clipped
surrogate), as docs/method.md §8 writes it. With ``logp[i,t]`` the current policy's
log-probability of the sampled token and ``H[i,t]`` the entropy of its full next-token
distribution (so that the policy's expected log-probability there is ``-H``), both
detached::

    r[i,t] = -logp[i,t] - H[i,t] + log(alpha)            tail risk (0 on padding)
    w[i,t] = 1                                           where r <= 0
           = 1 - lam * (1 - exp(-r[i,t]))                where r > 0
    A[i,t] <- w[i,t] * A[i,t]   where A > 0; non-positive advantages unchanged

``r > 0`` means ``p < alpha * exp(-H)``: the token is much less likely than the policy
expects in that context. ``w`` falls smoothly from 1 towards ``1 - lam`` as the risk
grows. Defaults ``alpha = 0.01``, ``lam = 0.9``.

Ablations (the paper's Table 2) keep TACO's down-weighting rate and strength and change
only which tokens are hit:

* ``taco-prob-only``: ``r = -logp + log(alpha)`` (no entropy term), same weight formula.
* ``taco-entropy-only`` / ``taco-entropy-high`` / ``taco-random``: the ``k``
  positive-advantage tokens TACO flags in the batch (``r > 0`` and ``A > 0``) define a
  budget; as many positive-advantage tokens are chosen and given TACO's own ``k`` weights
  in a random order, so the multiset of weights is identical to TACO's. The chosen tokens
  are, for ``taco-entropy-only``, the lowest-entropy ones: TACO's own entropy term alone
  (``r`` grows as ``H`` falls, so with ``logp`` ignored the riskiest tokens are those of
  lowest entropy); for ``taco-entropy-high``, the highest-entropy ones (an earlier
  reading of the ablation, "highest-entropy", kept under this name; docs/method.md §8); for
  ``taco-random``, uniformly random ones. Ties are broken by position.
* ``taco-hard``: TACO's flagged tokens get ``A <- 0`` (the paper's hard clipping).
* ``taco-step``: TACO's flagged tokens get ``A <- (1 - lam) A`` (a step instead of the
  smooth weight; an extra variant, not one of the paper's).

Logged (``CalibrationResult.metrics``; means over real tokens): ``mean_weight`` (the
rule's weight map: for ``taco`` and ``taco-prob-only`` the formula's ``w`` at every real
token, whatever the advantage's sign; for the other variants the weight they put on the
tokens they choose, 1 elsewhere), ``mean_tail_risk`` (``r``), ``tail_fraction``
(``r > 0``) and ``positive_advantage_fraction`` (``A > 0``). The ablations that borrow
TACO's budget report TACO's ``r``. :data:`TACO_METRIC_NAMES` gives the TACO authors'
names for the same four figures (``weight_mean``, ``tail_risk_mean``,
``tail_token_frac``, ``positive_adv_token_frac``), which loggers use for the rules of
:data:`TACO_FAMILY`.
"""

from __future__ import annotations

import math

import torch

from ktae.core.calibration_rules import (
    CALIBRATIONS,
    RuleResult,
    masked_mean,
    require_entropies,
    select_extreme,
)
from ktae.core.policy_loss import check_number
from ktae.core.registry import Alias

__all__ = ["CALIBRATIONS", "TACO_ALPHA", "TACO_FAMILY", "TACO_LAMBDA", "TACO_METRIC_NAMES",
           "soft_weight", "tail_risk"]

TACO_ALPHA = 0.01
TACO_LAMBDA = 0.9

#: ktae's names of the TACO family's diagnostics -> the TACO authors' names. Their verl
#: fork (``dp_actor.py``) calls ``core_algos.compute_taco_token_advantages(log_prob,
#: entropy, advantages, response_mask, alpha, lambda_)`` once per micro-batch with the
#: current, detached log-probs and entropies, and logs each metric it returns as
#: ``taco/<name>`` (verl averages them over micro-batches). The body of that function was
#: not in the source index this module was checked against (only ``dp_actor.py`` and the
#: README, which states the formula), so the definitions are docs/method.md §8's list read as
#: means over every real token of the micro-batch: ``weight_mean`` the weight ``w(r)``
#: (whatever the advantage's sign), ``tail_risk_mean`` the risk ``r``,
#: ``tail_token_frac`` the share with ``r > 0``, ``positive_adv_token_frac`` the share
#: with ``A > 0``.
TACO_METRIC_NAMES = {"mean_weight": "weight_mean", "mean_tail_risk": "tail_risk_mean",
                     "tail_fraction": "tail_token_frac",
                     "positive_advantage_fraction": "positive_adv_token_frac"}

_FAMILY: list[str] = []


def _register(name: str, needs=("entropies",), aliases=()):
    """Register a rule of the TACO family (all of them report the four metrics above; all
    but ``taco-prob-only`` read the current policy's entropies)."""
    _FAMILY.append(name)
    return CALIBRATIONS.register(name, needs=needs, aliases=aliases)


def _alpha(alpha) -> float:
    return check_number(alpha, "alpha", low=0, low_open=True)


def _lam(lam) -> float:
    return check_number(lam, "lam", low=0, high=1)


def _check_alpha_setting(value, settings) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"expected > 0, got {value!r}")


def _check_lambda_setting(value, settings) -> None:
    if value is not None and not 0 <= value <= 1:
        raise ValueError(f"expected in [0, 1], got {value!r}")


TACO_ALIASES = (
    Alias("taco_alpha", "alpha", float | None, None, help="TACO tail threshold alpha",
          check=_check_alpha_setting, shared=True,
          doc="Tail-risk threshold alpha of the TACO family (docs/method.md §8); None = its "
              "default (0.01)."),
    Alias("taco_lambda", "lam", float | None, None, help="TACO damping lambda",
          check=_check_lambda_setting, shared=True,
          doc="TACO damping lambda; None = its default (0.9). Only calibrations taking "
              "``lam``."),
)
"""The ``ktae train`` settings of TACO (:class:`ktae.core.registry.Alias`), read by every
calibration taking ``alpha`` or ``lam`` (``taco_lambda`` is ``lam``: ``lambda`` is a Python
keyword; ``taco@lambda=0.5`` works too)."""


def tail_risk(logprobs: torch.Tensor, entropies: torch.Tensor | None, mask: torch.Tensor,
              alpha: float) -> torch.Tensor:
    """``r = -logp - H + log(alpha)`` (``-logp + log(alpha)`` when ``entropies`` is None),
    0 on padding."""
    r = math.log(alpha) - logprobs
    if entropies is not None:
        r = r - entropies
    return torch.where(mask, r, 0)


def soft_weight(risk: torch.Tensor, lam: float) -> torch.Tensor:
    """``w = 1 - lam * (1 - exp(-max(r, 0)))``: exactly 1 where ``r <= 0``, tending to
    ``1 - lam`` as ``r`` grows (``1 - exp(-r)`` computed as ``-expm1(-r)``)."""
    return 1 - lam * -torch.expm1(-risk.clamp_min(0))


def _metrics(weight_map, risk, adv, mask) -> dict[str, torch.Tensor]:
    return {"mean_weight": masked_mean(weight_map, mask),
            "mean_tail_risk": masked_mean(risk, mask),
            "tail_fraction": masked_mean(risk > 0, mask),
            "positive_advantage_fraction": masked_mean(adv > 0, mask)}


def _positive(adv, mask) -> torch.Tensor:
    return (adv > 0) & mask


def _soft(adv, risk, mask, lam) -> RuleResult:
    """Weight ``w(r)`` on positive advantages; the TACO and probability-only rules."""
    w = soft_weight(risk, lam).to(adv.dtype)
    pos = _positive(adv, mask)
    weights = torch.where(pos, w, 1) * mask
    return RuleResult(weights, pos & (risk > 0), None, _metrics(w, risk, adv, mask))


def _step(adv, risk, mask, factor: float) -> RuleResult:
    """A constant ``factor`` on TACO's flagged tokens (hard clipping and the step rule)."""
    flagged = _positive(adv, mask) & (risk > 0)
    ones = mask.to(adv.dtype)
    weight_map = torch.where(risk > 0, torch.full_like(ones, factor), ones)
    weights = torch.where(flagged, torch.full_like(ones, factor), ones)
    return RuleResult(weights, flagged, None, _metrics(weight_map, risk, adv, mask))


def _budgeted(adv, risk, mask, lam, scores, generator, *, largest: bool = True) -> RuleResult:
    """TACO's flagged count and weights, moved to the ``k`` positive tokens of largest (or
    smallest) score."""
    pos = _positive(adv, mask)
    taco_flags = pos & (risk > 0)
    taco_weights = soft_weight(risk, lam).to(adv.dtype)[taco_flags]  # row-major order
    k = taco_weights.numel()
    chosen = select_extreme(scores, pos, k, largest=largest)  # k <= |pos|: exactly k
    device = generator.device if generator is not None else adv.device
    order = torch.randperm(k, generator=generator, device=device).to(adv.device)
    weights = mask.to(adv.dtype).clone()
    weights[chosen] = taco_weights[order]
    return RuleResult(weights, chosen, None, _metrics(weights, risk, adv, mask))


# -- the TACO family ------------------------------------------------------------------

@_register("taco", aliases=TACO_ALIASES)
def taco(adv, *, logprobs, entropies, old_logprobs=None, mask, generator=None,
         alpha: float = TACO_ALPHA, lam: float = TACO_LAMBDA) -> RuleResult:
    """TACO (the authors' soft weight, docs/method.md §8): ``A <- w(r) A`` where ``A > 0``, with
    ``r = -logp - H + log(alpha)`` and ``w = 1 - lam (1 - exp(-r))`` for ``r > 0``.

    Options: ``alpha`` > 0 (tail threshold, 0.01; larger flags more tokens),
    ``lam`` in [0, 1] (strength, 0.9: the weight's limit is ``1 - lam``; alias ``lambda_``).
    """
    alpha, lam = _alpha(alpha), _lam(lam)
    risk = tail_risk(logprobs, require_entropies(entropies, "taco"), mask, alpha)
    return _soft(adv, risk, mask, lam)


@_register("taco-prob-only", needs=())
def taco_prob_only(adv, *, logprobs, entropies=None, old_logprobs=None, mask,
                   generator=None, alpha: float = TACO_ALPHA,
                   lam: float = TACO_LAMBDA) -> RuleResult:
    """Probability-only ablation: TACO's soft weight with ``r = -logp + log(alpha)`` (the
    context's entropy ignored, so ``r > 0`` means ``p < alpha``)."""
    alpha, lam = _alpha(alpha), _lam(lam)
    return _soft(adv, tail_risk(logprobs, None, mask, alpha), mask, lam)


@_register("taco-entropy-only")
def taco_entropy_only(adv, *, logprobs, entropies, old_logprobs=None, mask, generator=None,
                      alpha: float = TACO_ALPHA, lam: float = TACO_LAMBDA) -> RuleResult:
    """Entropy-only ablation, by TACO's own entropy term: the lowest-entropy positive-
    advantage tokens (the riskiest under ``r = -logp - H + log(alpha)`` with ``logp``
    ignored), as many as TACO flags in this batch, get TACO's weights in a random order
    (``generator``)."""
    alpha, lam = _alpha(alpha), _lam(lam)
    entropies = require_entropies(entropies, "taco-entropy-only")
    risk = tail_risk(logprobs, entropies, mask, alpha)
    return _budgeted(adv, risk, mask, lam, entropies, generator, largest=False)


@_register("taco-entropy-high")
def taco_entropy_high(adv, *, logprobs, entropies, old_logprobs=None, mask, generator=None,
                      alpha: float = TACO_ALPHA, lam: float = TACO_LAMBDA) -> RuleResult:
    """Entropy ablation, highest-entropy reading (an earlier one, docs/method.md §8): the
    highest-entropy positive-advantage tokens, as many as TACO flags in this batch, get
    TACO's weights in a random order (``generator``)."""
    alpha, lam = _alpha(alpha), _lam(lam)
    entropies = require_entropies(entropies, "taco-entropy-high")
    risk = tail_risk(logprobs, entropies, mask, alpha)
    return _budgeted(adv, risk, mask, lam, entropies, generator, largest=True)


@_register("taco-random")
def taco_random(adv, *, logprobs, entropies, old_logprobs=None, mask, generator=None,
                alpha: float = TACO_ALPHA, lam: float = TACO_LAMBDA) -> RuleResult:
    """Random ablation: as many positive-advantage tokens as TACO flags, drawn uniformly
    at random, get TACO's weights in a random order (both draws from ``generator``)."""
    alpha, lam = _alpha(alpha), _lam(lam)
    risk = tail_risk(logprobs, require_entropies(entropies, "taco-random"), mask, alpha)
    device = generator.device if generator is not None else adv.device
    scores = torch.rand(adv.shape, generator=generator, device=device).to(adv.device)
    return _budgeted(adv, risk, mask, lam, scores, generator)


@_register("taco-hard")
def taco_hard(adv, *, logprobs, entropies, old_logprobs=None, mask, generator=None,
              alpha: float = TACO_ALPHA) -> RuleResult:
    """Hard clipping: TACO's flagged tokens (``r > 0``, ``A > 0``) get ``A <- 0``."""
    alpha = _alpha(alpha)
    risk = tail_risk(logprobs, require_entropies(entropies, "taco-hard"), mask, alpha)
    return _step(adv, risk, mask, 0.0)


@_register("taco-step")
def taco_step(adv, *, logprobs, entropies, old_logprobs=None, mask, generator=None,
              alpha: float = TACO_ALPHA, lam: float = TACO_LAMBDA) -> RuleResult:
    """Step variant: TACO's flagged tokens get ``A <- (1 - lam) A`` whatever their risk
    (this project's earlier rule, kept as an extra variant)."""
    alpha, lam = _alpha(alpha), _lam(lam)
    risk = tail_risk(logprobs, require_entropies(entropies, "taco-step"), mask, alpha)
    return _step(adv, risk, mask, 1 - lam)


#: The rules of this module, the TACO family: each reports :data:`TACO_METRIC_NAMES`' keys.
TACO_FAMILY: frozenset[str] = frozenset(_FAMILY)
