"""Calibrated policy losses in verl's calling convention (``core_algos.register_policy_loss``).

verl 0.9.1's ``workers/utils/losses.py: ppo_loss`` calls the loss registered under
``actor.policy_loss.loss_mode`` once per micro-batch as
``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights)``, all ``[B, T]`` padded, ``config`` the actor config. For a
calibration ``name`` of :data:`ktae.CALIBRATIONS`, the registered loss

1. calibrates the advantages with the *current* policy: ``ktae.calibrate_advantages(name,
   advantages, logprobs=log_prob (detached), entropies=current entropy, mask)``; the
   entropy is ``model_output["entropy"]`` of the same forward pass, provided by the
   ``ppo_loss`` wrapper (:mod:`ktae.integrations.verl.patches`) through
   :func:`ktae.integrations.verl.fields.current_step`;
2. multiplies in verl's rollout-correction weights when present (``w >= 0``, so
   ``w * loss(A) = loss(w * A)`` for the clipped surrogate, dual clip included);
3. returns ``ktae.policy_loss(log_prob, old_log_prob, A_calibrated, loss_mask, ...)`` with
   verl's clip ratios and dual clip (``clip_ratio_c``), or no clip at all where the
   calibration says so (``CalibrationResult.ppo_clip``: ``kl-cov``, as verl's ``kl_cov``),
   times the factor that turns one micro-batch's mean into verl's share of the global
   mini-batch loss (below).

Normalisation. verl aggregates every micro-batch against the whole mini-batch on all
data-parallel ranks (``agg_loss`` with ``global_batch_info``: ``batch_num_tokens``, the
real tokens of the mini-batch on all ranks, all-reduced by the engine before the first
forward pass; ``global_batch_size``, the mini-batch's responses on all ranks; ``dp_size``)
so that accumulated gradients do not depend on the split. ktae's loss is a mean over one
tensor. The returned loss is ``ktae.policy_loss(..., mask=keep) * local / global *
dp_size``, where ``keep`` is the calibration's ``loss_mask`` (every real token for rules
that only reweight), ``local`` what ktae divides by for this micro-batch and ``global``
what verl divides by:

=========================  =======================  ==================  ====================
verl ``loss_agg_mode``     ktae ``aggregation``     local               global
=========================  =======================  ==================  ====================
token-mean                 token-mean               real tokens         ``batch_num_tokens``
token-sum                  token-mean               kept tokens         1
seq-mean-token-mean        seq-mean-token-mean      rows with a kept    ``global_batch_size``
                                                    token
seq-mean-token-sum         seq-mean-token-sum-norm  rows                ``global_batch_size``
                           (constant 1)
seq-mean-token-sum-norm    seq-mean-token-sum-norm  rows                ``global_batch_size``
                           (``loss_scale_factor``
                           or T)
=========================  =======================  ==================  ====================

(``global`` falls back to the local count verl's ``agg_loss`` takes from its loss mask
when verl gives none: the real tokens for ``token-mean``, the rows with a kept token for
the ``seq-mean-*`` modes.) With one micro-batch on one rank and no token removed the
factor is 1 and the loss *is* ``ktae.policy_loss``; for calibrations that only reweight,
the loss equals verl's ``vanilla`` loss on the calibrated advantages for every mode and
split.

Calibrations that remove tokens (``CalibrationResult.loss_mask``: ``stapo``,
``forking-tokens``). Per mode, the loss is what verl's mode means on the kept tokens:

* ``token-sum``: verl's ``agg_loss`` on the kept mask, ``dp_size * sum over kept tokens``
  (a removed token adds nothing; nothing is rescaled).
* ``seq-mean-token-mean``: verl's ``agg_loss`` on the kept mask: each row's mean over its
  kept tokens, summed over the rows that keep a token, over ``global_batch_size``. A row
  that keeps no token adds 0 and still counts in ``global_batch_size``, as in verl (only
  without global batch info, verl's fallback divisor is the rows with a kept token).
* ``seq-mean-token-sum`` / ``-norm``: verl's ``agg_loss`` on the kept mask (each row's sum
  over its kept tokens, over ``global_batch_size``, ``/ loss_scale_factor``).
* ``token-mean``: the mean over the micro-batch's kept tokens, weighted by the
  micro-batch's share of ``batch_num_tokens`` (its real tokens over the mini-batch's). This
  is verl's ``agg_loss`` on the kept mask for one micro-batch on one rank (verl's own
  divisor is then the kept count) and what the TACO authors' verl fork did (it passed the
  kept mask as the micro-batch's loss mask and took its token mean). verl's global reading
  on the kept mask, ``sum over kept / batch_num_tokens``, would divide by tokens that are
  not in the loss: ``batch_num_tokens`` counts ``response_mask`` and is fixed before any
  forward pass, while the kept tokens are known only at each micro-batch's forward pass
  (after the earlier micro-batches' backward), so a global kept count is not available;
  that reading would also shrink the gradient by the removed share (5x for
  ``forking-tokens``' 20%), which the per-micro-batch mean keeps independent of it.

Fraction-based rules (``stapo``, ``forking-tokens``, ``taco-entropy-only``,
``taco-entropy-high``, ``taco-random``) see one micro-batch as "the batch", also as in
that fork. verl's entropy bonus and KL loss keep ``response_mask``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ktae.core import calibration as core_calibration  # read at call time: tests wrap it
from ktae.core.calibration import logged_metrics
from ktae.core.calibration_taco import TACO_FAMILY, TACO_METRIC_NAMES
from ktae.core.policy_loss import policy_loss as ktae_policy_loss
from ktae.integrations.verl.estimators import PLUGIN_MARK
from ktae.integrations.verl.fields import current_step
from ktae.integrations.verl.options import (
    CALCULATE_ENTROPY_PATH,
    POLICY_LOSS_PATH,
    calibration_accepts,
    calibration_settings,
)

VERL_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
                  "seq-mean-token-sum-norm")


def _number(value) -> float | None:
    if value is None:
        return None
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def aggregation_plan(loss_agg_mode: str, response_mask: torch.Tensor,
                     global_batch_info: dict[str, Any] | None,
                     loss_mask: torch.Tensor | None = None) -> tuple[str, float | None, float]:
    """``(ktae aggregation, max_response_length, factor)`` for one verl micro-batch.

    ``factor`` turns ktae's aggregate over ``loss_mask`` (the tokens the calibration keeps;
    default ``response_mask``) into verl's ``agg_loss`` share of the global mini-batch
    (see the module docstring). Counts that verl's ``agg_loss`` takes from its loss mask
    (kept tokens, rows with a kept token) come from ``loss_mask``; ``token-mean``'s share of
    ``batch_num_tokens`` is this micro-batch's count of real tokens, as verl counts it.
    """
    info = dict(global_batch_info or {})
    dp = int(_number(info.get("dp_size")) or 1)
    real = response_mask.bool()
    keep = real if loss_mask is None else loss_mask.bool() & real
    tokens = float(real.sum())
    kept = float(keep.sum())
    rows = float(keep.shape[0])
    kept_rows = float(keep.any(-1).sum())
    num_tokens = _number(info.get("batch_num_tokens"))
    num_seqs = _number(info.get("global_batch_size"))
    max_len: float | None = None
    if loss_agg_mode == "token-mean":
        if num_tokens is None and dp > 1:
            raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
        # ktae: sum over kept / kept; verl: the micro-batch's real tokens of batch_num_tokens
        aggregation, local, total = "token-mean", tokens, num_tokens if num_tokens else tokens
    elif loss_agg_mode == "token-sum":
        aggregation, local, total = "token-mean", kept, 1.0
    elif loss_agg_mode in ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        if num_seqs is None and dp > 1:
            raise ValueError("global_batch_size is required when dp_size > 1")
        total = num_seqs if num_seqs else kept_rows
        if loss_agg_mode == "seq-mean-token-mean":
            aggregation, local = "seq-mean-token-mean", kept_rows
        else:
            aggregation, local = "seq-mean-token-sum-norm", rows
            max_len = 1.0
            if loss_agg_mode == "seq-mean-token-sum-norm":
                max_len = _number(info.get("loss_scale_factor")) or float(keep.shape[-1])
    else:
        raise ValueError(f"loss_agg_mode: expected one of {', '.join(VERL_AGG_MODES)}, "
                         f"got {loss_agg_mode!r}")
    factor = local / total * dp if local > 0 and total > 0 else 0.0
    return aggregation, max_len, factor


def _clip_ratios(config) -> tuple[float, float, float]:
    clip = config.get("clip_ratio", 0.2)
    low = config.get("clip_ratio_low")
    high = config.get("clip_ratio_high")
    return (clip if low is None else low, clip if high is None else high,
            config.get("clip_ratio_c", 3.0))


def _calibrate(name: str, settings_options: dict, advantages, log_prob, old_log_prob,
               mask, entropies):
    extra = {"old_logprobs": old_log_prob.detach()} if calibration_accepts("old_logprobs") else {}
    try:
        return core_calibration.calibrate_advantages(name, advantages,
                                                     logprobs=log_prob.detach(),
                                                     entropies=entropies, mask=mask, **extra,
                                                     **settings_options)
    except ValueError as e:
        if entropies is None and str(e).startswith("entropies:"):
            raise ValueError(f"{POLICY_LOSS_PATH}.loss_mode={name} needs the current policy's "
                             f"entropy, which verl did not compute: set "
                             f"{CALCULATE_ENTROPY_PATH}=true") from None
        raise


def make_policy_loss(name: str) -> Callable:
    """A verl-convention policy loss: calibration ``name``, then ``ktae.policy_loss``."""

    def policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                    response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                    rollout_is_weights: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, dict[str, float]]:
        step = current_step()
        if step is None:
            raise RuntimeError(
                f"policy loss {name!r} needs the current policy's entropy, which verl passes "
                "to no registered loss; the ktae plugin provides it inside verl 0.9.1's "
                "workers/utils/losses.py: ppo_loss (the engine workers' actor loss). This "
                "call came from another code path, which the plugin does not support")
        if config is None:
            raise ValueError(f"config: policy loss {name!r} needs verl's actor config")
        settings = calibration_settings(config.policy_loss)
        if settings.name != name:
            raise ValueError(f"{POLICY_LOSS_PATH}.loss_mode={settings.name} but loss {name!r} "
                             "was called")
        mask = response_mask.bool()
        res = _calibrate(name, settings.options, advantages, log_prob, old_log_prob, mask,
                         step.entropies)
        # CalibrationResult.loss_mask: the tokens that stay in the loss (rules that remove
        # tokens, e.g. STAPO, drop them there); results without it keep every real token.
        keep = getattr(res, "loss_mask", mask) & mask
        adv = res.advantages
        if rollout_is_weights is not None:
            weights = rollout_is_weights.detach().to(adv.dtype)
            if bool((weights[mask] < 0).any()):
                raise ValueError("rollout_is_weights: expected non-negative weights")
            adv = adv * weights
        aggregation, max_len, factor = aggregation_plan(loss_agg_mode, mask,
                                                        config.get("global_batch_info"), keep)
        clip_low, clip_high, dual_clip = _clip_ratios(config)
        loss, stats = ktae_policy_loss(log_prob, old_log_prob, adv, keep, clip_low=clip_low,
                                       clip_high=clip_high, dual_clip=dual_clip,
                                       aggregation=aggregation, max_response_length=max_len,
                                       ppo_clip=res.ppo_clip)
        n_keep = keep.sum().clamp_min(1)
        with torch.no_grad():
            ppo_kl = float(torch.where(keep, old_log_prob - log_prob, 0).sum() / n_keep)
            weight_mean = float(torch.where(mask, res.weights, 0).sum() / mask.sum().clamp_min(1))
        metrics = {
            "actor/pg_clipfrac": stats["clip_frac_low"] + stats["clip_frac_high"],
            "actor/pg_clipfrac_lower": stats["dual_clip_frac"],
            "actor/ppo_kl": ppo_kl,
            "actor/calibration/weight_mean": weight_mean,  # the weights applied, real tokens
        }
        figures = logged_metrics(name, res)  # flag_rate, loss_token_fraction, the rule's own
        for key, val in figures.items():
            metrics[f"actor/calibration/{key}"] = float(val)
        if name in TACO_FAMILY:  # the same figures under the TACO authors' names
            for key, taco_key in TACO_METRIC_NAMES.items():
                metrics[f"taco/{taco_key}"] = float(figures[key])
        return loss * factor, metrics

    policy_loss.__name__ = f"compute_policy_loss_{name.replace('-', '_')}"
    policy_loss.__qualname__ = policy_loss.__name__
    policy_loss.__doc__ = (f"verl policy loss {name!r}: ktae.calibrate_advantages({name!r}) with "
                           "the current policy, then ktae.policy_loss; see "
                           "ktae.integrations.verl.losses.")
    setattr(policy_loss, PLUGIN_MARK, True)
    return policy_loss
