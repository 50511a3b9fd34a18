"""Slow, plain reference implementations of docs/method.md §2, §3 and §4, for tests.

Nothing here is vectorised: every function loops in Python over groups and distinct
tokens and writes each equation the way docs/method.md states it, so that the library's
vectorised code can be checked against an implementation that is easy to read.

- :func:`exact_ktae` / :func:`exact_token_stats`: docs/method.md §2 and §3 in float64, with the
  two-sided Fisher p-value taken from ``scipy.stats.fisher_exact``.
- :func:`graded_token_stats`: KTAE's graded split (ktae.core.ktae_graded), the
  module docstring's equations one by one, Fisher's p from scipy at each integer corner.
- :func:`runtime_ktae`: docs/method.md §4, an emulation of the authors' released runtime with its
  float32 quirks, in the per-group loop style of that runtime.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from functools import cache

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import HealthCheck
from hypothesis import strategies as st

GRPO_EPS = 1e-6
EQUAL_REWARDS_RTOL = 2.0**-20  # rewards this close, relative to their magnitude, are equal
TF_EPS = 1e-5
P_ONE_TOL = 1e-9
QWEN_EOS_ID = 151643
MAXABS_RTOL = 1e-9  # near-equal magnitudes are ties under ngram_reduce="maxabs"
# Hypothesis settings of the property tests against this oracle (deterministic examples).
SETTINGS = dict(deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def examples(n: int) -> dict:
    """``SETTINGS`` with ``n`` examples, scaled by ``KTAE_TEST_EXAMPLES`` (a fraction, 1 by
    default). The CI sweep over CPU kernels and thread counts runs the property tests on a
    tenth of their examples: it looks for results that depend on the machine, which show
    on the first examples as well as on all of them."""
    scale = float(os.environ.get("KTAE_TEST_EXAMPLES", "1"))
    return {**SETTINGS, "max_examples": max(1, round(n * scale))}
# The floating-point columns of ktae.key_token_table compared with the oracle's.
FLOAT_FIELDS = ("p_value", "fisher", "info_gain", "tf_correct", "tf_incorrect", "direction",
                "value")


# --------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Run a test module with one torch thread (fast and steady on a busy 2-core CPU), or
    with ``KTAE_TEST_THREADS`` threads when set (the CI sweep runs the numeric tests at 1
    and 2 threads, so a result that depends on the thread count fails there).

    Import it into a test module (``from oracle import single_thread``) to activate it.
    """
    n = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("KTAE_TEST_THREADS", "1")))
    yield
    torch.set_num_threads(n)


def _np(x, dtype=None) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            x = x.float()
        x = x.numpy()
    arr = np.asarray(x)
    return arr.astype(dtype) if dtype is not None else arr


def _labels(group) -> list:
    """Group labels as a list of hashables (tensors/arrays -> Python ints)."""
    if isinstance(group, (torch.Tensor, np.ndarray)):
        return [int(g) for g in _np(group).tolist()]
    return list(group)


def _groups_in_order(labels: list) -> dict:
    """label -> list of row indices, labels in order of first appearance."""
    out: dict = {}
    for i, g in enumerate(labels):
        out.setdefault(g, []).append(i)
    return out


def _responses(token_ids: np.ndarray, mask: np.ndarray, rows: list[int]) -> list[list[int]]:
    """The masked tokens of each response, in order."""
    return [[int(t) for t, m in zip(token_ids[i], mask[i], strict=True) if m] for i in rows]


def response_spans(token_ids: np.ndarray, mask: np.ndarray, i: int, n: int,
                   ignored: set) -> list[tuple[int, tuple]]:
    """The spans of response ``i`` as ``(first column, token ids)``, left to right.

    A span is n consecutive columns of the row, all real (mask 1), none holding an
    ignored id when n > 1 (a unigram of an ignored id is counted: its value is 0).
    """
    out = []
    T = token_ids.shape[1]
    for t in range(T - n + 1):
        cols = range(t, t + n)
        if not all(mask[i, c] for c in cols):
            continue
        ids = tuple(int(token_ids[i, c]) for c in cols)
        if n > 1 and any(x in ignored for x in ids):
            continue
        out.append((t, ids))
    return out


def _entropy_bits(counts: list[float]) -> float:
    total = sum(counts)
    if total == 0:
        return 0.0
    h = 0.0
    for c in counts:
        if c > 0:  # 0 log 0 = 0
            q = c / total
            h -= q * math.log2(q)
    return h


