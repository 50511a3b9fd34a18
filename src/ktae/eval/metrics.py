"""Sampling metrics of one benchmark: avg@k, unbiased pass@k, maj@k (pure numpy).

Inputs are ``[P, k]`` arrays: P problems, k samples each (every problem has the same k).

* **avg@k** (:func:`avg_at_k`): the accuracy of sample ``j`` over the P problems, for each
  ``j``; reported as the mean of those k accuracies (the usual avg@k, equal to the mean
  over all ``P * k`` samples) and their standard deviation (``ddof = 1``; 0 when k = 1),
  i.e. how much one k = 1 run at this temperature would vary.
* **pass@j** (:func:`pass_at_k`), for every j = 1..k: the unbiased estimator of Chen et
  al. (2021, "Evaluating Large Language Models Trained on Code", eq. 1), averaged over
  problems: ``1 - C(k - c, j) / C(k, j)`` with ``c`` correct samples of the problem.
  pass@k (j = k) is the share of problems with at least one correct sample.
* **maj@k** (:func:`majority_at_k`): each problem's answer is the most frequent class of
  equivalent answers among its samples (samples without a final answer do not vote). A
  problem scores 1 when that class is the correct one. **Ties**: when the highest count is
  shared by ``m`` classes, one of them correct, the problem scores ``1 / m`` (the expected
  score of breaking the tie uniformly at random); a problem where no sample answered
  scores 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

NO_ANSWER = -1
"""Class id of a sample without a final answer (it does not vote in maj@k)."""


def _matrix(values, name: str, dtype) -> np.ndarray:
    a = np.asarray(values, dtype=dtype)
    if a.ndim != 2 or a.shape[1] < 1:
        raise ValueError(f"{name}: expected a [problems, k] array with k >= 1, "
                         f"got shape {a.shape}")
    return a


def avg_at_k(correct) -> tuple[float, float]:
    """``(mean, std)`` of the k per-sample accuracies of ``correct`` (``[P, k]`` bools).

    ``P == 0`` gives ``(0.0, 0.0)``.
    """
    c = _matrix(correct, "correct", float)
    if c.shape[0] == 0:
        return 0.0, 0.0
    per_sample = c.mean(axis=0)  # [k]: accuracy of run j
    std = float(per_sample.std(ddof=1)) if per_sample.size > 1 else 0.0
    return float(per_sample.mean()), std


def pass_at_k(num_correct, k: int) -> np.ndarray:
    """Unbiased pass@j for j = 1..k, averaged over problems: ``[k]`` array.

    Args:
        num_correct: ``[P]`` correct samples per problem, each in ``0..k``.
        k: samples per problem.

    ``1 - C(k - c, j) / C(k, j) = 1 - prod_{t < j} (k - c - t) / (k - t)``: one cumulative
    product over ``t`` for all problems at once (a factor reaching 0 stays 0, the case
    ``k - c < j``). ``P == 0`` gives zeros.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected a positive integer, got {k!r}")
    c = np.asarray(num_correct, dtype=float).reshape(-1)
    if c.size and (c.min() < 0 or c.max() > k or not np.all(c == np.round(c))):
        raise ValueError(f"num_correct: expected integers in 0..{k}, got {c.tolist()}")
    if c.size == 0:
        return np.zeros(k)
    t = np.arange(k, dtype=float)  # [k]
    factors = np.clip((k - c[:, None] - t[None, :]) / (k - t[None, :]), 0.0, None)  # [P, k]
    all_wrong = np.cumprod(factors, axis=1)  # [P, j]: C(k-c, j) / C(k, j)
    return (1.0 - all_wrong).mean(axis=0)


def majority_at_k(classes, correct_class) -> float:
    """maj@k: the mean over problems of the majority vote's score (ties: see module doc).

    Args:
        classes: ``[P, k]`` integer class of each sample's answer, ``0 <= id < k`` within a
            problem, equal ids for equivalent answers, :data:`NO_ANSWER` for none.
        correct_class: ``[P]`` the id of the correct answers' class, or :data:`NO_ANSWER`
            when no sample is correct.
    """
    cls = _matrix(classes, "classes", int)
    p, k = cls.shape
    right = np.asarray(correct_class, dtype=int).reshape(-1)
    if right.shape != (p,):
        raise ValueError(f"correct_class: expected {p} entries, got {right.shape[0]}")
    if cls.size and (cls.min() < NO_ANSWER or cls.max() >= k):
        raise ValueError(f"classes: expected ids in 0..{k - 1} or {NO_ANSWER}")
    if p == 0:
        return 0.0
    counts = np.zeros((p, k + 1), dtype=int)  # column k collects NO_ANSWER
    rows = np.repeat(np.arange(p), k)
    np.add.at(counts, (rows, np.where(cls < 0, k, cls).reshape(-1)), 1)
    counts = counts[:, :k]
    top = counts.max(axis=1)  # [P]
    leaders = (counts == top[:, None]) & (top[:, None] > 0)  # [P, k]
    has_right = right >= 0
    right_leads = np.zeros(p, dtype=bool)
    right_leads[has_right] = leaders[has_right, right[has_right]]
    score = np.where(right_leads, 1.0 / np.maximum(leaders.sum(axis=1), 1), 0.0)
    return float(score.mean())


def _vote_keys(answers: Sequence[str | None], correct: Sequence[bool]) -> list[str | None]:
    if len(answers) != len(correct):
        raise ValueError(f"answers, correct: expected equal lengths, got {len(answers)} "
                         f"and {len(correct)}")
    return [_CORRECT if ok else (a.strip() if isinstance(a, str) and a.strip() else None)
            for a, ok in zip(answers, correct, strict=True)]


_CORRECT = "\0correct"


def candidate_pairs(answers: Sequence[str | None], correct: Sequence[bool]
                    ) -> list[tuple[str, str]]:
    """The pairs of distinct answer texts :func:`answer_classes` asks ``equal`` about:
    every pair of different, non-blank answers that are not correct, in first-appearance
    order (``(a, b)`` with ``a`` first)."""
    texts = list(dict.fromkeys(t for t in _vote_keys(answers, correct)
                               if t is not None and t != _CORRECT))
    return [(a, b) for i, a in enumerate(texts) for b in texts[i + 1:]]


def answer_classes(answers: Sequence[str | None], correct: Sequence[bool],
                   equal: Callable[[str, str], bool]) -> tuple[list[int], int]:
    """Group one problem's k final answers into classes of equivalent answers.

    Correct answers form one class (each is equivalent to the reference); an answer of
    None or blank gets :data:`NO_ANSWER`. The other answers are grouped by their text
    (stripped), and two distinct texts ``a, b`` (the pairs of :func:`candidate_pairs`)
    are merged when ``equal(a, b)``; merging is transitive.

    Returns:
        ``(classes, correct_class)``: ids in ``0..k-1`` numbered by first appearance,
        and the correct class's id (:data:`NO_ANSWER` when no answer is correct).
    """
    keys = _vote_keys(answers, correct)
    parent = {t: t for t in keys if t is not None}

    def root(t: str) -> str:
        while parent[t] != t:
            t = parent[t]
        return t

    for a, b in candidate_pairs(answers, correct):
        if root(a) != root(b) and equal(a, b):
            parent[root(b)] = root(a)
    ids: dict[str, int] = {}
    classes = [NO_ANSWER if t is None else ids.setdefault(root(t), len(ids)) for t in keys]
    return classes, ids.get(_CORRECT, NO_ANSWER)
