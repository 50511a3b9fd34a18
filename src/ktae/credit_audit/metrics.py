"""The credit audit's figures, per response in one vectorised pass, and their intervals.

Token labels are ``[B, T]`` int8: :data:`WRONG` (1, locally wrong), :data:`RIGHT` (0) or
:data:`OTHER` (-1: not an equation, or padding). A method's credit is ``[B, T]``, with
tokens a loss mask removes already set to 0 (they receive no credit).

Per response (all in float64):

``blame`` (wrong-answer responses of mixed groups holding both wrong and right tokens)
    ``P(A_w < A_r) + 1/2 P(A_w = A_r)`` over the response's (wrong token, right token)
    pairs: the Mann-Whitney probability that a locally wrong token gets less credit than
    a locally right one, ties half. Computed from mid-ranks: with ``R_w`` the sum of the
    wrong tokens' mid-ranks among the labelled tokens,
    ``blame = 1 - (R_w - n_w (n_w + 1) / 2) / (n_w n_r)``. A constant credit (GRPO)
    gives exactly 0.5.
``lowest`` (same responses)
    The share of wrong tokens among the labelled tokens of lowest credit (ties shared:
    ``#wrong at the minimum / #labelled at the minimum``); ``chance`` is
    ``n_w / (n_w + n_r)``, what a constant credit gives.
``contamination`` (right-answer responses of mixed groups holding a wrong token)
    ``sum_t max(A_t, 0) [t wrong] / sum_t max(A_t, 0)`` over all the response's tokens:
    the share of its positive credit on locally wrong tokens. Undefined (left out) when
    the response receives no positive credit.

A figure over a set of responses is the mean of its per-response values; its 95%
interval is the 2.5 and 97.5 percentiles of that mean over ``resamples`` bootstrap
draws of the contributing groups (with replacement, numpy's PCG64 seeded with
``seed``, so the interval is the same on every machine).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

WRONG, RIGHT, OTHER = 1, 0, -1
METRICS = ("blame", "lowest", "contamination")
"""Per-response figures of :func:`response_metrics`."""


@dataclass(frozen=True)
class ResponseMetrics:
    """``[B]`` float64 values of each figure and ``[B]`` bool: where it is defined."""

    blame: torch.Tensor
    lowest: torch.Tensor
    chance: torch.Tensor
    contamination: torch.Tensor
    blame_defined: torch.Tensor
    contamination_defined: torch.Tensor

    def defined(self, metric: str) -> torch.Tensor:
        return self.contamination_defined if metric == "contamination" else self.blame_defined


def mixed_groups(correct: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: the response's group holds both right and wrong answers."""
    n = int(group.max()) + 1 if group.numel() else 0
    ones = torch.ones_like(group, dtype=torch.long)
    size = torch.zeros(n, dtype=torch.long).index_add_(0, group, ones)
    right = torch.zeros(n, dtype=torch.long).index_add_(0, group, correct.long())
    return ((right > 0) & (right < size))[group]


def response_metrics(credit: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
                     correct: torch.Tensor, group: torch.Tensor) -> ResponseMetrics:
    """The per-response figures of the module docstring.

    Args:
        credit: ``[B, T]`` token credit (0 where a token receives none).
        labels: ``[B, T]`` int, :data:`WRONG` / :data:`RIGHT` / :data:`OTHER`.
        mask: ``[B, T]`` bool, the response's real tokens (labels outside it are
            ignored).
        correct: ``[B]`` bool, the response's answer is right.
        group: ``[B]`` int64 group id (0..G-1).
    """
    A = credit.double()
    mask = mask.bool()
    wrong, right = (labels == WRONG) & mask, (labels == RIGHT) & mask
    labelled = wrong | right
    n_w, n_r = wrong.sum(1).double(), right.sum(1).double()
    mixed = mixed_groups(correct, group)

    # mid-ranks of the labelled tokens within their response
    key = torch.where(labelled, A, torch.inf)
    ordered = key.sort(1).values
    below = torch.searchsorted(ordered, key.contiguous(), side="left").double()
    upto = torch.searchsorted(ordered, key.contiguous(), side="right").double()
    midrank = (below + upto + 1.0) / 2.0
    rank_sum = torch.where(wrong, midrank, 0.0).sum(1)
    blame_defined = mixed & ~correct & (n_w > 0) & (n_r > 0)
    pairs = (n_w * n_r).clamp_min(1.0)
    blame = 1.0 - (rank_sum - n_w * (n_w + 1.0) / 2.0) / pairs

    lowest_value = ordered[:, :1]
    at_min = labelled & (A == lowest_value)
    lowest = (at_min & wrong).sum(1).double() / at_min.sum(1).clamp_min(1).double()
    chance = n_w / (n_w + n_r).clamp_min(1.0)

    positive = torch.where(mask, A.clamp_min(0.0), 0.0)
    total = positive.sum(1)
    on_wrong = torch.where(wrong, positive, 0.0).sum(1)
    contamination_defined = mixed & correct & (n_w > 0) & (total > 0)
    contamination = on_wrong / torch.where(total > 0, total, 1.0)
    nan = torch.full_like(blame, torch.nan)
    return ResponseMetrics(
        blame=torch.where(blame_defined, blame, nan),
        lowest=torch.where(blame_defined, lowest, nan),
        chance=torch.where(blame_defined, chance, nan),
        contamination=torch.where(contamination_defined, contamination, nan),
        blame_defined=blame_defined, contamination_defined=contamination_defined)


def summarise(values: np.ndarray, group: np.ndarray, *, resamples: int = 1000,
              seed: int = 0) -> dict:
    """Mean of the defined (not NaN) ``values`` and its bootstrap 95% interval over
    their groups: ``{"mean", "low", "high", "responses", "groups"}`` (``mean`` None when
    no value is defined; ``low``/``high`` equal to ``mean`` for one group)."""
    values = np.asarray(values, dtype=np.float64)
    group = np.asarray(group)
    keep = ~np.isnan(values)
    values, group = values[keep], group[keep]
    if values.size == 0:
        return {"mean": None, "low": None, "high": None, "responses": 0, "groups": 0}
    ids, dense = np.unique(group, return_inverse=True)
    G = len(ids)
    sums = np.bincount(dense, weights=values, minlength=G)
    counts = np.bincount(dense, minlength=G).astype(np.float64)
    mean = float(sums.sum() / counts.sum())
    low = high = mean
    if G > 1 and resamples > 0:
        rng = np.random.default_rng(seed)
        draws = rng.integers(0, G, size=(resamples, G))
        weights = np.zeros((resamples, G))
        np.add.at(weights, (np.arange(resamples)[:, None], draws), 1.0)
        estimates = (weights @ sums) / (weights @ counts)
        low, high = (float(x) for x in np.percentile(estimates, [2.5, 97.5]))
    return {"mean": mean, "low": low, "high": high, "responses": int(values.size),
            "groups": int(G)}
