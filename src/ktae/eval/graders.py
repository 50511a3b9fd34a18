"""Graders of ``ktae eval --grader``: which rule decides that a math response is correct.

* ``default``: ktae's verifier (:func:`ktae.rewards.math_reward`): the strict last box,
  normalised exact match, exact decimal comparison (scientific notation included), then
  math-verify under a hard deadline.
* ``ktae-authors``: the KTAE authors' evaluation grader, re-implemented
  (:mod:`ktae.rewards.authors_grader`: MATH normalisation, PRM800K's sympy check,
  math-verify), run in the verifier processes under the same deadline. ``--protocol
  ktae`` grades with it, as the published KTAE scores were.
* ``taco``: the TACO paper's rule (Appendix A: "we compare the final boxed answer with
  the reference using normalized exact match or numerical equality"): the strict last
  box, :func:`ktae.rewards.normalize_answer` on both sides and string equality, else both
  read as exact numbers (:func:`numeric_value`: decimals, scientific notation, fractions
  ``a/b`` and ``\\frac{a}{b}``, thousands commas) and equal. No symbolic algebra.
  ``--protocol taco`` grades with it.

Every grader takes a list reference as "any of these". Multiple-choice benchmarks
(MMLU-Pro, GPQA-Diamond) are graded by their option letter whatever the grader.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from ktae.rewards import RewardResult, batch_math_reward, extract_boxed, normalize_answer
from ktae.rewards.batch import batch_scorer_reward
from ktae.rewards.verify import decimal_value, reference_alternatives

GradeFn = Callable[..., list[RewardResult]]
"""``grade(responses, references, *, timeout) -> results``, one per response."""


@dataclass(frozen=True)
class Grader:
    """One named grading rule (see the module docstring)."""

    name: str
    summary: str
    grade: GradeFn


_FRACTION = re.compile(r"^([-+]?)\\frac\{([^{}]+)\}\{([^{}]+)\}$")
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d*)?$")


def numeric_value(answer: str) -> Fraction | None:
    """The exact value of a normalised answer that is a number, else None.

    Decimals and scientific notation (:func:`ktae.rewards.verify.decimal_value`), numbers
    with thousands commas (``1,000``), and fractions of two such numbers (``3/4``,
    ``-\\frac{3}{4}``).
    """
    if _THOUSANDS.match(answer):
        answer = answer.replace(",", "")
    value = decimal_value(answer)
    if value is not None:
        return value
    m = _FRACTION.match(answer)
    if m:
        sign, num, den = m.group(1), m.group(2), m.group(3)
    elif answer.count("/") == 1:
        sign, (num, den) = "", answer.split("/")
    else:
        return None
    top, bottom = decimal_value(num), decimal_value(den)
    if top is None or bottom is None or bottom == 0:
        return None
    return -top / bottom if sign == "-" else top / bottom


def taco_equal(answer: str, reference: str) -> bool:
    """Normalised exact match, else numerical equality (the TACO paper's rule)."""
    a, r = normalize_answer(answer), normalize_answer(reference)
    if not a or not r:
        return False
    if a == r:
        return True
    va, vr = numeric_value(a), numeric_value(r)
    return va is not None and vr is not None and va == vr


def grade_taco(responses: Sequence[str], references: Sequence, *, timeout: float = 5.0
               ) -> list[RewardResult]:
    """The ``taco`` grader of each response (in process: string and number work only)."""
    out = []
    for i, (text, reference) in enumerate(zip(responses, references, strict=True)):
        refs = reference_alternatives(reference, f"references[{i}]")
        box = extract_boxed(text)
        if box is None or not box.strip():
            out.append(RewardResult(0.0, False, False, box))
            continue
        ok = any(taco_equal(box, r) for r in refs)
        out.append(RewardResult(1.0 if ok else 0.0, ok, True, box))
    return out


def grade_default(responses: Sequence[str], references: Sequence, *, timeout: float = 5.0
                  ) -> list[RewardResult]:
    """ktae's verifier on each response."""
    return batch_math_reward(list(responses), list(references), timeout=timeout)


def grade_ktae_authors(responses: Sequence[str], references: Sequence, *,
                       timeout: float = 5.0) -> list[RewardResult]:
    """The KTAE authors' grader on each response, in the verifier processes."""
    return batch_scorer_reward(list(responses), list(references), scorer="ktae-authors",
                               timeout=timeout)


GRADERS: dict[str, Grader] = {g.name: g for g in (
    Grader("default", "ktae's verifier: last box, exact, numeric, then math-verify",
           grade_default),
    Grader("ktae-authors", "the KTAE authors' evaluation grader (MATH normalisation, "
           "sympy, math-verify)", grade_ktae_authors),
    Grader("taco", "the TACO paper's rule: normalised exact match or numerical equality",
           grade_taco),
)}
"""Every grader ``--grader`` accepts, by name."""

DEFAULT_GRADER = "default"


def get_grader(name: str) -> Grader:
    """The grader called ``name``; an unknown name is a ValueError listing the known."""
    if name not in GRADERS:
        raise ValueError(f"--grader: expected one of {', '.join(GRADERS)}, got {name!r}")
    return GRADERS[name]
