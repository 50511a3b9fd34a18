"""LaTeX arithmetic as the claim labeller reads it (docs/claims.md, LaTeX).

:func:`plain_math` rewrites the LaTeX a math model writes (``\\( 6 \\times 7 = 42 \\)``,
``$12 \\div 4 = 3$``, ``\\frac{12}{4} = 3``) into the plain forms the labeller reads,
character for character: the output has the length of the input and every character the
labeller reads or labels (digits, signs, ``=``, brackets, words) stays where it was, so a
claim's spans in the rewritten text are its spans in the original, and the token labels
map onto the original tokens unchanged. What it does not rewrite stays as written, and
the labeller skips a claim that needs it (an operand that is not a number).
"""

from __future__ import annotations

import re

OPERATOR_COMMANDS = {"times": "\u00d7", "cdot": "\u00d7", "ast": "\u00d7", "div": "\u00f7"}
"""LaTeX operator -> the operator character it is read as (the rest of it reads as spaces)."""
BLANK_COMMANDS = ("left", "right")
"""Commands read as spaces (``\\left(``: the bracket after them stays)."""
FRACTION_COMMANDS = ("frac", "dfrac", "tfrac")

_NUMBER = r"-?(?:[0-9]{1,3}(?:(?:,|\{,\}|\\,)[0-9]{3}(?![0-9]))+|[0-9]+)(?:\.[0-9]+)?"
_COMMAND = re.compile(r"\\([A-Za-z]+)")
_FRACTION = re.compile(r"\{([ \t]*" + _NUMBER + r"[ \t]*)\}\{([ \t]*" + _NUMBER + r"[ \t]*)\}")
_BRACED = re.compile(r"\{[ \t]*" + _NUMBER + r"[ \t]*\}")


def _digit(text: str, k: int) -> bool:
    return 0 <= k < len(text) and text[k] in "0123456789"


def _blank(out: list[str], start: int, end: int) -> None:
    for k in range(start, end):
        out[k] = " "


def plain_math(text: str) -> str:
    """``text`` with its LaTeX arithmetic in plain form, character for character:

    * ``\\times``, ``\\cdot``, ``\\ast`` -> ``×`` and ``\\div`` -> ``÷`` (then spaces);
    * ``\\frac{a}{b}`` (also ``\\dfrac``, ``\\tfrac``), ``a`` and ``b`` each a number ->
      ``(a /b)`` (the ``\\frac{`` reads as ``(`` and spaces, ``}{`` as `` /``, the last
      ``}`` as ``)``), so the fraction is one operand;
    * math delimiters ``\\(``, ``\\)``, ``\\[``, ``\\]``, a ``$`` not directly followed by a
      digit (``$$``, a closing ``$``), ``\\left``, ``\\right`` and the spacing commands
      ``\\;``, ``\\:``, ``\\!``, ``\\`` + space, and ``\\,`` except between two digits -> spaces;
    * ``{N}``, braces around a number, not right after a letter, ``\\``, ``^``, ``_`` or
      ``}`` (a command's, a power's or an index's argument) -> the number between spaces;
    * ``\\%`` and ``\\$`` -> a space and the sign; ``&=`` (an aligned equation) -> a space
      and ``=``.

    A ``$`` directly followed by a digit stays: as a currency sign or an opening math
    delimiter it is read the same way (unlabelled, the value unchanged)."""
    if not isinstance(text, str):
        raise ValueError(f"text: expected a string, got {type(text).__name__}")
    if "\\" not in text and "$" not in text and "{" not in text and "&" not in text:
        return text
    out = list(text)
    n = len(text)
    k = 0
    while k < n:
        ch = text[k]
        if ch == "\\" and k + 1 < n:
            m = _COMMAND.match(text, k)
            if m is None:
                nxt = text[k + 1]
                if nxt in "()[];:! " or (nxt == "," and not (
                        _digit(text, k - 1) and _digit(text, k + 2))):
                    _blank(out, k, k + 2)
                elif nxt in "%$":  # an escaped percent or dollar sign: the sign itself
                    out[k] = " "
                k += 2
                continue
            name = m.group(1)
            if name in OPERATOR_COMMANDS:
                _blank(out, k, m.end())
                out[k] = OPERATOR_COMMANDS[name]
            elif name in BLANK_COMMANDS:
                _blank(out, k, m.end())
            elif name in FRACTION_COMMANDS and (f := _FRACTION.match(text, m.end())):
                _blank(out, k, f.start(1))
                out[k] = "("
                out[f.end(1)], out[f.start(2) - 1] = " ", "/"
                out[f.end(2)] = ")"
                k = f.end()
                continue
            k = m.end()
            continue
        if ch == "$" and not _digit(text, k + 1):
            out[k] = " "
        elif ch == "&" and text[k + 1:k + 2] == "=":
            out[k] = " "
        k += 1
    plain = "".join(out)
    while True:  # braces around a number, innermost first: {{42}} -> {  42  } -> 42
        changed = False
        for m in _BRACED.finditer(plain):
            before = plain[m.start() - 1] if m.start() else ""
            if before.isalpha() or before in ("\\", "^", "_", "}"):
                continue
            out[m.start()] = out[m.end() - 1] = " "
            changed = True
        if not changed:
            return plain
        plain = "".join(out)
