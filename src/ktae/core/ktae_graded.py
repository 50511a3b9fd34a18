"""KTAE's two classes from the rewards: the threshold split and the graded split.

``split="threshold"`` (docs/method.md §3, the default) makes each response correct (T) or incorrect
(F) by ``reward > reward_threshold``. ``split="graded"`` keeps how good each response was:
a response belongs to T with a weight in [0, 1] and to F with the rest, and every
statistic of KTAE is computed on those weights (docs/graded.md gives the reasons for each
choice). In a group g of G responses with rewards r_i:

    w_i   = (r_i - min_g r) / (max_g r - min_g r)         membership of T; 1 - w_i of F

For a token (or span, ``ngram = N``) v, S_v the responses of g containing it, K = |S_v|:

    a = sum_{i in S_v} w_i     b = K - a                  soft 2x2 table
    n_T = sum_i w_i            n_F = G - n_T              c = n_T - a,  d = n_F - b

    F~  = sum_{a', c'} (1 - |a - a'|) (1 - |c - c'|) F(a', K - a', c', G - K - c')
          over a' in {floor a, floor a + 1}, c' in {floor c, floor c + 1}: Fisher's
          F = exp(-2 p) (Eq. 4-5) of the integer tables next to the soft one,
          interpolated bilinearly (equally p~ for the displayed p-value)
    IG~ = H(n_T / G) - (K / G) H(a / K) - ((G - K) / G) H(c / (G - K))    bits (Eq. 6-7)
    h~  = asin(sqrt(a / n_T)) - asin(sqrt(b / n_F))                       Cohen's h
    count_T(v) = sum_i w_i count_i(v)    L_T = sum_i w_i len_i            (F: 1 - w_i)
    TF~_T = f (k1 + 1) / (f + k1 (1 - b_25 + b_25 L_T / avg)),  f = count_T(v) / max(L_T, 1),
          avg = (L_T + L_F) / 2 (Eq. 8, b_25 its option b; the same for F)
    D~  = h~ + h3 (TF~_T / (TF~_F + 1e-5) - TF~_F / (TF~_T + 1e-5))       (Eq. 9)
    k   = (h1 F~ + h2 IG~) D~ / (h1 + h2);  value = top (2 sigmoid(k) - 1) (Eq. 10)

Properties (tested in tests/test_ktae_graded.py):

- A group with two distinct rewards has w in {0, 1} exactly (``(hi - lo) / (hi - lo)`` is
  1 in floating point), every soft count is an integer, the interpolation weights are
  1, 0, 0, 0 and each statistic is the thresholded one computed by the same operations:
  on 0/1 rewards the output equals ``split="threshold"`` bit for bit.
- w, hence every value, is unchanged by ``r -> alpha r + beta`` (alpha > 0), and is a
  continuous function of the rewards: min-max scaling, sums, entropies, arcsines and the
  interpolation are continuous (the interpolation agrees with F on every integer table),
  and nothing compares a reward with a threshold or with another reward. Two exceptions,
  both forced: a group whose rewards become equal (scale invariance forces a value that
  depends only on the rewards' shape, which has no limit there; its values are 0, see
  :func:`ktae.core.baselines.equal_reward_groups`), and BM25 settings that make TF itself
  a step (``k1 = 0``: TF = 1 for any f > 0; ``b = 1``: the saturation vanishes with L);
  the defaults k1 = 2, b = 0.5 are continuous.
- h1 = 0 removes F~, h2 = 0 removes IG~ and h3 = 0 removes the TF contrast, as in docs/method.md §3.

A group whose rewards are equal up to rounding has no membership (w = 0) and values 0,
like a group with one class under the threshold split. The same rule makes the threshold
split of such a group one class (its rewards differ by rounding only), so both splits
give it zero advantages, as the baselines do.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ktae.core import pointwise, stats
from ktae.core.baselines import _group_scale, equal_reward_groups
from ktae.core.ktae_options import KTAEOptions
from ktae.core.ktae_table import KeyTokenTable
from ktae.core.ngrams import Spans, find_spans, reduce_to_tokens
from ktae.core.token_counts import TokenCounts, count_units, real_token_ids, unique_small_keys

__all__ = ["graded_table", "graded_token_values", "soft_membership", "threshold_membership"]


# ------------------------------------------------------------------ memberships


def _group_extreme(x: torch.Tensor, gid: torch.Tensor, num_groups: int, reduce: str):
    fill = torch.inf if reduce == "amin" else -torch.inf
    init = torch.full((num_groups,), fill, dtype=x.dtype, device=x.device)
    return init.scatter_reduce(0, gid, x, reduce=reduce, include_self=True)


def soft_membership(rewards: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``[B]`` float64 ``w_i = (r_i - min_g r) / (max_g r - min_g r)``; 0 in a group whose
    rewards are equal up to rounding. Computed on rewards divided by a power of two per
    group (exact), so the range never overflows."""
    x = rewards.to(torch.float64) / _group_scale(rewards, gid, num_groups)[gid].to(torch.float64)
    lo = _group_extreme(x, gid, num_groups, "amin")[gid]
    hi = _group_extreme(x, gid, num_groups, "amax")[gid]
    flat = equal_reward_groups(rewards, gid, num_groups)[gid]
    w = (x - lo) / torch.where(flat, torch.ones_like(hi), hi - lo)
    return torch.where(flat, torch.zeros_like(w), w)


