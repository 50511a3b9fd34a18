"""The calibration registry and the pieces every rule shares (docs/method.md §8 and §9).

A rule is a pure function of validated, detached ``[B, T]`` tensors::

    rule(adv, *, logprobs, entropies, old_logprobs, mask, generator, **options) -> RuleResult

(the calibrated advantage is ``weights * adv + offsets``; most rules only weight)

registered by name in :data:`CALIBRATIONS`; :func:`ktae.calibrate_advantages` validates
the input, calls it under ``torch.no_grad`` and builds the public
:class:`ktae.CalibrationResult`. ``adv`` is zero on padding; ``entropies`` and
``old_logprobs`` are None when the caller did not pass them (rules that need them say so
with :func:`require`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ktae.core.registry import Registry

RULE_ARGS = frozenset({"logprobs", "entropies", "old_logprobs", "mask", "generator"})
"""Arguments every rule receives; anything else a rule declares is a user option."""

CALIBRATIONS: Registry = Registry("calibration", reserved=RULE_ARGS)
"""Each rule registers with what it needs beyond ``logprobs`` and ``mask``, which every
caller has: ``needs=("entropies",)`` (the current policy's) or ``("old_logprobs",)``."""


class RuleResult(NamedTuple):
    """What a rule returns (all ``[B, T]``).

    Attributes:
        weights: the factor applied to each advantage (0 on padding and on removed tokens).
        flagged: bool, the real tokens whose credit the rule reduces or removes.
        loss_mask: bool, the tokens that stay in the loss; None = every real token.
        metrics: name -> 0-d tensor, the rule's own diagnostics (means over real tokens).
        offsets: a term added after the weights, ``A <- weights * A + offsets`` (rules
            that shift the advantage by an amount of their own: the entropy advantage,
            KL-Cov's penalty gradient); None = no shift.
        ppo_clip: whether the policy loss keeps its PPO clip on these tokens. False: the
            loss is the plain surrogate ``-A r`` on every token, no clip and no dual clip
            (KL-Cov, whose verl loss clips no token).
    """

    weights: torch.Tensor
    flagged: torch.Tensor
    loss_mask: torch.Tensor | None = None
    metrics: dict[str, torch.Tensor] | None = None
    offsets: torch.Tensor | None = None
    ppo_clip: bool = True


def require(value: torch.Tensor | None, arg: str, rule: str, what: str) -> torch.Tensor:
    """``value``, or a ValueError naming the missing argument ``arg``."""
    if value is None:
        raise ValueError(f"{arg}: required by calibration {rule!r} ({what})")
    return value


def require_entropies(entropies: torch.Tensor | None, rule: str) -> torch.Tensor:
    return require(entropies, "entropies", rule,
                   "the [B, T] entropies of the current policy's next-token distributions")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the True entries of ``mask`` as a float64 0-d tensor; 0 if none."""
    x = torch.where(mask, x.to(torch.float64), 0)
    return x.sum() / mask.sum().clamp_min(1)


def fraction_count(fraction: float, n: int) -> int:
    """``ceil(fraction * n)`` (robust to float error): what a quantile threshold keeps."""
    return min(n, max(0, math.ceil(fraction * n - 1e-9)))


def select_extreme(scores: torch.Tensor, pool: torch.Tensor, k: int, *,
                   largest: bool = True) -> torch.Tensor:
    """Bool ``[B, T]``: the ``k`` largest (or smallest) ``scores`` among ``pool``.

    One stable sort over the flattened batch; ties are broken by position (row-major,
    earlier first), so the result is deterministic. ``k`` is capped at the pool size.
    """
    flat = scores.flatten()
    fill = float("-inf") if largest else float("inf")
    flat = torch.where(pool.flatten(), flat, fill)
    k = min(int(k), int(pool.sum()))
    chosen = torch.zeros_like(pool).flatten()
    if k > 0:
        order = torch.sort(flat, descending=largest, stable=True).indices
        chosen[order[:k]] = True
    return chosen.view_as(pool) & pool


def linear_quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """The ``q``-quantile of a non-empty 1-D tensor with linear interpolation (numpy's and
    ``torch.quantile``'s default), by one sort, so that no size limit applies."""
    v = torch.sort(values.to(torch.float64)).values
    pos = q * (v.numel() - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, v.numel() - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])
