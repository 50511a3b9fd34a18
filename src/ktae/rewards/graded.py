"""A graded reward for the embedded task: partial credit for the final answer's digits.

``digits`` (``ktae train --reward digits``) scores a completion as

    score = 1                                   the boxed answer is correct (strict check)
    score = 0.4 * (digits right) / (digits)     otherwise

where the boxed answer and the reference are compared as integers written in decimal,
right-aligned (units with units, tens with tens, ...), over ``max(len(answer),
len(reference))`` positions; a missing box, a sign that differs or a non-integer answer
scores 0. ``correct`` is the strict check's.

Why digits: the embedded task's characteristic mistake is a forgotten carry or borrow,
which leaves a single digit of the answer wrong (``37+45=72``); digit credit tells such a
near miss (0.2 for ``72`` against ``82``) from a wild or missing answer (0), which a 0/1
reward cannot. The credit needs only the reference answer, as every registered reward.
Why 0.4 and 1: the graded part stays below 0.5 and a correct answer above it, so the
trainer's correctness rule (``score > 0.5``, used by threshold KTAE, dynamic sampling
and the accuracy metrics) is exactly the strict check, and the reward differs from
``boxed`` only among incorrect answers, which is where a graded reward adds information.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ktae.rewards.batch import batch_math_reward
from ktae.rewards.verify import RewardResult

#: Most a wrong answer can score (all of its digits right is still wrong: e.g. a leading
#: digit too many).
PARTIAL_CREDIT = 0.4

_INTEGER = re.compile(r"[+-]?\d+")


def digit_credit(extracted: str | None, reference) -> float:
    """Share of right-aligned decimal digits the two integers agree on, in ``[0, 1]``.

    0 when either is not an integer literal (after stripping spaces) or their signs
    differ. ``digit_credit("72", "82") == 0.5``; ``digit_credit("182", "82") == 2 / 3``.
    """
    if extracted is None:
        return 0.0
    if isinstance(reference, (list, tuple)):  # accepted alternatives: the closest one
        return max((digit_credit(extracted, r) for r in reference), default=0.0)
    a, b = str(extracted).replace(" ", ""), str(reference).replace(" ", "")
    if not (_INTEGER.fullmatch(a) and _INTEGER.fullmatch(b)):
        return 0.0
    if (a.startswith("-") and int(a) != 0) != (b.startswith("-") and int(b) != 0):
        return 0.0
    da, db = str(abs(int(a))), str(abs(int(b)))
    width = max(len(da), len(db))
    da, db = da.rjust(width, " "), db.rjust(width, " ")
    return sum(x == y for x, y in zip(da, db, strict=True)) / width


def score_digits(completions: Sequence[str], answers: Sequence, *, timeout: float = 5.0,
                 num_workers: int | None = 1, data_sources: Sequence | None = None
                 ) -> list[RewardResult]:
    """The ``digits`` reward of each completion (see the module docstring); the strict
    boxed check decides ``correct``. ``data_sources`` is ignored."""
    strict = batch_math_reward(list(completions), list(answers), timeout=timeout,
                               num_workers=num_workers)
    out = []
    for r, answer in zip(strict, answers, strict=True):
        score = 1.0 if r.correct else PARTIAL_CREDIT * digit_credit(r.extracted, answer)
        out.append(RewardResult(score=score, correct=r.correct, formatted=r.formatted,
                                extracted=r.extracted, timed_out=r.timed_out))
    return out
