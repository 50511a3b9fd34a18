"""KTAE's two classes from the rewards: the threshold split and the graded split.

``split="threshold"`` (SPEC 2, the default) makes each response correct (T) or incorrect
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
- h1 = 0 removes F~, h2 = 0 removes IG~ and h3 = 0 removes the TF contrast, as in SPEC 2.

A group whose rewards are equal up to rounding has no membership (w = 0) and values 0,
like a group with one class under the threshold split. The same rule makes the threshold
split of such a group one class (its rewards differ by rounding only), so both splits
give it zero advantages, as the baselines do.
"""

from __future__ import annotations

import torch

from ktae.core import stats
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
    """``[B]`` bool ``reward > threshold`` (SPEC 2), a group whose rewards are equal up to
    rounding taken as one class (by its largest reward): rounding does not split it."""
    flat = equal_reward_groups(rewards, gid, num_groups)[gid]
    top = _group_extreme(rewards, gid, num_groups, "amax")[gid]
    return torch.where(flat, top, rewards) > threshold


# ------------------------------------------------------------------ soft counts


class _Graded:
    """Soft counts of one chunk: per (group, unit) pair ``[U]`` and per group ``[P]``."""

    def __init__(self, cnt: TokenCounts, row: torch.Tensor, row_len: torch.Tensor,
                 gid: torch.Tensor, num_groups: int, w: torch.Tensor):
        dev = w.device
        f64 = torch.float64
        u = cnt.run_length.numel()
        # Sorted units are grouped by pair, and within a pair by response (count_units
        # sorts on (group, unit, class, rank in group)): a new response starts a run.
        rs = row.index_select(0, cnt.order)
        pid = torch.repeat_interleave(torch.arange(u, device=dev), cnt.run_length)
        new = torch.ones(rs.numel(), dtype=torch.bool, device=dev)
        if rs.numel():
            new[1:] = (pid[1:] != pid[:-1]) | (rs[1:] != rs[:-1])
        wr = w.index_select(0, rs)
        self.cnt = cnt
        self.K = cnt.a + cnt.b  # responses containing the unit (one class in count_units)
        self.a = torch.zeros(u, dtype=f64, device=dev).index_add_(
            0, pid, torch.where(new, wr, torch.zeros_like(wr)))
        self.count_t = torch.zeros(u, dtype=f64, device=dev).index_add_(0, pid, wr)
        self.count_f = cnt.run_length - self.count_t
        size = torch.bincount(gid, minlength=num_groups)
        n_t = torch.zeros(num_groups, dtype=f64, device=dev).index_add_(0, gid, w)
        self.len_t = torch.zeros(num_groups, dtype=f64, device=dev).index_add_(0, gid,
                                                                              w * row_len)
        len_all = torch.zeros(num_groups, dtype=torch.int64, device=dev).index_add_(0, gid,
                                                                                    row_len)
        self.len_f = len_all - self.len_t
        # w = 1 occurs (at the best response) exactly in the groups with a membership
        self.graded = torch.zeros(num_groups, dtype=torch.int64, device=dev).index_add_(
            0, gid, (w == 1.0).long()) > 0
        g = cnt.group
        self.G = size[g]
        self.b = (self.K - self.a).clamp_min(0.0)
        self.c = (n_t[g] - self.a).clamp_min(0.0)
        self.d = ((self.G - n_t[g]) - self.b).clamp_min(0.0)


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


def _interpolated_fisher(s: _Graded) -> tuple[torch.Tensor, torch.Tensor]:
    """``(p~, F~)`` ``[U]``: p and F of the four integer tables around each soft table,
    interpolated bilinearly in (a, c); each distinct integer table evaluated once."""
    K, G = s.K, s.G
    R = G - K  # responses without the unit
    a0, c0 = s.a.floor(), s.c.floor()
    fa, fc = s.a - a0, s.c - c0
    a0 = a0.long().clamp(min=torch.zeros_like(K), max=K)
    c0 = c0.long().clamp(min=torch.zeros_like(R), max=R)
    a_corner = torch.stack([a0, torch.minimum(a0 + 1, K), a0, torch.minimum(a0 + 1, K)])
    c_corner = torch.stack([c0, c0, torch.minimum(c0 + 1, R), torch.minimum(c0 + 1, R)])
    weight = torch.stack([(1 - fa) * (1 - fc), fa * (1 - fc), (1 - fa) * fc, fa * fc])
    need = weight > 0  # the first corner always (fa, fc < 1); all four only off the grid
    base = int(G.max()) + 1 if G.numel() else 1
    key = ((a_corner * base + K) * base + c_corner) * base + G
    uniq, inv = unique_small_keys(key[need], base**4)
    ua, uk, uc, ug = uniq // base**3, (uniq // base**2) % base, (uniq // base) % base, uniq % base
    p_u = stats.fisher_exact_pvalue(ua, uk - ua, uc, ug - uk - uc)
    f_u = stats.fisher_score(p_u)
    p = torch.zeros_like(weight).index_put_((need,), p_u[inv])
    f = torch.zeros_like(weight).index_put_((need,), f_u[inv])
    return (weight * p).sum(0), (weight * f).sum(0)


def _information_gain(s: _Graded) -> torch.Tensor:
    """IG~ in bits, the operations of :func:`ktae.core.stats.information_gain`."""
    n = s.G.to(torch.float64)
    r1, r0 = s.K, s.G - s.K
    h_y = stats.entropy_bits(s.a + s.c, s.G)
    h_y_x = ((r1 / n.clamp_min(1)) * stats.entropy_bits(s.a, r1)
             + (r0 / n.clamp_min(1)) * stats.entropy_bits(s.c, r0))
    return (h_y - h_y_x).clamp_min(0.0)


def _cohens_h(s: _Graded) -> torch.Tensor:
    """h~; n_T, n_F >= 1 in a graded group (its best has w = 1, its worst w = 0), so the
    clamp only guards groups whose values are 0 anyway."""
    p_t = s.a / (s.a + s.c).clamp_min(1)
    p_f = s.b / (s.b + s.d).clamp_min(1)
    return torch.asin(p_t.sqrt()) - torch.asin(p_f.sqrt())


def _term_frequencies(s: _Graded, k1: float, b: float):
    """TF~_T and TF~_F ``[U]`` (Eq. 8) on weighted counts and lengths.

    ``f = count / max(L, 1)``: a soft class holding less than one token of text counts as
    one token long, so f -> 0 as L -> 0 (count <= L) instead of jumping from count / L to
    the empty class's 0; on integer lengths it is SPEC 2's rule.
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


def _statistics(s: _Graded, opts: KTAEOptions):
    p, fisher = _interpolated_fisher(s)
    ig = _information_gain(s)
    tf_t, tf_f = _term_frequencies(s, opts.k1, opts.b)
    dirn = stats.direction(_cohens_h(s), tf_t, tf_f, opts.h3)
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
    _, fisher, ig, tf_t, tf_f, dirn = _statistics(s, opts)
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
    table = KeyTokenTable(s.cnt.group, s.cnt.token, s.a, s.b, s.c, s.d, p, fisher, ig,
                          tf_t, tf_f, dirn, value)
    return table, s.cnt, spans
