"""Statistics of the studies' comparisons: paired by seed, over seeds and problems, Holm.

A study compares arms trained from the same seeds (a seed fixes the prompt order, so the
arms' first rollouts are identical) and scored on the same held-out problems. The
difference of two arms is then a ``[problems, seeds]`` matrix ``D`` of per-problem
differences (1/0 correctness: -1, 0 or +1), paired twice: by seed and by problem.

* :func:`paired_interval`: the mean of ``D`` with a t interval whose variance counts both
  sources, seeds and problems (crossed random effects): ``var(seed means) / S +
  var(problem means) / P``, each term holding the residual once (so the residual's
  ``sigma_e^2 / (S P)`` is counted twice: conservative), and Welch-Satterthwaite's degrees
  of freedom. With one problem it is the paired t interval over seeds; with one seed, the
  paired t interval over problems.
* :func:`sign_flip_interval`: the exact sign-flip permutation test over seeds (all
  ``2^S`` flips of the per-seed differences) and its inverted interval. With 5 seeds the
  smallest two-sided p is 2/32 = 0.0625: it can never reject at 5%.
* :func:`holm`: Holm's step-down adjustment of a family's p-values, and the level each
  comparison's interval is read at so that "its interval excludes 0" is Holm's rejection.
* :func:`label`: ``helps`` / ``hurts`` only where Holm rejects, else ``no evidence``.

Checked against scipy (t quantiles), brute force (Holm, sign flips) and by simulation
(``coverage.py`` of the paired verdict).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import stats as sps

LEVEL = 0.95


def paired_interval(d, *, level: float = LEVEL) -> dict:
    """The mean of a ``[problems, seeds]`` difference matrix and its t interval over seeds
    and problems (see the module docstring).

    Returns ``{"diff", "se", "df", "low", "high", "p", "seeds", "problems", "se_seeds",
    "se_problems"}``; ``low``/``high``/``p`` None where the variance is 0 or undefined
    (fewer than 2 seeds and fewer than 2 problems).

    Raises:
        ValueError: not a 2-D matrix with at least one problem and one seed, or a level
            outside (0, 1).
    """
    d = np.asarray(d, dtype=float)
    if d.ndim != 2 or 0 in d.shape:
        raise ValueError(f"d: expected a [problems, seeds] matrix, got shape {d.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level: expected a number in (0, 1), got {level}")
    p, s = d.shape
    out = {"diff": float(d.mean()), "se": None, "df": None, "low": None, "high": None,
           "p": None, "seeds": s, "problems": p, "se_seeds": None, "se_problems": None}
    parts = []  # (variance of the mean from this source, its degrees of freedom)
    if s > 1:
        parts.append((d.mean(axis=0).var(ddof=1) / s, s - 1))
        out["se_seeds"] = math.sqrt(parts[-1][0])
    if p > 1:
        parts.append((d.mean(axis=1).var(ddof=1) / p, p - 1))
        out["se_problems"] = math.sqrt(parts[-1][0])
    var = sum(v for v, _ in parts)
    if not parts or var <= 0:
        return out
    df = var ** 2 / sum(v ** 2 / k for v, k in parts if v > 0)
    se = math.sqrt(var)
    half = float(sps.t.ppf(0.5 + level / 2, df)) * se
    t = out["diff"] / se
    out.update(se=se, df=float(df), low=out["diff"] - half, high=out["diff"] + half,
               p=float(2 * sps.t.sf(abs(t), df)))
    return out


def welch(a, b) -> dict:
    """Welch's t-test of ``mean(a) - mean(b)`` and the Welch-Satterthwaite 95% interval
    of the difference: ``{"diff", "low", "high", "p", "df", "n_a", "n_b"}`` (None where
    undefined: fewer than two values on a side, or both sides without spread)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    out = {"diff": None, "low": None, "high": None, "p": None, "df": None,
           "n_a": int(a.size), "n_b": int(b.size)}
    if a.size == 0 or b.size == 0:
        return out
    diff = float(a.mean() - b.mean())
    out["diff"] = diff
    if a.size < 2 or b.size < 2:
        return out
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se2 = va + vb
    if se2 == 0:
        return out
    df = se2 ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    half = sps.t.ppf(0.975, df) * math.sqrt(se2)
    t = diff / math.sqrt(se2)
    out.update(low=diff - half, high=diff + half, df=float(df),
               p=float(2 * sps.t.sf(abs(t), df)))
    return out



