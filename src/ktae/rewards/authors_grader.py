"""The KTAE authors' evaluation grader, re-implemented (``ktae eval --grader ktae-authors``).

The published KTAE scores were graded by ``boxed_reward_fn(response, gt, fast=False)`` of
``eval/math_eval/math_grader.py`` in the authors' repository (the grader of
understand-r1-zero, itself built from Hendrycks' MATH normalisation, PRM800K's sympy
grader and math-verify). Its rules, in order, each enough to accept:

1. **Extraction**: the last ``\\boxed`` of the response (``\\fbox`` only when there is no
   ``\\boxed``); braces counted from there without regard to escapes; the box must read
   ``\\boxed{...}`` exactly, else there is no answer ("not formatted", reward 0).
2. **MATH string match** (:func:`mathd_normalize`): ``\\text{}`` unwrapped, units and
   words of a long list removed, ``\\left``/``\\right``, ``\\%``, ``\\$`` and degrees
   dropped, ``\\frac12`` and ``\\sqrt3`` expanded, ``a/b`` of integers and ``0.5`` written
   as fractions, a short ``k =`` prefix removed; the two normal forms are equal.
3. **PRM800K sympy check** (:func:`sympy_equal`): a second normal form (lower case, no
   braces, integers without ``.0`` or commas, LaTeX read as text); equal strings, else
   tuples/intervals compared element by element: fractions as written, an integer only
   with an integer string, the rest by ``sympy.simplify(a - b) == 0``.
4. **math-verify** (:func:`math_verify_equal`, 1 second there, 3 here): the second
   normal forms equal,
   else math-verify's ``verify`` of the two answers wrapped in ``$...$``. Answers over 128
   characters that repeat themselves are refused first.

A list reference means any of its entries (the authors' loop over ``gt``). Differences
from the original, all documented: LaTeX-to-text (``pylatexenc`` there) is a small
converter here (fractions, roots, pi, products, text wrappers); the sympy check runs under
the verifier's deadline instead of without one.

This file imports only the standard library at module level (sympy and math-verify when a
check needs them), so the verifier worker runs it by path, as it runs
:mod:`ktae.rewards.answer_line`.
"""

from __future__ import annotations

import math
import re
import signal
import threading

# ----------------------------------------------------------------------------- extraction


