"""Loss-time token credit: calibrate advantages from the current policy (docs/method.md §8).

At each policy forward pass, a calibration rule turns the advantages (``[B]`` broadcast
or ``[B, T]``) into token-level advantages ``[B, T]`` from the current policy's
log-probability ``logp`` of each sampled token and the entropy ``H`` of each next-token
distribution (and, for ``adv-reweight``, the rollout policy's ``old_logp``). Everything
is computed under ``torch.no_grad`` from detached inputs, so no gradient flows through
the calibration. A rule may also remove tokens from the loss: the result's ``loss_mask``
is what the caller passes as the ``mask`` of :func:`ktae.policy_loss`, so that the
token-mean runs over the surviving tokens only.

TACO follows the authors' released code (docs/method.md §8)::

    r = -logp - H + log(alpha)                         (tail risk; r > 0: p < alpha e^-H)
    w = 1 if r <= 0 else 1 - lam * (1 - exp(-r))
    A <- w * A   where A > 0; non-positive advantages are unchanged

with ``alpha = 0.01`` and ``lam = 0.9``.

Registered rules (:data:`CALIBRATIONS`):

=====================  ==============================================================
``taco``               the formula above (options ``alpha``, ``lam``)
``taco-prob-only``     the same weight with ``r = -logp + log(alpha)`` (ablation)
``taco-entropy-only``  TACO's count and weights on the lowest-entropy positive tokens
                       (TACO's own entropy term: lower ``H``, higher ``r``; ablation)
``taco-entropy-high``  TACO's count and weights on the highest-entropy positive tokens
                       (an earlier reading of the entropy ablation, docs/method.md §8)
``taco-random``        TACO's count and weights on random positive tokens (ablation)
``taco-hard``          TACO's flagged tokens get ``A <- 0`` (ablation)
``taco-step``          TACO's flagged tokens get ``A <- (1 - lam) A`` (extra variant)
``adv-reweight``       ``A <- (w * p_old + 1 - w) * A``, ``w = 0.1`` (baseline)
``forking-tokens``     only the 20% highest-entropy tokens stay in the loss (baseline)
``stapo``              positive tokens with ``p < 0.002`` and ``H`` below the 0.2-quantile
                       of the positive tokens' entropies leave the loss (baseline)
``entropy-adv``        ``A <- A + min(alpha * H, |A| / kappa)`` (Cheng et al. 2025)
``clip-cov``           a random few high-covariance tokens get ``A <- 0`` (Cui et al. 2025)
``kl-cov``             the top covariance tokens get verl's ``|logp - old_logp|`` penalty,
                       as its gradient, and the loss drops its PPO clip (Cui et al. 2025)
``spo-mask``           only tokens with ``p_old < 0.9`` stay in the loss (SPO, Guo et al.)
``rsi-s``              only tokens with ``0.1 <= -logp / H <= 3`` stay in the loss (RSI-S,
                       Lv et al. 2026)
=====================  ==============================================================

The rules live in :mod:`ktae.core.calibration_taco`,
:mod:`ktae.core.calibration_baselines` and one module each for the last five;
``docs/calibration.md`` and ``docs/method.md §16`` give each one's source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ktae.core import (
    calibration_baselines,  # noqa: F401  (registers the baselines)
    calibration_taco,  # noqa: F401  (registers the TACO family)
    clip_cov,  # noqa: F401  (registers "clip-cov")
    entropy_advantage,  # noqa: F401  (registers "entropy-adv")
    kl_cov,  # noqa: F401  (registers "kl-cov")
    rsi_select,  # noqa: F401  (registers "rsi-s")
    spo_mask,  # noqa: F401  (registers "spo-mask")
)
from ktae.core.calibration_rules import CALIBRATIONS
from ktae.core.checks import as_tensor, check_mask
from ktae.core.chunk_pool import one_thread_caller
from ktae.core.policy_loss import token_advantages, token_tensor

__all__ = ["CALIBRATIONS", "CONSTANT_FLAG_RATE", "CalibrationResult", "calibrate_advantages",
           "calibration_options", "logged_metrics"]

#: Rules whose ``flag_rate`` is 1 by construction, so that loggers leave it out:
#: ``adv-reweight`` gives every real token with ``p_old < 1`` a weight below 1 (its
#: ``mean_weight`` metric says how much it scales the advantages).
CONSTANT_FLAG_RATE = frozenset({"adv-reweight"})


@dataclass(frozen=True)
class CalibrationResult:
    """The outcome of :func:`calibrate_advantages`. Shapes: B responses, T tokens.

    Attributes:
        advantages: ``[B, T]`` calibrated advantages, ``weights * A`` (0 on padding and on
            removed tokens), float32 (float64 for float64 advantages), detached.
        flagged: ``[B, T]`` bool, the real tokens whose credit the rule reduces or removes
            (TACO family: the chosen positive-advantage tokens; ``forking-tokens``,
            ``stapo``, ``spo-mask`` and ``rsi-s``: the removed tokens; ``adv-reweight``:
            tokens with weight < 1).
        flag_rate: ``flagged.sum() / mask.sum()``; 0.0 for an empty mask.
        weights: ``[B, T]`` the factor applied to each token's advantage (0 on padding).
        offsets: ``[B, T]`` what the rule adds after the weights, ``advantages = weights *
            A + offsets`` (0 on padding), or None for rules that only weight
            (``entropy-adv`` and ``kl-cov`` add one).
        loss_mask: ``[B, T]`` bool, the tokens that stay in the loss: pass it as the
            ``mask`` of :func:`ktae.policy_loss`. Equal to the input mask for rules that
            only reweight; ``forking-tokens``, ``stapo``, ``spo-mask`` and ``rsi-s`` remove
            tokens from it.
        metrics: the rule's diagnostics as floats (means over real tokens), plus
            ``loss_token_fraction`` (``loss_mask.sum() / mask.sum()``). TACO family:
            ``mean_weight``, ``mean_tail_risk``, ``tail_fraction``,
            ``positive_advantage_fraction``; ``adv-reweight``: ``mean_weight``;
            ``forking-tokens`` and ``stapo``: ``entropy_threshold``.
        ppo_clip: whether the policy loss keeps its PPO clip: pass it as the ``ppo_clip``
            of :func:`ktae.policy_loss`. False for ``kl-cov`` (verl's ``kl_cov`` loss clips
            no token) unless its option ``clip=true`` keeps the clip; True for every other
            rule.
    """

    advantages: torch.Tensor
    flagged: torch.Tensor
    flag_rate: float
    weights: torch.Tensor
    loss_mask: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    offsets: torch.Tensor | None = None
    ppo_clip: bool = True


def logged_metrics(name: str, result: CalibrationResult) -> dict[str, float]:
    """The figures a trainer logs for one call of calibration ``name``: ``flag_rate``
    (except for the rules of :data:`CONSTANT_FLAG_RATE`), then ``result.metrics``
    (``loss_token_fraction`` and the rule's diagnostics, e.g. ``mean_weight``)."""
    out = {} if name in CONSTANT_FLAG_RATE else {"flag_rate": float(result.flag_rate)}
    out.update(result.metrics)
    return out


def calibration_options(name: str) -> list[str] | None:
    """The user options calibration ``name`` accepts (e.g. ``["alpha", "lam"]``; None: any,
    a rule taking ``**options``)."""
    options = CALIBRATIONS.record(name).options
    return None if options is None else list(options)


def _rule_options(name: str, options: dict) -> dict:
    """Map ``lambda_`` to ``lam`` and reject options the rule does not take."""
    options = dict(options)
    if "lambda_" in options:
        if "lam" in options:
            raise ValueError("lam: given twice (as 'lam' and as 'lambda_')")
        options["lam"] = options.pop("lambda_")
    CALIBRATIONS.record(name).check(options)
    return options


@one_thread_caller
def calibrate_advantages(name: str, advantages, *, logprobs, entropies=None, mask,
                         old_logprobs=None, generator: torch.Generator | None = None,
                         **options) -> CalibrationResult:
    """Token-level advantages (and the loss mask) from a registered calibration rule.

    Args:
        name: a rule of :data:`CALIBRATIONS` (``"taco"``, ``"taco-prob-only"``,
            ``"taco-entropy-only"``, ``"taco-entropy-high"``, ``"taco-random"``,
            ``"taco-hard"``, ``"taco-step"``,
            ``"adv-reweight"``, ``"forking-tokens"``, ``"stapo"``, ``"rsi-s"``, ...).
        advantages: ``[B]`` (broadcast over the mask) or ``[B, T]``.
        logprobs: ``[B, T]`` current-policy log-probs of the sampled tokens.
        entropies: ``[B, T]`` entropies of the current policy's next-token distributions
            (required by every rule except ``taco-prob-only`` and ``adv-reweight``).
        mask: ``[B, T]`` 0/1 or bool, 1 = real response token.
        old_logprobs: ``[B, T]`` log-probs of the sampled tokens under the rollout (old)
            policy (required by ``adv-reweight``; on-policy, pass ``logprobs``).
        generator: random source of ``taco-random`` and of the weight order of
            ``taco-entropy-only`` / ``taco-entropy-high`` / ``taco-random`` (None:
            torch's global RNG).
        **options: rule options: ``alpha`` and ``lam`` (alias ``lambda_``) for the TACO
            family (``taco-hard`` takes ``alpha`` only), ``w`` for ``adv-reweight``,
            ``top_fraction`` for ``forking-tokens``, ``prob_threshold`` and
            ``entropy_quantile`` for ``stapo``, ``rsi_min`` and ``rsi_max`` for ``rsi-s``.

    Returns:
        A :class:`CalibrationResult`. Inputs are detached and the rule runs under
        ``torch.no_grad``, so nothing in it carries a gradient. "The batch" of the
        fraction- and count-based rules is the ``[B, T]`` passed in.

    Raises:
        ValueError: unknown rule or option, an option out of range, a missing input the
            rule needs, shape mismatches or NaN/inf inputs (the message names the
            argument).

    Example:
        >>> import torch, ktae
        >>> lp = torch.log(torch.tensor([[0.5, 0.001]]))
        >>> H = torch.tensor([[0.7, 0.7]])
        >>> r = ktae.calibrate_advantages("taco", torch.tensor([2.0]), logprobs=lp,
        ...                               entropies=H, mask=torch.ones(1, 2))
        >>> r.advantages, r.flag_rate
        (tensor([[2.0000, 0.5625]]), 0.5)
    """
    options = _rule_options(name, options)
    rule = CALIBRATIONS.get(name)
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
        if old_logprobs is not None:
            old_logprobs = token_tensor(old_logprobs, "old_logprobs", shape, device).detach()
        out = rule(adv, logprobs=logprobs, entropies=entropies, old_logprobs=old_logprobs,
                   mask=mask, generator=generator, **options)
        flagged = out.flagged & mask
        loss_mask = mask.clone() if out.loss_mask is None else out.loss_mask & mask
        n = mask.sum().clamp_min(1)
        stats = dict(out.metrics or {})
        stats["loss_token_fraction"] = loss_mask.sum() / n
        stats["flag_rate"] = flagged.sum() / n
        values = dict(zip(stats, torch.stack([v.to(torch.float64).reshape(())
                                              for v in stats.values()]).tolist(), strict=True))
        flag_rate = values.pop("flag_rate")
        weights = torch.where(mask, out.weights, 0)
        calibrated = weights * adv
        offsets = None
        if out.offsets is not None:
            offsets = torch.where(mask, out.offsets.to(calibrated.dtype), 0)
            calibrated = calibrated + offsets
        return CalibrationResult(advantages=calibrated, flagged=flagged,
                                 flag_rate=flag_rate, weights=weights, loss_mask=loss_mask,
                                 metrics=values, offsets=offsets,
                                 ppo_clip=bool(out.ppo_clip))
