"""Token credit scored against exact token labels, per response in one vectorised pass,
and the bootstrap intervals of the figures. Shared by ``ktae audit`` (the embedded
task's local-error labels, :mod:`ktae.credit_audit`) and ``ktae simulate`` (the MDP's
optimal actions, :mod:`ktae.sim.blame`): one formula, one place.

Token labels are ``[B, T]`` int: :data:`WRONG` (1, locally wrong), :data:`RIGHT` (0) or
:data:`OTHER` (-1: not judged, or padding). A method's credit is ``[B, T]``, with tokens
a loss mask removes already set to 0 (they receive no credit). A response is *mixed*
when its group holds both right (``correct``) and wrong answers.

Rank figures, per response (all in float64), :func:`response_metrics`:

``blame`` (wrong answers of mixed groups holding both wrong and right tokens)
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
``contamination`` (right answers of mixed groups holding a wrong token)
    ``sum_t max(A_t, 0) [t wrong] / sum_t max(A_t, 0)`` over all the response's tokens:
    the share of its positive credit on locally wrong tokens. Undefined (left out) when
    the response receives no positive credit.

Mass figures, against GRPO's credit ``A^G`` on the same responses,
:func:`mass_metrics`; each is a ratio of sums over the responses it covers (so that a
response whose GRPO advantage is near 0 cannot dominate), summarised by
:func:`summarise_ratio`:

``mass_gap`` (the responses of ``blame``)
    ``sum_i (mean_w A_i - mean_r A_i) / sum_i |A^G_i|``: the mean credit on a response's
    wrong tokens minus the mean on its right tokens, in units of GRPO's advantage
    (``|A^G_i|``, the mean of ``|A^G|`` over the response's tokens). Negative when wrong
    tokens get less credit; GRPO gives exactly 0.
``tokens_changed`` (every response of a mixed group)
    The share of the responses' tokens whose credit differs from GRPO's (by more than
    ``1e-6 (1 + |A^G|)``); GRPO gives exactly 0.
``scale`` (every response of a mixed group)
    ``sum |A| / sum |A^G|`` over the responses' tokens: the size of the update relative
    to GRPO's; GRPO gives exactly 1.

A figure over a set of responses is the mean of its per-response values (a ratio figure:
the ratio of the sums); its 95% interval is the 2.5 and 97.5 percentiles of that
estimate over ``resamples`` bootstrap draws of the contributing groups (with
replacement, numpy's PCG64 seeded with ``seed``, so the interval is the same on every
machine).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

WRONG, RIGHT, OTHER = 1, 0, -1
METRICS = ("blame", "lowest", "contamination")
"""Per-response rank figures of :func:`response_metrics`."""
MASS_METRICS = ("mass_gap", "tokens_changed", "scale")
"""Ratio figures of :func:`mass_metrics`."""
CHANGED_RTOL = 1e-6
"""A token's credit differs from GRPO's when ``|A - A^G| > CHANGED_RTOL (1 + |A^G|)``."""


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


@dataclass(frozen=True)
class MassMetrics:
    """Per response, ``[B]`` float64 numerator and denominator of each ratio figure of
    :data:`MASS_METRICS` (NaN where the response does not count)."""

    mass_gap: torch.Tensor
    mass_gap_norm: torch.Tensor
    tokens_changed: torch.Tensor
    tokens: torch.Tensor
    scale: torch.Tensor
    scale_norm: torch.Tensor

    def ratio(self, metric: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(numerator, denominator)`` of one figure of :data:`MASS_METRICS`."""
        den = {"mass_gap": self.mass_gap_norm, "tokens_changed": self.tokens,
               "scale": self.scale_norm}[metric]
        return getattr(self, metric), den