def last_box(text: str) -> str | None:
    """The answer of the last ``\\boxed{...}`` (or ``\\fbox`` when no ``\\boxed``), with
    the authors' rules: naive brace counting, and None unless it reads ``\\boxed{...}``."""
    at = text.rfind("\\boxed")
    if at < 0:
        at = text.rfind("\\fbox")
        if at < 0:
            return None
    depth, end = 0, None
    for i in range(at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                end = i
                break
    if end is None:
        return None
    box = text[at:end + 1]
    return box[len("\\boxed{"):-1] if box.startswith("\\boxed{") else None


# ----------------------------------------------------------------------------- rule 2

_UNIT_WORDS = (
    "east", "degree", "mph", "kmph", "ft", "m sqaure", " m east", "sq m", "deg", "mile",
    "q .", "monkey", "prime", "ratio", "profit of rs", "rd", "o", "gm", "p . m", "lb",
    "tile", "per", "dm", "lt", "gain", "ab", "way", "west", "a .", "b .", "c .", "d .",
    "e .", "f .", "g .", "h .", "t", "a", "h", "no change", "men", "soldier", "pie", "bc",
    "excess", "st", "inches", "noon", "percent", "by", "gal", "kmh", "c", "acre", "rise",
    "a . m", "th", "π r 2", "sq", "mark", "l", "toy", "coin", "sq . m", "gallon", "° f",
    "profit", "minw", "yr", "women", "feet", "am", "pm", "hr", "cu cm", "square",
    "v â € ™", "are", "rupee", "rounds", "cubic", "cc", "mtr", "s", "ohm", "number", "kmph",
    "day", "hour", "minute", "min", "second", "man", "woman", "sec", "cube", "mt",
    "sq inch", "mp", "∏ cm ³", "hectare", "more", "sec", "unit", "cu . m", "cm 2", "rs .",
    "rs", "kg", "g", "month", "km", "m", "cm", "mm", "apple", "liter", "loss", "yard",
    "pure", "year", "increase", "decrease", "d", "less", "Surface", "litre", "pi sq m",
    "s .", "metre", "meter", "inch")
"""Words removed as units by the MATH normalisation (mostly MathQA's units), each also
with a plural ``s``; order matters, as in the original."""
_UNIT_PATTERNS = [re.compile(r"(^|\W)" + w + r"($|\W)")
                  for w in (*_UNIT_WORDS, *(w + "s" for w in _UNIT_WORDS))]


def _expand_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{7}`` -> ``\\frac{1}{7}``."""
    head, *rest = s.split("\\frac")
    out = head
    for part in rest:
        out += "\\frac"
        if part.startswith("{"):
            out += part
        elif len(part) < 2:
            return s
        elif part[1] != "{":
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
        else:
            out += "{" + part[0] + "}" + part[1:]
    return out


def _slash_fraction(s: str) -> str:
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _expand_sqrt(s: str) -> str:
    if "\\sqrt" not in s:
        return s
    head, *rest = s.split("\\sqrt")
    return head + "".join("\\sqrt" + (p if p[:1] == "{" else "{" + p[:1] + "}" + p[1:])
                          for p in rest)


def _math_strip(s: str) -> str:
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", s)
    s = re.sub(r"\\end\{array\}", r"\\end{pmatrix}", s).replace("bmatrix", "pmatrix")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\neq", "\\ne").replace("\\leq", "\\le").replace("\\geq", "\\ge")
    s = s.replace("\\left", "").replace("\\right", "")
    without = re.sub(r"\\text{.*?}$", "", s).strip()
    if without and without != s:
        s = without
    for _ in range(2):
        for pattern in _UNIT_PATTERNS:
            t = pattern.sub(r"\1\2", s)
            if t:
                s = t
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:
        parts = s.split("\\text{ ")
        if len(parts) != 2:
            raise ValueError("more than one unit")
        s = parts[0]
    s = s.replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    if len(s.split("=")) == 2 and len(s.split("=")[0]) <= 2:
        s = s.split("=")[1]
    s = _expand_sqrt(s).replace(" ", "")
    s = _expand_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_fraction(s)


def mathd_normalize(answer: str | None) -> str | None:
    """Rule 2's normal form (Hendrycks' MATH normalisation, with the unit list)."""
    if answer is None:
        return None
    answer = answer.strip()
    try:
        m = re.search(r"^\\text\{(?P<text>.+?)\}$", answer)
        if m is not None:
            answer = m.group("text").strip()
        return _math_strip(answer)
    except Exception:  # noqa: BLE001 - the original returns the answer unchanged
        return answer


# ----------------------------------------------------------------------------- rule 3

_PRM_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour",
              "day", "week", "month", "year", "foot", "feet", "inch", "yard")
_LATEX_SYMBOLS = (("\\pi", "pi"), ("\\infty", "inf"), ("\\cup", "U"), ("\\cdot", "*"),
                  ("\\times", "*"), ("\\le", "<="), ("\\ge", ">="))


_FUNCTIONS = frozenset(("sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan",
                        "sinh", "cosh", "tanh", "log", "ln", "exp", "lg", "max", "min", "gcd",
                        "det", "lim"))
"""Operator names written as themselves in text (``\\cos x`` -> ``cos x``)."""


def _braced(s: str, at: int) -> tuple[str, int] | None:
    """The content of the group opening at ``s[at]`` and the index after it."""
    if at >= len(s) or s[at] != "{":
        return None
    depth = 0
    for i in range(at, len(s)):
        depth += {"{": 1, "}": -1}.get(s[i], 0)
        if depth == 0:
            return s[at + 1:i], i + 1
    return None


def latex_to_text(s: str) -> str:
    """A small LaTeX-to-text conversion in the manner of pylatexenc's ``latex_to_text``:
    ``\\frac{a}{b}`` -> ``a/b``, ``\\sqrt{x}`` -> ``sqrt(x)``, ``\\pi`` -> ``pi``,
    ``\\cdot``/``\\times`` -> ``*``, ``\\text{x}`` -> ``x``, ``\\cos`` -> ``cos``, other
    commands dropped."""
    out, i = [], 0
    while i < len(s):
        if s.startswith("\\frac", i):
            num = _braced(s, i + 5)
            den = _braced(s, num[1]) if num else None
            if num and den:
                out.append(f"{latex_to_text(num[0])}/{latex_to_text(den[0])}")
                i = den[1]
                continue
        if s.startswith("\\sqrt", i):
            arg = _braced(s, i + 5)
            if arg:
                out.append(f"sqrt({latex_to_text(arg[0])})")
                i = arg[1]
                continue
        m = re.match(r"\\([a-zA-Z]+)", s[i:])
        if m:
            name = "\\" + m.group(1)
            sym = dict(_LATEX_SYMBOLS).get(name)
            if sym is not None:
                out.append(sym)
            elif m.group(1) in _FUNCTIONS:
                out.append(m.group(1))
            elif m.group(1) in ("text", "textbf", "mathrm", "mathbf", "mbox"):
                arg = _braced(s, i + len(name))
                if arg:
                    out.append(latex_to_text(arg[0]))
                    i = arg[1]
                    continue
            i += len(name)
            continue
        if s[i] in "{}":
            i += 1
            continue
        if s[i] == "\\" and i + 1 < len(s):
            out.append(" " if s[i + 1] in ",;:! " else s[i + 1])
            i += 2
            continue
        out.append(s[i])
        i += 1
    return "".join(out).strip()


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _strip_thousands(s: str) -> str:
    pattern = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
    while True:
        t = pattern.sub(r"\1\3\4", s)
        if t == s:
            return t
        s = t


def _str_is_int(s: str) -> bool:
    try:
        x = float(_strip_thousands(s))
        return abs(x - int(round(x))) <= 1e-7
    except (ValueError, OverflowError):
        return False


def prm_normalize(expr: str | None) -> str | None:
    """Rule 3's normal form (PRM800K's grader)."""
    if expr is None:
        return None
    m = re.search(r"^\\text\{(?P<text>.+?)\}$", expr)
    if m is not None:
        expr = m.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    for word, power in (("million", 6), ("billion", 9), ("trillion", 12)):
        expr = expr.replace(word, f"*10^{power}")
    for unit in _PRM_UNITS:
        expr = re.sub(f"{unit}(es)?(s)? *(\\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr[:1] == "{" and expr[-1:] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and math.isfinite(float(expr)) \
            and abs(float(expr) - round(float(expr))) <= 1e-7:
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        try:
            expr = latex_to_text(expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
                                 .replace("\\frac", " \\frac"))
        except Exception:  # noqa: BLE001 - as the original, keep the text
            pass
    expr = re.sub("- *", "-", expr)
    expr = re.sub("([0-9]) +([0-9])", "\\1+\\2", expr)  # mixed numbers: 7 3/4 -> 7+3/4
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _may_simplify(expr: str) -> bool:
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2 or "^{" in expr or "^(" in expr:
        return False
    return not (re.search(r"\^[0-9]+\^", expr) or re.search(r"\^[0-9][0-9]+", expr))


def _simplifies_to_zero(a: str, b: str) -> bool:
    expr = f"({a})-({b})"
    if not _may_simplify(expr):
        return False
    try:
        import sympy
        from sympy.parsing import sympy_parser

        parsed = sympy_parser.parse_expr(
            expr.replace("^", "**"), transformations=sympy_parser.standard_transformations
            + (sympy_parser.implicit_multiplication_application,))
        return sympy.simplify(parsed) == 0
    except Exception:  # noqa: BLE001 - anything sympy cannot read is not equal
        return False


def _elements(expr: str) -> list[str]:
    expr = _strip_thousands(expr)
    if not expr:
        return []
    brackets = "()[]"
    if len(expr) > 2 and expr[0] in brackets and expr[-1] in brackets \
            and not any(c in expr[1:-1] for c in brackets):
        return [e.strip() for e in expr[1:-1].split(",")]
    return [expr]


def sympy_equal(given: str, truth: str) -> bool:
    """Rule 3: PRM800K's grader on the two answers."""
    t, g = prm_normalize(truth), prm_normalize(given)
    if t is None:
        return False
    if t == g:
        return True
    if not g:
        return False
    t_elems, g_elems = _elements(t), _elements(g)
    if len(t_elems) > 1 and (t[0] != g[0] or t[-1] != g[-1]):
        return False
    if len(t_elems) != len(g_elems):
        return False
    fraction = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
    for te, ge in zip(t_elems, g_elems, strict=True):
        if fraction.search(te) and fraction.search(ge):
            ok = te == ge  # unreduced fractions are not accepted
        elif _str_is_int(te) != _str_is_int(ge):
            ok = False
        else:
            ok = _simplifies_to_zero(te, ge)
        if not ok:
            return False
    return True


