"""The clipped policy-gradient loss shared by every method (docs/method.md §10).

Per token, with ratio ``r = exp(logp - old_logp)`` and advantage ``A``::

    l = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)          (PPO / GRPO Eq. 1)
    l = min(l, -c * A)   where A < 0, if dual clip c > 1 is set        (verl's dual clip)
    l = -r * A           instead of both, with ppo_clip=False          (KL-Cov, verl's kl_cov)
    l += kl_coef * KL_est(logp, ref_logp) - entropy_coef * H           (optional terms)

and the per-token terms are aggregated over the batch by one of:

* ``"token-mean"`` (DAPO Eq. 3): sum over every real token of the batch / number of tokens.
* ``"seq-mean-token-mean"`` (GRPO Eq. 2): each response's token mean, then the mean over
  responses that hold at least one real token.
* ``"seq-mean-token-sum-norm"`` (Dr.GRPO): each response's token sum divided by a
  constant, ``max_response_length``, then the mean over all B responses. This is TRL's
  ``loss_type="dr_grpo"``; verl's mode of the same name returns the plain sum divided by
  the constant, without the mean over responses (a factor of B larger).

Everything here is a pure function of tensors, so the trainer, the verl plugin and the
simulator share one implementation. Padding (``mask == 0``) never contributes: an
all-zero mask gives a loss of exactly 0 whose gradient is 0 (never NaN).

References:
    Schulman et al. (2017), PPO. Shao et al. (2024), GRPO. Yu et al. (2025), DAPO.
    Liu et al. (2025), Dr.GRPO. Schulman (2020), "Approximating KL divergence" (k1-k3).
"""

from __future__ import annotations

import math

import torch

from ktae.core.checks import as_tensor, check_float, check_mask
from ktae.core.chunk_pool import one_thread_caller, spreads_over_threads

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# estimator name -> canonical name; "kl", "mse" and "low_var_kl" are verl's names.
KL_ESTIMATORS = {"k1": "k1", "kl": "k1", "k2": "k2", "mse": "k2", "k3": "k3",
                 "low_var_kl": "k3"}

# verl clamps the log-ratio before exponentiating and k3 after; we do the same.
LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


def check_number(value, name: str, *, low: float | None = None, high: float | None = None,
                   low_open: bool = False, high_open: bool = False) -> float:
    """A finite real number inside the given bounds, else ValueError naming ``name``."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number, got {value!r}") from None
    ok = math.isfinite(x)
    if ok and low is not None:
        ok = x > low if low_open else x >= low
    if ok and high is not None:
        ok = x < high if high_open else x <= high
    if not ok:
        lo = "" if low is None else f"{'>' if low_open else '>='} {low}"
        hi = "" if high is None else f"{'<' if high_open else '<='} {high}"
        bounds = " and ".join(b for b in (lo, hi) if b) or "finite"
        raise ValueError(f"{name}: expected a finite number {bounds}, got {value!r}")
    return x


def token_tensor(x, name: str, shape: tuple[int, ...] | None, device) -> torch.Tensor:
    """A finite ``[B, T]`` float tensor (half precision promoted to float32)."""
    x = check_float(as_tensor(x, name, device=device), name, ndim=2)
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float64):
        x = x.to(torch.float32)
    return x


def token_advantages(advantages, shape: tuple[int, int], device) -> torch.Tensor:
    """``[B]`` (one per response, broadcast) or ``[B, T]`` advantages as ``[B, T]``."""
    adv = check_float(as_tensor(advantages, "advantages", device=device), "advantages",
                      ndim=(1, 2))
    B, T = shape
    if adv.dim() == 1 and adv.shape[0] == B:
        adv = adv[:, None].expand(B, T)
    elif tuple(adv.shape) != (B, T):
        raise ValueError(f"advantages: expected shape ({B},) or ({B}, {T}), "
                         f"got {tuple(adv.shape)}")
    if adv.dtype not in (torch.float32, torch.float64):
        adv = adv.to(torch.float32)
    return adv


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ``mask`` (bool, same shape); 0 when the mask is empty."""
    return torch.where(mask, x, 0).sum() / mask.sum().clamp_min(1)


