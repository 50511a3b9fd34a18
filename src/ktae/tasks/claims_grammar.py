"""Responses whose claims are known by construction, from a grammar of claim forms.

:func:`generate_response` writes a response as a sequence of fragments (equations, chains,
remainders, answer markers, forms the labeller skips, distractor sentences) joined by
separators, and records, as it writes each claim, its verdict and the character spans its
result labels (docs/claims.md, Labels). The values come from the fragment's own
construction, never from the labeller, so a labeller that reads a form wrongly (a missed
claim, a wrong verdict, a wrong span, a claim where none was written) disagrees with
:attr:`GeneratedResponse.claims`. Pure Python; seeded by the caller's ``random.Random``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from fractions import Fraction

OPERATOR_SPELLINGS = {"+": ["+"], "-": ["-", "\u2212"],
                      "*": ["*", "\u00d7", "x", "X", "\u00b7", "\u22c5", "\u2219"],
                      "/": ["/", "\u00f7"]}
"""Every spelling of each operation that docs/claims.md reads."""
FILLER = ["Tom has", "So", "Then", "In total", "We know that", "Sam buys", "which gives",
          "Each friend gets", "Let's see", "First"]
UNITS = ["", " apples", " books in total", " cookies", ".", ",", " 100-page books",
         " (since it is half)", " 2-liter bottles"]
SEPARATORS = [". ", ".\n", ", so ", "; then ", "\n\n", " and ", "\n- "]
LATEX_OPERATORS = {"+": ["+"], "-": ["-"], "*": ["\\times", "\\cdot", "\\ast"],
                   "/": ["\\div"]}
"""The LaTeX spelling of each operation (docs/claims.md, LaTeX)."""
LATEX_DELIMITERS = [("\\( ", " \\)"), ("\\(", "\\)"), ("$", "$"), ("$$", "$$"),
                    ("\\[ ", " \\]"), ("", "")]


@dataclass(frozen=True)
class ExpectedClaim:
    """A claim as written: its kind, its labelled spans and whether it is true."""

    kind: str
    spans: tuple[tuple[int, int], ...]
    correct: bool


@dataclass
class GeneratedResponse:
    """A generated response, the answer its markers are checked against, and its claims."""

    text: str = ""
    answer: int = 0
    claims: list[ExpectedClaim] = field(default_factory=list)


class _Writer:
    """Appends text and records the spans of what it writes."""

    def __init__(self, rng: random.Random, answer: int):
        self.rng, self.out = rng, GeneratedResponse(answer=answer)

    @property
    def pos(self) -> int:
        return len(self.out.text)

    def put(self, s: str) -> tuple[int, int]:
        start = self.pos
        self.out.text += s
        return start, self.pos

    def claim(self, kind: str, spans, correct: bool) -> None:
        self.out.claims.append(ExpectedClaim(kind, tuple(spans), bool(correct)))

    def number(self, value: Fraction, places: int = 0, emphasis: bool = True,
               dollar: bool = True, star: bool = True) -> tuple[int, int]:
        """Write a number (sign, ``$``, grouping, emphasis at random; ``star``: ``*N*``
        allowed, not before a number); the span of its sign and digits."""
        rng = self.rng
        negative = value < 0
        magnitude = abs(value)
        if places:
            digits = f"{float(magnitude):.{places}f}"
            assert Fraction(digits) == magnitude
        else:
            digits = str(int(magnitude))
            if magnitude >= 1000 and rng.random() < 0.5:
                digits = f"{int(magnitude):,}"
        mark = rng.choice(["**", "__", "*"][:3 if star else 2]) if emphasis and not negative \
            and rng.random() < 0.2 else ""
        cash = "$" if dollar and not negative and rng.random() < 0.1 else ""
        start = self.pos
        if negative:
            self.put("-")
        self.put(mark + cash)
        digits_span = self.put(digits)
        self.put(mark)
        return (start if negative else digits_span[0]), digits_span[1]


def _round(value: Fraction, places: int) -> Fraction:
    return Fraction(round(value * 10 ** places), 10 ** places)


def _operator(rng: random.Random, op: str, left_digit: bool, right_digit: bool) -> str:
    """A spelling of ``op`` with its spaces; unspaced only where docs/claims.md allows."""
    spelling = rng.choice(OPERATOR_SPELLINGS[op])
    spaced = rng.random() < 0.7
    if spelling in ("x", "X") and not (left_digit and right_digit):
        spaced = True
    if spelling == "\u00b7":
        spaced = True
    return f" {spelling} " if spaced else spelling


def _value_of(values: list[Fraction], ops: list[str]) -> Fraction | None:
    """The exact value of a flat chain, multiplication and division first."""
    terms = [values[0]]
    for op, v in zip(ops, values[1:], strict=True):
        if op in "*/":
            if op == "/" and v == 0:
                return None
            terms[-1] = terms[-1] * v if op == "*" else terms[-1] / v
        else:
            terms.append(v if op == "+" else -v)
    return sum(terms, Fraction(0))


class _Fragments:
    """The fragments of the grammar; each writes itself and records its claims."""

    def __init__(self, w: _Writer):
        self.w, self.rng = w, w.rng

    def _operands(self, n: int) -> list[Fraction]:
        return [Fraction(self.rng.choice([self.rng.randint(0, 12), self.rng.randint(2, 99),
                                          self.rng.randint(100, 2500)])) for _ in range(n)]

    def _chain(self, values: list[Fraction], ops: list[str], plain: bool = False) -> None:
        """Write ``values`` joined by ``ops``; ``plain``: no emphasis or ``$`` at all.
        Emphasis never touches a ``*`` operator and an unspaced ``x`` sits between digits
        (docs/claims.md, Numbers and Operators)."""
        w, rng = self.w, self.rng
        spellings = [_operator(rng, op, True, True) for op in ops]
        spellings = [f" {sp} " if sp in ("x", "X") and values[k] == 0 else sp  # not 0x (hex)
                     for k, sp in enumerate(spellings)]
        for k, v in enumerate(values):
            star_before = k > 0 and spellings[k - 1].strip() == "*"
            star_after = k < len(ops) and spellings[k].strip() == "*"
            x_before = k > 0 and spellings[k - 1] in ("x", "X")
            x_after = k < len(ops) and spellings[k] in ("x", "X")
            bare = plain or star_before or star_after or x_before or x_after or v < 0
            w.number(v, emphasis=not bare, dollar=not bare)
            if k < len(ops):
                w.put(spellings[k])

    def _result(self, value: Fraction, places: int, true: bool, unit: str = "",
                emphasis: bool = True) -> tuple[tuple[int, int], bool]:
        """Write a result for ``value``: right, or wrong by at least two units of its last
        place; (span, verdict)."""
        stated = _round(value, places)
        if not true:
            step = Fraction(1, 10 ** places)
            stated += self.rng.choice([-1, 1]) * self.rng.randint(2, 9) * step
        correct = abs(stated - value) <= Fraction(1, 2 * 10 ** places) if places \
            else stated == value
        star = not unit[1:2].isdigit()
        return self.w.number(stated, places, emphasis=emphasis, star=star), correct

    def equation(self) -> None:
        """``a op b (op c) = r``, with a signed first operand or brackets at random."""
        w, rng = self.w, self.rng
        n = rng.choice([2, 2, 3])
        values, ops = self._operands(n), [rng.choice("+-*/") for _ in range(n - 1)]
        ops = [op if not (op == "/" and values[k + 1] == 0) else "+" for k, op in enumerate(ops)]
        signed = rng.random() < 0.15
        if signed:
            values[0] = -values[0] if values[0] else Fraction(-3)
            w.put(rng.choice(["we get: ", "x = ", "So, ", "\n"]))
        else:
            w.put(rng.choice(FILLER) + " ")
        bold = not signed and rng.random() < 0.1
        w.put("**" if bold else "")
        if not signed and n == 3 and rng.random() < 0.3:
            w.put("(")
            self._chain(values[:2], ops[:1], plain=bold)
            inner = _value_of(values[:2], ops[:1])
            w.put(")" + _operator(rng, ops[1], False, True))
            w.number(values[2], emphasis=False, dollar=False)
            value = _value_of([inner, values[2]], ops[1:])
        else:
            self._chain(values, ops, plain=signed or bold)
            value = _value_of(values, ops)
        w.put(rng.choice([" = ", "=", " =  "]))
        places = 0 if value.denominator == 1 else rng.choice([1, 2, 3])
        unit = "**" if bold else rng.choice(UNITS)
        span, correct = self._result(value, places, rng.random() < 0.5, unit, not bold)
        w.claim("equation", [span], correct)
        w.put(unit)

    def running_chain(self) -> None:
        """``a op b = c op d = e``: the running reading, true or false at each link."""
        w, rng = self.w, self.rng
        a, b = self._operands(2)
        op = rng.choice("+-*")
        value = _value_of([a, b], [op])
        w.put(rng.choice(FILLER) + " ")
        self._chain([a, b], [op])
        w.put(" = ")
        c = value if rng.random() < 0.5 else value + rng.choice([-1, 1]) * rng.randint(1, 9)
        op2, d = rng.choice("+-*"), self._operands(1)[0]
        rewritten = _value_of([c, d], [op2])
        c_span = w.number(c, emphasis=False, dollar=False)
        spelled = _operator(rng, op2, True, True)
        w.put(f" {spelled} " if spelled in ("x", "X") and c == 0 else spelled)
        d_span = w.number(d, emphasis=False, dollar=False)
        if c == value:
            w.claim("equation", [c_span], True)
        else:
            w.claim("equation", [(c_span[0], d_span[1])], rewritten == value)
        w.put(" = ")
        unit = rng.choice(UNITS)
        span, correct = self._result(rewritten, 0, rng.random() < 0.5, unit)
        w.claim("equation", [span], correct)
        w.put(unit)

    def rewriting_chain(self) -> None:
        """``a * b * c = (a*b) * c = r`` and ``a op b = c = c``."""
        w, rng = self.w, self.rng
        a, b, c = (Fraction(rng.randint(2, 30)) for _ in range(3))
        w.put(rng.choice(FILLER) + " ")
        if rng.random() < 0.5:
            self._chain([a, b, c], ["*", "*"])
            w.put(" = ")
            first = a * b if rng.random() < 0.7 else a * b + rng.randint(1, 5)
            start = w.number(first, emphasis=False, dollar=False)[0]
            w.put(" * ")
            end = w.number(c, emphasis=False, dollar=False)[1]
            w.claim("equation", [(start, end)], first == a * b)
            w.put(" = ")
            unit = rng.choice(UNITS)
            span, correct = self._result(first * c, 0, rng.random() < 0.5, unit)
        else:
            self._chain([a, b], ["+"])
            w.put(" = ")
            first = a + b if rng.random() < 0.5 else a + b + 1
            w.claim("equation", [w.number(first, emphasis=False, dollar=False)], first == a + b)
            w.put(" = ")
            unit = rng.choice(UNITS)
            span, correct = self._result(first, 0, rng.random() < 0.5, unit)
        w.claim("equation", [span], correct)
        w.put(unit)

    def _latex_number(self, value: Fraction, braces: bool) -> tuple[int, int]:
        """Write a non-negative integer in LaTeX: ``{,}`` between groups of thousands and
        ``{N}`` braces at random; the span of its digits."""
        rng = self.rng
        digits = str(int(value))
        if value >= 1000 and rng.random() < 0.5:
            digits = f"{int(value):,}".replace(",", rng.choice(["{,}", ","]))
        braced = braces and rng.random() < 0.2
        self.w.put("{" if braced else "")
        span = self.w.put(digits)
        self.w.put("}" if braced else "")
        return span

    def latex_equation(self) -> None:
        """``\\( a \\times b = r \\)`` and its kin: LaTeX operators, delimiters, braces,
        ``{,}`` thousands and ``\\frac{p}{q}`` operands (docs/claims.md, LaTeX)."""
        w, rng = self.w, self.rng
        n = rng.choice([2, 2, 3])
        values, ops = self._operands(n), [rng.choice("+-*/") for _ in range(n - 1)]
        ops = [op if not (op == "/" and values[k + 1] == 0) else "+" for k, op in enumerate(ops)]
        opening, closing = rng.choice(LATEX_DELIMITERS)
        w.put(rng.choice(FILLER) + " " + opening)
        for k, v in enumerate(values):
            if rng.random() < 0.15:  # a fraction of two numbers, one operand
                q = rng.randint(1, 12)
                w.put("\\" + rng.choice(["frac", "dfrac", "tfrac"]) + "{")
                w.put(str(int(v)))
                w.put("}{" + str(q) + "}")
                values[k] = v / q
            else:
                self._latex_number(v, braces=True)
            if k < len(ops):
                spelling = rng.choice(LATEX_OPERATORS[ops[k]])
                w.put(f" {spelling} " if rng.random() < 0.8 or spelling[0] != "\\" else spelling)
        value = _value_of(values, ops)
        w.put(rng.choice([" = ", "=", " &= "]))
        correct = rng.random() < 0.5 if value.denominator == 1 and value >= 0 else False
        stated = value if correct else Fraction(max(0, round(value)) + rng.randint(1, 9))
        span = self._latex_number(stated, braces=True)
        w.claim("equation", [span], stated == value)
        w.put(closing + rng.choice(["", ".", " \\text{ apples}", " apples"]))

    def remainder(self) -> None:
        """``a / b = q remainder r`` in every spelling docs/claims.md reads."""
        w, rng = self.w, self.rng
        b = rng.randint(2, 12)
        a = rng.randint(b, 150)
        q, r = divmod(a, b)
        if rng.random() < 0.5:
            q, r = rng.choice([(q + 1, r), (q, r + 1), (q - 1, r + b), (q, (r + 3) % b)])
        w.put(rng.choice(FILLER) + " " + str(a) + rng.choice([" / ", " \u00f7 ", "/"]) + str(b)
              + " = ")
        q_span = w.put(str(q))
        marker, close = rng.choice([(" remainder ", ""), (" r ", ""), (" R", ""),
                                    (" with remainder ", ""), (", remainder ", ""),
                                    (" with a remainder of ", ""), (" (remainder ", ")"),
                                    (" (with a remainder of ", ")"), (" R ", ""),
                                    (" Remainder: ", "")])
        w.put(marker)
        r_span = w.put(str(r))
        w.put(close)
        w.claim("remainder", [q_span, r_span], q * b + r == a and 0 <= r < b)
        w.put(rng.choice(["", " apples", "."]))

    def answer(self) -> None:
        """An answer marker and a number, the problem's answer or another."""
        w, rng = self.w, self.rng
        stated = w.out.answer if rng.random() < 0.5 else w.out.answer + rng.randint(1, 9)
        before, after, emphasis = rng.choice([
            ("The answer is ", ".", True), ("So the answer is: ", "", True),
            ("Answer: ", " apples", True), ("**Answer:** ", "", False),
            ("\\boxed{", "}", False), ("\\boxed{ ", " }", False), ("#### ", "", True),
            ('The answer is "', '".', False), ("ANSWER IS ", "", True)])
        w.put(before)
        span = w.number(Fraction(stated), emphasis=emphasis, dollar=emphasis)
        w.claim("answer", [span], stated == w.out.answer)
        w.put(after)

    def skipped(self) -> None:
        """A form docs/claims.md skips: it makes no claim."""
        a, b, c = (self.rng.randint(1, 99) for _ in range(3))
        self.w.put(self.rng.choice([
            f"x + {a} = {b}", f"{a}^2 + {b} = {c}", f"{a} \u2013 {b} = {c}",
            f"{a} {b:03d} + {c} = {a} {b + c:03d}", f"{a}% + {b} = {c}",
            f"so -{a} + {b} = {c}", f"{a} / {b} = {c} remainder", f"{a} + {b} = {c} r 1",
            f"f({a} + {b}) = {c}", f"2({a} + {b}) = {c}", f"{a} / 0 = {c}",
            f"{a} + {b} =\n{c}", f"{a} + {b} = {c}%", f"{a} apples + {b} = {c}",
            f"{a} ** {b} = {c}", f"{a} + {b} == {c}", f"{a} + {b} = {c} + x",
            f"{a} + {b} = - {c}", f"{a} + {b} = {c} 1/2", f"{a} + {b} = {c}^2",
            f"y x {a} + {b} = {c}", f"{a}.{b}.{c} + 1 = 2", f"{a} + {b} = {c} *"]))

    def distractor(self) -> None:
        """Words and numbers, no claim."""
        a, b = self.rng.randint(1, 999), self.rng.randint(1, 99)
        self.w.put(self.rng.choice([
            f"Tom has {a} apples and {b} boxes", f"It is the {b}rd day", f"about {b}% of them",
            f"pages {b}\u2013{a}", "H2O is water", f"Step {b}: think", f"x = {a}",
            f"{a} boxes with {b} books each", f"the remainder is {b}",
            f"{a} is more than {b}", f"there are {a:,} people"]))


def generate_response(rng: random.Random, fragments: int | None = None) -> GeneratedResponse:
    """A response of ``fragments`` fragments (1 to 6 at random), its answer and its claims."""
    if not isinstance(rng, random.Random):
        raise ValueError(f"rng: expected a random.Random, got {type(rng).__name__}")
    count = rng.randint(1, 6) if fragments is None else fragments
    if count < 1:
        raise ValueError(f"fragments: expected at least 1, got {count}")
    writer = _Writer(rng, rng.randint(1, 500))
    grammar = _Fragments(writer)
    forms = [grammar.equation] * 4 + [grammar.running_chain, grammar.rewriting_chain,
                                      grammar.remainder, grammar.answer, grammar.skipped,
                                      grammar.distractor, grammar.latex_equation]
    for k in range(count):
        if k:
            writer.put(rng.choice(SEPARATORS))
        rng.choice(forms)()
    return writer.out