def sign_flip_p(values, null: float = 0.0) -> float:
    """The exact two-sided p of the sign-flip test that ``values - null`` are symmetric
    about 0: the share of the ``2^n`` sign patterns whose |mean| is at least the
    observed one (the observed pattern included)."""
    x = np.asarray(values, dtype=float) - null
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values: expected a non-empty 1-D array, got shape {x.shape}")
    if x.size > 20:
        raise ValueError(f"values: at most 20 for the exact test, got {x.size}")
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=x.size)))
    means = np.abs(signs @ x) / x.size
    observed = abs(x.mean())
    return float(np.mean(means >= observed - 1e-12 * max(1.0, observed)))


def sign_flip_interval(values, *, level: float = LEVEL, grid: int = 2001) -> dict:
    """The sign-flip test over seeds (per-seed differences ``values``) and its interval:
    the nulls in a grid over the values' range that the test does not reject at
    ``1 - level``. ``{"diff", "p", "low", "high", "min_p"}``; ``min_p`` is the smallest
    p the test can give with this many seeds (2 / 2^n)."""
    x = np.asarray(values, dtype=float)
    p = sign_flip_p(x)
    spread = float(x.max() - x.min()) or 1.0
    nulls = np.linspace(x.min() - spread, x.max() + spread, grid)
    kept = [m for m in nulls if sign_flip_p(x, m) > 1 - level]
    return {"diff": float(x.mean()), "p": p, "low": min(kept) if kept else None,
            "high": max(kept) if kept else None, "min_p": 2.0 / 2 ** x.size}


def holm(pvalues, *, alpha: float = 1 - LEVEL) -> dict:
    """Holm's step-down adjustment of a family's p-values (None: not testable, left out of
    the family).

    Returns ``{"adjusted", "reject", "levels"}``, each in the input order: the adjusted
    p-values (``max_{j<=i} min(1, (m - j + 1) p_(j))`` in sorted order), whether each
    hypothesis is rejected at ``alpha``, and the confidence level of each comparison's
    interval at its step (``1 - alpha / (m - rank + 1)``): its interval excludes 0 at
    that level exactly when its p passes its step."""
    m = sum(p is not None for p in pvalues)
    order = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    adjusted = [None] * len(pvalues)
    levels = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
        levels[i] = 1 - alpha / (m - rank)
    return {"adjusted": adjusted, "levels": levels,
            "reject": [a is not None and a < alpha for a in adjusted]}


def label(diff: float | None, rejected: bool) -> str:
    """``helps`` / ``hurts`` where the corrected test rejects, else ``no evidence``."""
    if not rejected or diff is None:
        return "no evidence"
    return "helps" if diff > 0 else "hurts"


def drop_one_labels(family: list, index: int, *, level: float = LEVEL) -> list[str]:
    """The label of comparison ``index`` of ``family`` (each a ``[problems, seeds]``
    difference matrix over the same seeds) with each seed left out in turn, Holm over the
    whole family each time: a label that changes is not a finding."""
    seeds = np.asarray(family[index]).shape[1]
    out = []
    for drop in range(seeds):
        keep = [j for j in range(seeds) if j != drop]
        intervals = [paired_interval(np.asarray(x)[:, keep], level=level) for x in family]
        h = holm([iv["p"] for iv in intervals], alpha=1 - level)
        out.append(label(intervals[index]["diff"], h["reject"][index]))
    return out
