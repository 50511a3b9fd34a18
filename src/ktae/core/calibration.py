"""Loss-time token credit: calibrate advantages from the current policy (SPEC section 5).

At each policy forward pass, a calibration rule turns the advantages (``[B]`` broadcast
or ``[B, T]``) into token-level advantages ``[B, T]`` from the current policy's
log-probability ``logp`` of each sampled token and the entropy ``H`` of each next-token
distribution. All weights are computed under ``torch.no_grad`` from detached inputs, so
no gradient flows through the calibration; the result is fed to
:func:`ktae.policy_loss` as the advantages.

TACO (Tail-Aware Credit Calibration). The TACO paper's equations were lost from its
text: the formula below is this project's reconstruction from the paper's prose
(SPEC section 5), not a transcription::

    high_risk[i,t] = logp[i,t] < -H[i,t] + log(alpha)      (p < alpha * exp(-H))
    A[i,t] <- (1 - lam) * A[i,t]   if high_risk[i,t] and A[i,t] > 0, else unchanged

with ``alpha = 0.01`` and ``lam = 0.9``. Non-positive advantages are never changed.

Registered rules (:data:`CALIBRATIONS`):

=====================  ==============================================================
``taco``               the reconstruction above (options ``alpha``, ``lam``)
``taco-prob-only``     flag ``p < alpha`` alone (ablation)
``taco-entropy-only``  the highest-entropy positive-advantage tokens, as many as TACO
                       flags in the batch (ablation)
``taco-random``        as many positive-advantage tokens at random (ablation)
``taco-hard``          TACO with ``lam = 1`` (ablation)
``adv-reweight``       ``A <- (w * p + 1 - w) * A``, ``w = 0.1`` (baseline)
``forking-tokens``     only the top 20% highest-entropy tokens keep ``A`` (baseline)
``stapo``              ``A > 0``, ``p < 0.002`` and among the 20% lowest-entropy tokens
                       -> 0 (baseline)
=====================  ==============================================================

The rules live in :mod:`ktae.core.calibration_taco` and
:mod:`ktae.core.calibration_baselines`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from ktae.core import calibration_baselines  # noqa: F401  (registers the baselines)
from ktae.core.calibration_taco import CALIBRATIONS
from ktae.core.checks import as_tensor, check_mask
from ktae.core.policy_loss import token_advantages, token_tensor

__all__ = ["CALIBRATIONS", "CalibrationResult", "calibrate_advantages"]

# Arguments every rule receives; anything else a rule declares is a user option.
_RULE_ARGS = {"logprobs", "entropies", "mask", "generator"}


@dataclass(frozen=True)
class CalibrationResult:
    """The outcome of :func:`calibrate_advantages`. Shapes: B responses, T tokens.

    Attributes:
        advantages: ``[B, T]`` calibrated advantages, ``weights * A`` (0 on padding),
            float32 (float64 for float64 advantages), detached.
        flagged: ``[B, T]`` bool, the real tokens whose credit the rule reduces (TACO
            family: the selected positive-advantage tokens; ``forking-tokens`` and
            ``stapo``: the silenced tokens; ``adv-reweight``: tokens with weight < 1).
        flag_rate: ``flagged.sum() / mask.sum()``; 0.0 for an empty mask.
        weights: ``[B, T]`` the factor applied to each token's advantage (0 on padding).
    """

    advantages: torch.Tensor
    flagged: torch.Tensor
    flag_rate: float
    weights: torch.Tensor


def _rule_options(name: str, rule, options: dict) -> dict:
    """Map ``lambda_`` to ``lam`` and reject options the rule does not take."""
    options = dict(options)
    if "lambda_" in options:
        if "lam" in options:
            raise ValueError("lam: given twice (as 'lam' and as 'lambda_')")
        options["lam"] = options.pop("lambda_")
    accepted = [p for p in inspect.signature(rule).parameters
                if p not in _RULE_ARGS and p != "adv"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        expected = ", ".join(accepted) or "no options"
        raise ValueError(f"{unknown[0]}: unknown option for calibration {name!r}; "
                         f"expected {expected}")
    return options


def calibrate_advantages(name: str, advantages, *, logprobs, entropies=None, mask,
                         generator: torch.Generator | None = None,
                         **options) -> CalibrationResult:
    """Token-level advantages from a registered calibration rule (SPEC section 5).

    Args:
        name: a rule of :data:`CALIBRATIONS` (``"taco"``, ``"taco-prob-only"``,
            ``"taco-entropy-only"``, ``"taco-random"``, ``"taco-hard"``,
            ``"adv-reweight"``, ``"forking-tokens"``, ``"stapo"``).
        advantages: ``[B]`` (broadcast over the mask) or ``[B, T]``.
        logprobs: ``[B, T]`` current-policy log-probs of the sampled tokens.
        entropies: ``[B, T]`` entropies of the current policy's next-token distributions
            (required by every rule except ``taco-prob-only`` and ``adv-reweight``).
        mask: ``[B, T]`` 0/1 or bool, 1 = real response token.
        generator: random source of ``taco-random`` (None: torch's global RNG).
        **options: rule options: ``alpha`` and ``lam`` (alias ``lambda_``) for the TACO
            family (``taco-hard`` takes ``alpha`` only), ``w`` for ``adv-reweight``,
            ``top_fraction`` for ``forking-tokens``, ``prob_threshold`` and
            ``low_entropy_fraction`` for ``stapo``.

    Returns:
        A :class:`CalibrationResult`. Inputs are detached and the rule runs under
        ``torch.no_grad``, so nothing in it carries a gradient. "The batch" of the
        fraction- and count-based rules is the ``[B, T]`` passed in.

    Raises:
        ValueError: unknown rule or option, an option out of range, shape mismatches or
            NaN/inf inputs (the message names the argument).

    Example:
        >>> import math, torch, ktae
        >>> lp = torch.log(torch.tensor([[0.5, 0.001]]))
        >>> H = torch.tensor([[0.7, 0.7]])
        >>> r = ktae.calibrate_advantages("taco", torch.tensor([2.0]), logprobs=lp,
        ...                               entropies=H, mask=torch.ones(1, 2))
        >>> r.advantages, r.flag_rate
        (tensor([[2.0000, 0.2000]]), 0.5)
    """
    rule = CALIBRATIONS.get(name)
    options = _rule_options(name, rule, options)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: expected a torch.Generator or None, "
                         f"got {type(generator).__name__}")
    with torch.no_grad():
        device = logprobs.device if isinstance(logprobs, torch.Tensor) else None
        logprobs = token_tensor(logprobs, "logprobs", None, device).detach()
        shape, device = tuple(logprobs.shape), logprobs.device
        mask = check_mask(as_tensor(mask, "mask", device=device), "mask", shape)
        adv = token_advantages(advantages, shape, device).detach()
        adv = torch.where(mask, adv, 0)
        if entropies is not None:
            entropies = token_tensor(entropies, "entropies", shape, device).detach()
        weights, flagged = rule(adv, logprobs=logprobs, entropies=entropies, mask=mask,
                                generator=generator, **options)
        flagged = flagged & mask
        n = int(mask.sum())
        flag_rate = float(flagged.sum()) / n if n else 0.0
        return CalibrationResult(advantages=weights * adv, flagged=flagged,
                                 flag_rate=flag_rate, weights=weights)
