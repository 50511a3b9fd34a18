"""OAR-G: the sequence advantage redistributed over a response by input-gradient importance.

Li et al. (2026), "Outcome-Grounded Advantage Reshaping for Fine-Grained Credit Assignment
in Mathematical Reasoning", arXiv 2601.07408 (OAR-G, the gradient variant of OAR). Source
read: the authors' released code, github.com/Valsure/Outcome-Grounded-Advantage-Reshaping
at commit 8dbc478, ``OAR-main.py`` (``calculate_token_importance_gradient``,
``calculate_oar_hybrid_weights``, ``compute_loss``); the paper's abstract and its
constraint that the weights of a response sum to its length. Where the two could differ
the code is followed.

Each real token ``t`` of a response of ``L`` tokens has an importance ``s_t >= 0``, the
input-gradient sensitivity of the model's answer distribution to the token's embedding
(:mod:`ktae.models.input_grad_importance`, the need ``input_grad_importance``). The
"Bi-Level" reshaping of ``calculate_oar_hybrid_weights``, per response::

    u_t   = log(1 + s_t)
    n_t   = (u_t - min u) / (max u - min u)          (range 1 when max u = min u)
    tau   = quantile(n, threshold)                   (linear interpolation, numpy's)
    w_t   = max(n_t / (tau + 1e-8), min_weight)      where n_t <  tau   (suppression)
    w_t   = 1 + gating_beta * (n_t - tau) / (1 - tau + 1e-8) where n_t >= tau  (boost)
    w_t  <- w_t * L / (sum w + 1e-8)                 (sum_to_length; all 1 if sum w <= 0)
    A_t   = A * w_t

with ``A`` the response's sequence advantage (``base``, GRPO's by default, as the code's
``inputs['advantages']``). With ``sum_to_length`` the weights average 1, so a response's
advantage mass ``sum_t A_t = L * A`` is kept (up to the code's ``1e-8``): credit moves from
low- to high-importance tokens of the same response, never between responses.

Defaults: ``min_weight = 0.1`` is the code's constant. ``threshold``, ``beta`` and
``sum_to_L`` are command-line arguments of the released code (``self.args``) whose values
the released fragment does not show; ``sum_to_length = True`` is the paper's stated mass
constraint, and ``threshold = 0.5``, ``gating_beta = 1.0`` are this library's choice (set
them to the values of a run you reproduce). The boost is named ``gating_beta``, the code's
local name for ``args.beta``, because ``beta`` is the KL coefficient's name in ``ktae
train`` and in ``ktae compare`` arms.
"""

from __future__ import annotations

import torch

from ktae.core.advantages import ADVANTAGE_ESTIMATORS, AdvantageBatch
from ktae.core.baselines import SEQUENCE_BASELINES
from ktae.core.policy_loss import check_number

OAR_THRESHOLD = 0.5
OAR_BETA = 1.0
OAR_MIN_WEIGHT = 0.1
_EPS = 1e-8  # the released code's guard, kept so that its weights are reproduced


