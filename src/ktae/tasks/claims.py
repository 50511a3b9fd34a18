"""Exact labels for free-text arithmetic: find, recompute and label a response's claims.

A claim is a link of an equation chain (``a op b = r``; in ``2+3=5+1=6`` each ``=`` is a
link), an integer division with a remainder (``7 / 2 = 3 remainder 1``) or an explicit
final answer (``the answer is N``, ``Answer: N``, ``\\boxed{N}``, ``#### N``) checked
against the problem's answer. Each claim is recomputed in exact rational arithmetic; the
characters of its *result* are labelled :data:`~ktae.tasks.embedded.LABEL_WRONG` when it
is false and :data:`~ktae.tasks.embedded.LABEL_RIGHT` when it is true, so that ``ktae
audit`` and ``ktae explain`` read these labels as they read the embedded task's.
``docs/claims.md`` is the specification (what counts as a number, an operator, a claim;
what is skipped and why); ``tests/claims_reference.py`` is a second implementation written
from it alone, and :mod:`ktae.tasks.claims_grammar` writes responses whose claims are
known by construction.

LaTeX arithmetic is first rewritten in place, character for character
(:func:`ktae.tasks.claims_latex.plain_math`), so spans stay those of the response as
written. Each line is cut into items (:func:`ktae.tasks.claims_lexer.lex`); claims are read
off the items around each ``=`` and each answer marker. A response cut at the token budget
(``cut_off=True``) keeps only the claims a closing mark after them puts out of the cut's
reach (docs/claims.md, Cut-off responses). Pure Python; :func:`claim_token_labels` maps the
labels to a tokenizer's tokens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from ktae.tasks.claims_latex import plain_math
from ktae.tasks.claims_lexer import (
    DIGITS,
    EQ,
    HASH,
    LP,
    NUM,
    OP,
    OTHER,
    RP,
    SPACES,
    Item,
    Number,
    lex,
)
from ktae.tasks.embedded import LABEL_OTHER, LABEL_RIGHT, LABEL_WRONG, token_labels
from ktae.viz.tokens import token_pieces

__all__ = ["Claim", "Number", "claim_labels", "claim_token_labels", "final_answer",
           "find_claims", "find_numbers", "has_false_claim", "parse_answer"]

BLOCKING = set("^]}\u2013\u2014\u00b7%*0123456789")
"""Characters that, as the nearest non-space before a left side or (``^``) after a result,
leave part of an expression unread (docs/claims.md, Complete)."""
_EXPRESSION = (NUM, OP, LP, RP)
_ANSWER_IS = re.compile(r"(?<![^\W\d_])answer\**[ \t]+is:?", re.IGNORECASE)
_ANSWER_COLON = re.compile(r"(?<![^\W\d_])answer\**[ \t]*:", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{", re.IGNORECASE)
OPEN_WORDS = ("with", "a", "remainder", "of", "r", "x")
"""Words that may go on reading a result (a remainder, the operator ``x``): in a cut-off
response, a run of letters that begins one of them does not close a claim."""
CLOSING_MARKS = '.!?;"'
"""Characters that close a claim in a cut-off response when a character other than a
digit follows them (docs/claims.md, Cut-off responses)."""
_REMAINDER = re.compile(r"[ \t]*([(,]?)[ \t]*(?:with[ \t]+(?:a[ \t]+)?)?"
                        r"(?:remainder(?:[ \t]+of)?|r)(?![^\W\d_])[ \t]*:?[ \t]*", re.IGNORECASE)


@dataclass(frozen=True)
class Claim:
    """One checkable claim of a response.

    Attributes:
        kind: ``"equation"`` (a link ``left = right``), ``"remainder"`` (``a / b = q
            remainder r``) or ``"answer"`` (an explicit final answer).
        start, end: the claim's span in the text (from its left side or marker through its
            result).
        result_start, result_end: the labelled span (docs/claims.md, Labels).
        stated: the result's value as written (for a remainder claim: ``q * b + r``).
        expected: the recomputed value, or the problem's answer.
        correct: whether the claim is true (docs/claims.md, Rounding).
        parts: the labelled spans when they are not the whole result span (a remainder
            claim labels its quotient and its remainder, not the words between them).
    """

    kind: str
    start: int
    end: int
    result_start: int
    result_end: int
    stated: Fraction
    expected: Fraction
    correct: bool
    parts: tuple[tuple[int, int], ...] = ()

    @property
    def labelled(self) -> tuple[tuple[int, int], ...]:
        """The labelled spans of the text: ``parts``, or the result span."""
        return self.parts or ((self.result_start, self.result_end),)


class _Parser:
    """Recursive descent over the items of an expression (docs/claims.md, Expressions)."""

    def __init__(self, items: Sequence[Item]):
        self.items, self.pos, self.ops = items, 0, 0

    def _peek_op(self, ops: str) -> str:
        it = self.items[self.pos] if self.pos < len(self.items) else None
        return it.op if it is not None and it.kind == OP and it.op in ops else ""

    def factor(self) -> Fraction | None:
        items, sign = self.items, 1
        if self.pos >= len(items):
            return None
        it = items[self.pos]
        if it.kind == OP and it.op == "-" and (self.pos == 0 or items[self.pos - 1].kind == LP):
            if self.pos + 1 >= len(items) or items[self.pos + 1].start != it.end:
                return None  # a sign is written directly before its operand
            sign, self.pos = -1, self.pos + 1
            it = items[self.pos]
        self.pos += 1
        if it.kind == NUM:
            return sign * it.number.value
        if it.kind != LP:
            return None
        inner = self.expr()
        if inner is None or self.pos >= len(items) or items[self.pos].kind != RP:
            return None
        self.pos += 1
        return sign * inner

    def term(self) -> Fraction | None:
        value = self.factor()
        while value is not None and (op := self._peek_op("*/")):
            self.pos, self.ops = self.pos + 1, self.ops + 1
            right = self.factor()
            if right is None or (op == "/" and right == 0):
                return None
            value = value * right if op == "*" else value / right
        return value

    def expr(self) -> Fraction | None:
        value = self.term()
        while value is not None and (op := self._peek_op("+-")):
            self.pos, self.ops = self.pos + 1, self.ops + 1
            right = self.term()
            if right is None:
                return None
            value = value + right if op == "+" else value - right
        return value


def _evaluate(items: Sequence[Item]) -> tuple[Fraction, int] | None:
    """(value, number of binary operators) of an expression, or None when the items are not
    one expression or it divides by zero. Usual precedence, left to right within a level;
    brackets evaluated; a ``-`` sign only first or just after ``(``, directly before its
    operand."""
    parser = _Parser(items)
    value = parser.expr()
    if value is None or parser.pos != len(items):
        return None
    return value, parser.ops


def _matches(value: Fraction, stated: Fraction, places: int) -> bool:
    """docs/claims.md, Rounding: within half a unit of the last written place."""
    if places == 0:
        return value == stated
    return abs(value - stated) <= Fraction(1, 2 * 10 ** places)


def _char(text: str, k: int) -> str:
    return text[k] if 0 <= k < len(text) else ""


def _solid_before(text: str, k: int) -> int:
    """Index of the nearest non-space character before ``k`` (-1 if none)."""
    k -= 1
    while k >= 0 and text[k] in SPACES:
        k -= 1
    return k


def _solid_after(text: str, k: int) -> str:
    while k < len(text) and text[k] in SPACES:
        k += 1
    return _char(text, k)


def _line_start(text: str, k: int) -> bool:
    return k < 0 or text[k] == "\n"


def _span(items: Sequence[Item]) -> tuple[int, int]:
    """The labelled span of a result: its sign or first digit (or bracket) through its last
    digit (or bracket); ``$`` and emphasis are outside it."""
    first, last = items[0], items[-1]
    start = first.number.digits_start if first.kind == NUM else first.start
    return start, last.number.end if last.kind == NUM else last.end


def _single(items: Sequence[Item]) -> Item | None:
    """The number of a single result (a number, or ``-`` directly before a number)."""
    if len(items) == 1 and items[0].kind == NUM:
        return items[0]
    if len(items) == 2 and items[0].kind == OP and items[0].op == "-" \
            and items[1].kind == NUM and items[1].start == items[0].end:
        return items[1]
    return None


def _complete_before(text: str, left: Sequence[Item]) -> bool:
    """docs/claims.md, Complete: nothing before the left side leaves part of it unread."""
    start = left[0].start
    before = _char(text, start - 1)
    if before.isalpha() or (before != "" and before in "0123456789_.,$"):
        return False
    k = _solid_before(text, start)
    ch = _char(text, k)
    if left[0].kind == OP and (ch.isalpha() or (ch != "" and ch in ").")):
        return False  # "apples -3": a subtraction from a quantity written in words
    if ch == "" or ch not in BLOCKING:
        return True
    if ch != "*":
        return False
    if "*" in (_char(text, k - 1), _char(text, k + 1)):
        return True  # markdown bold
    return _line_start(text, _solid_before(text, k)) and _char(text, k + 1) in SPACES  # a bullet


def _closed(text: str, end: int) -> bool:
    """Whether the text after ``end`` (where a claim's reading stops) holds, on the same
    line, a mark that no rule reads past: a line break; a run of letters, not after ``\\``,
    that begins none of :data:`OPEN_WORDS`; an ``=`` followed by a character other than
    ``=`` and ``>``; one of :data:`CLOSING_MARKS` followed by a character other than a
    digit (docs/claims.md, Cut-off responses)."""
    k, n = end, len(text)
    while k < n:
        ch = text[k]
        if ch == "\n":
            return True
        if ch.isalpha():
            j = k
            while j < n and text[j].isalpha():
                j += 1
            word = text[k:j].lower()
            if _char(text, k - 1) != "\\" and not any(w.startswith(word) for w in OPEN_WORDS):
                return True
            k = j
            continue
        nxt = _char(text, k + 1)
        if nxt != "" and ((ch == "=" and nxt not in "=>")
                          or (ch in CLOSING_MARKS and nxt not in DIGITS)):
            return True
        k += 1
    return False


def _complete_after(text: str, end: int) -> bool:
    """Nothing after a result continues its expression (``= 5^2``, ``= 7 \u2013 3``, ``= 40 %``,
    ``= 2 *``)."""
    k = end
    while k < len(text) and text[k] in SPACES:
        k += 1
    ch = _char(text, k)
    if ch in ("^", "%") or (ch == "*" and _char(text, k + 1) != "*"):
        return False  # a power, a percentage, or a product cut short
    return not (ch != "" and ch in "\u2013\u2014\u00b7" and _solid_after(text, k + 1).isdigit())


class _Reader:
    """The items of a text (its LaTeX in plain form), with the claims read off them;
    ``cut_off``: the text was cut at the token budget, so a claim the end of the text
    leaves open is not read."""

    def __init__(self, text: str, cut_off: bool = False):
        self.text = plain_math(text)
        self.cut_off = cut_off
        self.items = lex(self.text)
        self.at = {it.start: k for k, it in enumerate(self.items)}

    def left_side(self, e: int) -> tuple[list[Item], Item | None] | None:
        """(left side, item before it) of the ``=`` at item ``e``."""
        items, j = self.items, e
        while j > 0 and items[j - 1].kind in _EXPRESSION:
            j -= 1
        run, depth, cut = items[j:e], 0, 0
        for k in range(len(run) - 1, -1, -1):
            if run[k].kind == RP:
                depth += 1
            elif run[k].kind == LP:
                if depth == 0:
                    cut = k + 1  # an opening bracket around the whole equation
                    break
                depth -= 1
        left = run[cut:]
        if not left:
            return None
        return left, run[cut - 1] if cut else (items[j - 1] if j else None)

    def right_side(self, e: int) -> tuple[list[Item], int] | None:
        """(right side, index of the item after it) of the ``=`` at item ``e``."""
        items, j, depth = self.items, e + 1, 0
        while j < len(items) and items[j].kind in _EXPRESSION:
            if items[j].kind == LP:
                depth += 1
            elif items[j].kind == RP:
                if depth == 0:
                    break  # closes a bracket opened before the equation
                depth -= 1
            j += 1
        run = items[e + 1:j]
        if run and _evaluate(run) is not None:
            return run, j
        for m in range(len(run) - 1, 0, -1):
            if _evaluate(run[:m]) is not None and self._ends_result(run, m):
                return run[:m], e + 1 + m
        return None

    def _ends_result(self, run: Sequence[Item], m: int) -> bool:
        """Whether ``run[m]`` starts words after a result: a parenthesis of words
        (``= 10 (with ...``) or a number of a hyphenated word (``= 7 100-page books``)."""
        nxt, text = run[m], self.text
        if nxt.start == run[m - 1].end:
            return False
        if nxt.kind == LP:
            return m == len(run) - 1
        if nxt.kind != NUM or m + 1 >= len(run):
            return False
        dash = run[m + 1]
        return dash.op == "-" and _char(text, dash.start) == "-" and dash.start == nxt.end \
            and _char(text, dash.end).isalpha()

    def remainder(self, end: int) -> tuple[int, int] | None | bool:
        """After a quotient ending at ``end``: (start, end) of a written remainder's digits,
        False when none is written, None when a remainder marker has no number."""
        m = _REMAINDER.match(self.text, end)
        if m is None:
            return False
        d = re.compile(r"[0-9]+(?![\w%]|[.,][0-9])").match(self.text, m.end())
        if d is None:
            return None
        if m.group(1) == "(" and _solid_after(self.text, d.end()) != ")":
            return None
        return d.start(), d.end()

    def equation_claims(self) -> list[Claim]:
        out: list[Claim] = []
        claimed: set[int] = set()  # items of the "=" signs that made a claim
        for e, eq in enumerate(self.items):
            if eq.kind == EQ and (claim := self._link(e, claimed)) is not None:
                out.append(claim)
                claimed.add(e)
        return out

    def _link(self, e: int, claimed: set[int]) -> Claim | None:
        """The claim of the ``=`` at item ``e`` (docs/claims.md, Equation claims)."""
        text, sides = self.text, self.left_side(e)
        if sides is None:
            return None
        left, before = sides
        lhs = _evaluate(left)
        if lhs is None:
            return None
        value, ops = lhs
        if before is not None and before.kind == EQ:
            if ops == 0 and (_single(left) is None or self.at[before.start] not in claimed):
                return None  # "x = 5 = 5": a bare number continues only a claimed chain
        elif ops == 0 or (before is None or before.kind != LP) and not _complete_before(text, left):
            return None
        right = self.right_side(e)
        if right is None:
            return None
        rhs, after = right
        if self.cut_off and not _closed(text, rhs[-1].end):
            return None  # what the cut removed may continue the right side or its result
        start, end = _span(rhs)
        if not (after < len(self.items) and self.items[after].kind == EQ) \
                and not _complete_after(text, rhs[-1].end):
            return None
        number = _single(rhs)
        if number is not None:
            stated = number.number.value * (-1 if rhs[0].kind == OP else 1)
            rem = self.remainder(number.end)
            if rem is None:
                return None
            if rem:
                return self._remainder_claim(left, rhs, rem)
            return Claim("equation", left[0].start, end, start, end, stated, value,
                         _matches(value, stated, number.number.places))
        evaluated = _evaluate(rhs)
        if evaluated is None or evaluated[1] == 0:
            return None  # "= (7)"
        first = _single(rhs[:2]) or _single(rhs[:1])
        middle = after < len(self.items) and self.items[after].kind == EQ
        if first is not None and middle and not self._fraction_after(rhs, first):
            # the running reading: "2 + 3 = 5 + 1 = 6"
            c_items = rhs[:2] if first is rhs[1] else rhs[:1]
            c_value = first.number.value * (-1 if c_items[0].kind == OP else 1)
            if _matches(value, c_value, first.number.places):
                c_start, c_end = _span(c_items)
                return Claim("equation", left[0].start, c_end, c_start, c_end, c_value,
                             value, True)
        stated = evaluated[0]  # the rewriting reading: "3 * 7 * 5 = 21 * 5 = 105"
        return Claim("equation", left[0].start, end, start, end, stated, value, stated == value)

    @staticmethod
    def _fraction_after(rhs: Sequence[Item], first: Item) -> bool:
        """Whether the number ``first`` of a right side is the numerator of a fraction
        written ``1/10`` (no spaces around the ``/``)."""
        k = rhs.index(first)
        return k + 2 < len(rhs) and rhs[k + 1].op == "/" and rhs[k + 1].start == first.end \
            and rhs[k + 2].start == rhs[k + 1].end

    def _remainder_claim(self, left: Sequence[Item], rhs: Sequence[Item],
                         rem: tuple[int, int]) -> Claim | None:
        """``a / b = q remainder r``: true iff ``q * b + r = a`` and ``0 <= r < b``."""
        if len(left) != 3 or left[1].op != "/" or left[0].kind != NUM or left[2].kind != NUM \
                or len(rhs) != 1:
            return None
        a, b, q = left[0].number, left[2].number, rhs[0].number
        if a.places or b.places or q.places or a.value.denominator != 1:
            return None
        r = int(self.text[rem[0]:rem[1]])
        stated = q.value * b.value + r
        return Claim("remainder", left[0].start, rem[1], q.digits_start, rem[1], stated,
                     a.value, stated == a.value and 0 <= r < b.value,
                     ((q.digits_start, q.end), rem))

    def answer_claims(self, answer: Fraction) -> list[Claim]:
        text, markers = self.text, []
        for pattern in (_ANSWER_IS, _ANSWER_COLON, _BOXED):
            markers += [(m.start(), m.end(), pattern is _BOXED) for m in pattern.finditer(text)]
        markers += [(it.start, it.end, False) for it in self.items if it.kind == HASH]
        out = []
        for start, pos, boxed in markers:
            k = self._first_item(pos)
            while k is not None and self.items[k].kind == OTHER \
                    and all(c in "*\"'\u201c" for c in text[self.items[k].start:self.items[k].end]):
                k = self._first_item(self.items[k].end)
            if k is None:
                continue
            items = self.items[k:k + 2] if self.items[k].kind == OP else self.items[k:k + 1]
            number = _single(items)
            if number is None:
                continue
            nxt = self.items[k + len(items)] if k + len(items) < len(self.items) else None
            if nxt is not None and nxt.kind in (OP, EQ, NUM):
                continue  # an expression or an equation, not a single answer
            if not _complete_after(text, number.end):
                continue
            if boxed and _solid_after(text, number.end) != "}":
                continue
            if self.cut_off and not _closed(text, number.end):
                continue
            res_start, res_end = _span(items)
            stated = number.number.value * (-1 if items[0].kind == OP else 1)
            out.append(Claim("answer", start, res_end, res_start, res_end, stated, answer,
                             _matches(answer, stated, number.number.places)))
        return out

    def _first_item(self, pos: int) -> int | None:
        """The item starting at ``pos`` after spaces, if any."""
        while pos < len(self.text) and self.text[pos] in SPACES:
            pos += 1
        return self.at.get(pos)


def find_numbers(text: str) -> list[Number]:
    """Every number of ``text`` (``docs/claims.md``, Numbers), left to right."""
    if not isinstance(text, str):
        raise ValueError(f"text: expected a string, got {type(text).__name__}")
    return [it.number for it in lex(text) if it.kind == NUM]


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


def _check_cut_off(cut_off) -> bool:
    if not isinstance(cut_off, bool):
        raise ValueError(f"cut_off: expected True or False, got {cut_off!r}")
    return cut_off


def find_claims(text: str, answer=None, *, cut_off: bool = False) -> list[Claim]:
    """Every checkable claim of ``text``, ordered by where its result starts.

    Args:
        text: the response (LaTeX arithmetic included: docs/claims.md, LaTeX).
        answer: the problem's exact answer (see :func:`parse_answer`); without it, answer
            claims are not read.
        cut_off: the response was cut at the token budget (it ends without an
            end-of-sequence token); a claim whose reading the end of the text leaves open
            is then skipped (docs/claims.md, Cut-off responses).
    """
    if not isinstance(text, str):
        raise ValueError(f"text: expected a string, got {type(text).__name__}")
    expected = None if answer is None else parse_answer(answer)
    reader = _Reader(text, _check_cut_off(cut_off))
    claims = reader.equation_claims()
    if expected is not None:
        claims += reader.answer_claims(expected)
    return sorted(claims, key=lambda c: (c.result_start, c.start))


def claim_labels(text: str, answer=None, *, cut_off: bool = False) -> str:
    """Per-character labels of ``text``: ``"w"`` on the result of a false claim, ``"r"`` on
    the result of a true one, ``"."`` elsewhere (a character in both: ``"w"``);
    ``cut_off`` as in :func:`find_claims`."""
    claims = find_claims(text, answer, cut_off=cut_off)
    labels = [LABEL_OTHER] * len(text)
    for c in claims:
        for start, end in c.labelled:
            for k in range(start, end):
                if labels[k] != LABEL_WRONG:
                    labels[k] = LABEL_RIGHT if c.correct else LABEL_WRONG
    return "".join(labels)


def claim_token_labels(tokenizer, ids: Sequence[int], answer=None, *,
                       cut_off: bool = False) -> list[str]:
    """One label per token of a response (its token ids): the response is decoded piece by
    piece (:func:`ktae.viz.tokens.token_pieces`, leading spaces kept with their token), and
    a token is ``"w"`` when any of its characters is, else ``"r"`` when any is, else
    ``"."``. ``cut_off``: the response ran out of its token budget (:func:`find_claims`)."""
    pieces = [p.text for p in token_pieces(tokenizer, ids)]
    return token_labels(claim_labels("".join(pieces), answer, cut_off=cut_off), pieces)


def has_false_claim(text: str, answer=None, *, cut_off: bool = False) -> bool:
    """Whether ``text`` makes at least one false claim (``cut_off`` as in
    :func:`find_claims`)."""
    return any(not c.correct for c in find_claims(text, answer, cut_off=cut_off))


def final_answer(text: str, answer=None) -> Claim | None:
    """The response's last answer claim (``answer is``, ``Answer:``, ``\\boxed{}``,
    ``####``), or None."""
    claims = [c for c in find_claims(text, 0 if answer is None else answer) if c.kind == "answer"]
    return claims[-1] if claims else None
