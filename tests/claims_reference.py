"""A second claim labeller, written from docs/claims.md alone, as a character scanner.

It shares no code with ``ktae.tasks.claims`` (no regular expressions, its own number
reader and evaluator): the tests check that both give the same per-character labels.
The text is first cut into items (numbers, operators, ``=`` signs, answer markers) by one
pass over the characters; claims are then read off the item sequence.
"""

from __future__ import annotations

from fractions import Fraction

DIGITS = "0123456789"
SPACE = (" ", "\t")


def is_digit(ch: str) -> bool:
    return len(ch) == 1 and ch in DIGITS


def read_digits(text: str, i: int) -> int:
    """The index just past the run of digits starting at ``i``."""
    while i < len(text) and is_digit(text[i]):
        i += 1
    return i


def literal_end(text: str, i: int) -> int | None:
    """End of the longest number literal starting at ``i`` (after an optional ``$``), or
    None when no digit starts there."""
    if i < len(text) and text[i] == "$":
        i += 1
    if i >= len(text) or not is_digit(text[i]):
        return None
    run = read_digits(text, i)
    end = run
    if run - i <= 3:
        for sep in (",", " "):
            j, groups = run, 0
            while (j + 4 <= len(text) and text[j] == sep
                   and all(is_digit(c) for c in text[j + 1:j + 4])
                   and not (j + 4 < len(text) and is_digit(text[j + 4]))):
                j += 4
                groups += 1
            if groups:
                end = j
                break
    if end + 1 < len(text) and text[end] == "." and is_digit(text[end + 1]):
        end = read_digits(text, end + 1)
    return end


def bad_before(ch: str) -> bool:
    return ch.isalpha() or ch in DIGITS or ch in "_.,$"


def bad_after(text: str, j: int) -> bool:
    if j >= len(text):
        return False
    ch = text[j]
    if ch.isalpha() or ch in DIGITS or ch in "_%":
        return True
    return ch in ",." and j + 1 < len(text) and is_digit(text[j + 1])


def scan_numbers(text: str) -> list[tuple[int, int, int]]:
    """(start, start of digits, end) of every number, left to right."""
    found, i = [], 0
    while i < len(text):
        end = literal_end(text, i)
        ok = end is not None and not (i > 0 and bad_before(text[i - 1])) \
            and not bad_after(text, end)
        if ok:
            found.append((i, i + 1 if text[i] == "$" else i, end))
            i = end
        else:
            i += 1
    return found


def number_value(text: str, digits_start: int, end: int) -> tuple[Fraction, int]:
    """Value and decimal places of the number ``text[digits_start:end]``."""
    whole, frac, seen_point = 0, "", False
    for ch in text[digits_start:end]:
        if ch == ".":
            seen_point = True
        elif is_digit(ch):
            if seen_point:
                frac += ch
            else:
                whole = whole * 10 + int(ch)
    value = Fraction(whole) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)
    return value, len(frac)


def gap_operator(text: str, a: int, b: int) -> str | None:
    """The operation of the gap ``text[a:b]`` between two numbers, or None."""
    gap = text[a:b]
    core = gap.strip(" \t")
    if len(core) != 1 or any(c not in SPACE for c in gap.replace(core, "", 1)):
        return None
    if core == "x":
        left = gap.index("x")
        if left == 0 or left == len(gap) - 1:
            return None  # needs a space on each side
        return "mul"
    return {"+": "add", "-": "sub", "\u2212": "sub", "*": "mul", "\u00d7": "mul",
            "/": "div", "\u00f7": "div"}.get(core)


def compute(values: list[Fraction], ops: list[str]) -> Fraction | None:
    """Two passes: first products and quotients, then sums, each left to right."""
    vals, rest = [values[0]], []
    for op, v in zip(ops, values[1:], strict=True):
        if op == "mul":
            vals[-1] *= v
        elif op == "div":
            if v == 0:
                return None
            vals[-1] /= v
        else:
            rest.append(op)
            vals.append(v)
    acc = vals[0]
    for op, v in zip(rest, vals[1:], strict=True):
        acc = acc + v if op == "add" else acc - v
    return acc


def agrees(value: Fraction, stated: Fraction, places: int) -> bool:
    if places:
        return abs(value - stated) * 2 * 10 ** places <= 1
    return value == stated


def incomplete_before(text: str, start: int) -> bool:
    k = start - 1
    while k >= 0 and text[k] in SPACE:
        k -= 1
    if k < 0:
        return False
    c = text[k]
    if c in "+-\u2212\u00d7\u00f7/^)]":
        return True
    if c == "*":
        doubled = (k - 1 >= 0 and text[k - 1] == "*") or (k + 1 < len(text) and text[k + 1] == "*")
        return not doubled
    if c == "x":
        return k == 0 or text[k - 1] in SPACE
    return False


