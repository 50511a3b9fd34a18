"""KTAE as the authors' released runtime computes it, quirks included (docs/method.md §4).

Users reproducing the paper's numbers need the runtime's values, which differ from the
exact statistics on 10-30% of tokens. Reproduced here, vectorised:

- every statistic in float32;
- Fisher p as the float32 sum, along the last dimension, of a ``[tokens, K]`` grid of
  hypergeometric probabilities ``p_k`` (kept where ``p_k <= p_obs`` with no tolerance,
  0 elsewhere), ``K = 1 +`` the largest ``min(R1, C1)`` among the group's tokens, column
  ``k`` holding ``p_k``; ``F = exp(-2 p)`` unless ``p == 1.0`` exactly, then 0 (so most
  tables whose exact p is 1 still get ``exp(-2) ~ 0.135``, and tied terms can be dropped);
- Cohen's h with ``a / (a + c + 1e-10)`` and ``b / (b + d + 1e-10)`` clamped to [0, 1].

The float32 sum over a row depends only on the row's values and K, so the grid is built
once per distinct (table, K) and gathered back.

Two of these float32 decisions depend on the CPU's kernels (vector width, or
``ATEN_CPU_CAPABILITY``), in the released runtime as here: ``p == 1.0`` for a table whose
exact p is 1, and ``p_k <= p_obs`` for a term that ties the observed probability exactly.
This module computes the same float32 terms and row sums with torch, so it takes the side
the released code takes on the same machine and torch build; on another CPU both may take
the other one for such tables.
"""

from __future__ import annotations

import torch

from ktae.core import pointwise, stats
from ktae.core.ktae_table import KeyTokenTable
from ktae.core.token_counts import TokenCounts, unique_small_keys

_F32 = torch.float32


