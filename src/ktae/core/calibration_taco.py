"""TACO (Tail-Aware Credit Calibration) and its ablations (SPEC section 5).

Reconstruction notice: the TACO paper's equations were lost from its text; what follows
is this project's reconstruction from the paper's prose (SPEC section 5), not a
transcription. With ``logp[i,t]`` the current policy's log-probability of the sampled
token and ``H[i,t]`` the entropy of its full next-token distribution (so that the
policy's expected log-probability in that context is ``E_v[log pi(v)] = -H``):

* tail risk: token (i,t) is high-risk when ``logp < -H + log(alpha)``, i.e.
  ``p < alpha * exp(-H)`` (much less likely than the policy expects there);
* calibration: ``A <- (1 - lam) * A`` for high-risk tokens with ``A > 0``; low-risk
  tokens and non-positive advantages are unchanged. Defaults ``alpha = 0.01``,
  ``lam = 0.9`` (the paper's setting).

Ablations (the paper's Table 2): probability-only (``p < alpha``), entropy-only (the
highest-entropy positive-advantage tokens, as many as TACO flags), random (as many
positive-advantage tokens, uniformly at random) and hard clipping (``lam = 1``).

Each rule is a pure function ``rule(adv, *, logprobs, entropies, mask, generator,
**options) -> (weights, flagged)`` of validated, detached ``[B, T]`` tensors, registered
in :data:`CALIBRATIONS`; :func:`ktae.calibrate_advantages` validates the input and calls
it. ``flagged`` marks the tokens whose credit the rule reduces (for the TACO family: the
selected positive-advantage tokens), and ``weights`` is the factor applied to each
advantage (0 on padding).
"""

from __future__ import annotations

import math

import torch

from ktae.core.policy_loss import check_number
from ktae.core.registry import Registry

CALIBRATIONS: Registry = Registry("calibration")

TACO_ALPHA = 0.01
TACO_LAMBDA = 0.9


# -- selection helpers shared with the baselines ---------------------------------------

def require_entropies(entropies: torch.Tensor | None, name: str) -> torch.Tensor:
    if entropies is None:
        raise ValueError(f"entropies: required by calibration {name!r} "
                         "(the [B, T] entropies of the next-token distributions)")
    return entropies


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


def weights_for(flagged: torch.Tensor, mask: torch.Tensor, factor: float,
                dtype: torch.dtype) -> torch.Tensor:
    """``factor`` on flagged tokens, 1 on the other real tokens, 0 on padding."""
    ones = mask.to(dtype)
    return torch.where(flagged, torch.full_like(ones, factor), ones)


def _alpha(alpha) -> float:
    return check_number(alpha, "alpha", low=0, low_open=True)


def _lam(lam) -> float:
    return check_number(lam, "lam", low=0, high=1)


def taco_flags(adv: torch.Tensor, logprobs: torch.Tensor, entropies: torch.Tensor,
               mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """Positive-advantage real tokens with ``logp < -H + log(alpha)`` (SPEC 5)."""
    return (logprobs < -entropies + math.log(alpha)) & (adv > 0) & mask


def tail_count(adv, logprobs, entropies, mask, alpha: float) -> int:
    """How many tokens TACO would flag in this batch (the ablations' budget)."""
    return int(taco_flags(adv, logprobs, entropies, mask, alpha).sum())


# -- the TACO family ------------------------------------------------------------------

@CALIBRATIONS.register("taco")
def taco(adv, *, logprobs, entropies, mask, generator=None, alpha: float = TACO_ALPHA,
         lam: float = TACO_LAMBDA):
    """TACO (project reconstruction, SPEC 5): ``A <- (1 - lam) A`` where ``A > 0`` and
    ``logp < -H + log(alpha)``, i.e. ``p < alpha * exp(-H)``.

    Options: ``alpha`` > 0 (tail strictness, 0.01; larger flags more tokens),
    ``lam`` in [0, 1] (suppression strength, 0.9; alias ``lambda_``).
    """
    alpha, lam = _alpha(alpha), _lam(lam)
    flagged = taco_flags(adv, logprobs, require_entropies(entropies, "taco"), mask, alpha)
    return weights_for(flagged, mask, 1 - lam, adv.dtype), flagged


@CALIBRATIONS.register("taco-hard")
def taco_hard(adv, *, logprobs, entropies, mask, generator=None,
              alpha: float = TACO_ALPHA):
    """TACO with hard clipping (``lam = 1``): flagged positive advantages become 0."""
    alpha = _alpha(alpha)
    flagged = taco_flags(adv, logprobs, require_entropies(entropies, "taco-hard"), mask,
                         alpha)
    return weights_for(flagged, mask, 0.0, adv.dtype), flagged


@CALIBRATIONS.register("taco-prob-only")
def taco_prob_only(adv, *, logprobs, entropies=None, mask, generator=None,
                   alpha: float = TACO_ALPHA, lam: float = TACO_LAMBDA):
    """Probability-only ablation: flag ``p < alpha`` (``logp < log alpha``), ignoring
    the context's entropy; then scale those positive advantages by ``1 - lam``.
    """
    alpha, lam = _alpha(alpha), _lam(lam)
    flagged = (logprobs < math.log(alpha)) & (adv > 0) & mask
    return weights_for(flagged, mask, 1 - lam, adv.dtype), flagged


@CALIBRATIONS.register("taco-entropy-only")
def taco_entropy_only(adv, *, logprobs, entropies, mask, generator=None,
                      alpha: float = TACO_ALPHA, lam: float = TACO_LAMBDA):
    """Entropy-only ablation: flag the highest-entropy positive-advantage tokens, as
    many as TACO (same ``alpha``) flags in this batch, ignoring the sampled token.
    """
    alpha, lam = _alpha(alpha), _lam(lam)
    entropies = require_entropies(entropies, "taco-entropy-only")
    k = tail_count(adv, logprobs, entropies, mask, alpha)
    flagged = select_extreme(entropies, (adv > 0) & mask, k, largest=True)
    return weights_for(flagged, mask, 1 - lam, adv.dtype), flagged


@CALIBRATIONS.register("taco-random")
def taco_random(adv, *, logprobs, entropies, mask, generator=None,
                alpha: float = TACO_ALPHA, lam: float = TACO_LAMBDA):
    """Random ablation: flag, uniformly at random among positive-advantage tokens, as
    many tokens as TACO (same ``alpha``) flags in this batch, and scale them by
    ``1 - lam`` (same down-weighting rate and strength). Draws from ``generator``.
    """
    alpha, lam = _alpha(alpha), _lam(lam)
    entropies = require_entropies(entropies, "taco-random")
    k = tail_count(adv, logprobs, entropies, mask, alpha)
    device = generator.device if generator is not None else adv.device
    scores = torch.rand(adv.shape, generator=generator, device=device).to(adv.device)
    flagged = select_extreme(scores, (adv > 0) & mask, k, largest=True)
    return weights_for(flagged, mask, 1 - lam, adv.dtype), flagged