def starts_with_ci(text: str, i: int, word: str) -> bool:
    part = text[i:i + len(word)]
    return len(part) == len(word) and all(
        p in (w, w.upper()) for p, w in zip(part, word, strict=True))


def answer_marker_end(text: str, i: int) -> int | None:
    """End of an ``answer is`` / ``answer:`` marker starting at ``i``, or None."""
    if not starts_with_ci(text, i, "answer") or (i > 0 and text[i - 1].isalpha()):
        return None
    j = i + 6
    while j < len(text) and text[j] == "*":
        j += 1
    k = j
    while k < len(text) and text[k] in SPACE:
        k += 1
    if k < len(text) and text[k] == ":":
        k += 1
    elif k > j and starts_with_ci(text, k, "is"):
        k += 2
        if k < len(text) and text[k] == ":":
            k += 1
    else:
        return None
    while k < len(text) and (text[k] in SPACE or text[k] == "*"):
        k += 1
    return k


class Labeller:
    def __init__(self, text: str, answer: Fraction | None):
        self.text = text
        self.answer = answer
        self.numbers = scan_numbers(text)
        self.starting = {n[0]: idx for idx, n in enumerate(self.numbers)}
        self.ending = {n[2]: idx for idx, n in enumerate(self.numbers)}
        self.labels = ["."] * len(text)

    def value(self, idx: int) -> tuple[Fraction, int]:
        _, d, e = self.numbers[idx]
        return number_value(self.text, d, e)

    def op_after(self, idx: int) -> str | None:
        if idx + 1 >= len(self.numbers):
            return None
        return gap_operator(self.text, self.numbers[idx][2], self.numbers[idx + 1][0])

    def result(self, pos: int):
        """(label start, end, stated value, places) of a single result at ``pos``."""
        text = self.text
        negative = pos < len(text) and text[pos] in ("-", "\u2212")
        idx = self.starting.get(pos + 1 if negative else pos)
        if idx is None or self.op_after(idx) is not None:
            return None
        value, places = self.value(idx)
        start = pos if negative else self.numbers[idx][1]
        return start, self.numbers[idx][2], -value if negative else value, places

    def mark(self, start: int, end: int, right: bool) -> None:
        for k in range(start, end):
            if self.labels[k] != "w":
                self.labels[k] = "r" if right else "w"

    def equations(self) -> None:
        text = self.text
        for pos, ch in enumerate(text):
            if ch != "=":
                continue
            k = pos
            while k > 0 and text[k - 1] in SPACE:
                k -= 1
            wrapped = k > 0 and text[k - 1] == ")"
            if wrapped:
                k -= 1
                while k > 0 and text[k - 1] in SPACE:
                    k -= 1
            last = self.ending.get(k)
            if last is None:
                continue
            first = last
            while first > 0 and self.op_after(first - 1) is not None:
                first -= 1
            if first == last:
                continue
            begin = self.numbers[first][0]
            if wrapped:
                while begin > 0 and text[begin - 1] in SPACE:
                    begin -= 1
                if begin == 0 or text[begin - 1] != "(":
                    continue
                begin -= 1
            if incomplete_before(text, begin):
                continue
            r = pos + 1
            while r < len(text) and text[r] in SPACE:
                r += 1
            res = self.result(r)
            if res is None:
                continue
            values = [self.value(i)[0] for i in range(first, last + 1)]
            ops = [self.op_after(i) for i in range(first, last)]
            value = compute(values, ops)
            if value is None:
                continue
            start, end, stated, places = res
            self.mark(start, end, agrees(value, stated, places))

    def answers(self) -> None:
        text = self.text
        for i in range(len(text)):
            k = answer_marker_end(text, i)
            if k is not None:
                res = self.result(k)
                if res is not None:
                    self.mark(res[0], res[1], agrees(self.answer, res[2], res[3]))
            if text[i] == "\\" and starts_with_ci(text, i + 1, "boxed{"):
                k = i + 7
                while k < len(text) and text[k] in SPACE:
                    k += 1
                res = self.result(k)
                if res is None:
                    continue
                close = res[1]
                while close < len(text) and text[close] in SPACE:
                    close += 1
                if close < len(text) and text[close] == "}":
                    self.mark(res[0], res[1], agrees(self.answer, res[2], res[3]))


def reference_labels(text: str, answer=None) -> str:
    """Per-character labels of ``text`` (``w``, ``r``, ``.``) as docs/claims.md defines them."""
    lab = Labeller(text, None if answer is None else Fraction(str(answer)))
    lab.equations()
    if answer is not None:
        lab.answers()
    return "".join(lab.labels)
