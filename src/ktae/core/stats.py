"""Contingency-table statistics of KTAE (paper section 3, Eq. 4-8), elementwise.

Every function takes the 2x2 table of one token in one group,

    ============  =========  ===========
                  correct    incorrect
    ============  =========  ===========
    present       a          b
    absent        c          d
    ============  =========  ===========

as broadcastable integer tensors and returns a float64 tensor. They are exact (float64,
log space) and vectorised: callers evaluate them once per *distinct* table.

References:
    KTAE: Key-token Advantage Estimation in Mathematical Reasoning (NeurIPS 2025), Eq. 4-9.
    R. A. Fisher, "On the interpretation of chi-squared from contingency tables" (1922).
    scipy.stats.fisher_exact (the two-sided rule and its 1e-7 relative tolerance).
"""

from __future__ import annotations

import math

import torch

from ktae.core import pointwise

#: Relative tolerance when comparing hypergeometric probabilities to the observed one,
#: as scipy.stats.fisher_exact does (tables of equal probability count as "as extreme").
FISHER_RTOL = 1e-7
#: A p-value at least this close to 1 counts as 1 ("no evidence of association").
P_ONE_ATOL = 1e-9
#: Stabiliser of the term-frequency ratio in the direction term (Eq. 9).
TF_RATIO_EPS = 1e-5


def _table(a, b, c, d) -> tuple[torch.Tensor, ...]:
    ts = [torch.as_tensor(x) for x in (a, b, c, d)]
    for name, t in zip("abcd", ts, strict=True):
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"{name}: expected integer counts, got dtype {t.dtype}")
        if t.numel() and bool((t < 0).any()):
            raise ValueError(f"{name}: expected non-negative counts")
    return tuple(torch.broadcast_tensors(*[t.to(torch.int64) for t in ts]))


