"""A second claim labeller, written from docs/claims.md alone, as a character scanner.

It shares no code with ``ktae.tasks.claims`` (no regular expressions, its own number
reader, a shunting-yard evaluator, its own LaTeX rewrite): the tests check that both find
the same claims with the same verdicts and labels. The LaTeX of the text is rewritten in
place (docs/claims.md, LaTeX); each line is cut into tokens by one pass over its
characters; claims are read off the tokens; in a cut-off text, a claim of the last line
needs a closing mark after it (docs/claims.md, Cut-off responses).
"""

from __future__ import annotations

from fractions import Fraction

DIGITS = "0123456789"
SPACE = " \t"
MINUS = ("-", "\u2212")
TIMES = ("\u00d7", "\u22c5", "\u2219")


def digit(ch: str) -> bool:
    return len(ch) == 1 and ch in DIGITS


# -- LaTeX (docs/claims.md, LaTeX) -------------------------------------------------------


def _at(s: str, k: int) -> str:
    return s[k] if 0 <= k < len(s) else ""


def _number_end(s: str, i: int) -> int | None:
    """End of "spaces, optional -, a number literal, spaces" at i (a fraction's part or a
    braced number), or None."""
    k = i
    while _at(s, k) != "" and _at(s, k) in SPACE:
        k += 1
    if _at(s, k) == "-":
        k += 1
    start = k
    while digit(_at(s, k)):
        k += 1
    if k == start:
        return None
    if k - start <= 3:  # groups of three digits after a separator
        j = k
        while True:
            for sep in ("{,}", "\\,", ","):
                if s[j:j + len(sep)] == sep:
                    g = j + len(sep)
                    if all(digit(_at(s, g + t)) for t in range(3)) and not digit(_at(s, g + 3)):
                        j = g + 3
                        break
            else:
                break
        k = j
    if _at(s, k) == "." and digit(_at(s, k + 1)):
        k += 1
        while digit(_at(s, k)):
            k += 1
    while _at(s, k) != "" and _at(s, k) in SPACE:
        k += 1
    return k


def latex_plain(text: str) -> str:
    """The text with its LaTeX rewritten as the table of docs/claims.md (LaTeX) says,
    character for character."""
    out = list(text)
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            j = i + 1
            while j < len(text) and text[j].isascii() and text[j].isalpha():
                j += 1
            name = text[i + 1:j]
            if not name:
                nxt = text[i + 1]
                if nxt in "()[];:! ":
                    out[i] = out[i + 1] = " "
                elif nxt == ",":
                    if not (digit(_at(text, i - 1)) and digit(_at(text, i + 2))):
                        out[i] = out[i + 1] = " "
                elif nxt in "%$":
                    out[i] = " "
                i += 2
                continue
            if name in ("times", "cdot", "ast", "div"):
                out[i] = "\u00f7" if name == "div" else "\u00d7"
                for k in range(i + 1, j):
                    out[k] = " "
            elif name in ("left", "right"):
                for k in range(i, j):
                    out[k] = " "
            elif name in ("frac", "dfrac", "tfrac") and _at(text, j) == "{":
                a_end = _number_end(text, j + 1)
                if a_end is not None and _at(text, a_end) == "}" and _at(text, a_end + 1) == "{":
                    b_end = _number_end(text, a_end + 2)
                    if b_end is not None and _at(text, b_end) == "}":
                        out[i] = "("
                        for k in range(i + 1, j + 1):
                            out[k] = " "
                        out[a_end], out[a_end + 1], out[b_end] = " ", "/", ")"
                        i = b_end + 1
                        continue
            i = j
            continue
        if c == "$" and not digit(_at(text, i + 1)):
            out[i] = " "
        if c == "&" and _at(text, i + 1) == "=":
            out[i] = " "
        i += 1
    changed = True
    while changed:  # braces around a number, innermost first
        changed = False
        s = "".join(out)
        k = 0
        while k < len(s):
            if s[k] == "{":
                before = _at(s, k - 1)
                end = _number_end(s, k + 1)
                if end is not None and _at(s, end) == "}" and not before.isalpha() \
                        and before not in ("\\", "^", "_", "}"):
                    out[k] = out[end] = " "
                    changed = True
                    k = end
            k += 1
    return "".join(out)