def mixed_groups(correct: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: the response's group holds both right and wrong answers."""
    n = int(group.max()) + 1 if group.numel() else 0
    ones = torch.ones_like(group, dtype=torch.long)
    size = torch.zeros(n, dtype=torch.long).index_add_(0, group, ones)
    right = torch.zeros(n, dtype=torch.long).index_add_(0, group, correct.long())
    return ((right > 0) & (right < size))[group]


def response_metrics(credit: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
                     correct: torch.Tensor, group: torch.Tensor) -> ResponseMetrics:
    """The per-response rank figures of the module docstring.

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


def mass_metrics(credit: torch.Tensor, reference: torch.Tensor, labels: torch.Tensor,
                 mask: torch.Tensor, correct: torch.Tensor,
                 group: torch.Tensor) -> MassMetrics:
    """The per-response terms of the mass figures of the module docstring.

    Args:
        credit: ``[B, T]`` the method's token credit (0 where a token receives none).
        reference: ``[B, T]`` GRPO's credit on the same responses.
        labels, mask, correct, group: as :func:`response_metrics`.
    """
    A, ref = credit.double(), reference.double()
    mask = mask.bool()
    wrong, right = (labels == WRONG) & mask, (labels == RIGHT) & mask
    n_w, n_r = wrong.sum(1).double(), right.sum(1).double()
    n = mask.sum(1).double()
    mixed = mixed_groups(correct, group)
    blame_defined = mixed & ~correct & (n_w > 0) & (n_r > 0)
    counted = mixed & (n > 0)

    mean_w = torch.where(wrong, A, 0.0).sum(1) / n_w.clamp_min(1.0)
    mean_r = torch.where(right, A, 0.0).sum(1) / n_r.clamp_min(1.0)
    ref_abs = torch.where(mask, ref.abs(), 0.0)
    grpo_size = ref_abs.sum(1) / n.clamp_min(1.0)
    changed = mask & ((A - ref).abs() > CHANGED_RTOL * (1.0 + ref.abs()))
    nan = torch.full_like(n, torch.nan)
    return MassMetrics(
        mass_gap=torch.where(blame_defined, mean_w - mean_r, nan),
        mass_gap_norm=torch.where(blame_defined, grpo_size, nan),
        tokens_changed=torch.where(counted, changed.sum(1).double(), nan),
        tokens=torch.where(counted, n, nan),
        scale=torch.where(counted, torch.where(mask, A.abs(), 0.0).sum(1), nan),
        scale_norm=torch.where(counted, ref_abs.sum(1), nan))


def _group_weights(G: int, resamples: int, seed: int) -> np.ndarray:
    """``[resamples, G]`` how often each group is drawn in each bootstrap draw."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, G, size=(resamples, G))
    flat = (np.arange(resamples)[:, None] * G + draws).ravel()
    return np.bincount(flat, minlength=resamples * G).reshape(resamples, G).astype(np.float64)


def summarise_ratio(numerator: np.ndarray, denominator: np.ndarray, group: np.ndarray, *,
                    resamples: int = 1000, seed: int = 0) -> dict:
    """``sum(numerator) / sum(denominator)`` over the responses where both are defined
    (not NaN), and its bootstrap 95% interval over their groups: ``{"mean", "low",
    "high", "responses", "groups"}`` (``mean`` None when no response counts or the
    denominator sums to 0; ``low``/``high`` equal to ``mean`` for one group; a draw whose
    denominator is 0 is left out of the percentiles)."""
    num = np.asarray(numerator, dtype=np.float64)
    den = np.asarray(denominator, dtype=np.float64)
    group = np.asarray(group)
    keep = ~(np.isnan(num) | np.isnan(den))
    num, den, group = num[keep], den[keep], group[keep]
    if num.size == 0 or den.sum() == 0:
        return {"mean": None, "low": None, "high": None, "responses": int(num.size),
                "groups": int(len(np.unique(group)))}
    ids, dense = np.unique(group, return_inverse=True)
    G = len(ids)
    sums = np.bincount(dense, weights=num, minlength=G)
    dens = np.bincount(dense, weights=den, minlength=G)
    mean = float(sums.sum() / dens.sum())
    low = high = mean
    if G > 1 and resamples > 0:
        weights = _group_weights(G, resamples, seed)
        bottom = weights @ dens
        ok = bottom != 0
        estimates = (weights @ sums)[ok] / bottom[ok]
        if estimates.size:
            low, high = (float(x) for x in np.percentile(estimates, [2.5, 97.5]))
    return {"mean": mean, "low": low, "high": high, "responses": int(num.size),
            "groups": int(G)}


def summarise(values: np.ndarray, group: np.ndarray, *, resamples: int = 1000,
              seed: int = 0) -> dict:
    """Mean of the defined (not NaN) ``values`` and its bootstrap 95% interval over
    their groups: ``{"mean", "low", "high", "responses", "groups"}`` (``mean`` None when
    no value is defined; ``low``/``high`` equal to ``mean`` for one group). The mean is
    :func:`summarise_ratio` with denominator 1 per response."""
    values = np.asarray(values, dtype=np.float64)
    return summarise_ratio(values, np.where(np.isnan(values), np.nan, 1.0), group,
                           resamples=resamples, seed=seed)