def information_gain_bits(a: int, b: int, c: int, d: int) -> float:
    """docs/method.md §3, Eq. 6-7: ``IG = H(Y) - H(Y|X)`` in bits, Y = correct, X = token present."""
    n = a + b + c + d
    if n == 0:
        return 0.0
    h_y = _entropy_bits([a + c, b + d])
    h_y_x = ((a + b) / n) * _entropy_bits([a, b]) + ((c + d) / n) * _entropy_bits([c, d])
    return h_y - h_y_x


@cache  # tables repeat a lot across tokens and batches
def fisher_pvalue(a: int, b: int, c: int, d: int) -> float:
    """Two-sided Fisher exact p-value of ``[[a, b], [c, d]]`` (scipy)."""
    return float(scipy.stats.fisher_exact([[a, b], [c, d]], alternative="two-sided")[1])


def fisher_score(p: float) -> float:
    """docs/method.md §3, Eq. 4-5: ``F = exp(-2p)``; 0 when ``p >= 1 - 1e-9`` (no evidence)."""
    return math.exp(-2.0 * p) if p < 1.0 - P_ONE_TOL else 0.0


def bm25_tf(count: int, length: int, other_length: int, k1: float, b: float) -> float:
    """docs/method.md §3, Eq. 8 (released-runtime form) for one class; 0 for a class with no tokens."""
    if length == 0:
        return 0.0
    f = count / length
    if f == 0:
        return 0.0
    avg = (length + other_length) / 2.0
    K = k1 * (1.0 - b + b * length / avg)
    return f * (k1 + 1.0) / (f + K)


def rewards_equal(r: list[float]) -> bool:
    """The group's rewards are equal up to rounding: spread <= 2**-20 * largest magnitude."""
    return max(r) - min(r) <= EQUAL_REWARDS_RTOL * max(abs(x) for x in r)


def base_advantages(rewards: np.ndarray, groups: dict, base: str) -> np.ndarray:
    """docs/method.md §2: sequence-level advantages ``[B]`` in float64, one group at a time; 0 in a
    group of two or more whose rewards are equal up to rounding."""
    adv = np.zeros(len(rewards), dtype=np.float64)
    for rows in groups.values():
        r = [float(rewards[i]) for i in rows]
        n = len(r)
        if n > 1 and rewards_equal(r):
            continue
        if base == "grpo":
            if n == 1:
                mean, std = 0.0, 1.0
            else:
                mean = sum(r) / n
                std = math.sqrt(sum((x - mean) ** 2 for x in r) / (n - 1))
            for i, x in zip(rows, r, strict=True):
                adv[i] = (x - mean) / (std + GRPO_EPS)
        elif base == "drgrpo":
            mean = 0.0 if n == 1 else sum(r) / n
            for i, x in zip(rows, r, strict=True):
                adv[i] = x - mean
        elif base == "rloo":
            for j, (i, x) in enumerate(zip(rows, r, strict=True)):
                others = r[:j] + r[j + 1:]
                adv[i] = x - sum(others) / len(others) if others else 0.0
        else:
            raise ValueError(f"base: unknown {base!r}")
    return adv


# --------------------------------------------------------------------- exact (docs/method.md §3)


def _correctness(rewards: np.ndarray, correct, reward_threshold: float) -> np.ndarray:
    if correct is not None:
        return _np(correct).astype(bool)
    return rewards > reward_threshold