# ----------------------------------------------------------------------------- rule 4


def _repeats_itself(s: str) -> bool:
    """The authors' repetition test: the adjacent longest common prefixes of the sorted
    suffixes sum to more than 0.2 of ``n (n + 1) / 2``."""
    n = len(s)
    if n <= 1:
        return False
    suffixes = sorted(range(n), key=lambda i: s[i:])
    total = 0
    for x, y in zip(suffixes, suffixes[1:], strict=False):
        k = 0
        while x + k < n and y + k < n and s[x + k] == s[y + k]:
            k += 1
        total += k
    return total * 2 / (n * (n + 1)) > 0.2


class _Deadline:
    def __init__(self, seconds: int):
        self.seconds = seconds

    def _fire(self, signum, frame):
        raise TimeoutError

    def __enter__(self):
        # signals work in the main thread only (the verifier worker's); elsewhere the
        # caller's own deadline is the only one
        self.armed = threading.current_thread() is threading.main_thread()
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._fire)
            signal.alarm(self.seconds)

    def __exit__(self, *exc):
        if self.armed:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, self.previous)


MATH_VERIFY_SECONDS = 3
"""Limit of rule 4. The original allows 1 second; on a slower machine that cuts checks the
authors' machine finished (one Minerva response of their published file needs 1-2 s
here), so the limit is 3 s (the verifier's own deadline, ``--timeout``, still bounds the
whole check)."""