def threshold_membership(rewards: torch.Tensor, gid: torch.Tensor, num_groups: int,
                         threshold: float) -> torch.Tensor:
    """``[B]`` bool ``reward > threshold`` (docs/method.md §3), a group whose rewards are equal up to
    rounding taken as one class (by its largest reward): rounding does not split it."""
    flat = equal_reward_groups(rewards, gid, num_groups)[gid]
    top = _group_extreme(rewards, gid, num_groups, "amax")[gid]
    return torch.where(flat, top, rewards) > threshold


# ------------------------------------------------------------------ soft counts


def _segment_sums(x: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Sums of ``x`` over the consecutive runs ``[starts, ends)`` (covering ``x``), each
    added up in order within its own run: a float sum then depends on its run alone, not
    on the runs before it in the chunk (as differences of one cumulative sum would)."""
    run = torch.repeat_interleave(torch.arange(starts.numel(), device=x.device), ends - starts,
                                  output_size=x.numel())
    return torch.zeros(starts.numel(), dtype=x.dtype, device=x.device).index_add_(0, run, x)


class _Graded:
    """Soft counts of one chunk: per (group, unit) pair ``[U]`` and per group ``[P]``.

    The sets of responses containing each unit are kept as bitmasks of the responses'
    ranks in their group (``pattern``: group and set in one int64) when they fit 62 bits:
    a soft table depends on nothing else, and few sets occur (a unit found in one
    response has one of G sets), so the tables are built and scored once per distinct
    set (:func:`_soft_tables`). Otherwise ``a`` is summed per pair.
    """

    def __init__(self, cnt: TokenCounts, row: torch.Tensor, row_len: torch.Tensor,
                 gid: torch.Tensor, num_groups: int, w: torch.Tensor):
        dev = w.device
        f64 = torch.float64
        # Sorted units are grouped by pair, and within a pair by response (count_units
        # sorts on (group, unit, class, rank in group)): a new response starts a run.
        rs = row.index_select(0, cnt.order)
        ends = torch.cumsum(cnt.run_length, 0)
        starts = ends - cnt.run_length
        new = torch.ones(rs.numel(), dtype=torch.bool, device=dev)
        if rs.numel():
            new[1:] = rs[1:] != rs[:-1]
            new[starts] = True
        wr = w.index_select(0, rs)
        self.cnt = cnt
        self.K = cnt.a + cnt.b  # responses containing the unit (one class in count_units)
        self.count_t = torch.minimum(_segment_sums(wr, starts, ends).clamp_min(0.0),
                                     cnt.run_length.to(f64))
        self.count_f = cnt.run_length - self.count_t
        size = torch.bincount(gid, minlength=num_groups)
        self.size = size
        self.n_t = torch.zeros(num_groups, dtype=f64, device=dev).index_add_(0, gid, w)
        self.len_t = torch.zeros(num_groups, dtype=f64, device=dev).index_add_(0, gid,
                                                                              w * row_len)
        len_all = torch.zeros(num_groups, dtype=torch.int64, device=dev).index_add_(0, gid,
                                                                                    row_len)
        self.len_f = len_all - self.len_t
        # w = 1 occurs (at the best response) exactly in the groups with a membership
        self.graded = torch.zeros(num_groups, dtype=torch.int64, device=dev).index_add_(
            0, gid, (w == 1.0).long()) > 0
        self.G = size[cnt.group]
        self.g_max = int(size.max()) if size.numel() else 1
        self.pattern = self.a = None
        if self.g_max + max(1, num_groups).bit_length() <= 62:
            order = torch.argsort(gid, stable=True)
            rank = torch.empty_like(gid)
            rank[order] = (torch.arange(gid.numel(), device=dev)
                           - (torch.cumsum(size, 0) - size)[gid[order]])
            self.w_by_rank = torch.zeros(num_groups, self.g_max, dtype=f64,
                                         device=dev).index_put_((gid, rank), w)
            bit = torch.bitwise_left_shift(torch.ones_like(rank), rank)  # [B]
            bits = bit.index_select(0, rs) * new
            self.pattern = (cnt.group << self.g_max) | _segment_sums(bits, starts, ends)
        else:
            a = _segment_sums(torch.where(new, wr, torch.zeros_like(wr)), starts, ends)
            self.a = torch.minimum(a.clamp_min(0.0), self.K.to(f64))


def _count(token_ids, mask, gid, num_groups, w, opts: KTAEOptions
           ) -> tuple[_Graded, Spans | None]:
    if opts.ngram == 1:
        flat = mask.reshape(-1).nonzero().squeeze(1)
        unit = real_token_ids(token_ids, flat)
        row = flat.div_(token_ids.shape[1], rounding_mode="floor")
        row_len = mask.sum(1, dtype=torch.int32).long()
        spans = None
    else:
        spans, unit = find_spans(token_ids, mask, opts.ngram, opts.ignore_token_ids)
        row, row_len = spans.row, spans.row_len
    one_class = torch.ones(gid.shape, dtype=torch.bool, device=gid.device)
    cnt = count_units(unit, row, row_len, gid, num_groups, one_class)
    return _Graded(cnt, row, row_len, gid, num_groups, w), spans


# ------------------------------------------------------------------ statistics


@dataclass(frozen=True)
class _Soft:
    """Soft 2x2 tables: a, b, c, d float64, K (responses with the unit) and G int64."""

    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    d: torch.Tensor
    K: torch.Tensor
    G: torch.Tensor

    def take(self, index: torch.Tensor) -> _Soft:
        return _Soft(*(getattr(self, f.name)[index] for f in fields(self)))


def _tables(a: torch.Tensor, K: torch.Tensor, G: torch.Tensor, n_t: torch.Tensor) -> _Soft:
    b = (K - a).clamp_min(0.0)
    return _Soft(a, b, (n_t - a).clamp_min(0.0), ((G - n_t) - b).clamp_min(0.0), K, G)


def _soft_tables(s: _Graded) -> tuple[_Soft, torch.Tensor | None]:
    """The distinct soft tables of the chunk and the ``[U]`` map to them (None: one
    table per pair)."""
    if s.pattern is None:
        return _tables(s.a, s.K, s.G, s.n_t[s.cnt.group]), None
    uniq, inv = torch.unique(s.pattern, return_inverse=True)  # a sort: the key space is
    g = uniq >> s.g_max  # too large for unique_small_keys' bitmap
    members = (uniq[:, None] >> torch.arange(s.g_max, device=uniq.device)) & 1
    a = (members.to(torch.float64) * s.w_by_rank[g]).sum(1)
    return _tables(a, members.sum(1), s.size[g], s.n_t[g]), inv


def _interpolated_fisher(s: _Soft, with_p: bool = True
                         ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(p~, F~)`` ``[U]``: p and F of the four integer tables around each soft table,
    interpolated bilinearly in (a, c); each distinct integer table evaluated once.
    ``with_p=False`` skips p~ (None)."""
    K, G = s.K, s.G
    R = G - K  # responses without the unit
    a0, c0 = s.a.floor(), s.c.floor()
    fa, fc = s.a - a0, s.c - c0
    a0, c0 = a0.long(), c0.long()
    # Table keys are linear in (a', c'): corner (a0 + i, c0 + j) is key00 + i da + j dc.
    # A corner of weight 0 (every corner but the first on the integer grid) keeps key00,
    # so the set of distinct tables, hence Fisher's arithmetic, is the threshold split's
    # on 0/1 rewards. (c may exceed G - K by a rounding error: that corner stays key00.)
    base = int(G.max()) + 1 if G.numel() else 1
    key00 = ((a0 * base + K) * base + c0) * base + G
    da = torch.where((fa > 0) & (a0 < K), base**3, 0)
    dc = torch.where((fc > 0) & (c0 < R), base, 0)
    keys = torch.stack([key00, key00 + da, key00 + dc, key00 + da + dc])
    uniq, inv = unique_small_keys(keys.reshape(-1), base**4)
    ua, uk, uc, ug = uniq // base**3, (uniq // base**2) % base, (uniq // base) % base, uniq % base
    p_u = stats.fisher_exact_pvalue(ua, uk - ua, uc, ug - uk - uc)
    inv = inv.view(keys.shape)
    ga, gc = 1 - fa, 1 - fc

    def interpolate(x: torch.Tensor) -> torch.Tensor:
        x = x[inv]
        return ga * gc * x[0] + fa * gc * x[1] + ga * fc * x[2] + fa * fc * x[3]

    return (interpolate(p_u) if with_p else None), interpolate(stats.fisher_score(p_u))


def _information_gain(s: _Soft) -> torch.Tensor:
    """IG~ in bits, the operations of :func:`ktae.core.stats.information_gain`."""
    n = s.G.to(torch.float64)
    r1, r0 = s.K, s.G - s.K
    h_y = stats.entropy_bits(s.a + s.c, s.G)
    h_y_x = ((r1 / n.clamp_min(1)) * stats.entropy_bits(s.a, r1)
             + (r0 / n.clamp_min(1)) * stats.entropy_bits(s.c, r0))
    return (h_y - h_y_x).clamp_min(0.0)


def _cohens_h(s: _Soft) -> torch.Tensor:
    """h~; n_T, n_F >= 1 in a graded group (its best has w = 1, its worst w = 0), so the
    clamp only guards groups whose values are 0 anyway."""
    p_t = s.a / (s.a + s.c).clamp_min(1)
    p_f = s.b / (s.b + s.d).clamp_min(1)
    return pointwise.asin(p_t.sqrt()) - pointwise.asin(p_f.sqrt())


def _term_frequencies(s: _Graded, k1: float, b: float):
    """TF~_T and TF~_F ``[U]`` (Eq. 8) on weighted counts and lengths.

    ``f = count / max(L, 1)``: a soft class holding less than one token of text counts as
    one token long, so f -> 0 as L -> 0 (count <= L) instead of jumping from count / L to
    the empty class's 0; on integer lengths it is docs/method.md §3's rule.
    """
    def one(count, length, other):
        inv_len = torch.where(length > 0, 1.0 / length.clamp_min(1), 0.0)
        sat = k1 * (1 - b + b * length / ((length + other) / 2).clamp_min(1e-12))
        f = count * inv_len[s.cnt.group]
        return f * (k1 + 1) / (f + sat[s.cnt.group]).clamp_min(1e-300)

    return one(s.count_t, s.len_t, s.len_f), one(s.count_f, s.len_f, s.len_t)


def _keep(s: _Graded, opts: KTAEOptions) -> torch.Tensor:
    keep = s.graded[s.cnt.group]
    if opts.ngram == 1 and opts.ignore_token_ids:
        ids = torch.tensor(opts.ignore_token_ids, dtype=s.cnt.token.dtype,
                           device=s.cnt.token.device)
        keep &= ~torch.isin(s.cnt.token, ids)
    return keep


def _statistics(s: _Graded, opts: KTAEOptions, with_p: bool = True):
    """``(p~ or None, F~, IG~, TF~_T, TF~_F, D~)``, each ``[U]``."""
    tables, inv = _soft_tables(s)
    p, fisher = _interpolated_fisher(tables, with_p)
    ig, h = _information_gain(tables), _cohens_h(tables)
    if inv is not None:
        p = None if p is None else p[inv]
        fisher, ig, h = fisher[inv], ig[inv], h[inv]
    tf_t, tf_f = _term_frequencies(s, opts.k1, opts.b)
    dirn = stats.direction(h, tf_t, tf_f, opts.h3)
    return p, fisher, ig, tf_t, tf_f, dirn


# ------------------------------------------------------------------ entry points


def graded_token_values(token_ids: torch.Tensor, mask: torch.Tensor, gid: torch.Tensor,
                        num_groups: int, w: torch.Tensor, opts: KTAEOptions,
                        dtype: torch.dtype) -> torch.Tensor:
    """``[M]`` graded key-token values of the real tokens (row-major), in ``dtype``.

    Args:
        token_ids, mask: ``[B, T]``; gid: ``[B]`` dense group ids; w: ``[B]`` float64
            memberships (:func:`soft_membership`); opts: validated options.
    """
    s, spans = _count(token_ids, mask, gid, num_groups, w, opts)
    _, fisher, ig, tf_t, tf_f, dirn = _statistics(s, opts, with_p=False)
    weight = (opts.h1 * fisher + opts.h2 * ig) / (opts.h1 + opts.h2)
    value = stats.scale_key_value(weight * dirn, opts.top, opts.variant)
    value = torch.where(_keep(s, opts), value, torch.zeros_like(value))
    if spans is None:
        return s.cnt.spread(value.to(dtype))
    return reduce_to_tokens(s.cnt.spread(value), spans, opts.ngram_reduce).to(dtype)


def graded_table(token_ids: torch.Tensor, mask: torch.Tensor, gid: torch.Tensor,
                 num_groups: int, w: torch.Tensor, opts: KTAEOptions
                 ) -> tuple[KeyTokenTable, TokenCounts, Spans | None]:
    """The :class:`KeyTokenTable` of the graded statistics (a, b, c, d are the soft
    counts, ``p_value`` and ``fisher`` the interpolated p~ and F~), with the counts and
    spans behind it (for the span column)."""
    s, spans = _count(token_ids, mask, gid, num_groups, w, opts)
    p, fisher, ig, tf_t, tf_f, dirn = _statistics(s, opts)
    value = stats.scale_key_value((opts.h1 * fisher + opts.h2 * ig) * dirn
                                  / (opts.h1 + opts.h2), opts.top, opts.variant)
    value = torch.where(_keep(s, opts), value, torch.zeros_like(value))
    tables, inv = _soft_tables(s)
    if inv is not None:
        tables = tables.take(inv)
    table = KeyTokenTable(s.cnt.group, s.cnt.token, tables.a, tables.b, tables.c, tables.d,
                          p, fisher, ig, tf_t, tf_f, dirn, value)
    return table, s.cnt, spans
