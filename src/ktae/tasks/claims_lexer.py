"""Cut one line of a response into the items the claim labeller reads (docs/claims.md).

Items are numbers (with their ``$``, emphasis and value), operators, brackets, ``=``
signs, ``####`` markers, words and other characters; spaces and tabs separate items and
are not items. :mod:`ktae.tasks.claims` reads claims off this list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

SPACES = " \t"
"""What "spaces" means in claims: spaces and tabs, never a line break."""
DIGITS = "0123456789"
OPERATORS = {"+": "+", "-": "-", "\u2212": "-", "*": "*", "\u00d7": "*", "x": "*", "X": "*",
             "\u00b7": "*", "\u22c5": "*", "\u2219": "*", "/": "/", "\u00f7": "/"}
"""Written operator -> operation (docs/claims.md, Operators)."""
EMPHASIS = ("**", "__", "*")
"""Markdown emphasis a number may be wrapped in (docs/claims.md, Numbers)."""

NUM, OP, LP, RP, EQ, HASH, WORD, OTHER = "num", "op", "(", ")", "=", "####", "word", "other"

GROUP_SEPARATORS = ("{,}", "\\,", ",")
"""What separates groups of three digits: LaTeX's ``{,}`` and ``\\,``, and a comma."""
_LITERAL = re.compile(r"\$?(?:[0-9]{1,3}(?:(?:,|\{,\}|\\,)[0-9]{3}(?![0-9]))+|[0-9]+)"
                      r"(?:\.[0-9]+)?")


@dataclass(frozen=True)
class Number:
    """A number: ``text[start:outer_end]`` as written (emphasis and ``$`` included);
    ``text[digits_start:end]`` is its digits (the labelled part of a result)."""

    start: int
    digits_start: int
    end: int
    value: Fraction
    places: int
    """Decimal places as written (0 for an integer)."""
    outer_end: int = -1


@dataclass(frozen=True)
class Item:
    """One item of a line: ``kind`` (one of NUM, OP, LP, RP, EQ, HASH, WORD, OTHER), its span,
    its operation (``+ - * /``, OP only) and its number (NUM only)."""

    kind: str
    start: int
    end: int
    op: str = ""
    number: Number | None = None


def _char(text: str, k: int) -> str:
    return text[k] if 0 <= k < len(text) else ""


def _prev_solid(text: str, k: int) -> str:
    """The nearest character before ``k`` that is not a space ("" at the line's start)."""
    k -= 1
    while k >= 0 and text[k] in SPACES:
        k -= 1
    return _char(text, k)


def _next_solid(text: str, k: int) -> str:
    while k < len(text) and text[k] in SPACES:
        k += 1
    return _char(text, k)


def _among(ch: str, chars: str) -> bool:
    """Whether ``ch`` (one character, or "" past the line's ends) is one of ``chars``."""
    return ch != "" and ch in chars


def _is_digit(ch: str) -> bool:
    return _among(ch, DIGITS)


def _times_x(text: str, k: int) -> bool:
    """Whether the ``x``/``X`` at ``k`` is a multiplication: spaces (or the line's start)
    before and spaces after it, or a digit directly on each side (not ``0x``, a hex
    prefix)."""
    before, after = _char(text, k - 1), _char(text, k + 1)
    if (before == "" or before in SPACES + "\n") and _among(after, SPACES):
        return True
    if not (_is_digit(before) and _is_digit(after)):
        return False
    j = k - 1
    while j >= 0 and _is_digit(text[j]):
        j -= 1
    return text[j + 1:k] != "0"


def _literal(text: str, i: int) -> tuple[int, int, Fraction, int] | None:
    """(digits start, end, value, places) of the longest literal at ``i`` (``$`` allowed)."""
    m = _LITERAL.match(text, i)
    if m is None:
        return None
    digits = m.group().lstrip("$")
    for separator in GROUP_SEPARATORS:
        digits = digits.replace(separator, "")
    return i + (text[i] == "$"), m.end(), Fraction(digits), len(digits.partition(".")[2])