def math_verify_equal(given: str, truth: str) -> bool:
    """Rule 4: equal normal forms, else math-verify, within :data:`MATH_VERIFY_SECONDS`
    (the alarm works in the main thread, as in the verifier worker)."""
    # imported before the deadline is armed: an import cut short by the alarm would leave
    # sympy half-initialised for every later check
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    try:
        with _Deadline(MATH_VERIFY_SECONDS):
            if (len(given) > 128 and _repeats_itself(given)) or \
                    (len(truth) > 128 and _repeats_itself(truth)):
                return False
            t, g = prm_normalize(truth), prm_normalize(given)
            if t is None:
                return False
            if t == g:
                return True
            config = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())

            def read(s: str):
                return parse(s if "$" in s else f"${s}$", extraction_config=config,
                             fallback_mode="no_fallback", extraction_mode="any_match",
                             parsing_timeout=None)

            return bool(verify(read(truth), read(given), timeout_seconds=None))
    except Exception:  # noqa: BLE001 - TimeoutError and parse failures: not equal
        return False


# ----------------------------------------------------------------------------- the grader


def grade(given: str, truth: str) -> bool:
    """Whether the extracted answer ``given`` matches the reference ``truth`` (rules 2-4;
    a reference holding a box is first reduced to its box)."""
    if "\\boxed" in truth:
        truth = last_box(truth)
        if truth is None:
            return False
    if mathd_normalize(given) == mathd_normalize(truth):
        return True
    return sympy_equal(given, truth) or math_verify_equal(given, truth)


def check_response(response: str, truth: str) -> tuple[bool, str | None]:
    """``(correct, extracted)`` of a whole response, as the verifier worker's scorers
    answer (extracted None: no box, not formatted)."""
    given = last_box(response)
    if given is None:
        return False, None
    return grade(given, truth), given


CHECKS = {"ktae-authors": check_response}
"""Scorer name -> check, merged into the verifier worker's scorers."""
