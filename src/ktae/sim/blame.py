"""The credit audit on the MDP: each method's step credit against the exact labels.

The MDP knows the optimal actions of every step, so every sampled step is labelled
exactly: a sub-optimal action (step reward 0) is a *wrong* token, an optimal one a
*right* token. A trajectory is *successful* when its return is above its group's mean
(the trajectories GRPO credits positively; the split ``ktae`` uses by default) and
*failed* otherwise; a group is mixed unless all its returns are equal. With these, the
figures are those of ``ktae audit``, computed by the same functions
(:mod:`ktae.core.credit_metrics`):

* ``blame``: in a failed trajectory, ``P(a sub-optimal step gets less credit than an
  optimal one)``, ties half (GRPO: exactly 0.5);
* ``lowest``: how often a failed trajectory's lowest-credit step is sub-optimal (ties
  shared), against ``chance`` (the sub-optimal share of its steps);
* ``contamination``: the share of a successful trajectory's positive credit on its
  sub-optimal steps; ``contamination_vs_grpo`` pairs it with GRPO's on the same one;
* ``mass_gap``, ``tokens_changed``, ``scale``: the credit mass against GRPO's
  (broadcast) credit on the same trajectories.

The groups are *probe* groups: at each audited update, ``audit_groups`` extra groups of
G trajectories per run are sampled from the run's current policy with their own random
stream, and every method's credit is computed on its run's probe groups (each group its
own batch, as a run's group is in training). Training never sees them: the curves are
the same with or without the audit. At update 0 every method of a seed and setting has
the same policy and draws the same probe groups, so the methods are compared on the same
trajectories.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ktae.core.credit_metrics import (
    MASS_METRICS,
    METRICS,
    OTHER,
    RIGHT,
    WRONG,
    mass_metrics,
    response_metrics,
    summarise,
    summarise_ratio,
)
from ktae.sim.credit import Credit, CreditBatch, base_advantages

RANK_FIGURES = (*METRICS, "chance", "contamination_vs_grpo")
"""Per-trajectory figures, summarised as means over trajectories."""
FIGURES = (*RANK_FIGURES, *MASS_METRICS)
"""Every figure of the MDP's audit, in table order."""
NORM = "_norm"
"""Suffix of a mass figure's per-trajectory denominator."""
RESAMPLES = 1000
"""Bootstrap draws of every interval (numpy PCG64 seeded 0, as ``ktae audit``)."""


def step_labels(batch: CreditBatch) -> torch.Tensor:
    """``[B, T]`` int8: :data:`WRONG` on sub-optimal steps, :data:`RIGHT` on optimal
    ones, :data:`OTHER` on padding."""
    labels = torch.where(batch.step_rewards > 0, RIGHT, WRONG).to(torch.int8)
    return torch.where(batch.mask, labels, torch.full_like(labels, OTHER))


def score(credit: Credit, batch: CreditBatch) -> dict[str, np.ndarray]:
    """Per trajectory of ``batch``: each figure of :data:`RANK_FIGURES` (NaN where
    undefined) and each mass figure's numerator and denominator (``NAME`` and
    ``NAME_norm``), for one method's :class:`~ktae.sim.credit.Credit` (tokens outside its
    loss mask receive no credit). Computed on the CPU, whatever the simulation's device."""
    batch = dataclasses.replace(batch, **{f.name: getattr(batch, f.name).cpu()
                                          for f in dataclasses.fields(batch)
                                          if isinstance(getattr(batch, f.name), torch.Tensor)})
    credit = Credit(*(x.cpu() for x in (credit.advantages, credit.loss_mask, credit.flagged)))
    labels = step_labels(batch)
    correct = batch.above_group_mean()
    kept = credit.loss_mask & batch.mask
    A = torch.where(kept, credit.advantages.double(), 0.0)
    grpo = torch.where(batch.mask, base_advantages("broadcast", batch).double(), 0.0)
    m = response_metrics(A, labels, batch.mask, correct, batch.group)
    ref = response_metrics(grpo, labels, batch.mask, correct, batch.group)
    out = {k: getattr(m, k).numpy() for k in (*METRICS, "chance")}
    out["contamination_vs_grpo"] = (m.contamination - ref.contamination).numpy()
    mass = mass_metrics(A, grpo, labels, batch.mask, correct, batch.group)
    for k in MASS_METRICS:
        num, den = mass.ratio(k)
        out[k], out[k + NORM] = num.numpy(), den.numpy()
    return out


def concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-trajectory values of several sets of groups, one after the other (each part
    carries a ``group`` array; the parts' group ids must already be distinct)."""
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def summaries(values: dict[str, np.ndarray], *, resamples: int = RESAMPLES) -> dict:
    """Every figure of :data:`FIGURES` over ``values`` (as :func:`score`, with a
    ``group`` array): ``{figure: {"mean", "low", "high", "responses", "groups"}}``, 95%
    bootstrap intervals over the groups."""
    group = values["group"]
    out = {k: summarise(values[k], group, resamples=resamples, seed=0) for k in RANK_FIGURES}
    for k in MASS_METRICS:
        out[k] = summarise_ratio(values[k], values[k + NORM], group, resamples=resamples,
                                 seed=0)
    return out
