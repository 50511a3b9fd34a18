"""Contingency statistics of KTAE (docs/method.md §3, Eq. 4-7) against scipy on every small table.

``fisher_exact_pvalue`` is checked on every 2x2 table with N = a+b+c+d <= 32 (58,905
tables, one vectorised call). scipy is called once per orbit of the table's symmetry group
(swap rows, swap columns, transpose: the two-sided p-value is invariant under all 8), so
the reference costs about 8,000 scipy calls instead of 58,905; a random sample of tables
is also checked against a direct scipy call, which verifies that invariance.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.stats
import torch
from oracle import information_gain_bits, single_thread  # noqa: F401

from ktae.core.stats import fisher_exact_pvalue, information_gain

N_MAX_FISHER = 32
N_MAX_IG = 16


def all_tables(n_max: int) -> np.ndarray:
    """``[M, 4]`` int64: every (a, b, c, d) >= 0 with a + b + c + d <= n_max."""
    rng = range(n_max + 1)
    return np.array([(a, b, c, d) for a, b, c, d in itertools.product(rng, repeat=4)
                     if a + b + c + d <= n_max], dtype=np.int64)


def canonical(a: int, b: int, c: int, d: int) -> tuple[int, int, int, int]:
    """The smallest of the 8 tables equivalent under row swap, column swap, transpose."""
    forms = []
    for (p, q), (r, s) in ([(a, b), (c, d)], [(c, d), (a, b)]):
        for t in ((p, q, r, s), (q, p, s, r)):  # column swap
            forms.append(t)
            forms.append((t[0], t[2], t[1], t[3]))  # transpose
    return min(forms)


def scipy_p(a: int, b: int, c: int, d: int) -> float:
    return float(scipy.stats.fisher_exact([[a, b], [c, d]], alternative="two-sided").pvalue)


@pytest.fixture(scope="module")
def tables() -> np.ndarray:
    return all_tables(N_MAX_FISHER)


def test_table_enumeration_is_complete(tables):
    from math import comb
    assert len(tables) == comb(N_MAX_FISHER + 4, 4)  # stars and bars
    assert len({tuple(t) for t in tables.tolist()}) == len(tables)


def test_fisher_pvalue_matches_scipy_on_every_table(tables):
    t = torch.from_numpy(tables)
    got = fisher_exact_pvalue(t[:, 0], t[:, 1], t[:, 2], t[:, 3])
    assert got.dtype == torch.float64 and got.shape == (len(tables),)
    cache: dict = {}
    expect = np.empty(len(tables))
    for i, (a, b, c, d) in enumerate(tables.tolist()):
        key = canonical(a, b, c, d)
        if key not in cache:
            cache[key] = scipy_p(*key)
        expect[i] = cache[key]
    got = got.numpy()
    rel = np.abs(got - expect) / np.maximum(np.abs(expect), 1e-300)
    worst = int(np.argmax(rel))
    assert rel[worst] <= 1e-9, (f"table {tables[worst].tolist()}: scipy {expect[worst]!r}, "
                                f"got {got[worst]!r} ({int((rel > 1e-9).sum())} tables off)")


def test_fisher_symmetry_shortcut_against_direct_scipy(tables):
    rng = np.random.default_rng(0)
    sample = tables[rng.choice(len(tables), size=400, replace=False)]
    t = torch.from_numpy(sample)
    got = fisher_exact_pvalue(t[:, 0], t[:, 1], t[:, 2], t[:, 3]).numpy()
    for (a, b, c, d), g in zip(sample.tolist(), got, strict=True):
        assert scipy_p(a, b, c, d) == pytest.approx(scipy_p(*canonical(a, b, c, d)), rel=1e-12)
        assert g == pytest.approx(scipy_p(a, b, c, d), rel=1e-9)


def test_fisher_pvalue_broadcasts_and_accepts_int32():
    a = torch.tensor([[3], [1]], dtype=torch.int32)
    p = fisher_exact_pvalue(a, torch.tensor(0), torch.tensor(0), torch.tensor([3, 1]))
    assert p.shape == (2, 2) and p.dtype == torch.float64
    assert float(p[0, 0]) == pytest.approx(scipy_p(3, 0, 0, 3), rel=1e-12)
    assert float(p[1, 1]) == pytest.approx(scipy_p(1, 0, 0, 1), rel=1e-12)


def entropy_bits(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Binary entropy (bits) of counts ``x, y`` with scipy.stats.entropy (0 log 0 = 0);
    0 where ``x + y = 0``."""
    pk = np.stack([x, y]).astype(np.float64)
    empty = pk.sum(axis=0) == 0
    pk[:, empty] = 1.0  # any valid distribution; overwritten below
    h = scipy.stats.entropy(pk, base=2, axis=0)
    return np.where(empty, 0.0, h)


def test_information_gain_matches_scipy_entropy_on_every_table():
    tables = all_tables(N_MAX_IG)
    a, b, c, d = tables.T
    n = np.maximum(tables.sum(axis=1), 1)
    expect = (entropy_bits(a + c, b + d) - (a + b) / n * entropy_bits(a, b)
              - (c + d) / n * entropy_bits(c, d))
    t = torch.from_numpy(tables)
    got = information_gain(t[:, 0], t[:, 1], t[:, 2], t[:, 3])
    assert got.dtype == torch.float64 and got.shape == (len(tables),)
    np.testing.assert_allclose(got.numpy(), expect, rtol=1e-9, atol=1e-12)
    # the scalar textbook formula agrees too (a few tables, by hand-checkable loops)
    for row in tables[:: max(1, len(tables) // 300)].tolist():
        assert float(information_gain(*[torch.tensor(x) for x in row])) == pytest.approx(
            information_gain_bits(*row), rel=1e-9, abs=1e-12)
    # IG is non-negative and at most H(Y) <= 1 bit
    assert float(got.min()) >= 0.0 and float(got.max()) <= 1.0 + 1e-12