def _lgc(n: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    n = n.to(_F32)
    k = k.to(_F32)
    return pointwise.lgamma(n + 1) - pointwise.lgamma(k + 1) - pointwise.lgamma(n - k + 1)


def runtime_fisher_pvalue(a, b, c, d, width) -> torch.Tensor:
    """The runtime's float32 two-sided p-value on a grid of ``width`` columns ``k = 0..K-1``."""
    a, b, c, d, width = (torch.as_tensor(x).to(torch.int64) for x in (a, b, c, d, width))
    n = a + b + c + d
    r1, c1 = a + b, a + c
    lo = (r1 + c1 - n).clamp_min(0)
    hi = torch.minimum(r1, c1)
    if a.numel() == 0:
        return torch.zeros(a.shape, dtype=_F32)
    kmax = int(width.max().item())
    k = torch.arange(kmax, device=a.device)[None, :].expand(a.numel(), kmax)
    in_support = (k >= lo[:, None]) & (k <= hi[:, None]) & (k < width[:, None])
    kk = torch.minimum(torch.maximum(k, lo[:, None]), hi[:, None])
    log_norm = _lgc(n, r1)[:, None]
    p_k = pointwise.exp(_lgc(c1[:, None], kk) + _lgc((n - c1)[:, None], r1[:, None] - kk) - log_norm)
    p_obs = pointwise.exp(_lgc(c1, a) + _lgc(n - c1, r1 - a) - log_norm[:, 0])
    grid = torch.where(in_support & (p_k <= p_obs[:, None]), p_k, torch.zeros_like(p_k))
    # Rows narrower than kmax: their zero columns beyond K do not change a float32 row sum
    # only if summed in the same width; sum each distinct width separately.
    out = torch.empty(a.numel(), dtype=_F32, device=a.device)
    for w in torch.unique(width).tolist():  # a handful of widths (<= group size + 1)
        rows = (width == w).nonzero().squeeze(1)
        out[rows] = grid[rows, :w].sum(dim=-1)
    return out


def runtime_table_terms(a, bb, c, d) -> tuple[torch.Tensor, torch.Tensor]:
    """The runtime's float32 information gain and Cohen's h of tables ``[[a, bb], [c, d]]``."""
    n = a + bb + c + d
    r1, c1 = a + bb, a + c
    nf = n.to(_F32)
    h_y = stats.entropy_bits(c1, n, _F32)
    h_y_x = ((r1.to(_F32) / nf) * stats.entropy_bits(a, r1, _F32)
             + ((c + d).to(_F32) / nf) * stats.entropy_bits(c, c + d, _F32))
    p_t = (a.to(_F32) / (a + c).to(_F32).add(1e-10)).clamp(0.0, 1.0)
    p_f = (bb.to(_F32) / (bb + d).to(_F32).add(1e-10)).clamp(0.0, 1.0)
    return h_y - h_y_x, pointwise.asin(p_t.sqrt()) - pointwise.asin(p_f.sqrt())


def runtime_fisher_score(p: torch.Tensor) -> torch.Tensor:
    """``F = exp(-2 p)`` unless the float32 ``p`` is exactly 1.0, then 0 (the runtime's rule)."""
    return torch.where(p == 1.0, torch.zeros_like(p), pointwise.exp(-2.0 * p))


def reference_table(cnt: TokenCounts, *, h1, h2, h3, k1, b, top, variant, tables=None):
    """The runtime's per-(group, token) statistics, as a ``KeyTokenTable`` (float32).

    ``tables``: the call's :class:`ktae.core.table_stats.ReferenceTableStats`, whose rows
    give p, F, IG and h of each pair's table and width (else evaluated here per distinct
    table and width)."""
    a, bb = cnt.a, cnt.b
    c, d = cnt.n_correct - a, cnt.n_incorrect - bb
    r1, c1 = a + bb, a + c
    # K per group: 1 + the largest min(R1, C1) among the group's present tokens.
    num_groups = int(cnt.group.max().item()) + 1 if cnt.group.numel() else 0
    gk = torch.zeros(num_groups, dtype=torch.int64, device=a.device)
    gk.scatter_reduce_(0, cnt.group, torch.minimum(r1, c1), reduce="amax")
    width = gk.index_select(0, cnt.group) + 1

    if tables is not None:
        rows = tables.rows(a, bb, cnt.group, cnt.group_n_correct, cnt.group_n_incorrect)
        p, fisher = tables.fisher_at(rows, width)
        ig, h = tables.info_gain.index_select(0, rows), tables.cohens_h.index_select(0, rows)
    else:
        n = a + bb + c + d
        base = int(n.max().item()) + 2 if a.numel() else 2
        tkey = (((a * base + bb) * base + c) * base + d) * base + width
        uniq, inv = unique_small_keys(tkey, base**5)
        uw = uniq % base
        ud = (uniq // base) % base
        uc = (uniq // base**2) % base
        ub = (uniq // base**3) % base
        ua = uniq // base**4
        p = runtime_fisher_pvalue(ua, ub, uc, ud, uw)[inv]
        fisher = runtime_fisher_score(p)
        ig, h = runtime_table_terms(a, bb, c, d)

    def tf(count, length, other):
        count, length, other = count.to(_F32), length.to(_F32), other.to(_F32)
        f = torch.where(length > 0, count / length.clamp_min(1), torch.zeros_like(count))
        avg = ((length + other) / 2).clamp_min(1e-12)
        kk = k1 * (1 - b + b * length / avg)
        denom = f + kk
        return torch.where(f > 0, f * (k1 + 1) / torch.where(denom > 0, denom, 1.0), torch.zeros_like(f))

    tf_t = tf(cnt.count_correct, cnt.len_correct, cnt.len_incorrect)
    tf_f = tf(cnt.count_incorrect, cnt.len_incorrect, cnt.len_correct)
    eps = stats.TF_RATIO_EPS
    dirn = h + h3 * (tf_t / (tf_f + eps) - tf_f / (tf_t + eps))
    value = stats.scale_key_value((h1 * fisher + h2 * ig) * dirn / (h1 + h2), top, variant)
    return KeyTokenTable(cnt.group, cnt.token, a, bb, c, d, p, fisher, ig, tf_t, tf_f, dirn, value)
