"""Final-answer extraction and string normalisation (docs/method.md §12).

Extraction is strict: the final answer is the content of the last ``\\boxed{...}`` or
``\\fbox{...}`` in the completion, and nothing else. There is no fallback to the last
number of the text, so a completion is "formatted" exactly when it closes a box.
Everything here is linear in the length of the input and never calls sympy.
"""

from __future__ import annotations

import re

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _closing_brace(text: str, open_at: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_at``, or None when unclosed.

    Escaped braces (``\\{``, ``\\}``) are literal characters in LaTeX and do not count;
    a backslash always consumes the character after it (so ``\\\\{`` opens a group).
    One forward scan: O(len(text)).
    """
    depth = 0
    i, n = open_at, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` of ``text``, or None.

    "Last" means the box that starts last (for ``\\boxed{\\boxed{3}}`` that is the inner
    one, ``"3"``). When that box is not closed (``"... \\boxed{7"``, a truncated answer)
    the result is None: an earlier, complete box is *not* used, because the model's final
    answer is the unfinished one. The content is returned verbatim (``\\boxed{}`` gives
    ``""``). Linear time and memory in ``len(text)``, whatever the nesting.

    >>> extract_boxed(r"so $\\boxed{\\frac{1}{2}}$.")
    '\\\\frac{1}{2}'
    >>> extract_boxed(r"\\boxed{7") is None
    True
    """
    if not isinstance(text, str):
        raise ValueError(f"text: expected a string, got {type(text).__name__}")
    last = None
    for last in _BOX_OPEN.finditer(text):  # noqa: B007 - we only want the last match
        pass
    if last is None:
        return None
    open_at = last.end() - 1
    close_at = _closing_brace(text, open_at)
    if close_at is None:
        return None
    return text[open_at + 1:close_at]


# ----------------------------------------------------------------------------- normalise

_TEXT_UNITS = re.compile(
    r"\\(?:text|textbf|mathrm|mbox)\{\s*(?:cm|m|km|mm|kg|g|mg|s|sec|seconds?|min|minutes?|"
    r"hours?|h|days?|weeks?|years?|degrees?|units?|sq\.?\s*units?|square\s+units?|"
    r"inches?|in|feet|foot|ft|miles?|mph|meters?|cents?|dollars?|pounds?|lbs?|"
    r"ounces?|oz|liters?|L|ml|people|students?|ways|points?)\s*\}(\^\{?\d\}?)?")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\{([^{}]*)\}")
_SPACING = re.compile(r"\\[,;:! ]|\\quad|\\qquad|~")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?|\\degree")
_DOLLARS = re.compile(r"^\\?\$|\\?\$$")


def normalize_answer(answer: str) -> str:
    """A canonical string for exact-match comparison of two final answers.

    Removes what never changes the value: spaces and LaTeX spacing (``\\,``, ``\\!``,
    ``\\quad``, ``~``), ``\\left``/``\\right``, ``$`` delimiters, a trailing ``.``,
    degree signs, common units in ``\\text{...}`` (``5\\text{ cm}`` -> ``5``), and
    ``\\text{}`` wrappers around the rest; maps ``\\dfrac``/``\\tfrac`` to ``\\frac``,
    ``\\le``/``\\ge`` forms to their short names and ``\\%`` to ``%``; and removes a
    leading ``x =`` style assignment of a single letter. It does not touch digits, so
    ``"07"`` and ``"7"`` stay different here (the symbolic stage accepts them as equal).
    """
    s = answer.strip().rstrip(".").strip()
    s = _DOLLARS.sub("", s)
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\leq", "\\le").replace("\\geq", "\\ge").replace("\\neq", "\\ne")
    s = s.replace("\\%", "%").replace("\\$", "")
    s = _DEGREES.sub("", s)
    s = _TEXT_UNITS.sub("", s)
    s = _TEXT_WRAP.sub(r"\1", s)
    s = _SPACING.sub("", s)
    s = "".join(s.split())
    s = re.sub(r"^[a-zA-Z]=(?!=)", "", s)
    s = s.rstrip(".")
    return s