def aggregate_loss(per_token: torch.Tensor, mask, aggregation: str = "token-mean",
                   max_response_length: float | None = None) -> torch.Tensor:
    """Aggregate a per-token loss ``[B, T]`` into a scalar (docs/method.md §10).

    Args:
        per_token: ``[B, T]`` per-token loss (values at padding are ignored, even NaN).
        mask: ``[B, T]`` 0/1 or bool, 1 = real response token.
        aggregation: ``"token-mean"`` (DAPO Eq. 3), ``"seq-mean-token-mean"`` (GRPO
            Eq. 2) or ``"seq-mean-token-sum-norm"`` (Dr.GRPO, TRL's ``dr_grpo``).
        max_response_length: the constant divisor of ``"seq-mean-token-sum-norm"``
            (required there, ignored by the other modes).

    Returns:
        A scalar tensor. Empty responses are skipped by ``seq-mean-token-mean`` (they
        have no token mean) but count in the B of ``seq-mean-token-sum-norm``, as in
        TRL. An all-zero mask or an empty batch gives 0, with a zero gradient. The means
        are finite whenever the per-token terms are (the sums are scaled, exactly, so
        they do not overflow); ``seq-mean-token-sum-norm`` can exceed the dtype's range
        only when a response's token sum divided by ``max_response_length`` does.

    Note:
        verl's ``seq-mean-token-sum-norm`` is ``sum(loss * mask) / max_response_length``,
        i.e. this value times B; scale the learning rate accordingly when comparing.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation: expected one of {', '.join(AGGREGATIONS)}, "
                         f"got {aggregation!r}")
    if not isinstance(per_token, torch.Tensor) or per_token.dim() != 2:
        shape = tuple(per_token.shape) if isinstance(per_token, torch.Tensor) else None
        raise ValueError(f"per_token: expected a 2-D tensor [B, T], got shape {shape}")
    mask = check_mask(as_tensor(mask, "mask", device=per_token.device), "mask",
                      tuple(per_token.shape))
    x = torch.where(mask, per_token, 0)  # where, not *, so NaN padding cannot leak
    # Sums run on x / s (s: a power of two near max |x|, exact) so that a mean of
    # representable terms never overflows on the way (float32 advantages of +-3e38).
    s = _sum_scale(x)
    x = x / s
    if aggregation == "token-mean":
        return x.sum() / mask.sum().clamp_min(1) * s
    if aggregation == "seq-mean-token-mean":
        lengths = mask.sum(-1)
        seq = x.sum(-1) / lengths.clamp_min(1)
        return seq.sum() / (lengths > 0).sum().clamp_min(1) * s
    if max_response_length is None:
        raise ValueError("max_response_length: required by aggregation "
                         "'seq-mean-token-sum-norm' (the constant divisor, e.g. the "
                         "generation length limit)")
    norm = check_number(max_response_length, "max_response_length", low=0, low_open=True)
    return x.sum(-1).div(norm).sum() / max(x.shape[0], 1) * s


def _sum_scale(x: torch.Tensor) -> torch.Tensor:
    """A power of two within a factor 2 of ``max |x|`` (1 for zeros, inf or an empty x),
    a constant for autograd; dividing by it and multiplying back is exact."""
    if x.numel() == 0:
        return torch.ones((), dtype=x.dtype, device=x.device)
    top = x.detach().abs().amax()
    _, exponent = torch.frexp(top)
    exponent = torch.where((top > 0) & torch.isfinite(top), exponent - 1, 0)
    return torch.ldexp(torch.ones_like(top), exponent)


def kl_penalty(logprobs, ref_logprobs, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs, ``[B, T]``.

    With ``d = logp - ref_logp`` (tokens sampled from pi, or from the rollout policy):

    * ``"k1"`` (alias ``"kl"``): ``d``; unbiased, high variance, can be negative.
    * ``"k2"`` (alias ``"mse"``): ``d**2 / 2``.
    * ``"k3"`` (alias ``"low_var_kl"``): ``exp(-d) - 1 + d``, computed as verl does:
      ``-d`` clamped to [-20, 20] before the exponential and the result clamped to
      [-10, 10] (so the gradient vanishes on extreme tokens); non-negative, low variance.

    Args:
        logprobs: ``[B, T]`` log-probs of the sampled tokens under the trained policy.
        ref_logprobs: ``[B, T]`` log-probs of the same tokens under the reference policy
            (treated as constants: detached).
        estimator: ``"k1"``, ``"k2"``, ``"k3"`` or an alias above.

    Returns:
        ``[B, T]`` per-token KL estimates (the caller masks and aggregates them, e.g.
        with :func:`aggregate_loss`).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator: expected one of {', '.join(KL_ESTIMATORS)}, "
                         f"got {estimator!r}")
    device = logprobs.device if isinstance(logprobs, torch.Tensor) else None
    logprobs = token_tensor(logprobs, "logprobs", None, device)
    ref = token_tensor(ref_logprobs, "ref_logprobs", tuple(logprobs.shape), logprobs.device)
    return _kl(logprobs, ref.detach(), KL_ESTIMATORS[estimator])


def _kl(logprobs: torch.Tensor, ref: torch.Tensor, kind: str) -> torch.Tensor:
    d = logprobs - ref
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.square()
    neg = (-d).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (neg.exp() - neg - 1).clamp(-K3_CLAMP, K3_CLAMP)


def policy_loss(logprobs, old_logprobs, advantages, mask, *, clip_low: float = 0.2,
                clip_high: float = 0.2, dual_clip: float | None = None,
                aggregation: str = "token-mean", max_response_length: float | None = None,
                ref_logprobs=None, kl_coef: float = 0.0, kl_estimator: str = "k3",
                entropies=None, entropy_coef: float = 0.0, ppo_clip: bool = True
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate loss with optional dual clip, KL and entropy terms (docs/method.md §10).

    Args:
        logprobs: ``[B, T]`` log-probs of the sampled tokens under the current policy
            (the tensor gradients flow into).
        old_logprobs: ``[B, T]`` log-probs under the policy that generated the batch
            (detached).
        advantages: ``[B]`` (broadcast over the response) or ``[B, T]`` (token-level,
            e.g. KTAE or a calibrated TACO advantage); detached.
        mask: ``[B, T]`` 0/1 or bool, the tokens in the loss: the real response tokens,
            or a calibration's ``CalibrationResult.loss_mask`` (STAPO and forking tokens
            remove tokens from it). Every aggregation, the KL and entropy terms and the
            metrics run over it, so the token-mean is over the surviving tokens.
        clip_low, clip_high: ``eps_low`` in [0, 1) and ``eps_high`` >= 0 of
            ``clip(r, 1 - eps_low, 1 + eps_high)`` (DAPO clip-higher: 0.2 / 0.28).
        dual_clip: ``c > 1`` bounds the loss of negative-advantage tokens by ``-c * A``
            (verl's ``clip_ratio_c``, 3.0 there); None disables it.
        aggregation: see :func:`aggregate_loss`.
        max_response_length: divisor of ``"seq-mean-token-sum-norm"``.
        ref_logprobs: ``[B, T]`` reference-policy log-probs; enables the ``ref_kl``
            metric, and the KL term when ``kl_coef > 0`` (then required).
        kl_coef: weight ``beta >= 0`` of the KL term (TRL's ``beta``).
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"``/``"low_var_kl"`` (:func:`kl_penalty`).
        entropies: ``[B, T]`` entropies of the current policy's next-token distributions
            (keep their graph for the bonus to have a gradient); enables
            ``entropy_mean``, and the bonus when ``entropy_coef != 0`` (then required).
        entropy_coef: weight of the entropy bonus (subtracted from the loss).
        ppo_clip: False drops the clip and the dual clip: every token's loss is ``-r * A``
            (a calibration's ``CalibrationResult.ppo_clip``: KL-Cov's loss, as verl's
            ``kl_cov``, clips no token; docs/method.md §16). The clip fractions are then 0.

    Returns:
        ``(loss, metrics)``: the scalar loss (float32, or float64 for float64 inputs) and
        floats, each a mean over real tokens (0 for an empty mask):
        ``pg_loss`` (the aggregated surrogate alone), ``clip_frac_low`` (A < 0 and
        r < 1 - eps_low), ``clip_frac_high`` (A > 0 and r > 1 + eps_high),
        ``dual_clip_frac`` (A < 0 and the dual bound active), ``approx_kl``
        (``(r - 1) - log r``, the k3 estimate of KL(pi_old || pi)), ``ratio_mean``,
        and ``entropy_mean`` / ``ref_kl`` when those inputs are given.

    The log-ratio is clamped to [-20, 20] before the exponential, as in verl.

    Example:
        >>> import torch, ktae
        >>> lp = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_()
        >>> loss, m = ktae.policy_loss(lp, lp.detach(), torch.tensor([1.0]),
        ...                            torch.ones(1, 2))
        >>> round(loss.item(), 4), m["ratio_mean"]
        (-1.0, 1.0)
    """
    settings = dict(clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
                    aggregation=aggregation, max_response_length=max_response_length,
                    ref_logprobs=ref_logprobs, kl_coef=kl_coef, kl_estimator=kl_estimator,
                    entropy_coef=entropy_coef, ppo_clip=ppo_clip)
    with_grad = [isinstance(t, torch.Tensor) and t.requires_grad for t in (logprobs, entropies)]
    device = logprobs.device if isinstance(logprobs, torch.Tensor) else torch.device("cpu")
    if not (any(with_grad) and torch.is_grad_enabled() and spreads_over_threads(device)):
        return one_thread_caller(_policy_loss)(logprobs, old_logprobs, advantages, mask,
                                               entropies=entropies, **settings)
    # On a multi-threaded CPU: the loss and its gradients in one pass on one intra-op thread
    # (ktae.core.chunk_pool: a busy machine would make each of the backward pass's operations
    # wait a time slice), joined to the caller's graph by one product per input.
    inputs = [t for t, g in zip((logprobs, entropies), with_grad, strict=True) if g]

    def loss_and_grads():
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in inputs]
            it = iter(leaves)
            lp = next(it) if with_grad[0] else logprobs
            ent = next(it) if with_grad[1] else entropies
            loss, metrics = _policy_loss(lp, old_logprobs, advantages, mask, entropies=ent,
                                         **settings)
            grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves, strict=True)]
        return loss.detach(), metrics, grads

    value, metrics, grads = one_thread_caller(loss_and_grads)()
    return _PrecomputedGradients.apply(value, len(inputs), *grads, *inputs), metrics


