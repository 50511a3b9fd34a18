"""Fisher's p, F, IG and Cohen's h of every 2x2 table a batch can hold, once per call.

These statistics depend on the table alone (``a``, ``b`` and the group's class sizes
``n_T``, ``n_F``), not on any option, and a batch holds few group compositions
``(n_T, n_F)``. So every table of every composition present, ``(n_T + 1) (n_F + 1)`` of
each (under a thousand in all for groups of 16), is evaluated once per call, and each
(group, token) pair of each chunk reads its table's row by index. Evaluating them per chunk
instead would repeat the same small computations in every chunk, a cost that grows with
the number of chunks rather than with the batch.

The rows are laid out composition after composition, ``a``-major:
``row = offset[n_T, n_F] + a (n_F + 1) + b``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ktae.core import stats
from ktae.core.ktae_reference import (
    runtime_fisher_pvalue,
    runtime_fisher_score,
    runtime_table_terms,
)

#: Beyond this many tables (huge groups with many compositions), the caller evaluates the
#: distinct tables of each chunk instead.
MAX_TABLES = 1 << 21


@dataclass(frozen=True)
class TableStats:
    """Statistics of every table of the compositions present. E = number of tables.

    Attributes:
        p_value, fisher, info_gain, cohens_h: ``[E]`` float64 (docs/method.md §3, Eq. 4-7, 9).
        offset: ``[S, S]`` int64, the first row of composition ``(n_T, n_F)``; -1 where the
            batch has no such group (S = the largest class size + 1).
    """

    p_value: torch.Tensor
    fisher: torch.Tensor
    info_gain: torch.Tensor
    cohens_h: torch.Tensor
    offset: torch.Tensor

    def rows(self, a: torch.Tensor, b: torch.Tensor, group: torch.Tensor,
             group_n_correct: torch.Tensor, group_n_incorrect: torch.Tensor) -> torch.Tensor:
        """``[U]`` row of each table ``[[a, b], [n_T - a, n_F - b]]``: ``a``, ``b`` and
        ``group`` per pair, the class sizes per group."""
        first = self.offset[group_n_correct, group_n_incorrect]
        return (first.index_select(0, group) + b
                + a * (group_n_incorrect + 1).index_select(0, group))


def _all_tables(n_correct: torch.Tensor, n_incorrect: torch.Tensor):
    """Every table of the compositions present: ``(a, b, c, d)`` ``[E]`` and the offsets,
    or None beyond :data:`MAX_TABLES`."""
    device = n_correct.device
    size = int(max(int(n_correct.max()), int(n_incorrect.max()))) + 1 if n_correct.numel() else 1
    comp = torch.unique(n_correct * size + n_incorrect)
    n_t, n_f = comp // size, comp % size
    per_comp = (n_t + 1) * (n_f + 1)
    total = int(per_comp.sum())
    if total > MAX_TABLES:
        return None
    first = torch.cumsum(per_comp, 0) - per_comp
    offset = torch.full((size, size), -1, dtype=torch.int64, device=device)
    offset[n_t, n_f] = first
    which = torch.repeat_interleave(torch.arange(comp.numel(), device=device), per_comp)
    local = torch.arange(total, device=device) - first[which]
    nf1 = n_f[which] + 1
    a, b = local // nf1, local % nf1
    return (a, b, n_t[which] - a, n_f[which] - b), offset


@dataclass(frozen=True)
class ReferenceTableStats(TableStats):
    """Reference mode's float32 statistics (:mod:`ktae.core.ktae_reference`): IG and h per
    table, p and F per table and grid width ``K = 1 .. W`` (the runtime's Fisher sum
    depends on its group's K)."""

    width: int = 1

    def fisher_at(self, rows: torch.Tensor, k: torch.Tensor):
        """``(p, F)`` of each pair's table row at its group's width ``k`` (``[U]``)."""
        at = rows * self.width + (k - 1)
        return self.p_value.index_select(0, at), self.fisher.index_select(0, at)


def reference_table_stats(n_correct: torch.Tensor, n_incorrect: torch.Tensor
                          ) -> ReferenceTableStats | None:
    """:func:`table_stats` for reference mode, or None when too large."""

    found = _all_tables(n_correct, n_incorrect)
    width = int(n_correct.max()) + 1 if n_correct.numel() else 1  # K <= n_T + 1
    if found is None or found[0][0].numel() * width > MAX_TABLES:
        return None
    (a, b, c, d), offset = found
    ig, h = runtime_table_terms(a, b, c, d)
    k = torch.arange(1, width + 1, device=a.device).repeat(a.numel())
    p = runtime_fisher_pvalue(*(x.repeat_interleave(width) for x in (a, b, c, d)), k)
    return ReferenceTableStats(p_value=p, fisher=runtime_fisher_score(p), info_gain=ig,
                               cohens_h=h, offset=offset, width=width)


def table_stats(n_correct: torch.Tensor, n_incorrect: torch.Tensor) -> TableStats | None:
    """Every table of the group compositions ``(n_correct[g], n_incorrect[g])``.

    Args:
        n_correct, n_incorrect: ``[P]`` int64 class sizes of each group.

    Returns:
        The statistics, or None when they would hold more than :data:`MAX_TABLES` tables.
    """
    found = _all_tables(n_correct, n_incorrect)
    if found is None:
        return None
    (a, b, c, d), offset = found
    p = stats.fisher_exact_pvalue(a, b, c, d)
    return TableStats(p_value=p, fisher=stats.fisher_score(p),
                      info_gain=stats.information_gain(a, b, c, d),
                      cohens_h=stats.cohens_h(a, b, c, d), offset=offset)
