"""The slow reference implementations (tests/oracle.py) against hand-computed values.

The worked example: one group of four responses,
    correct:   [5, 6], [5, 7]        (L_T = 4 tokens)
    incorrect: [6, 8], [8]           (L_F = 3 tokens)
with k1 = 2, b = 0.5, so avg = 3.5, K_T = 2 (0.5 + 0.5 * 4 / 3.5) = 15/7 and
K_F = 2 (0.5 + 0.5 * 3 / 3.5) = 13/7.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from oracle import (
    base_advantages,
    bm25_tf,
    exact_ktae,
    exact_token_stats,
    fisher_pvalue,
    information_gain_bits,
    response_spans,
    runtime_ktae,
)

TOK = np.array([[5, 6, 0], [5, 7, 0], [6, 8, 0], [8, 0, 0]])
MASK = np.array([[1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 0, 0]])
REW = np.array([1.0, 1.0, 0.0, 0.0])


def test_fisher_by_hand():
    # [[2,0],[0,2]]: margins 2/2 of N=4; P(k) = C(2,k) C(2,2-k) / C(4,2) = 1/6, 4/6, 1/6.
    assert fisher_pvalue(2, 0, 0, 2) == pytest.approx(2 / 6, rel=1e-12)
    # [[3,1],[1,3]]: P(k) = C(4,k) C(4,4-k) / 70 = 1, 16, 36, 16, 1 (/70); observed 16/70.
    assert fisher_pvalue(3, 1, 1, 3) == pytest.approx(34 / 70, rel=1e-12)
    # [[1,1],[1,1]] is the mode: p = 1.
    assert fisher_pvalue(1, 1, 1, 1) == pytest.approx(1.0)


def test_information_gain_by_hand():
    assert information_gain_bits(2, 0, 0, 2) == pytest.approx(1.0)
    assert information_gain_bits(1, 1, 1, 1) == pytest.approx(0.0, abs=1e-15)
    # [[1,0],[1,2]]: H(Y) = 1; X=1 holds 1 correct (H=0), X=0 holds 1 correct 2 wrong.
    h = -(1 / 3) * math.log2(1 / 3) - (2 / 3) * math.log2(2 / 3)
    assert information_gain_bits(1, 0, 1, 2) == pytest.approx(1.0 - 0.75 * h, rel=1e-12)
    # one-class group: H(Y) = 0, so IG = 0
    assert information_gain_bits(2, 0, 1, 0) == 0.0


def test_term_frequency_by_hand():
    # token 5: 2 of the 4 correct tokens: f = 1/2, TF = 0.5 * 3 / (0.5 + 15/7) = 21/37.
    assert bm25_tf(2, 4, 3, 2.0, 0.5) == pytest.approx(21 / 37, rel=1e-12)
    # token 6 in the incorrect class: f = 1/3, TF = 1 / (1/3 + 13/7) = 21/46.
    assert bm25_tf(1, 3, 4, 2.0, 0.5) == pytest.approx(21 / 46, rel=1e-12)
    # a class without tokens has TF 0, even where K would be 0 (b = 1)
    assert bm25_tf(0, 0, 5, 2.0, 1.0) == 0.0


def test_grpo_baseline_by_hand():
    groups = {0: [0, 1, 2, 3], 1: [4]}
    adv = base_advantages(np.array([1.0, 1.0, 0.0, 0.0, 3.0]), groups, "grpo")
    std = math.sqrt(1 / 3)
    expect = [0.5 / (std + 1e-6)] * 2 + [-0.5 / (std + 1e-6)] * 2 + [3.0 / (1 + 1e-6)]
    np.testing.assert_allclose(adv, expect, rtol=1e-12)
    np.testing.assert_allclose(base_advantages(np.array([1.0, 0.0, 0.5]), {0: [0, 1, 2]},
                                               "rloo"), [0.75, -0.75, 0.0], atol=1e-15)
    np.testing.assert_allclose(base_advantages(np.array([1.0, 0.0, 2.0]), {0: [0, 1], 1: [2]},
                                               "drgrpo"), [0.5, -0.5, 2.0])


def test_token_stats_by_hand():
    st = exact_token_stats(REW, [0, 0, 0, 0], TOK, MASK, h3=0.0)
    assert list(st) == [(0, 5), (0, 6), (0, 7), (0, 8)]  # padding id 0 is absent
    s5 = st[(0, 5)]
    assert (s5["a"], s5["b"], s5["c"], s5["d"]) == (2, 0, 0, 2)
    assert s5["fisher"] == pytest.approx(math.exp(-2 / 3))
    # h3 = 0: D = asin(1) - asin(0) = pi/2; k = (F + IG) D / 2; value = tanh(k/2)
    assert s5["direction"] == pytest.approx(math.pi / 2)
    k = (math.exp(-2 / 3) + 1.0) * (math.pi / 2) / 2
    assert s5["value"] == pytest.approx(2 / (1 + math.exp(-k)) - 1, rel=1e-12)
    assert st[(0, 8)]["value"] == pytest.approx(-s5["value"], rel=1e-12)
    s6 = st[(0, 6)]
    assert s6["fisher"] == 0.0 and s6["info_gain"] == pytest.approx(0, abs=1e-15)
    assert s6["value"] == pytest.approx(0.0, abs=1e-15)
    assert s6["tf_correct"] == pytest.approx(21 / 67)
    assert s6["tf_incorrect"] == pytest.approx(21 / 46)


def test_direction_with_tf_term_by_hand():
    st = exact_token_stats(REW, [0, 0, 0, 0], TOK, MASK)
    s6 = st[(0, 6)]
    tf_t, tf_f = 21 / 67, 21 / 46
    # a/(a+c) = b/(b+d) = 1/2: Cohen's h is 0, D is the TF term alone
    d = tf_t / (tf_f + 1e-5) - tf_f / (tf_t + 1e-5)
    assert s6["direction"] == pytest.approx(d, rel=1e-12)


def test_exact_ktae_assembles_base_plus_value():
    adv = exact_ktae(REW, [0, 0, 0, 0], TOK, MASK, h3=0.0)
    st = exact_token_stats(REW, [0, 0, 0, 0], TOK, MASK, h3=0.0)
    base = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert adv[0, 0] == pytest.approx(base + st[(0, 5)]["value"])
    assert adv[2, 1] == pytest.approx(-base + st[(0, 8)]["value"])
    assert adv[3, 1] == 0.0 and adv[0, 2] == 0.0  # padding
    # ignored ids and paper variant
    ign = exact_ktae(REW, [0, 0, 0, 0], TOK, MASK, h3=0.0, ignore_token_ids=[5])
    assert ign[0, 0] == pytest.approx(base)
    paper = exact_token_stats(REW, [0, 0, 0, 0], TOK, MASK, h3=0.0, variant="paper")
    k5 = (math.exp(-2 / 3) + 1.0) * (math.pi / 2) / 2
    assert paper[(0, 5)]["value"] == pytest.approx(1 / (1 + math.exp(-k5)) - 0.5)


def test_one_class_and_singleton_groups_get_zero_values():
    st = exact_token_stats([1.0, 1.0, 0.0], ["x", "x", "y"], [[1, 2], [2, 3], [1, 1]],
                           np.ones((3, 2)))
    assert all(row["value"] == 0.0 for row in st.values())
    assert st[("x", 2)]["p_value"] == pytest.approx(1.0) and st[("x", 2)]["fisher"] == 0.0
    adv = exact_ktae([1.0, 1.0, 0.0], ["x", "x", "y"], [[1, 2], [2, 3], [1, 1]], np.ones((3, 2)))
    np.testing.assert_allclose(adv, [[0, 0], [0, 0], [0, 0]], atol=1e-15)


def test_runtime_emulation_on_worked_example():
    rt = runtime_ktae(REW, [0, 0, 0, 0], TOK, MASK)
    assert rt.dtype == np.float32
    st = exact_token_stats(REW, [0, 0, 0, 0], TOK, MASK)
    base = np.float32(0.5) / (np.float32(math.sqrt(1 / 3)) + np.float32(1e-6))
    # token 6 has exact p = 1 (F = 0) but its float32 sum misses 1.0: F = exp(-2p) ~ 0.135
    k6 = (math.exp(-2) + 0.0) * st[(0, 6)]["direction"] / 2
    assert rt[0, 1] == pytest.approx(base + math.tanh(k6 / 2), abs=1e-4)
    assert rt[0, 1] != pytest.approx(base + st[(0, 6)]["value"], abs=1e-3)
    # token 5 agrees with the exact value
    assert rt[0, 0] == pytest.approx(base + st[(0, 5)]["value"], abs=1e-6)
    # 151643 is forced to 0
    tok = TOK.copy()
    tok[tok == 5] = 151643
    rt2 = runtime_ktae(REW, [0, 0, 0, 0], tok, MASK)
    assert rt2[0, 0] == pytest.approx(base, abs=1e-6)


def test_spans_by_hand():
    tok = np.array([[1, 2, 3, 4, 9, 5, 6, 7]])
    mask = np.array([[1, 1, 0, 1, 1, 1, 1, 1]])
    assert response_spans(tok, mask, 0, 2, {9}) == [(0, (1, 2)), (5, (5, 6)), (6, (6, 7))]
    assert response_spans(tok, mask, 0, 3, {9}) == [(5, (5, 6, 7))]
    assert response_spans(tok, mask, 0, 3, set()) == [(3, (4, 9, 5)), (4, (9, 5, 6)),
                                                      (5, (5, 6, 7))]
    assert [ids for _, ids in response_spans(tok, mask, 0, 1, {9})] == [
        (1,), (2,), (4,), (9,), (5,), (6,), (7,)]  # a unigram of an ignored id is kept


def test_bigram_statistics_and_reductions_by_hand():
    """Bigrams of the worked example: correct (5,6), (5,7); incorrect (6,8); the last
    response has none. L_T = 2 spans, L_F = 1."""
    stats = exact_token_stats(REW, [0] * 4, TOK, MASK, ngram=2)
    assert set(stats) == {(0, (5, 6)), (0, (5, 7)), (0, (6, 8))}
    s = stats[(0, (5, 6))]
    assert (s["a"], s["b"], s["c"], s["d"]) == (1, 0, 1, 2)
    assert s["tf_correct"] == pytest.approx(bm25_tf(1, 2, 1, 2.0, 0.5), rel=1e-12)
    adv = exact_ktae(REW, [0] * 4, TOK, MASK, ngram=2)
    base = base_advantages(REW, {0: [0, 1, 2, 3]}, "grpo")
    np.testing.assert_allclose(adv[0, :2] - base[0], stats[(0, (5, 6))]["value"], rtol=1e-12)
    assert adv[3, 0] == pytest.approx(base[3])  # one token: no bigram covers it