def _after_ok(text: str, j: int) -> bool:
    ch = _char(text, j)
    if ch in ("x", "X") and _times_x(text, j):
        return True
    if ch.isalpha() or _is_digit(ch) or ch in ("_", "%"):
        return False
    if _among(ch, ",.") and _is_digit(_char(text, j + 1)):
        return False
    return not any(text.startswith(s, j) and _is_digit(_char(text, j + len(s)))
                   for s in GROUP_SEPARATORS[:2])


def _before_ok(text: str, i: int) -> bool:
    ch = _char(text, i - 1)
    if ch in ("x", "X") and _times_x(text, i - 1):
        return True
    if any(text.endswith(s, 0, i) for s in GROUP_SEPARATORS[:2]):
        return False  # the last group of "1{,}000" after a cut-off literal
    return not (ch.isalpha() or _is_digit(ch) or _among(ch, "_.,$"))


def _number_at(text: str, i: int) -> Number | None:
    """The number starting at ``i``, emphasis included (docs/claims.md, Numbers)."""
    for mark in EMPHASIS:
        if not text.startswith(mark, i) or (mark == "*" and _char(text, i + 1) == "*"):
            continue
        lit = _literal(text, i + len(mark))
        if lit is None:
            continue
        close = lit[1]
        if not text.startswith(mark, close) or _char(text, close + len(mark)) == mark[0]:
            continue
        outer = close + len(mark)
        if mark == "*" and (_among(_prev_solid(text, i), DIGITS + ")")
                            or _is_digit(_next_solid(text, outer))):
            continue  # next to a number: asterisks that multiply, not emphasis
        if _before_ok(text, i) and _after_ok(text, outer):
            return Number(i, lit[0], lit[1], lit[2], lit[3], outer)
    lit = _literal(text, i)
    if lit is None or not (_before_ok(text, i) and _after_ok(text, lit[1])):
        return None
    return Number(i, lit[0], lit[1], lit[2], lit[3], lit[1])


def _operator_kind(text: str, i: int) -> bool:
    """Whether the operator character at ``i`` is read as an operator here."""
    ch = text[i]
    if ch == "*":
        if "*" in (_char(text, i - 1), _char(text, i + 1)):
            return False  # part of ** (bold), not a product
        return _among(_prev_solid(text, i), DIGITS + ")") \
            and _among(_next_solid(text, i + 1), DIGITS + "$(")
    if ch == "\u00b7":  # also a decimal point in some typography: spaced only
        return _among(_char(text, i - 1), SPACES) and _among(_char(text, i + 1), SPACES)
    return True


def lex(text: str) -> list[Item]:
    """The items of one line ``text`` (no line breaks), left to right."""
    items: list[Item] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in SPACES:
            i += 1
            continue
        num = _number_at(text, i) if ch in DIGITS + "$*_" else None
        if num is not None:
            items.append(Item(NUM, i, num.outer_end, number=num))
            i = num.outer_end
        elif ch in ("x", "X") and _times_x(text, i):
            items.append(Item(OP, i, i + 1, "*"))
            i += 1
        elif ch.isalpha():
            j = i
            while j < n and text[j].isalpha():
                j += 1
            items.append(Item(WORD, i, j))
            i = j
        elif ch in OPERATORS and _operator_kind(text, i):
            items.append(Item(OP, i, i + 1, OPERATORS[ch]))
            i += 1
        elif ch in "(=)#*":
            j = i
            while j < n and text[j] == ch:
                j += 1
            if ch == "=" and (j - i > 1 or _among(_char(text, i - 1), "<>!")
                              or _char(text, j) == ">"):
                items.append(Item(OTHER, i, j))
            elif ch in "()" or (ch == "=") or (ch == "#" and j - i == 4):
                j = i + 1 if ch in "()=" else j
                items.append(Item({"(": LP, ")": RP, "=": EQ, "#": HASH}[ch], i, j))
            else:
                items.append(Item(OTHER, i, j))
            i = j
        else:
            items.append(Item(OTHER, i, i + 1))
            i += 1
    return items