def exact_token_stats(rewards, group, token_ids, mask, *, correct=None,
                      reward_threshold: float = 0.0, h1: float = 1.0, h2: float = 1.0,
                      h3: float = 1.0, k1: float = 2.0, b: float = 0.5, top: float = 1.0,
                      ignore_token_ids=(), variant: str = "runtime", ngram: int = 1,
                      **_unused) -> dict:
    """Per (group label, token id) statistics of docs/method.md §3, float64.

    Returns:
        ``{(label, token): {a, b, c, d, p_value, fisher, info_gain, tf_correct,
        tf_incorrect, direction, value}}`` for every token present (mask = 1) in a group,
        groups and tokens in order of first appearance. In a group without both classes,
        ``value`` is 0 and ``direction`` is NaN (Cohen's h is undefined there, so tests
        only require it to be finite in the library). Ignored ids keep their statistics
        and get value 0; their occurrences still count in the class lengths L_T, L_F.

        With ``ngram = n > 1`` the units are the spans of :func:`response_spans` and the
        keys ``(label, tuple of n token ids)``: a, b count the responses of each class
        holding the span, the counts and the lengths L_T, L_F count spans.
    """
    rewards = _np(rewards, np.float64)
    token_ids = _np(token_ids).astype(np.int64)
    mask = _np(mask).astype(bool)
    is_correct = _correctness(rewards, correct, reward_threshold)
    ignored = {int(t) for t in ignore_token_ids}
    stats: dict = {}
    for label, rows in _groups_in_order(_labels(group)).items():
        if ngram == 1:
            resp = _responses(token_ids, mask, rows)
        else:
            resp = [[ids for _, ids in response_spans(token_ids, mask, i, ngram, ignored)]
                    for i in rows]
        cls = [bool(is_correct[i]) for i in rows]
        if correct is None and rewards_equal([rewards[i] for i in rows]):
            cls = [max(rewards[i] for i in rows) > reward_threshold] * len(rows)
        n_t = sum(cls)
        n_f = len(rows) - n_t
        both = n_t > 0 and n_f > 0
        count_t, count_f = Counter(), Counter()
        has_t, has_f = Counter(), Counter()
        for toks, c in zip(resp, cls, strict=True):
            (count_t if c else count_f).update(toks)
            (has_t if c else has_f).update(set(toks))
        L_t, L_f = sum(count_t.values()), sum(count_f.values())
        order = list(dict.fromkeys(t for toks in resp for t in toks))
        for v in order:
            a, bb = has_t[v], has_f[v]
            c, d = n_t - a, n_f - bb
            p = fisher_pvalue(int(a), int(bb), int(c), int(d))
            F = fisher_score(p)
            ig = information_gain_bits(a, bb, c, d)
            tf_t = bm25_tf(count_t[v], L_t, L_f, k1, b)
            tf_f = bm25_tf(count_f[v], L_f, L_t, k1, b)
            if both:
                cohen = math.asin(math.sqrt(a / (a + c))) - math.asin(math.sqrt(bb / (bb + d)))
                D = cohen + h3 * (tf_t / (tf_f + TF_EPS) - tf_f / (tf_t + TF_EPS))
                k = (h1 * F + h2 * ig) * D / (h1 + h2)
                # 2 sigmoid(k) - 1 = tanh(k / 2), without overflow for large |k|
                if variant == "runtime":
                    value = top * math.tanh(k / 2.0)
                elif variant == "paper":
                    value = top * 0.5 * math.tanh(k / 2.0)
                else:
                    raise ValueError(f"variant: unknown {variant!r}")
                if v in ignored:
                    value = 0.0
            else:
                D, value = math.nan, 0.0
            stats[(label, v)] = dict(a=a, b=bb, c=c, d=d, p_value=p, fisher=F, info_gain=ig,
                                     tf_correct=tf_t, tf_incorrect=tf_f, direction=D,
                                     value=value)
    return stats


def _interpolated(fn, a: float, c: float, K: int, G: int) -> float:
    """``sum (1 - |a - a'|)(1 - |c - c'|) fn(a', K - a', c', G - K - c')`` over the integer
    tables (a', c') next to the soft one."""
    total = 0.0
    for a_ in (math.floor(a), math.floor(a) + 1):
        for c_ in (math.floor(c), math.floor(c) + 1):
            weight = (1 - abs(a - a_)) * (1 - abs(c - c_))
            if weight > 0 and 0 <= a_ <= K and 0 <= c_ <= G - K:
                total += weight * fn(a_, K - a_, c_, G - K - c_)
    return total


def _graded_tf(count: float, length: float, other_length: float, k1: float, b: float) -> float:
    """Eq. 8 on a soft class: ``f = count / max(L, 1)`` (0 when L = 0)."""
    if length <= 0 or count == 0:
        return 0.0
    f = count / max(length, 1.0)
    avg = (length + other_length) / 2.0
    K = k1 * (1.0 - b + b * length / avg)
    return f * (k1 + 1.0) / (f + K)


