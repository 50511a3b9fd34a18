"""avg@k, unbiased pass@k and maj@k (ktae.eval.metrics) against hand-made cases and the
closed forms, and the per-benchmark metrics evaluate() reports."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest
import torch

from ktae.eval import BenchmarkRecord, evaluate
from ktae.eval import runner as runner_mod
from ktae.eval.metrics import (
    NO_ANSWER,
    answer_classes,
    avg_at_k,
    candidate_pairs,
    majority_at_k,
    pass_at_k,
)
from ktae.eval.results import benchmark_metrics
from ktae.models import build_char_tokenizer, build_tiny_model
from ktae.models.generate import Generation


def closed_form_pass_at(n: int, c: int, k: int) -> float:
    """Chen et al. (2021), eq. 1, with exact binomials: 1 - C(n - c, k) / C(n, k)."""
    return 1.0 - comb(n - c, k) / comb(n, k)


@pytest.mark.parametrize("k, counts", [
    (1, [0, 1, 1]),
    (4, [0, 1, 2, 3, 4]),
    (5, [2, 0, 5, 1]),
    (32, [0, 1, 7, 16, 31, 32]),
])
def test_pass_at_k_matches_the_closed_form(k, counts):
    got = pass_at_k(counts, k)
    want = [np.mean([closed_form_pass_at(k, c, j) for c in counts]) for j in range(1, k + 1)]
    # both sides are computed here; 1e-12 covers float rounding of the product form
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert got[0] == pytest.approx(np.mean(counts) / k)  # pass@1 = mean accuracy
    assert got[-1] == pytest.approx(np.mean([c > 0 for c in counts]))  # pass@k


def test_pass_at_k_hand_made():
    # n = 4, c = 1: pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5; pass@3 = 1 - 1/4
    np.testing.assert_allclose(pass_at_k([1], 4), [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(pass_at_k([], 3), [0, 0, 0])
    with pytest.raises(ValueError, match="num_correct"):
        pass_at_k([5], 4)
    with pytest.raises(ValueError, match="k"):
        pass_at_k([1], 0)


def test_avg_at_k_mean_and_std_over_the_k_runs():
    # 3 problems x 4 samples; run accuracies 2/3, 1/3, 1/3, 0
    correct = [[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]
    mean, std = avg_at_k(correct)
    runs = np.array([2 / 3, 1 / 3, 1 / 3, 0.0])
    assert mean == pytest.approx(runs.mean()) == pytest.approx(4 / 12)
    assert std == pytest.approx(float(np.std(runs, ddof=1)))
    assert avg_at_k([[1], [0]]) == (0.5, 0.0)  # k = 1: no spread
    assert avg_at_k(np.zeros((0, 3))) == (0.0, 0.0)


def test_majority_vote_with_ties():
    cases = [
        ([0, 0, 1, 2], 0, 1.0),  # correct class leads alone
        ([0, 1, 1, 2], 0, 0.0),  # a wrong class leads
        ([0, 0, 1, 1], 0, 0.5),  # two-way tie with the correct class: half
        ([0, 1, 2, NO_ANSWER], 1, 1 / 3),  # three-way tie, the unanswered sample does not vote
        ([NO_ANSWER, NO_ANSWER, 0, 1], NO_ANSWER, 0.0),  # no correct answer at all
        ([NO_ANSWER] * 4, NO_ANSWER, 0.0),  # nobody answered
        ([0, NO_ANSWER, NO_ANSWER, NO_ANSWER], 0, 1.0),  # one vote is a majority
    ]
    for classes, right, want in cases:
        assert majority_at_k([classes], [right]) == pytest.approx(want), classes
    all_classes = [c for c, _, _ in cases]
    assert majority_at_k(all_classes, [r for _, r, _ in cases]) == pytest.approx(
        np.mean([w for _, _, w in cases]))
    with pytest.raises(ValueError, match="classes"):
        majority_at_k([[0, 4]], [0])
    with pytest.raises(ValueError, match="correct_class"):
        majority_at_k([[0, 1]], [0, 1])


def test_answer_classes_merge_equivalent_answers_transitively():
    answers = ["3", "1/2", "0.5", None, " 7 ", "\\frac12", "7"]
    correct = [True, False, False, False, False, False, False]
    same = {frozenset(p) for p in (("1/2", "0.5"), ("0.5", "\\frac12"))}
    asked = []

    def equal(a, b):
        asked.append((a, b))
        return frozenset((a, b)) in same

    classes, right = answer_classes(answers, correct, equal)
    # 1/2 ~ 0.5 ~ \frac12 form one class; " 7 " and "7" are one text
    assert classes == [0, 1, 1, NO_ANSWER, 2, 1, 2]
    assert right == 0
    assert set(asked) <= set(candidate_pairs(answers, correct))
    assert candidate_pairs(answers, correct) == [
        ("1/2", "0.5"), ("1/2", "7"), ("1/2", "\\frac12"), ("0.5", "7"), ("0.5", "\\frac12"),
        ("7", "\\frac12")]
    assert answer_classes([None, "x"], [False, False], equal) == ([NO_ANSWER, 0], NO_ANSWER)


def _row(i, j, correct, cls, tokens=3, truncated=False, formatted=True):
    return {"index": i, "sample": j, "correct": correct, "formatted": formatted,
            "timed_out": False, "response_tokens": tokens, "truncated": truncated,
            "answer_class": cls}


def test_benchmark_metrics_from_rows():
    rows = [_row(0, 0, True, 0, 4), _row(0, 1, False, 1, 8, truncated=True),
            _row(0, 2, False, 1, 8, truncated=True),
            _row(1, 0, False, NO_ANSWER, 2, formatted=False), _row(1, 1, True, 0, 5),
            _row(1, 2, False, 1, 3)]
    m = benchmark_metrics(rows, k=3)
    assert m["accuracy"] == pytest.approx(2 / 6)
    assert m["accuracy_std"] == pytest.approx(float(np.std([0.5, 0.5, 0.0], ddof=1)))
    assert m["pass_at"] == pytest.approx({"1": 1 / 3, "2": 2 / 3, "3": 1.0})
    assert m["pass_at_k"] == 1.0
    assert m["maj_at_k"] == pytest.approx((0.0 + 0.5) / 2)  # problem 1: a 1-1 tie
    assert m["truncation_rate"] == pytest.approx(2 / 6)
    assert (m["mean_response_length"], m["max_response_length"]) == (30 / 6, 8)
    assert (m["n"], m["k"], m["num_samples"]) == (2, 3, 6)
    with pytest.raises(ValueError, match="samples"):
        benchmark_metrics(rows[:-1], k=3)


def test_maj_at_k_uses_the_verifier_for_equivalent_wrong_answers(monkeypatch):
    """Two wrong answers written differently (1/2, 0.5) outvote one right answer."""
    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, intermediate_size=32,
                             num_heads=2)
    recs = [BenchmarkRecord("0", "1+2", "3", "custom"), BenchmarkRecord("1", "2+2", "4", "custom")]

    def fake_generate(model, tokenizer, prompts, sampling, **kwargs):
        assert sampling.k == 4
        return [[Generation("\\boxed{3}", 3), Generation("\\boxed{\\frac{1}{2}}", 9),
                 Generation("\\boxed{0.5}", 5, truncated=True), Generation("no box", 4)],
                [Generation("\\boxed{4}", 3), Generation("\\boxed{4.0}", 3),
                 Generation("\\boxed{5}", 3), Generation("\\boxed{6}", 3)]]

    monkeypatch.setattr(runner_mod, "generate_hf", fake_generate)
    res = evaluate(model, tok, {"custom": recs}, k=4, temperature=0.7, template="compact")
    m = res["benchmarks"]["custom"]
    assert m["maj_at_k"] == pytest.approx((0.0 + 1.0) / 2)
    assert [r["answer_class"] for r in res["samples"]["custom"]] == \
        [0, 1, 1, NO_ANSWER, 0, 0, 1, 2]
    assert m["accuracy"] == pytest.approx(3 / 8)
    assert m["pass_at"]["1"] == pytest.approx(3 / 8) and m["pass_at_k"] == 1.0
    assert m["truncation_rate"] == pytest.approx(1 / 8)
    assert res["config"]["k"] == {"custom": 4}


@pytest.mark.parametrize("seed", range(20))
def test_vectorised_metrics_match_the_slow_references(seed):
    from oracle import majority_at_k_slow, pass_at_k_slow

    rng = np.random.default_rng(seed)
    p, k = int(rng.integers(1, 30)), int(rng.integers(1, 17))
    counts = rng.integers(0, k + 1, size=p)
    np.testing.assert_allclose(pass_at_k(counts, k),
                               [pass_at_k_slow(counts, k, j) for j in range(1, k + 1)],
                               rtol=0, atol=1e-12)  # both live; float rounding only
    classes = rng.integers(-1, min(k, 4), size=(p, k))  # few classes: ties are common
    right = np.array([rng.choice(row[row >= 0]) if (row >= 0).any() and rng.random() < 0.7
                      else -1 for row in classes])
    assert majority_at_k(classes, right) == pytest.approx(majority_at_k_slow(classes, right),
                                                          abs=1e-12)