class _PrecomputedGradients(torch.autograd.Function):
    """``value`` in the graph of ``inputs``, whose gradients were computed with it:
    backward scales them by the incoming gradient (no second-order gradients)."""

    @staticmethod
    def forward(ctx, value, n, *grads_and_inputs):
        ctx.save_for_backward(*grads_and_inputs[:n])
        ctx.n = n
        return value.clone()

    @staticmethod
    def backward(ctx, grad_output):
        grads = [grad_output * g for g in ctx.saved_tensors]
        return (None, None, *([None] * ctx.n), *grads)


def _policy_loss(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip,
                 aggregation, max_response_length, ref_logprobs, kl_coef, kl_estimator,
                 entropies, entropy_coef, ppo_clip) -> tuple[torch.Tensor, dict[str, float]]:
    device = logprobs.device if isinstance(logprobs, torch.Tensor) else None
    logprobs = token_tensor(logprobs, "logprobs", None, device)
    shape = tuple(logprobs.shape)
    device = logprobs.device
    old = token_tensor(old_logprobs, "old_logprobs", shape, device).detach()
    adv = token_advantages(advantages, shape, device).detach()
    mask = check_mask(as_tensor(mask, "mask", device=device), "mask", shape)
    eps_low = check_number(clip_low, "clip_low", low=0, high=1, high_open=True)
    eps_high = check_number(clip_high, "clip_high", low=0)
    c = None if dual_clip is None else check_number(dual_clip, "dual_clip", low=1,
                                                      low_open=True)
    beta = check_number(kl_coef, "kl_coef", low=0)
    ent_coef = check_number(entropy_coef, "entropy_coef")
    if not isinstance(ppo_clip, bool):
        raise ValueError(f"ppo_clip: expected true or false, got {ppo_clip!r}")
    if not ppo_clip:  # no clip range, no dual clip: the clip terms below are inactive
        eps_low, eps_high, c = math.inf, math.inf, None
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation: expected one of {', '.join(AGGREGATIONS)}, "
                         f"got {aggregation!r}")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator: expected one of {', '.join(KL_ESTIMATORS)}, "
                         f"got {kl_estimator!r}")
    if beta > 0 and ref_logprobs is None:
        raise ValueError("ref_logprobs: required when kl_coef > 0")
    if ent_coef != 0 and entropies is None:
        raise ValueError("entropies: required when entropy_coef != 0")
    dtype = torch.promote_types(logprobs.dtype, old.dtype)

    # Padding may hold anything finite: zero its log-ratio so exp() stays bounded.
    log_ratio = torch.where(mask, logprobs.to(dtype) - old.to(dtype), 0)
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    adv = adv.to(dtype)
    unclipped = -adv * ratio
    per_token = unclipped
    if ppo_clip:
        clipped = -adv * ratio.clamp(1 - eps_low, 1 + eps_high)
        per_token = torch.maximum(unclipped, clipped)
    neg = adv < 0
    dual_active = torch.zeros_like(mask)
    if c is not None:
        bound = -c * adv
        dual_active = neg & (bound < per_token)
        per_token = torch.where(neg, torch.minimum(per_token, bound), per_token)

    pg_loss = aggregate_loss(per_token, mask, aggregation, max_response_length)
    loss = pg_loss
    stats = {
        "pg_loss": pg_loss.detach(),
        "clip_frac_low": masked_mean((neg & (ratio < 1 - eps_low)).to(dtype), mask),
        "clip_frac_high": masked_mean(((adv > 0) & (ratio > 1 + eps_high)).to(dtype), mask),
        "dual_clip_frac": masked_mean(dual_active.to(dtype), mask),
        "approx_kl": masked_mean((ratio - 1 - log_ratio).detach(), mask),
        "ratio_mean": masked_mean(ratio.detach(), mask),
    }
    if ref_logprobs is not None:
        ref = token_tensor(ref_logprobs, "ref_logprobs", shape, device).detach()
        kl = _kl(logprobs.to(dtype), torch.where(mask, ref.to(dtype), logprobs.detach()),
                 KL_ESTIMATORS[kl_estimator])
        stats["ref_kl"] = masked_mean(kl.detach(), mask)
        if beta > 0:
            loss = loss + beta * aggregate_loss(kl, mask, aggregation, max_response_length)
    if entropies is not None:
        ent = token_tensor(entropies, "entropies", shape, device).to(dtype)
        stats["entropy_mean"] = masked_mean(ent.detach(), mask)
        if ent_coef != 0:
            loss = loss - ent_coef * aggregate_loss(ent, mask, aggregation,
                                                    max_response_length)
    values = torch.stack([v.detach().to(torch.float64) for v in stats.values()]).tolist()
    return loss, dict(zip(stats, values, strict=True))