def log_binom(n: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``log C(n, k)`` in float64 via lgamma (``n >= k >= 0``)."""
    n = n.to(torch.float64)
    k = k.to(torch.float64)
    return pointwise.lgamma(n + 1) - pointwise.lgamma(k + 1) - pointwise.lgamma(n - k + 1)


def fisher_exact_pvalue(a, b, c, d) -> torch.Tensor:
    """Two-sided Fisher exact test p-value of ``[[a, b], [c, d]]`` (paper Eq. 4-5).

    The sum of the hypergeometric probabilities of every table with the same margins
    that is no more probable than the observed one (within a relative tolerance of
    ``1e-7``, as :func:`scipy.stats.fisher_exact`), computed in float64 log space.

    Args:
        a, b, c, d: broadcastable non-negative integer tensors.

    Returns:
        float64 tensor of p-values in ``[0, 1]``; 1 for a table with an empty margin.

    Examples:
        >>> fisher_exact_pvalue(torch.tensor(3), 0, 0, 3)
        tensor(0.1000, dtype=torch.float64)
    """
    a, b, c, d = _table(a, b, c, d)
    n = a + b + c + d
    r1 = a + b  # tokens present
    c1 = a + c  # correct responses
    lo = (r1 + c1 - n).clamp_min(0)
    hi = torch.minimum(r1, c1)
    flat = [t.reshape(-1) for t in (a, n, r1, c1, lo, hi)]
    a_, n_, r1_, c1_, lo_, hi_ = flat
    if a_.numel() == 0:
        return torch.zeros(a.shape, dtype=torch.float64, device=a.device)
    width = int((hi_ - lo_).max().item()) + 1
    k = lo_[:, None] + torch.arange(width, device=a.device)[None, :]
    valid = k <= hi_[:, None]
    k = torch.minimum(k, hi_[:, None])
    logp = (log_binom(c1_[:, None], k) + log_binom((n_ - c1_)[:, None], r1_[:, None] - k)
            - log_binom(n_, r1_)[:, None])
    logp_obs = (log_binom(c1_, a_) + log_binom(n_ - c1_, r1_ - a_) - log_binom(n_, r1_))
    keep = valid & (logp <= logp_obs[:, None] + math.log1p(FISHER_RTOL))
    terms = torch.where(keep, pointwise.exp(logp), torch.zeros_like(logp))
    # Each row summed over its own support only, so that a table's p does not depend on
    # the widest table it is evaluated with (a float sum's rounding depends on its length).
    own = hi_ - lo_ + 1
    p = torch.empty(own.shape, dtype=torch.float64, device=a.device)
    for w in torch.unique(own).tolist():  # a handful of widths (<= the group size + 1)
        rows = (own == w).nonzero().squeeze(1)
        p[rows] = terms[rows, :w].sum(dim=1)
    return p.clamp_(0.0, 1.0).reshape(a.shape)


def fisher_score(p: torch.Tensor) -> torch.Tensor:
    """``F = exp(-2 p)``, and 0 when ``p`` is 1 (no evidence of association)."""
    return torch.where(p >= 1.0 - P_ONE_ATOL, torch.zeros_like(p), pointwise.exp(-2.0 * p))


def entropy_bits(pos: torch.Tensor, total: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """Binary entropy (bits) of ``pos/total``; 0 for an empty or pure split."""
    q = pos.to(dtype) / total.to(dtype).clamp_min(1)
    safe = (q > 0) & (q < 1)
    qs = torch.where(safe, q, torch.full_like(q, 0.5))
    h = -(qs * pointwise.log2(qs) + (1 - qs) * pointwise.log2(1 - qs))
    return torch.where(safe, h, torch.zeros_like(h))


def information_gain(a, b, c, d) -> torch.Tensor:
    """Information gain (bits) of correctness from token presence (paper Eq. 6-7).

    ``IG = H(Y) - H(Y | X)`` with Y = correct, X = token present, ``0 log 0 = 0``.

    Examples:
        >>> information_gain(torch.tensor(2), 0, 0, 2)
        tensor(1., dtype=torch.float64)
    """
    a, b, c, d = _table(a, b, c, d)
    n = (a + b + c + d).to(torch.float64)
    r1, r0 = a + b, c + d
    h_y = entropy_bits(a + c, a + b + c + d)
    h_y_x = (r1 / n.clamp_min(1)) * entropy_bits(a, r1) + (r0 / n.clamp_min(1)) * entropy_bits(c, r0)
    return (h_y - h_y_x).clamp_min(0.0)


def bm25_term_frequency(count, length, other_length, *, k1: float = 2.0, b: float = 0.5) -> torch.Tensor:
    """BM25-style saturated term frequency of one class (paper Eq. 8, runtime form).

    With ``f = count / length`` (relative frequency in the class's concatenated
    responses), ``avg = (length + other_length) / 2`` and
    ``K = k1 * (1 - b + b * length / avg)``: ``TF = f * (k1 + 1) / (f + K)``.
    A class holding no tokens (``length == 0``) has ``f = 0`` and ``TF = 0``.

    Args:
        count: occurrences of the token in the class (masked tokens only).
        length: L, number of tokens in the class's responses.
        other_length: the other class's L.
        k1, b: BM25 saturation and length-normalisation parameters.
    """
    if k1 < 0 or not 0.0 <= b <= 1.0:
        raise ValueError(f"k1, b: expected k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
    count = torch.as_tensor(count).to(torch.float64)
    length = torch.as_tensor(length).to(torch.float64)
    other_length = torch.as_tensor(other_length).to(torch.float64)
    f = torch.where(length > 0, count / length.clamp_min(1), torch.zeros_like(count))
    avg = ((length + other_length) / 2).clamp_min(1e-12)
    k = k1 * (1 - b + b * length / avg)
    denom = f + k
    return torch.where(f > 0, f * (k1 + 1) / torch.where(denom > 0, denom, 1.0), torch.zeros_like(f))


def cohens_h(a, b, c, d) -> torch.Tensor:
    """Cohen's h between presence rates: ``asin(sqrt(a/(a+c))) - asin(sqrt(b/(b+d)))``.

    Empty columns (no correct or no incorrect responses) count as rate 0.
    """
    a, b, c, d = _table(a, b, c, d)
    p_t = a.to(torch.float64) / (a + c).clamp_min(1)
    p_f = b.to(torch.float64) / (b + d).clamp_min(1)
    return pointwise.asin(p_t.sqrt()) - pointwise.asin(p_f.sqrt())


def scale_key_value(k: torch.Tensor, top: float, variant: str = "runtime") -> torch.Tensor:
    """Key-token value from the weighted direction ``k`` (Eq. 10's scaling).

    ``variant="runtime"`` (the released runtime): ``top * (2 sigmoid(k) - 1)``, in
    ``(-top, top)``; ``variant="paper"`` (paper Eq. 10): ``top * (sigmoid(k) - 0.5)``.
    """
    if variant == "paper":
        return top * (pointwise.sigmoid(k) - 0.5)
    return top * (2.0 * pointwise.sigmoid(k) - 1.0)


def direction(h: torch.Tensor, tf_correct: torch.Tensor, tf_incorrect: torch.Tensor,
              h3: float = 1.0) -> torch.Tensor:
    """Direction of association (Eq. 9): Cohen's h plus ``h3`` times the TF contrast."""
    contrast = tf_correct / (tf_incorrect + TF_RATIO_EPS) - tf_incorrect / (tf_correct + TF_RATIO_EPS)
    return h + h3 * contrast
