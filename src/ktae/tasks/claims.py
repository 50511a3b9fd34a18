"""Exact labels for free-text arithmetic: find, recompute and label a response's claims.

A claim is an equation ``a op b (op c ...) = r`` or an explicit final answer (``the answer
is N``, ``Answer: N``, ``\\boxed{N}``) checked against the problem's answer. Each claim is
recomputed in exact rational arithmetic; the characters of its *result* are labelled
:data:`~ktae.tasks.embedded.LABEL_WRONG` when it is false and
:data:`~ktae.tasks.embedded.LABEL_RIGHT` when it is true, so that ``ktae audit`` and
``ktae explain`` read these labels as they read the embedded task's. ``docs/claims.md`` is
the specification (what counts as a number, an operator, a claim; what is ignored and
why); ``tests/claims_reference.py`` is a second implementation written from it alone.

This one reads numbers with a regular expression and checks their boundaries in Python;
claims are then found around each ``=`` and each answer marker, from the list of numbers.
Pure Python; :func:`claim_token_labels` maps the labels to a tokenizer's tokens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from ktae.tasks.embedded import LABEL_OTHER, LABEL_RIGHT, LABEL_WRONG, token_labels

SPACES = " \t"
"""What "spaces" means in claims: spaces and tabs, never a line break."""
MINUS_SIGNS = "-\u2212"
"""Signs a result may carry directly before its digits."""
ADD, MUL = 1, 2
"""Precedence levels: multiplication and division bind tighter."""
OPERATORS = {"+": (ADD, "+"), "-": (ADD, "-"), "\u2212": (ADD, "-"), "*": (MUL, "*"),
             "\u00d7": (MUL, "*"), "x": (MUL, "*"), "/": (MUL, "/"), "\u00f7": (MUL, "/")}
"""Written operator -> (precedence, operation)."""
BLOCKING = set("+-\u2212\u00d7\u00f7/^)]")
"""Characters that, just before a chain, leave part of its expression unread."""

_NUMBER = re.compile(r"\$?(?:[0-9]{1,3}(?:,[0-9]{3}(?![0-9]))+"
                     r"|[0-9]{1,3}(?: [0-9]{3}(?![0-9]))+"
                     r"|[0-9]+)(?:\.[0-9]+)?")
_OPERATOR_GAP = re.compile(r"[ \t]*([+\-\u2212*\u00d7/\u00f7])[ \t]*|[ \t]+(x)[ \t]+")
_ANSWER_IS = re.compile(r"[Aa][Nn][Ss][Ww][Ee][Rr]\**[ \t]+[Ii][Ss]:?[ \t*]*")
_ANSWER_COLON = re.compile(r"[Aa][Nn][Ss][Ww][Ee][Rr]\**[ \t]*:[ \t*]*")
_BOXED = re.compile(r"\\[Bb][Oo][Xx][Ee][Dd]\{[ \t]*")


@dataclass(frozen=True)
class Number:
    """A number literal: ``text[start:end]``; ``digits_start`` skips its ``$``."""

    start: int
    digits_start: int
    end: int
    value: Fraction
    places: int
    """Decimal places as written (0 for an integer)."""


@dataclass(frozen=True)
class Claim:
    """One checkable claim of a response.

    Attributes:
        kind: ``"equation"`` (``a op b ... = r``) or ``"answer"`` (an explicit final answer).
        start, end: the claim's span in the text (from its first operand, its opening
            bracket or its marker
            through its result).
        result_start, result_end: the labelled span: the result's sign or first digit
            through its last digit.
        stated: the result as written (exact).
        expected: the recomputed value, or the problem's answer.
        correct: whether the result is right (``docs/claims.md``, Rounding).
    """

    kind: str
    start: int
    end: int
    result_start: int
    result_end: int
    stated: Fraction
    expected: Fraction
    correct: bool


def _is_letter(ch: str) -> bool:
    return ch.isalpha()


def _left_ok(text: str, i: int) -> bool:
    if i == 0:
        return True
    ch = text[i - 1]
    return not (_is_letter(ch) or ch in "0123456789_.,$")


def _right_ok(text: str, j: int) -> bool:
    if j >= len(text):
        return True
    ch = text[j]
    if _is_letter(ch) or ch in "0123456789_%":
        return False
    return not (ch in ",." and j + 1 < len(text) and text[j + 1] in "0123456789")


def find_numbers(text: str) -> list[Number]:
    """Every number of ``text`` (``docs/claims.md``, Numbers), left to right."""
    out, pos = [], 0
    while True:
        m = _NUMBER.search(text, pos)
        if m is None:
            return out
        i, j = m.span()
        if _left_ok(text, i) and _right_ok(text, j):
            literal = m.group().lstrip("$").replace(",", "").replace(" ", "")
            places = len(literal.partition(".")[2])
            out.append(Number(i, i + (text[i] == "$"), j, Fraction(literal), places))
            pos = j
        else:
            pos = i + 1


def _operator_between(text: str, left: Number, right: Number) -> str | None:
    """The operation written between two numbers, or None if the gap is not one operator."""
    m = _OPERATOR_GAP.fullmatch(text, left.end, right.start)
    return None if m is None else OPERATORS[m.group(1) or m.group(2)][1]


def _evaluate(values: list[Fraction], ops: list[str]) -> Fraction | None:
    """Usual precedence, left to right within a level; None on a division by zero."""
    terms, signs = [values[0]], []
    for op, v in zip(ops, values[1:], strict=True):
        if op == "*":
            terms[-1] = terms[-1] * v
        elif op == "/":
            if v == 0:
                return None
            terms[-1] = terms[-1] / v
        else:
            signs.append(op)
            terms.append(v)
    total = terms[0]
    for sign, term in zip(signs, terms[1:], strict=True):
        total = total + term if sign == "+" else total - term
    return total


def _matches(value: Fraction, stated: Fraction, places: int) -> bool:
    if places == 0:
        return value == stated
    return abs(value - stated) <= Fraction(1, 2 * 10 ** places)


def _blocked(text: str, start: int) -> bool:
    """Whether the nearest non-space character before ``start`` leaves part of an
    expression unread (``docs/claims.md``, Complete)."""
    k = start - 1
    while k >= 0 and text[k] in SPACES:
        k -= 1
    if k < 0:
        return False
    ch = text[k]
    if ch in BLOCKING:
        return True
    if ch == "*":
        return not ((k > 0 and text[k - 1] == "*") or (k + 1 < len(text) and text[k + 1] == "*"))
    return ch == "x" and (k == 0 or text[k - 1] in SPACES)


class _Reader:
    """The numbers of one text, indexed by where they start and end."""

    def __init__(self, text: str):
        self.text = text
        self.numbers = find_numbers(text)
        self.by_start = {n.start: k for k, n in enumerate(self.numbers)}
        self.by_end = {n.end: k for k, n in enumerate(self.numbers)}

    def result_at(self, pos: int) -> tuple[int, int, Fraction, int] | None:
        """A single result starting at ``pos``: (labelled start, end, value, places)."""
        sign = pos < len(self.text) and self.text[pos] in MINUS_SIGNS
        k = self.by_start.get(pos + sign)
        if k is None:
            return None
        n = self.numbers[k]
        if k + 1 < len(self.numbers) and _operator_between(self.text, n, self.numbers[k + 1]):
            return None  # an expression, not a single result
        start = pos if sign else n.digits_start
        return start, n.end, -n.value if sign else n.value, n.places


def _skip_spaces_back(text: str, pos: int) -> int:
    """The position after the last non-space character before ``pos``."""
    while pos > 0 and text[pos - 1] in SPACES:
        pos -= 1
    return pos


def _skip_spaces(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in SPACES:
        pos += 1
    return pos


def _equation_claims(r: _Reader) -> list[Claim]:
    text, out = r.text, []
    for eq in (m.start() for m in re.finditer("=", text)):
        k = _skip_spaces_back(text, eq)
        bracketed = k > 0 and text[k - 1] == ")"
        if bracketed:
            k = _skip_spaces_back(text, k - 1)
        last = r.by_end.get(k)
        if last is None:
            continue
        first, ops = last, []
        while first > 0:
            op = _operator_between(text, r.numbers[first - 1], r.numbers[first])
            if op is None:
                break
            ops.insert(0, op)
            first -= 1
        front = r.numbers[first].start
        if bracketed:
            front = _skip_spaces_back(text, front)
            if front == 0 or text[front - 1] != "(":
                continue
            front -= 1
        if not ops or _blocked(text, front):
            continue
        result = r.result_at(_skip_spaces(text, eq + 1))
        if result is None:
            continue
        value = _evaluate([n.value for n in r.numbers[first:last + 1]], ops)
        if value is None:
            continue
        start, end, stated, places = result
        out.append(Claim("equation", front, end, start, end, stated, value,
                         _matches(value, stated, places)))
    return out


def _answer_claims(r: _Reader, answer: Fraction) -> list[Claim]:
    text, out = r.text, []
    markers = []
    for pattern in (_ANSWER_IS, _ANSWER_COLON):
        for m in pattern.finditer(text):
            if m.start() == 0 or not _is_letter(text[m.start() - 1]):
                markers.append((m.start(), m.end(), False))
    markers += [(m.start(), m.end(), True) for m in _BOXED.finditer(text)]
    for start, pos, boxed in markers:
        result = r.result_at(pos)
        if result is None:
            continue
        res_start, end, stated, places = result
        if boxed:
            close = _skip_spaces(text, end)
            if close >= len(text) or text[close] != "}":
                continue
        out.append(Claim("answer", start, end, res_start, end, stated, answer,
                         _matches(answer, stated, places)))
    return out


def parse_answer(answer) -> Fraction:
    """The problem's answer as an exact number (an int, a Fraction, or a string such as
    ``"42"``, ``"-3.5"``, ``"1,234"``, ``"7/2"``)."""
    if isinstance(answer, bool) or not isinstance(answer, (int, float, str, Fraction)):
        raise ValueError(f"answer: expected a number or a numeric string, got {answer!r}")
    try:
        if isinstance(answer, str):
            return Fraction(answer.strip().replace(",", "").replace("$", ""))
        return Fraction(str(answer)) if isinstance(answer, float) else Fraction(answer)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"answer: expected a number or a numeric string, got {answer!r}") from None


def find_claims(text: str, answer=None) -> list[Claim]:
    """Every checkable claim of ``text``, ordered by where its result starts.

    Args:
        text: the response.
        answer: the problem's exact answer (see :func:`parse_answer`); without it, answer
            claims are not read.
    """
    if not isinstance(text, str):
        raise ValueError(f"text: expected a string, got {type(text).__name__}")
    reader = _Reader(text)
    claims = _equation_claims(reader)
    if answer is not None:
        claims += _answer_claims(reader, parse_answer(answer))
    return sorted(claims, key=lambda c: (c.result_start, c.start))


def claim_labels(text: str, answer=None) -> str:
    """Per-character labels of ``text``: ``"w"`` on the result of a false claim, ``"r"`` on
    the result of a true one, ``"."`` elsewhere (a character in both: ``"w"``)."""
    claims = find_claims(text, answer)
    labels = [LABEL_OTHER] * len(text)
    for c in claims:
        for k in range(c.result_start, c.result_end):
            if labels[k] != LABEL_WRONG:
                labels[k] = LABEL_RIGHT if c.correct else LABEL_WRONG
    return "".join(labels)


def claim_token_labels(tokenizer, ids: Sequence[int], answer=None) -> list[str]:
    """One label per token of a response (its token ids): the response is decoded piece by
    piece (:func:`ktae.viz.tokens.token_pieces`, leading spaces kept with their token), and
    a token is ``"w"`` when any of its characters is, else ``"r"`` when any is, else
    ``"."``."""
    from ktae.viz.tokens import token_pieces

    pieces = [p.text for p in token_pieces(tokenizer, ids)]
    return token_labels(claim_labels("".join(pieces), answer), pieces)


def has_false_claim(text: str, answer=None) -> bool:
    """Whether ``text`` makes at least one false claim."""
    return any(not c.correct for c in find_claims(text, answer))


def final_answer(text: str, answer=None) -> Claim | None:
    """The response's last answer claim (``answer is``, ``Answer:``, ``\\boxed{}``), or None."""
    claims = [c for c in find_claims(text, 0 if answer is None else answer) if c.kind == "answer"]
    return claims[-1] if claims else None