def graded_token_stats(rewards, group, token_ids, mask, *, h1: float = 1.0, h2: float = 1.0,
                       h3: float = 1.0, k1: float = 2.0, b: float = 0.5, top: float = 1.0,
                       ignore_token_ids=(), variant: str = "runtime", ngram: int = 1,
                       **_unused) -> dict:
    """Per (group label, token id or span) graded statistics (split="graded"), float64.

    Same keys and fields as :func:`exact_token_stats`; a, b, c, d are the soft counts.
    A group whose rewards are equal up to rounding has w = 0 and value 0.
    """
    rewards = _np(rewards, np.float64)
    token_ids = _np(token_ids).astype(np.int64)
    mask = _np(mask).astype(bool)
    ignored = {int(t) for t in ignore_token_ids}
    stats: dict = {}
    for label, rows in _groups_in_order(_labels(group)).items():
        r = [float(rewards[i]) for i in rows]
        graded = not rewards_equal(r)
        lo, hi = min(r), max(r)
        w = [(x - lo) / (hi - lo) if graded else 0.0 for x in r]
        if ngram == 1:
            resp = _responses(token_ids, mask, rows)
        else:
            resp = [[ids for _, ids in response_spans(token_ids, mask, i, ngram, ignored)]
                    for i in rows]
        G = len(rows)
        n_t = sum(w)
        n_f = G - n_t
        L_t = sum(wi * len(toks) for wi, toks in zip(w, resp, strict=True))
        L_f = sum((1 - wi) * len(toks) for wi, toks in zip(w, resp, strict=True))
        for v in dict.fromkeys(t for toks in resp for t in toks):
            has = [v in toks for toks in resp]
            K = sum(has)
            a = sum(wi for wi, h in zip(w, has, strict=True) if h)
            bb = K - a
            c, d = n_t - a, n_f - bb
            p = _interpolated(fisher_pvalue, a, c, K, G)
            F = _interpolated(lambda *t: fisher_score(fisher_pvalue(*t)), a, c, K, G)
            ig = information_gain_bits(a, bb, c, d)
            count_t = sum(wi * toks.count(v) for wi, toks in zip(w, resp, strict=True))
            count_f = sum((1 - wi) * toks.count(v) for wi, toks in zip(w, resp, strict=True))
            tf_t = _graded_tf(count_t, L_t, L_f, k1, b)
            tf_f = _graded_tf(count_f, L_f, L_t, k1, b)
            if graded:
                cohen = math.asin(math.sqrt(a / n_t)) - math.asin(math.sqrt(bb / n_f))
                D = cohen + h3 * (tf_t / (tf_f + TF_EPS) - tf_f / (tf_t + TF_EPS))
                k = (h1 * F + h2 * ig) * D / (h1 + h2)
                value = top * math.tanh(k / 2.0) * (0.5 if variant == "paper" else 1.0)
                if ngram == 1 and v in ignored:
                    value = 0.0
            else:
                D, value = math.nan, 0.0
            stats[(label, v)] = dict(a=a, b=bb, c=c, d=d, p_value=p, fisher=F, info_gain=ig,
                                     tf_correct=tf_t, tf_incorrect=tf_f, direction=D,
                                     value=value)
    return stats


def exact_ktae(rewards, group, token_ids, mask, *, base: str = "grpo", correct=None,
               reward_threshold: float = 0.0, h1: float = 1.0, h2: float = 1.0,
               h3: float = 1.0, k1: float = 2.0, b: float = 0.5, top: float = 1.0,
               ignore_token_ids=(), variant: str = "runtime", ngram: int = 1,
               ngram_reduce: str = "mean", split: str = "threshold",
               apply: str = "all") -> np.ndarray:
    """docs/method.md §3, Eq. 10: ``A[i, t] = A_base[i] + value(group(i), token_ids[i, t])`` on mask.

    ``apply="wrong"`` (``"right"``): only the incorrect (correct) responses get values,
    the others ``A_base[i]`` on every token.

    With ``ngram = n > 1`` a token's value comes from the spans covering it (those
    starting at columns t-n+1 .. t): ``ngram_reduce="maxabs"`` takes the value of largest
    magnitude (the first such span, left to right, on ties: a later span wins only when
    larger by a relative ``MAXABS_RTOL``), ``"mean"`` their mean; a token covered by no
    span gets 0. ``split="graded"`` takes the values from :func:`graded_token_stats`.

    Returns:
        ``[B, T]`` float64, zero where mask is 0.
    """
    rewards_np = _np(rewards, np.float64)
    tok = _np(token_ids).astype(np.int64)
    m = _np(mask).astype(bool)
    labels = _labels(group)
    groups = _groups_in_order(labels)
    adv = base_advantages(rewards_np, groups, base)
    stats_fn = graded_token_stats if split == "graded" else exact_token_stats
    stats = stats_fn(rewards_np, labels, tok, m, correct=correct,
                              reward_threshold=reward_threshold, h1=h1, h2=h2, h3=h3, k1=k1,
                              b=b, top=top, ignore_token_ids=ignore_token_ids, variant=variant,
                              ngram=ngram)
    ignored = {int(t) for t in ignore_token_ids}
    out = np.zeros(tok.shape, dtype=np.float64)
    for i in range(tok.shape[0]):
        is_correct = bool(correct[i]) if correct is not None else rewards_np[i] > reward_threshold
        if apply != "all" and is_correct != (apply == "right"):
            out[i] = np.where(m[i], adv[i], 0.0)
            continue
        if ngram > 1:
            span_value = {t: stats[(labels[i], ids)]["value"]
                          for t, ids in response_spans(tok, m, i, ngram, ignored)}
        for t in range(tok.shape[1]):
            if not m[i, t]:
                continue
            if ngram == 1:
                out[i, t] = adv[i] + stats[(labels[i], int(tok[i, t]))]["value"]
                continue
            covering = [span_value[s] for s in range(t - ngram + 1, t + 1) if s in span_value]
            value = 0.0
            if covering and ngram_reduce == "mean":
                value = sum(covering) / len(covering)
            elif covering and ngram_reduce == "maxabs":
                for v in covering:
                    if abs(v) > abs(value) * (1 + MAXABS_RTOL):
                        value = v
            elif covering:
                raise ValueError(f"ngram_reduce: unknown {ngram_reduce!r}")
            out[i, t] = adv[i] + value
    return out


