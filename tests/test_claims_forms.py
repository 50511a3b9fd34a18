"""Each form of docs/claims.md (Forms, at a glance) on the lines SmolLM2 writes: what the
labeller claims, with which verdict and which labelled characters, and what it skips.
Every case runs on both implementations (ktae.tasks.claims and tests/claims_reference.py)."""

from __future__ import annotations

import pytest
from claims_reference import reference_claims

from ktae.tasks.claims import find_claims


def module_claims(text: str, answer=None) -> list[tuple[str, bool]]:
    """(labelled text, verdict) of each claim, in the order of their results."""
    return [(" ".join(text[a:b] for a, b in c.labelled), c.correct)
            for c in find_claims(text, answer)]


def reference(text: str, answer=None) -> list[tuple[str, bool]]:
    claims = sorted(reference_claims(text, answer), key=lambda c: c[1][0])
    return [(" ".join(text[a:b] for a, b in spans), ok) for _, spans, ok in claims]


BOTH = pytest.mark.parametrize("read", [module_claims, reference], ids=["module", "reference"])


@BOTH
@pytest.mark.parametrize("text, expected", [
    # chains: every link is a claim
    ("2+3=6+1=7", [("6+1", False), ("7", True)]),
    ("2+3=5+1=6", [("5", True), ("6", True)]),                 # running reading
    ("3 * 7 * 5 = 21 * 5 = 105", [("21 * 5", True), ("105", True)]),  # rewriting reading
    ("3 * 7 * 5 = 18 * 5 = 90", [("18 * 5", False), ("90", True)]),
    ("16 * 6 = 8 * 6 = 49", [("8 * 6", False), ("49", False)]),
    ("2+3=5=5", [("5", True), ("5", True)]),
    ("58 + 91 = 149 = 20 marbles", [("149", True), ("20", False)]),
    ("x = 5 = 5", []),                                         # a bare number starts nothing
    ("127 - 30 = 127 - 30 = 127 + 30 = 204",
     [("127 - 30", True), ("127 + 30", False), ("204", False)]),
    ("Each friend gets 10/10 = 1/10 books.", [("1/10", False)]),  # a fraction, not 1
    ("4 * 12 = 4 * 16, which is an identity", [("4 * 16", False)]),
    ("12 = (2 * 10) / 2 = 2 * 20 = 40.", [("2 * 20", False), ("40", True)]),
    # emphasis around results and operands
    ("4 + 4 = **8**", [("8", True)]),
    ("4 + 4 = *8*", [("8", True)]),
    ("4 + 4 = __9__", [("9", False)]),
    ("**4** + __4__ = 8", [("8", True)]),
    ("**4 + 4 = 8**", [("8", True)]),
    ("2*3*4 = 24", [("24", True)]),                            # asterisks between numbers
    # signed first operands
    ("-3 + 5 = 8", [("8", False)]),
    ("x = -3 + 5 = 2", [("2", True)]),
    ("(-3 + 5 = 2)", [("2", True)]),
    ("2 * (-3) = -6", [("-6", True)]),
    # every spelling of the operators
    ("4x3=12", [("12", True)]),
    ("4 X 3 = 12", [("12", True)]),
    ("4 x 3 = 13", [("13", False)]),
    ("4 · 3 = 12", [("12", True)]),
    ("4 ⋅ 3 = 12", [("12", True)]),
    ("4 ∙ 3 = 12", [("12", True)]),
    ("4 × 3 = 12", [("12", True)]),
    ("4*3 = 12", [("12", True)]),
    ("12 ÷ 4 = 3", [("3", True)]),
    ("12 − 4 = 8", [("8", True)]),
    ("4x4x4 = 64", [("64", True)]),
    # brackets, evaluated exactly
    ("(3 + 4) * 2 = 14", [("14", True)]),
    ("2 * (3 + 4) = 15", [("15", False)]),
    ("(7 * 23) / 2 = 24 (since 23 is odd)", [("24", False)]),
    ("sum (56+36=92). He", [("92", True)]),
    # remainders
    ("7 / 2 = 3 remainder 1", [("3 1", True)]),
    ("7 / 2 = 3 r 1", [("3 1", True)]),
    ("7 / 2 = 3 R1", [("3 1", True)]),
    ("7 / 2 = 3 with remainder 1", [("3 1", True)]),
    ("7 ÷ 2 = 3, remainder 1", [("3 1", True)]),
    ("7 / 2 = 3 remainder 2", [("3 2", False)]),              # r < b
    ("9 / 2 = 3 remainder 3", [("3 3", False)]),
    ("40 / 8 = 4 with a remainder of 1.", [("4 1", False)]),
    ("30 ÷ 3 = 10 (with a remainder of 2)", [("10 2", False)]),
    ("84 / 12 = 7 remainder 0", [("7 0", True)]),
    ("7 / 2 = 3", [("3", False)]),                            # no remainder written
    # numbers beside words
    ("3 + 4 = 7 100-page books", [("7", True)]),
    ("3 + 4 = 8 2-liter bottles", [("8", False)]),
    # other number forms
    ("$50 - $36 = $14", [("14", True)]),
    ("1,000 * 3 = 3,001", [("3,001", False)]),
    ("10 / 3 = 3.33", [("3.33", True)]),
    ("5 - 8 = -3", [("-3", True)]),
])
def test_equation_forms(read, text, expected):
    assert read(text) == expected


@BOTH
@pytest.mark.parametrize("text", [
    "1 234 + 1 = 1 235",        # no space-grouped thousands
    "3 + 4 = 7 100 books",      # 7 100 could be 7100
    "3 + 4 = 7 1/2",            # a mixed number
    "x + 3 = 5", "17 apples + 25 = 42", "y x 3 + 4 = 7",
    "2^3 + 1 = 9", "3 + 4 = 7^2", "2 ** 3 = 8", "f(3 + 4) = 7", "2(3 + 4) = 14",
    "5 – 3 = 2", "5 — 3 = 2", "3·5 + 1 = 4.5",
    "so -3 + 5 = 2", "- 3 + 5 = 2", "5 + -3 = 2", "3 + 4 = - 7",
    "3 + 4 = 7%", "50% + 3 = 53", "3 + 4 = 40 %",
    "3 + 4 =\n7", "3 +\n4 = 7",
    "7 / 2 = 3 remainder", "2 + 3 = 5 r 1", "7.5 / 2 = 3 r 1.5",
    "5 / 0 = 0", "3 + 4 == 7", "3 + 4 >= 7", "0x10 = 16",
    "3 + 4) = 7", "(3 + 4)) = 7", "3 + 4 = 5 + x", "10 + 14 * 4 = 10 + 4 * 2 *",
    "**4** * 3 = 12",           # emphasis next to a * operator
])
def test_skipped_forms(read, text):
    assert read(text, 7) == []


@BOTH
@pytest.mark.parametrize("text, expected", [
    ("#### 22", [("22", True)]),
    ("#### 21", [("21", False)]),
    ("The total is 10 x 10 = 100 apples.\n#### 22\nThe answer is \"22\"",
     [("100", True), ("22", True), ("22", True)]),
    ("The answer is: 22", [("22", True)]),
    ("The answer is **22**", [("22", True)]),
    ("Answer: $22", [("22", True)]),
    ("\\boxed{23}", [("23", False)]),
    ("##### 22", []),                          # not exactly four
    ("#### 20 + 2", []),                       # an expression
    ("The answer is 98 ÷ 98 = 1.", [("1", True)]),  # the equation, not the answer
    ("So, the answer is 60 +", []),
])
def test_answer_forms(read, text, expected):
    assert read(text, 22) == expected