class Tok:
    """kind: 'n' number, 'o' operator, '(' ')' '=' '#' (####), 't' text."""

    def __init__(self, kind, a, b, op=None, value=None, places=0, da=None, db=None):
        self.kind, self.a, self.b, self.op = kind, a, b, op
        self.value, self.places = value, places
        self.da, self.db = da, db  # the digits (labelled part) of a number

    def __repr__(self):
        return f"Tok({self.kind!r}, {self.a}, {self.b}, {self.op!r})"


class Line:
    def __init__(self, text: str, base: int):
        self.s, self.base = text, base
        self.toks: list[Tok] = []
        self.scan()

    def ch(self, k: int) -> str:
        return self.s[k] if 0 <= k < len(self.s) else ""

    def solid_left(self, k: int) -> int:
        k -= 1
        while k >= 0 and self.s[k] in SPACE:
            k -= 1
        return k

    def solid_right(self, k: int) -> int:
        while k < len(self.s) and self.s[k] in SPACE:
            k += 1
        return k

    # -- numbers -------------------------------------------------------------
    def literal(self, i: int):
        """(digits start, end) of the longest literal at i, or None."""
        if self.ch(i) == "$":
            i += 1
        if not digit(self.ch(i)):
            return None
        j = i
        while digit(self.ch(j)):
            j += 1
        end = j
        if j - i <= 3:
            k, groups = j, 0
            while True:
                sep = next((x for x in ("{,}", "\\,", ",") if self.s[k:k + len(x)] == x), "")
                g = k + len(sep)
                if not (sep and all(digit(self.ch(g + t)) for t in (0, 1, 2))
                        and not digit(self.ch(g + 3))):
                    break
                k = g + 3
                groups += 1
            if groups:
                end = k
        if self.ch(end) == "." and digit(self.ch(end + 1)):
            end += 1
            while digit(self.ch(end)):
                end += 1
        return i, end

    def times_x(self, k: int) -> bool:
        if self.ch(k) not in ("x", "X"):
            return False
        before, after = self.ch(k - 1), self.ch(k + 1)
        if before in ("", " ", "\t") and after in (" ", "\t"):
            return True
        if digit(before) and digit(after):
            j = k - 1
            while digit(self.ch(j)):
                j -= 1
            return self.s[j + 1:k] != "0"
        return False

    def ok_before(self, i: int) -> bool:
        c = self.ch(i - 1)
        if c == "":
            return True
        if self.times_x(i - 1):
            return True
        if self.s[max(0, i - 3):i] == "{,}" or self.s[max(0, i - 2):i] == "\\,":
            return False
        return not (c.isalpha() or c in DIGITS or c in "_.,$")

    def ok_after(self, j: int) -> bool:
        c = self.ch(j)
        if c == "":
            return True
        if self.times_x(j):
            return True
        if c.isalpha() or c in DIGITS or c in "_%":
            return False
        if self.s[j:j + 3] == "{,}" and digit(self.ch(j + 3)):
            return False
        if self.s[j:j + 2] == "\\," and digit(self.ch(j + 2)):
            return False
        return not (c in ",." and digit(self.ch(j + 1)))

    def number(self, i: int):
        """(outer end, digits start, digits end) of a number at i, or None."""
        for mark in ("**", "__", "*"):
            if self.s[i:i + len(mark)] != mark:
                continue
            if mark == "*" and self.ch(i + 1) == "*":
                continue
            lit = self.literal(i + len(mark))
            if lit is None:
                continue
            close = lit[1]
            if self.s[close:close + len(mark)] != mark or self.ch(close + len(mark)) == mark[0]:
                continue
            outer = close + len(mark)
            left = self.ch(self.solid_left(i))
            right = self.ch(self.solid_right(outer))
            if mark == "*" and ((left != "" and left in DIGITS + ")") or digit(right)):
                continue
            if self.ok_before(i) and self.ok_after(outer):
                return outer, lit[0], lit[1]
        lit = self.literal(i)
        if lit is not None and self.ok_before(i) and self.ok_after(lit[1]):
            return lit[1], lit[0], lit[1]
        return None

    @staticmethod
    def value_of(text: str) -> tuple[Fraction, int]:
        whole, _, frac = text.replace("{,}", "").replace("\\,", "").replace(",", "").partition(".")
        v = Fraction(int(whole))
        if frac:
            v += Fraction(int(frac), 10 ** len(frac))
        return v, len(frac)

    # -- tokens --------------------------------------------------------------
    def is_operator(self, k: int):
        c = self.ch(k)
        if c == "+":
            return "+"
        if c in MINUS:
            return "-"
        if c in ("/", "\u00f7"):
            return "/"
        if c in TIMES:
            return "*"
        if c == "\u00b7":
            return "*" if self.ch(k - 1) in (" ", "\t") and self.ch(k + 1) in (" ", "\t") \
                and self.ch(k + 1) != "" and self.ch(k - 1) != "" else None
        if c == "*":
            if self.ch(k - 1) == "*" or self.ch(k + 1) == "*":
                return None
            before = self.ch(self.solid_left(k))
            after = self.ch(self.solid_right(k + 1))
            return "*" if (before != "" and before in DIGITS + ")") and \
                (after != "" and after in DIGITS + "$(") else None
        if self.times_x(k):
            return "*"
        return None

    def scan(self) -> None:
        s, k = self.s, 0
        while k < len(s):
            c = s[k]
            if c in SPACE:
                k += 1
                continue
            got = self.number(k) if (digit(c) or c in "$*_") else None
            if got is not None:
                outer, da, db = got
                value, places = self.value_of(s[da:db])
                self.toks.append(Tok("n", k, outer, value=value, places=places, da=da, db=db))
                k = outer
                continue
            op = self.is_operator(k)
            if op is not None:
                self.toks.append(Tok("o", k, k + 1, op=op))
                k += 1
                continue
            if c in "()":
                self.toks.append(Tok(c, k, k + 1))
                k += 1
                continue
            if c == "=":
                single = self.ch(k + 1) != "=" and self.ch(k - 1) != "=" \
                    and self.ch(k - 1) not in ("<", ">", "!") and self.ch(k + 1) != ">"
                j = k
                while self.ch(j) == "=":
                    j += 1
                self.toks.append(Tok("=" if single else "t", k, j))
                k = j
                continue
            if c == "#":
                j = k
                while self.ch(j) == "#":
                    j += 1
                self.toks.append(Tok("#" if j - k == 4 else "t", k, j))
                k = j
                continue
            if c.isalpha():
                j = k
                while self.ch(j).isalpha():
                    j += 1
                self.toks.append(Tok("t", k, j))
                k = j
                continue
            if c == "*":
                j = k
                while self.ch(j) == "*":
                    j += 1
                self.toks.append(Tok("t", k, j))
                k = j
                continue
            self.toks.append(Tok("t", k, k + 1))
            k += 1


