"""Answer formats other than the last box, read as verl's scorers read them (stdlib only).

* DAPO (verl's ``math_dapo`` scorer, the reward of DAPO-Math-17k): only the last
  ``ANSWER_CLIP`` characters of a response count; its answer is the text after the last
  ``Answer:`` (any case, spaces allowed before and after the colon) up to the end of that
  line; both that text and the reference go through :func:`normalize_final_answer` (the
  Minerva normalisation: the part after the last ``=``, units and words removed,
  ``\\text{}``/``\\boxed{}`` unwrapped, shorthand ``\\frac12`` expanded, thousands commas
  of whole numbers dropped) and must then be equal as strings. No line means no answer
  (``[INVALID]`` in verl), which is never equal to a reference.
* number (the reward of the ``arith`` task, :mod:`ktae.tasks.arith`): the last number in
  the last ``ANSWER_CLIP`` characters, read as :func:`last_number` reads it (a minus sign,
  thousands groups separated by commas or single spaces, a decimal part), equal in value to
  the reference. A response without a number has no answer.
* GSM8K (verl's ``gsm8k`` scorer, strict mode): the last ``#### N`` (digits, ``.``, ``,``,
  a leading ``-``) of the last ``ANSWER_CLIP`` characters, commas and ``$`` removed, equal
  to the reference string.

Everything here is string work on at most ``ANSWER_CLIP`` characters. This file imports
nothing but :mod:`re`, so the verifier worker (:mod:`ktae.rewards._worker`) runs it by
path, under the same hard deadline as the symbolic checks.
"""

from __future__ import annotations

import re

ANSWER_CLIP = 300
"""Characters at the end of a response that the scorers read (verl: the longest MATH-500
answer has 159)."""

INVALID = "[INVALID]"
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_GSM8K = re.compile(r"#### (\-?[0-9\.\,]+)")

# in order: (old, new) substitutions, then removed expressions (Minerva's normalisation)
_SUBSTITUTIONS = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""),
                  ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","),
                  ("\\text{m}", "\\text{}"))
_REMOVED = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units",
            "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm",
            "gm", "pounds", "meters", "meals", "edges", "students", "childrentickets",
            "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
            "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!",
            "{,}", '"', "\\dots")
_REWRITES = ((re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"),
             (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
             (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"),
             (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
             (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"),
             (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),
             (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}"))


def normalize_final_answer(answer: str) -> str:
    """The Minerva / DAPO normal form of a final answer (see the module docstring)."""
    s = answer.split("=")[-1]
    for old, new in _SUBSTITUTIONS:
        s = s.replace(old, new)
    for expr in _REMOVED:
        s = s.replace(expr, "")
    for pattern, repl in _REWRITES:
        s = pattern.sub(repl, s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def answer_line(response: str) -> str | None:
    """The raw text after the last ``Answer:`` of the response's tail, or None."""
    found = _ANSWER_LINE.findall(response[-ANSWER_CLIP:])
    return found[-1] if found else None


def dapo_check(response: str, reference: str) -> tuple[bool, str | None]:
    """``(correct, prediction)`` as verl's ``math_dapo.compute_score`` decides them:
    the normalised last ``Answer:`` line equals the normalised reference. ``prediction``
    is the normalised answer, or None without an ``Answer:`` line."""
    line = answer_line(response)
    if line is None:
        return False, None
    pred = normalize_final_answer(line)
    return pred == normalize_final_answer(reference), pred


def gsm8k_check(response: str, reference: str) -> tuple[bool, str | None]:
    """``(correct, prediction)`` of verl's strict GSM8K scorer: the last ``#### N``."""
    found = _GSM8K.findall(response[-ANSWER_CLIP:])
    if not found:
        return False, None
    pred = found[-1].replace(",", "").replace("$", "")
    return pred == reference, pred


# a number: digits with optional thousands groups (",ddd" or " ddd"), a decimal part, and a
# minus sign directly before it; not part of a word or of a longer digit run ("x2", "3rd")
_NUMBER = re.compile(r"(?<![\w.])(-?)(\d{1,3}(?:[, ]\d{3})+|\d+)(\.\d+)?(?![\w])")


def last_number(response: str) -> str | None:
    """The last number of ``response`` as a canonical decimal string, or None.

    ``1,234`` and ``1 234`` are 1234; ``-7`` is negative; ``2.50`` is ``2.5``; a trailing
    ``.`` ends a sentence (``is 16.`` is 16). Digits inside words (``x2``, ``3rd``) are not
    numbers."""
    found = _NUMBER.findall(response)
    if not found:
        return None
    sign, whole, frac = found[-1]
    whole = whole.replace(",", "").replace(" ", "").lstrip("0") or "0"
    frac = frac.rstrip("0").rstrip(".")
    text = whole + frac
    return text if text == "0" or not sign else "-" + text


def number_check(response: str, reference: str) -> tuple[bool, str | None]:
    """``(correct, prediction)``: the last number of the response's tail equals the reference
    (both read by :func:`last_number`)."""
    pred = last_number(response[-ANSWER_CLIP:])
    if pred is None:
        return False, None
    return pred == last_number(str(reference)), pred


CHECKS = {"dapo": dapo_check, "gsm8k": gsm8k_check, "number": number_check}
"""Scorer name -> check, as the verifier worker looks them up."""