# ------------------------------------------------------------ released runtime (docs/method.md §4)


def _lgamma_comb(n: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``lgC(n, k) = lgamma(n+1) - lgamma(k+1) - lgamma(n-k+1)``, float32 in, float32 out."""
    return torch.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)


def _runtime_fisher_p(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                      d: torch.Tensor) -> torch.Tensor:
    """Two-sided Fisher p of the runtime: float32 ``[tokens, K]`` grid summed along K.

    Decisions (unspecified by docs/method.md §4, taken as a float32 torch code writes them):
    the support grid is ``arange(K)`` in float32 broadcast against ``[tokens, 1]``
    margins; entries outside a token's support are replaced by 0 with ``torch.where``
    (their lgamma terms may be inf there); the observed probability ``p_obs`` is the
    same expression evaluated at ``k = a`` on the ``[tokens]`` vector.
    """
    N = a + b + c + d
    R1 = a + b
    C1 = a + c
    lo = torch.clamp(R1 + C1 - N, min=0)
    hi = torch.minimum(R1, C1)
    K = int(hi.max().item()) + 1
    k = torch.arange(K, dtype=torch.float32)[None, :]
    R1_, C1_, N_ = R1[:, None], C1[:, None], N[:, None]
    valid = (k >= lo[:, None]) & (k <= hi[:, None])
    k_safe = torch.where(valid, k, lo[:, None])  # keep lgamma finite off-support
    log_pk = (_lgamma_comb(C1_, k_safe) + _lgamma_comb(N_ - C1_, R1_ - k_safe)
              - _lgamma_comb(N_, R1_))
    pk = torch.exp(log_pk)
    log_pobs = _lgamma_comb(C1, a) + _lgamma_comb(N - C1, R1 - a) - _lgamma_comb(N, R1)
    p_obs = torch.exp(log_pobs)
    keep = valid & (pk <= p_obs[:, None])  # no tolerance
    return torch.where(keep, pk, torch.zeros_like(pk)).sum(dim=-1)


def _runtime_entropy(p: torch.Tensor) -> torch.Tensor:
    """Binary entropy in bits of a float32 probability, 0 log 0 = 0 (float32)."""
    q = 1 - p
    t1 = torch.where(p > 0, -p * torch.log2(torch.where(p > 0, p, torch.ones_like(p))),
                     torch.zeros_like(p))
    t2 = torch.where(q > 0, -q * torch.log2(torch.where(q > 0, q, torch.ones_like(q))),
                     torch.zeros_like(q))
    return t1 + t2


def runtime_ktae(rewards, group, token_ids, mask, *, ignore_token_id: int = QWEN_EOS_ID,
                 h1: float = 1.0, h2: float = 1.0, h3: float = 1.0, k1: float = 2.0,
                 b: float = 0.5, top: float = 1.0) -> np.ndarray:
    """Emulation of the released KTAE runtime (docs/method.md §4), float32, one group at a time.

    Decisions where docs/method.md §4 is silent (how a float32 torch implementation would go):
    - scores are the rewards cast to float32; a response is correct when score > 0;
    - GRPO statistics: ``torch.mean`` and ``torch.std`` (unbiased) of the group's float32
      scores, advantage ``(score - mean) / (std + 1e-6)``; a singleton uses mean 0, std 1;
    - present tokens: ``torch.unique`` (sorted) of the group's masked tokens; counts a, b
      and per-class occurrence counts are float32;
    - IG: float32 binary entropies ``H(Y) - P(X=1) H(Y|X=1) - P(X=0) H(Y|X=0)`` with
      0 log 0 = 0 (``torch.log2``);
    - TF: ``f = count / L`` in float32 with f = 0 when the class has no tokens (L = 0;
      never happens in the runtime, whose responses end with EOS), then docs/method.md §3 Eq. 8;
    - Cohen's h: ``asin(sqrt(clamp(a / (a + c + 1e-10), 0, 1)))`` (float32; the 1e-10 is
      below float32 resolution for a + c >= 1 and only matters for an empty class);
    - value: ``top * (2 * sigmoid(k) - 1)``; id 151643 forced to 0 after the fact.

    Returns:
        ``[B, T]`` float32 numpy array, zero where mask is 0.
    """
    f32 = torch.float32
    scores = torch.as_tensor(_np(rewards, np.float64)).to(f32)
    tok = torch.as_tensor(_np(token_ids).astype(np.int64))
    m = torch.as_tensor(_np(mask).astype(bool))
    out = torch.zeros(tok.shape, dtype=f32)
    for rows in _groups_in_order(_labels(group)).values():
        idx = torch.tensor(rows, dtype=torch.long)
        s = scores[idx]
        if len(rows) == 1:
            mean, std = torch.tensor(0.0, dtype=f32), torch.tensor(1.0, dtype=f32)
        else:
            mean, std = s.mean(), s.std()
        adv = (s - mean) / (std + 1e-6)
        g_tok, g_mask = tok[idx], m[idx]
        values = {}
        correct = s > 0
        n_t = correct.sum().to(f32)
        n_f = (~correct).sum().to(f32)
        present = torch.unique(g_tok[g_mask])
        if len(rows) > 1 and n_t > 0 and n_f > 0 and present.numel() > 0:
            contains = torch.stack([((g_tok[j] == present[:, None]) & g_mask[j]).any(-1)
                                    for j in range(len(rows))])  # [G, V]
            occ = torch.stack([((g_tok[j] == present[:, None]) & g_mask[j]).sum(-1)
                               for j in range(len(rows))]).to(f32)  # [G, V]
            a = contains[correct].sum(0).to(f32)
            bb = contains[~correct].sum(0).to(f32)
            c = n_t - a
            d = n_f - bb
            N = n_t + n_f
            p = _runtime_fisher_p(a, bb, c, d)
            F = torch.where(p == 1.0, torch.zeros_like(p), torch.exp(-2 * p))
            h_y = _runtime_entropy(n_t / N)
            px = (a + bb) / N
            h_x1 = _runtime_entropy(torch.where(a + bb > 0, a / (a + bb), torch.zeros_like(a)))
            h_x0 = _runtime_entropy(torch.where(c + d > 0, c / (c + d), torch.zeros_like(c)))
            ig = h_y - (px * h_x1 + (1 - px) * h_x0)
            cnt_t = occ[correct].sum(0)
            cnt_f = occ[~correct].sum(0)
            L_t = g_mask[correct].sum().to(f32)
            L_f = g_mask[~correct].sum().to(f32)
            f_t = cnt_t / L_t if L_t > 0 else torch.zeros_like(cnt_t)
            f_f = cnt_f / L_f if L_f > 0 else torch.zeros_like(cnt_f)
            avg = (L_t + L_f) / 2
            K_t = k1 * (1 - b + b * L_t / avg)
            K_f = k1 * (1 - b + b * L_f / avg)
            tf_t = f_t * (k1 + 1) / (f_t + K_t) if L_t > 0 else torch.zeros_like(f_t)
            tf_f = f_f * (k1 + 1) / (f_f + K_f) if L_f > 0 else torch.zeros_like(f_f)
            ratio_t = torch.clamp(a / (a + c + 1e-10), 0, 1)
            ratio_f = torch.clamp(bb / (bb + d + 1e-10), 0, 1)
            cohen = torch.asin(torch.sqrt(ratio_t)) - torch.asin(torch.sqrt(ratio_f))
            D = cohen + h3 * (tf_t / (tf_f + 1e-5) - tf_f / (tf_t + 1e-5))
            k = (h1 * F + h2 * ig) * D / (h1 + h2)
            val = top * (2 * torch.sigmoid(k) - 1)
            val = torch.where(present == ignore_token_id, torch.zeros_like(val), val)
            values = dict(zip(present.tolist(), val.tolist(), strict=True))
        for j, i in enumerate(rows):
            for t in range(tok.shape[1]):
                if m[i, t]:
                    out[i, t] = adv[j] + torch.tensor(values.get(int(tok[i, t]), 0.0), dtype=f32)
    return out.numpy()


# ------------------------------------------------------------------ random test batches


def random_batch(seed: int, *, sizes: list[int], vocab: int, max_len: int,
                 reward_kind: str = "binary", string_labels: bool = False,
                 left_pad: bool = False, empty_class: bool = False, pad_only_token: bool = True,
                 eos_id: int | None = None, id_range: int = 151_936) -> dict:
    """A batch with shared tokens and the awkward cases KTAE must handle.

    Groups get uneven ``sizes`` and non-contiguous labels (ints or strings), interleaved in
    the batch; responses have variable lengths (0 included), right or left padding; padding
    holds real vocabulary ids (and, with ``pad_only_token``, an id found only in padding);
    ``empty_class`` empties every incorrect (or correct) response of one group;
    ``eos_id`` ends every non-empty response with that id.

    Returns:
        dict with ``rewards`` [B] float64, ``group`` (list of labels), ``token_ids`` [B, T]
        int64, ``mask`` [B, T] int64 (numpy arrays).
    """
    rng = np.random.default_rng(seed)
    ids = rng.choice(id_range - 1, size=vocab + 1, replace=False)
    pad_id, vocab_ids = int(ids[0]), ids[1:]
    weights = 1.0 / np.arange(1, vocab + 1)  # Zipf-like: frequent tokens are shared
    weights /= weights.sum()
    raw = rng.choice(10_000, size=len(sizes), replace=False)
    labels = [f"uid-{g}" for g in raw] if string_labels else [int(g) * 7 - 3000 for g in raw]
    rows = [lab for lab, n in zip(labels, sizes, strict=True) for _ in range(n)]
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order]
    B, T = len(rows), max(1, max_len)
    if reward_kind == "binary":
        rewards = rng.integers(0, 2, size=B).astype(np.float64)
    else:  # continuous, on a 0.05 grid so that distinct rewards are not nearly equal
        rewards = np.round(rng.uniform(-1.0, 1.5, size=B) * 20) / 20
    lengths = rng.integers(0, T + 1, size=B)
    if empty_class:  # in a group with both classes (by reward > 0) if there is one
        mixed = [lab for lab in labels
                 if len({bool(rewards[i] > 0) for i, r in enumerate(rows) if r == lab}) == 2]
        target = mixed[0] if mixed else rows[0]
        empty_correct = bool(rng.integers(0, 2))
        for i, r in enumerate(rows):
            if r == target and bool(rewards[i] > 0) == empty_correct:
                lengths[i] = 0
    token_ids = rng.choice(vocab_ids, size=(B, T), p=weights)
    mask = np.zeros((B, T), dtype=np.int64)
    for i, n in enumerate(lengths):
        if left_pad:
            mask[i, T - n:] = 1
        else:
            mask[i, :n] = 1
        if eos_id is not None and n > 0:
            last = T - 1 if left_pad else n - 1
            token_ids[i, last] = eos_id
    if pad_only_token:
        token_ids[mask == 0] = np.where(rng.random(int((mask == 0).sum())) < 0.5, pad_id,
                                        token_ids[mask == 0])
    return dict(rewards=rewards, group=rows, token_ids=token_ids.astype(np.int64), mask=mask)


def dense_group_index(group) -> dict:
    """label -> dense index in order of first appearance (the library's numbering)."""
    return {lab: i for i, lab in enumerate(_groups_in_order(_labels(group)))}


@st.composite
def batch_specs(draw, *, max_groups: int = 6, max_size: int = 8, vocab=(3, 12), length=(1, 10)):
    """Keyword arguments of :func:`random_batch` (hypothesis strategy)."""
    n_groups = draw(st.integers(1, max_groups))
    return dict(
        seed=draw(st.integers(0, 2**31 - 1)),
        sizes=draw(st.lists(st.integers(1, max_size), min_size=n_groups, max_size=n_groups)),
        vocab=draw(st.integers(*vocab)),
        max_len=draw(st.integers(*length)),
        reward_kind=draw(st.sampled_from(["binary", "binary", "continuous"])),
        string_labels=draw(st.booleans()),
        left_pad=draw(st.booleans()),
        empty_class=draw(st.booleans()),
        pad_only_token=draw(st.booleans()),
    )


# --------------------------------------------------------------------------- evaluation


def pass_at_k_slow(num_correct, n: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021, eq. 1) with exact binomials, averaged over
    problems: ``1 - C(n - c, k) / C(n, k)``."""
    return float(np.mean([1.0 - math.comb(n - c, k) / math.comb(n, k) for c in num_correct]))


def majority_at_k_slow(classes, correct_class) -> float:
    """maj@k one problem at a time: count the votes (NO_ANSWER = -1 does not vote); a
    problem scores 1/m when the correct class is among the m classes with the top count."""
    scores = []
    for votes, right in zip(classes, correct_class, strict=True):
        counts = Counter(v for v in votes if v >= 0)
        if not counts or right < 0:
            scores.append(0.0)
            continue
        top = max(counts.values())
        leaders = [c for c, n in counts.items() if n == top]
        scores.append(1.0 / len(leaders) if right in leaders else 0.0)
    return float(np.mean(scores))


# --------------------------------------------------------------------------- credit audit


def audit_response_metrics(credit, labels, mask, correct, group) -> list[dict]:
    """The credit audit's per-response figures (ktae.core.credit_metrics), by plain loops
    over token pairs: ``{"blame", "lowest", "chance", "contamination"}`` per response, None
    where undefined."""
    credit, labels, mask = _np(credit, np.float64), _np(labels), _np(mask).astype(bool)
    correct, group = _np(correct).astype(bool), _np(group)
    out = []
    for i in range(len(credit)):
        members = [j for j in range(len(credit)) if group[j] == group[i]]
        mixed = any(correct[j] for j in members) and not all(correct[j] for j in members)
        toks = [t for t in range(credit.shape[1]) if mask[i, t]]
        wrong = [credit[i, t] for t in toks if labels[i, t] == 1]
        right = [credit[i, t] for t in toks if labels[i, t] == 0]
        row = {"blame": None, "lowest": None, "chance": None, "contamination": None}
        if mixed and not correct[i] and wrong and right:
            score = 0.0
            for w in wrong:
                for r in right:
                    score += 1.0 if w < r else 0.5 if w == r else 0.0
            row["blame"] = score / (len(wrong) * len(right))
            low = min(wrong + right)
            row["lowest"] = (sum(w == low for w in wrong)
                             / (sum(w == low for w in wrong) + sum(r == low for r in right)))
            row["chance"] = len(wrong) / (len(wrong) + len(right))
        positive = [max(credit[i, t], 0.0) for t in toks]
        on_wrong = sum(max(credit[i, t], 0.0) for t in toks if labels[i, t] == 1)
        if mixed and correct[i] and wrong and sum(positive) > 0:
            row["contamination"] = on_wrong / sum(positive)
        out.append(row)
    return out


# --------------------------------------------------------------------------- calibration


def budgeted_ablation_slow(adv, logprobs, entropies, mask, *, lowest_entropy: bool,
                           alpha: float = 0.01, lam: float = 0.9):
    """TACO's entropy ablations (docs/method.md §8 and the ``taco-entropy-only`` /
    ``taco-entropy-high`` rules), one token at a time: ``k`` = the number of positive-
    advantage tokens with TACO's ``r = -logp - H + log(alpha) > 0``; the chosen tokens are
    the ``k`` positive-advantage tokens of lowest (``lowest_entropy``) or highest entropy,
    ties broken by position (row-major, earlier first).

    Returns ``(chosen, weights)``: the set of chosen ``(i, t)`` and the sorted list of
    TACO's weights ``1 - lam (1 - exp(-r))`` of its ``k`` flagged tokens (the multiset the
    ablation hands out)."""
    adv, lp, H = _np(adv, np.float64), _np(logprobs, np.float64), _np(entropies, np.float64)
    mask = _np(mask).astype(bool)
    if adv.ndim == 1:
        adv = np.repeat(adv[:, None], mask.shape[1], axis=1)
    pool, taco_weights = [], []
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if not (mask[i, t] and adv[i, t] > 0):
                continue
            pool.append((H[i, t] if lowest_entropy else -H[i, t], i, t))
            r = -lp[i, t] - H[i, t] + math.log(alpha)
            if r > 0:
                taco_weights.append(1.0 - lam * (1.0 - math.exp(-r)))
    chosen = {(i, t) for _, i, t in sorted(pool)[:len(taco_weights)]}
    return chosen, sorted(taco_weights)