def evaluate(toks: list[Tok]):
    """(value, operators) of an expression (docs/claims.md, Expressions) by shunting-yard,
    or None."""
    if not toks:
        return None
    prec = {"+": 1, "-": 1, "*": 2, "/": 2}
    out: list[Fraction] = []
    stack: list[str] = []  # operators, "(" and "neg"
    expect_operand, binary = True, 0

    def apply(op: str) -> bool:
        if op == "neg":
            if not out:
                return False
            out.append(-out.pop())
            return True
        if len(out) < 2:
            return False
        b, a = out.pop(), out.pop()
        if op == "/" and b == 0:
            return False
        out.append({"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[op])
        return True

    for k, t in enumerate(toks):
        if expect_operand:
            if t.kind == "o" and t.op == "-" and (k == 0 or toks[k - 1].kind == "(") \
                    and k + 1 < len(toks) and toks[k + 1].a == t.b \
                    and toks[k + 1].kind in ("n", "("):
                stack.append("neg")
            elif t.kind == "n":
                out.append(t.value)
                expect_operand = False
            elif t.kind == "(":
                stack.append("(")
            else:
                return None
        else:
            if t.kind == "o":
                while stack and stack[-1] not in ("(",) and (
                        stack[-1] == "neg" or prec[stack[-1]] >= prec[t.op]):
                    if not apply(stack.pop()):
                        return None
                stack.append(t.op)
                binary += 1
                expect_operand = True
            elif t.kind == ")":
                while stack and stack[-1] != "(":
                    if not apply(stack.pop()):
                        return None
                if not stack:
                    return None
                stack.pop()
                if stack and stack[-1] == "neg":
                    if not apply(stack.pop()):
                        return None
            else:
                return None
    if expect_operand:
        return None
    while stack:
        op = stack.pop()
        if op == "(" or not apply(op):
            return None
    return (out[0], binary) if len(out) == 1 else None


def close_enough(value: Fraction, stated: Fraction, places: int) -> bool:
    if places == 0:
        return value == stated
    return 2 * 10 ** places * abs(value - stated) <= 1


def lower_at(s: str, k: int, word: str) -> bool:
    return s[k:k + len(word)].lower() == word


OPEN = ("with", "a", "remainder", "of", "r", "x")


class Reader:
    def __init__(self, line: Line, answer: Fraction | None, cut: bool = False):
        """``cut``: the line is the last of a cut-off text (no line break after it)."""
        self.line, self.s, self.toks, self.answer = line, line.s, line.toks, answer
        self.cut = cut
        self.claims: list[tuple[str, tuple[tuple[int, int], ...], bool]] = []

    def closed(self, end: int) -> bool:
        """A closing mark after ``end`` on this line (docs/claims.md, Cut-off responses)."""
        s, k = self.s, end
        while k < len(s):
            c = s[k]
            if c.isalpha():
                j = k
                while j < len(s) and s[j].isalpha():
                    j += 1
                word = s[k:j].lower()
                if _at(s, k - 1) != "\\" and all(w[:len(word)] != word for w in OPEN):
                    return True
                k = j
                continue
            nxt = _at(s, k + 1)
            if nxt != "" and c == "=" and nxt not in ("=", ">"):
                return True
            if nxt != "" and c in '.!?;"' and not digit(nxt):
                return True
            k += 1
        return not self.cut

    def emit(self, kind: str, spans, ok: bool) -> None:
        b = self.line.base
        self.claims.append((kind, tuple((x + b, y + b) for x, y in spans), ok))

    @staticmethod
    def single(toks: list[Tok]):
        """(number token, sign) of a single result, or None."""
        if len(toks) == 1 and toks[0].kind == "n":
            return toks[0], 1
        if len(toks) == 2 and toks[0].kind == "o" and toks[0].op == "-" \
                and toks[1].kind == "n" and toks[1].a == toks[0].b:
            return toks[1], -1
        return None

    @staticmethod
    def span(toks: list[Tok]) -> tuple[int, int]:
        a = toks[0].da if toks[0].kind == "n" else toks[0].a
        b = toks[-1].db if toks[-1].kind == "n" else toks[-1].b
        return a, b

    def complete_left(self, left: list[Tok]) -> bool:
        s, start = self.s, left[0].a
        c = self.line.ch(start - 1)
        if c != "" and (c.isalpha() or c in DIGITS or c in "_.,$"):
            return False
        k = self.line.solid_left(start)
        p = self.line.ch(k)
        if left[0].kind == "o" and p != "" and (p.isalpha() or p in ")."):
            return False
        if p == "":
            return True
        if p in DIGITS:
            return False
        if p not in "^]}\u2013\u2014\u00b7%*":
            return True
        if p != "*":
            return False
        if self.line.ch(k - 1) == "*" or self.line.ch(k + 1) == "*":
            return True
        return self.line.solid_left(k) < 0 and self.line.ch(k + 1) in (" ", "\t") \
            and s[k + 1:k + 2] != ""

    def complete_right(self, end: int) -> bool:
        k = self.line.solid_right(end)
        c = self.line.ch(k)
        if c in ("^", "%"):
            return False
        if c == "*" and self.line.ch(k + 1) != "*":
            return False
        if c in ("\u2013", "\u2014", "\u00b7"):
            return not digit(self.line.ch(self.line.solid_right(k + 1)))
        return True

    def remainder(self, end: int):
        """((digits start, end) of a remainder, or None when its marker has no number) or
        False when no marker follows."""
        s, ln = self.s, self.line
        k = ln.solid_right(end)
        paren = ln.ch(k) == "("
        if ln.ch(k) in ("(", ","):
            k = ln.solid_right(k + 1)
        if lower_at(s, k, "with") and ln.ch(k + 4) in (" ", "\t"):
            j = ln.solid_right(k + 4)
            if lower_at(s, j, "a") and ln.ch(j + 1) in (" ", "\t"):
                j = ln.solid_right(j + 1)
            if not (lower_at(s, j, "remainder") or lower_at(s, j, "r")):
                return False
            k = j
        if lower_at(s, k, "remainder"):
            k += len("remainder")
            j = ln.solid_right(k)
            if j > k and lower_at(s, j, "of") and not ln.ch(j + 2).isalpha():
                k = j + 2
        elif lower_at(s, k, "r"):
            k += 1
        else:
            return False
        if ln.ch(k).isalpha():
            return False
        k = ln.solid_right(k)
        if ln.ch(k) == ":":
            k = ln.solid_right(k + 1)
        j = k
        while digit(ln.ch(j)):
            j += 1
        if j == k:
            return None
        c = ln.ch(j)
        if c != "" and (c.isalpha() or c in DIGITS or c in "_%" or (c in ".," and digit(ln.ch(j + 1)))):
            return None
        if paren and ln.ch(ln.solid_right(j)) != ")":
            return None
        return k, j

    # -- links ---------------------------------------------------------------
    def links(self) -> None:
        toks, made = self.toks, set()
        for e, t in enumerate(toks):
            if t.kind == "=" and self.link(e, made):
                made.add(e)

    def link(self, e: int, made: set[int]) -> bool:
        toks = self.toks
        expr_kinds = ("n", "o", "(", ")")
        j = e
        while j > 0 and toks[j - 1].kind in expr_kinds:
            j -= 1
        run = toks[j:e]
        opened = 0  # unclosed "(" of the run, scanning from the "="
        start = 0
        for k in range(len(run) - 1, -1, -1):
            if run[k].kind == ")":
                opened -= 1
            elif run[k].kind == "(":
                opened += 1
                if opened > 0:
                    start = k + 1
                    break
        left = run[start:]
        if not left:
            return False
        prev = run[start - 1] if start > 0 else (toks[j - 1] if j > 0 else None)
        got = evaluate(left)
        if got is None:
            return False
        value, ops = got
        if prev is not None and prev.kind == "=":
            if ops == 0:
                if self.single(left) is None or toks.index(prev) not in made:
                    return False
        else:
            if ops == 0:
                return False
            if (prev is None or prev.kind != "(") and not self.complete_left(left):
                return False
        # the right side
        k, depth = e + 1, 0
        while k < len(toks) and toks[k].kind in expr_kinds:
            if toks[k].kind == "(":
                depth += 1
            elif toks[k].kind == ")":
                if depth == 0:
                    break
                depth -= 1
            k += 1
        run = toks[e + 1:k]
        right = None
        if run and evaluate(run) is not None:
            right = run
        else:
            for m in range(len(run) - 1, 0, -1):
                if evaluate(run[:m]) is None:
                    continue
                nxt = run[m]
                if nxt.a == run[m - 1].b:
                    continue
                if nxt.kind == "(" and m == len(run) - 1:
                    right = run[:m]
                    break
                if nxt.kind == "n" and m + 1 < len(run):
                    dash = run[m + 1]
                    if self.s[dash.a] == "-" and dash.a == nxt.b \
                            and self.line.ch(dash.b).isalpha():
                        right = run[:m]
                        break
        if right is None:
            return False
        if not self.closed(right[-1].b):
            return False
        after = e + 1 + len(right)
        middle = after < len(toks) and toks[after].kind == "="
        if not middle and not self.complete_right(right[-1].b):
            return False
        one = self.single(right)
        if one is not None:
            num, sign = one
            rem = self.remainder(num.b)
            if rem is None:
                return False
            if rem:
                if not (len(left) == 3 and left[0].kind == "n" and left[2].kind == "n"
                        and left[1].kind == "o" and left[1].op == "/" and sign == 1):
                    return False
                a, b = left[0], left[2]
                if a.places or b.places or num.places:
                    return False
                r = int(self.s[rem[0]:rem[1]])
                ok = num.value * b.value + r == a.value and 0 <= r < b.value
                self.emit("remainder", ((num.da, num.db), rem), ok)
                return True
            self.emit("equation", (self.span(right),),
                      close_enough(value, sign * num.value, num.places))
            return True
        got = evaluate(right)
        if got is None or got[1] == 0:
            return False
        if middle:
            first = self.single(right[:2]) or self.single(right[:1])
            if first is not None:
                num, sign = first
                n_c = 2 if sign == -1 else 1
                fraction = len(right) > n_c + 1 and right[n_c].op == "/" \
                    and right[n_c].a == num.b and right[n_c + 1].a == right[n_c].b
                if not fraction and close_enough(value, sign * num.value, num.places):
                    self.emit("equation", (self.span(right[:n_c]),), True)
                    return True
        self.emit("equation", (self.span(right),), got[0] == value)
        return True

    # -- answers -------------------------------------------------------------
    def markers(self) -> list[int]:
        """Where N may start, after each answer marker (docs/claims.md, Answer claims);
        negative for \\boxed (N must be followed by "}")."""
        s, ln, out = self.s, self.line, []
        for i in range(len(s)):
            if lower_at(s, i, "answer") and not (i > 0 and s[i - 1].isalpha()):
                k = i + 6
                while ln.ch(k) == "*":
                    k += 1
                j = ln.solid_right(k)
                if ln.ch(j) == ":":
                    out.append(j + 1)
                elif j > k and lower_at(s, j, "is"):
                    out.append(j + 3 if ln.ch(j + 2) == ":" else j + 2)
            if s[i] == "\\" and lower_at(s, i + 1, "boxed{"):
                out.append(-(i + 7) - 1)
        out += [t.b for t in self.toks if t.kind == "#"]
        return out

    def answers(self) -> None:
        by_start = {t.a: n for n, t in enumerate(self.toks)}
        for pos in self.markers():
            boxed = pos < 0
            pos = -pos - 1 if boxed else pos
            n = by_start.get(self.line.solid_right(pos))
            while n is not None and self.toks[n].kind == "t" and all(
                    c in "*\"'\u201c" for c in self.s[self.toks[n].a:self.toks[n].b]):
                n = by_start.get(self.line.solid_right(self.toks[n].b))
            if n is None:
                continue
            cand = self.toks[n:n + 2] if self.toks[n].kind == "o" else self.toks[n:n + 1]
            one = self.single(cand)
            if one is None:
                continue
            nxt = self.toks[n + len(cand)] if n + len(cand) < len(self.toks) else None
            if nxt is not None and nxt.kind in ("o", "=", "n"):
                continue
            num, sign = one
            if not self.complete_right(num.b):
                continue
            if boxed and self.line.ch(self.line.solid_right(num.b)) != "}":
                continue
            if not self.closed(num.b):
                continue
            self.emit("answer", (self.span(cand),),
                      close_enough(self.answer, sign * num.value, num.places))


def reference_claims(text: str, answer=None, cut_off: bool = False
                     ) -> list[tuple[str, tuple[tuple[int, int], ...], bool]]:
    """(kind, labelled spans, verdict) of every claim of ``text``, line by line;
    ``cut_off``: the text was cut at the token budget."""
    out, base = [], 0
    value = None if answer is None else Fraction(str(answer).replace(",", ""))
    lines = latex_plain(text).split("\n")
    for n, line_text in enumerate(lines):
        reader = Reader(Line(line_text, base), value, cut=cut_off and n == len(lines) - 1)
        reader.links()
        if value is not None:
            reader.answers()
        out += reader.claims
        base += len(line_text) + 1
    return out


def reference_labels(text: str, answer=None, cut_off: bool = False) -> str:
    """Per-character labels of ``text`` (``w``, ``r``, ``.``) as docs/claims.md defines them."""
    labels = ["."] * len(text)
    for _, spans, ok in reference_claims(text, answer, cut_off):
        for a, b in spans:
            for k in range(a, b):
                if labels[k] != "w":
                    labels[k] = "r" if ok else "w"
    return "".join(labels)