def masked_quantile(values: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """``[B]``: each row's ``q``-quantile over its True entries, linear interpolation
    (numpy's default); 0 for an empty row. One sort for the batch."""
    n = mask.sum(dim=1)
    v = torch.sort(torch.where(mask, values, torch.inf), dim=1).values
    pos = q * (n - 1).clamp_min(0).to(values.dtype)
    lo = pos.floor().long()
    hi = torch.minimum(lo + 1, (n - 1).clamp_min(0))
    v_lo = v.gather(1, lo[:, None]).squeeze(1)
    v_hi = v.gather(1, hi[:, None]).squeeze(1)
    out = v_lo + (pos - lo.to(values.dtype)) * (v_hi - v_lo)
    return torch.where(n > 0, out, 0)


def oar_weights(importance: torch.Tensor, mask: torch.Tensor, *,
                threshold: float = OAR_THRESHOLD, gating_beta: float = OAR_BETA,
                min_weight: float = OAR_MIN_WEIGHT, sum_to_length: bool = True
                ) -> torch.Tensor:
    """``[B, T]`` OAR's token weights from ``[B, T]`` importances (module docstring), per
    response over its real tokens (``mask``); 0 on padding. float64."""
    s = importance.to(torch.float64)
    u = torch.log1p(torch.where(mask, s, 0))
    lo = torch.where(mask, u, torch.inf).amin(dim=1, keepdim=True)
    hi = torch.where(mask, u, -torch.inf).amax(dim=1, keepdim=True)
    span = torch.where(hi > lo, hi - lo, 1.0)
    n = torch.where(mask, (u - lo) / span, 0)
    tau = masked_quantile(n, mask, threshold)[:, None]
    low = n < tau
    suppressed = (n / (tau + _EPS)).clamp_min(min_weight)
    boosted = 1 + gating_beta * (n - tau) / (1 - tau + _EPS)
    w = torch.where(mask, torch.where(low, suppressed, boosted), 0)
    if sum_to_length:
        length = mask.sum(dim=1, keepdim=True).to(w.dtype)
        total = w.sum(dim=1, keepdim=True)
        w = torch.where(total > 0, w * (length / (total + _EPS)), mask.to(w.dtype))
    return w


@ADVANTAGE_ESTIMATORS.register("oar-g", needs=("mask", "input_grad_importance"))
def oar_g_advantages(batch: AdvantageBatch, *, base: str = "grpo",
                     threshold: float = OAR_THRESHOLD, gating_beta: float = OAR_BETA,
                     min_weight: float = OAR_MIN_WEIGHT,
                     sum_to_length: bool = True) -> torch.Tensor:
    """``[B, T]``: ``A * w`` with OAR's weights ``w`` (module docstring) from the batch's
    ``input_grad_importance``. Options: ``base`` ("grpo", "drgrpo", "rloo"), ``threshold``
    in [0, 1] (0.5, the quantile splitting suppressed from boosted tokens), ``gating_beta
    >= 0`` (1.0, the boost), ``min_weight`` in [0, 1] (0.1, the floor of a suppressed token's
    weight), ``sum_to_length`` (True: a response's weights sum to its length)."""
    if not isinstance(base, str) or base not in SEQUENCE_BASELINES:
        raise ValueError(f"base: expected one of {sorted(SEQUENCE_BASELINES)}, got {base!r}")
    threshold = check_number(threshold, "threshold", low=0, high=1)
    gating_beta = check_number(gating_beta, "gating_beta", low=0)
    min_weight = check_number(min_weight, "min_weight", low=0, high=1)
    if not isinstance(sum_to_length, bool):
        raise ValueError(f"sum_to_length: expected true or false, got {sum_to_length!r}")
    if batch.mask is None or batch.input_grad_importance is None:
        raise ValueError("input_grad_importance: required by advantage estimator 'oar-g' "
                         "(the [B, T] input-gradient importance of each response token, "
                         "computed from the model)")
    seq = SEQUENCE_BASELINES[base](batch.rewards, batch.gid, batch.num_groups)
    w = oar_weights(batch.input_grad_importance, batch.mask, threshold=threshold,
                    gating_beta=gating_beta,
                    min_weight=min_weight, sum_to_length=sum_to_length)
    return (seq[:, None].to(torch.float64) * w).to(batch.rewards.dtype)


def importance_read(rewards, *, base: str = "grpo", **_options) -> bool:
    """Whether OAR-G's credit of one group (its rewards) reads the importance at all: the
    credit ``A * w_t`` is 0 on every token of a group whose base advantages ``A`` are all 0
    (GRPO's, Dr. GRPO's and RLOO's for equal rewards), whatever the weights. A caller that
    computes the importance from a model (the audit) skips such groups."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    seq = SEQUENCE_BASELINES[base](r, torch.zeros(len(r), dtype=torch.long), 1)
    return bool((seq != 0).any())


def reads_need(need: str, rewards, **options) -> bool:
    """Whether OAR-G's credit of one group reads ``need`` there: the importance only where
    :func:`importance_read` says so; any other need everywhere."""
    return need != "input_grad_importance" or importance_read(rewards, **options)


oar_g_advantages.reads_need = reads_need
"""Read by a caller through the estimator's function (``getattr(fn, "reads_need")``): an
estimator without it reads its needs on every group."""
