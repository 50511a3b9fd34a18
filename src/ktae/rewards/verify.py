"""The rule-based math reward (docs/method.md §12): strict boxed extraction, then equivalence.

Equivalence of the extracted answer and the reference, in order:

1. normalised exact match (:func:`ktae.rewards.extract.normalize_answer`), in process;
2. decimal numbers on both sides are compared exactly as fractions, in process
   (``7.0 == 7``; ``07 == 7``: leading zeros are formatting, as in AIME's ``007``),
   scientific notation included: ``1e-5 == 0.00001 == 10^{-5}``, ``3e8 == 3\\times10^{8}``,
   ``2.5e3 == 2500`` (:func:`decimal_value`; math-verify reads ``1e-5`` as a product
   with Euler's number, and compares powers of ten inexactly; an E-notation reference
   goes on to the symbolic stage as its exact fraction). Against a number, an
   answer that is a number followed by a unit in ``\\text{}`` (``5.11\\times10^{-19}
   \\,\\text{J}``) is compared by its number, exactly: math-verify rounds to 6 decimals, so it would call
   any two numbers below 5e-7 equal;
3. otherwise math-verify (``parse`` + ``verify``: fractions, LaTeX expressions,
   sets/intervals, percentages, simple units) in a verifier process with a hard deadline
   (:mod:`ktae.rewards.pool`). A check that misses the deadline counts as incorrect and
   as a timeout (:func:`reward_stats`); answers longer than ``MAX_SYMBOLIC_CHARS`` are
   not sent to sympy at all.

math-verify on its own would also accept unboxed or unclosed answers (``"7"``,
``"\\boxed{7"``); here extraction is strict, so those score 0 and are not "formatted".
"""

from __future__ import annotations

import math
import numbers
import re
import sys
import threading
from dataclasses import dataclass
from fractions import Fraction

from ktae.rewards.answer_line import ANSWER_CLIP
from ktae.rewards.extract import extract_boxed, normalize_answer
from ktae.rewards.pool import VerifierTimeout, WorkerError, get_pool

MAX_SYMBOLIC_CHARS = 1000
"""Answers (extracted or reference) longer than this are compared by exact match only."""

_PLAIN_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)$")
_MANTISSA = r"[-+]?(?:\d+\.?\d*|\.\d+)"
_E_NOTATION = re.compile(rf"^({_MANTISSA})[eE]([-+]?\d+)$")
_TIMES_TEN = re.compile(rf"^(?:({_MANTISSA})\\(?:times|cdot))?(-)?10\^(?:\{{([-+]?\d+)\}}|(\d))$")
_TEXT_UNIT = re.compile(r"(?:\\[,;:! ]|\s)*\\(?:text|mathrm|mbox)\{[^{}]*\}(?:\^\{?-?\d\}?)?\s*$")
MAX_EXPONENT = 400
"""Powers of ten beyond this are left to the symbolic stage (no huge exact fractions)."""

_STATS_LOCK = threading.Lock()
_STATS = {"calls": 0, "exact": 0, "symbolic": 0, "timeouts": 0, "errors": 0}


@dataclass(frozen=True)
class RewardResult:
    """Outcome of one check. ``score`` is the reward: 1.0 when ``correct`` else 0.0 for
    the boxed reward (other scorers give their own values, e.g. DAPO's +1 / -1).

    ``formatted``: the completion closes a non-empty ``\\boxed{}``; ``extracted``: its
    content (None when there is no complete box); ``timed_out``: the symbolic check was
    killed at its deadline (the answer then counts as incorrect); ``cut_off``: the response
    hit its token budget without ending, and was counted wrong for it
    (:func:`ktae.rewards.ends.require_end`).
    """

    score: float
    correct: bool
    formatted: bool
    extracted: str | None
    timed_out: bool = False
    cut_off: bool = False


def _count(key: str) -> None:
    with _STATS_LOCK:
        _STATS[key] += 1


def reward_stats() -> dict[str, int]:
    """Counters of this process since the last reset.

    ``calls`` (math_reward calls), ``exact`` (decided in process), ``symbolic`` (sent to
    a verifier process), ``timeouts`` (killed at the deadline), ``errors`` (the verifier
    failed or crashed: counted incorrect).
    """
    with _STATS_LOCK:
        return dict(_STATS)


def reset_reward_stats() -> None:
    with _STATS_LOCK:
        for key in _STATS:
            _STATS[key] = 0


def _clean(text: str) -> str:
    """Replace lone surrogates (invalid UTF-8, e.g. ``"\\ud800"``) by ``?``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def reference_text(reference, name: str = "reference") -> str:
    """The reference answer as text; numpy scalars count as numbers."""
    if isinstance(reference, str):
        return _clean(reference)
    if isinstance(reference, bool) or not isinstance(reference, numbers.Real):
        raise ValueError(f"{name}: expected a string or number, got {type(reference).__name__}")
    if isinstance(reference, numbers.Integral):
        reference = int(reference)
    elif not isinstance(reference, Fraction):
        reference = float(reference)
        if not math.isfinite(reference):
            raise ValueError(f"{name}: expected a finite number, got {reference}")
        if not reference.is_integer():
            return repr(reference)
        reference = int(reference)
    try:
        return str(reference)
    except ValueError:  # Python's limit on int -> str conversion (4300 digits by default)
        digits = int(max(abs(reference.numerator), abs(reference.denominator)).bit_length()
                     * math.log10(2)) + 1
        raise ValueError(f"{name}: expected a number of at most {sys.get_int_max_str_digits()} "
                         f"digits, got one of about {digits} digits") from None


def reference_alternatives(reference, name: str = "reference") -> tuple[str, ...]:
    """The accepted answers of a reference: one for a string or number; for a list or
    tuple (Minerva's ``['0.01', '0.02']``), each of its entries, any of which is correct.

    Raises:
        ValueError: an empty list, a list inside a list (``[1, [2, 3]]``), or an entry
            :func:`reference_text` refuses; the message names ``name`` and the entry.
    """
    if isinstance(reference, (list, tuple)):
        if not reference:
            raise ValueError(f"{name}: expected at least one accepted answer, got an empty list")
        out = []
        for j, item in enumerate(reference):
            if isinstance(item, (list, tuple)):
                raise ValueError(f"{name}: expected a list of accepted answers (strings or "
                                 f"numbers), got a nested list at entry {j}: {item!r}"[:300])
            out.append(reference_text(item, f"{name}[{j}]"))
        return tuple(out)
    return (reference_text(reference, name),)


def _check_timeout(timeout) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout: expected a positive number of seconds, got {timeout!r}")
    return float(timeout)


def _plain_number(s: str) -> Fraction | None:
    return Fraction(s) if len(s) <= 100 and _PLAIN_NUMBER.match(s) else None


def decimal_value(s: str) -> Fraction | None:
    """The exact value of a normalised answer written as a decimal number: plain
    (``0.00001``), E notation (``1e-5``, ``2.5E3``) or a power of ten in LaTeX
    (``3\\times10^{8}``, ``2\\cdot10^{-3}``, ``10^{-5}``, ``10^5``); None otherwise
    (and for exponents beyond :data:`MAX_EXPONENT`)."""
    if len(s) > 100:
        return None
    plain = _plain_number(s)
    if plain is not None:
        return plain
    m = _E_NOTATION.match(s)
    if m:
        mantissa, exponent = Fraction(m.group(1)), int(m.group(2))
    else:
        m = _TIMES_TEN.match(s)
        if not m:
            return None
        mantissa = Fraction(m.group(1)) if m.group(1) else Fraction(-1 if m.group(2) else 1)
        if m.group(1) and m.group(2):
            return None  # "3\\times-10^{2}" is not a way to write a number
        exponent = int(m.group(3) if m.group(3) is not None else m.group(4))
    if abs(exponent) > MAX_EXPONENT:
        return None
    return mantissa * Fraction(10) ** exponent


def answers_equivalent(answer: str, reference: str, *, timeout: float = 5.0) -> tuple[bool, bool]:
    """Whether two final answers are equal: ``(equal, timed_out)``.

    ``answer`` and ``reference`` are bare answers (no ``\\boxed``). Never raises on odd
    strings and never takes (much) longer than ``timeout`` seconds (a fresh verifier
    process, needed after a timeout, starts in the background or, at worst, on the next
    call, bounded by ``pool.STARTUP_TIMEOUT``).
    """
    timeout = _check_timeout(timeout)
    if not isinstance(answer, str) or not isinstance(reference, str):
        raise ValueError("answer, reference: expected strings, got "
                         f"{type(answer).__name__}, {type(reference).__name__}")
    answer, reference = _clean(answer), _clean(reference)
    a, r = normalize_answer(answer), normalize_answer(reference)
    if not a or not r:
        _count("exact")
        return False, False
    if a == r:
        _count("exact")
        return True, False
    na, nr = decimal_value(a), decimal_value(r)
    if nr is not None and na is None and _TEXT_UNIT.search(answer):
        na = decimal_value(normalize_answer(_TEXT_UNIT.sub("", answer)))  # "5.1\\text{ J}"
    if na is not None and nr is not None:
        _count("exact")
        return na == nr, False
    if nr is not None and _E_NOTATION.match(r):
        # math-verify reads "1e-5" as 1*e - 5: give it the number as a fraction
        reference = str(nr.numerator) if nr.denominator == 1 else \
            f"\\frac{{{nr.numerator}}}{{{nr.denominator}}}"
        r = reference
    if len(a) > MAX_SYMBOLIC_CHARS or len(r) > MAX_SYMBOLIC_CHARS:
        _count("exact")
        return False, False
    _count("symbolic")
    try:
        reply = get_pool().run({"gold": reference, "pred": answer}, timeout)
    except VerifierTimeout:
        _count("timeouts")
        return False, True
    except WorkerError:
        _count("errors")
        return False, False
    if "error" in reply:
        _count("errors")
    return bool(reply.get("equal", False)), False


def math_reward(completion: str, reference, *, timeout: float = 5.0) -> RewardResult:
    """Score a completion against a reference answer: 1.0 if its last box is equivalent.

    Args:
        completion: model output; its final answer is the last ``\\boxed{...}`` or
            ``\\fbox{...}`` (:func:`ktae.rewards.extract_boxed`), nothing else.
        reference: the ground-truth answer, bare (``"\\frac{1}{2}"``) or a number; a list
            of them means any of these (:func:`reference_alternatives`).
        timeout: hard limit in seconds on the symbolic check; safe from any thread and
            inside multiprocessing workers.

    Returns:
        RewardResult(score, correct, formatted, extracted, timed_out).

    >>> math_reward("so the answer is $\\\\boxed{0.5}$", "\\\\frac{1}{2}").correct
    True
    """
    if not isinstance(completion, str):
        raise ValueError(f"completion: expected a string, got {type(completion).__name__}")
    refs = reference_alternatives(reference)
    timeout = _check_timeout(timeout)
    _count("calls")
    extracted = extract_boxed(_clean(completion))
    if extracted is None or not extracted.strip():
        return RewardResult(0.0, False, False, extracted, False)
    correct, timed_out = _any_equivalent(extracted, refs, timeout)
    return RewardResult(1.0 if correct else 0.0, correct, True, extracted, timed_out)


def _any_equivalent(answer: str, refs: tuple[str, ...], timeout: float) -> tuple[bool, bool]:
    """Whether ``answer`` equals one of ``refs``; timed out when none did and one timed
    out. The cheap in-process stages see every alternative before any symbolic check."""
    timed_out = False
    for ref in sorted(refs, key=lambda r: normalize_answer(r) != normalize_answer(answer)):
        equal, late = answers_equivalent(answer, ref, timeout=timeout)
        if equal:
            return True, False
        timed_out = timed_out or late
    return False, timed_out


SCORER_VALUES = {"dapo": (1.0, -1.0), "gsm8k": (1.0, 0.0), "number": (1.0, 0.0),
                 "ktae-authors": (1.0, 0.0)}
"""Scorer of :mod:`ktae.rewards.answer_line` -> (score if correct, score if not), as verl
gives them (``math_dapo``: +1 / -1; ``gsm8k``: 1 / 0); ``number``: the last number
(1 / 0); ``ktae-authors``:
:mod:`ktae.rewards.authors_grader` (1 / 0)."""
WHOLE_RESPONSE_SCORERS = frozenset({"ktae-authors"})
"""Scorers that read the whole response (the others read its last ``ANSWER_CLIP``
characters, as verl's do)."""


def scorer_reward(completion: str, reference, *, scorer: str, timeout: float = 5.0
                  ) -> RewardResult:
    """Score a completion with a scorer of :mod:`ktae.rewards.answer_line` (``"dapo"``:
    the last ``Answer:`` line; ``"gsm8k"``: the last ``#### N``) or the KTAE authors'
    grader (``"ktae-authors"``, :mod:`ktae.rewards.authors_grader`). A list reference is
    correct when any of its entries is.

    The check runs in a verifier process under the same hard deadline as the symbolic
    stage of :func:`math_reward` (a missed deadline counts as incorrect and as a timeout).
    ``formatted`` is whether the completion has the scorer's answer line and
    ``extracted`` the normalised answer read from it; ``score`` is the scorer's value
    (:data:`SCORER_VALUES`).
    """
    if not isinstance(completion, str):
        raise ValueError(f"completion: expected a string, got {type(completion).__name__}")
    if scorer not in SCORER_VALUES:
        raise ValueError(f"scorer: expected one of {tuple(SCORER_VALUES)}, got {scorer!r}")

    refs = reference_alternatives(reference)
    timeout = _check_timeout(timeout)
    right, wrong = SCORER_VALUES[scorer]
    text = _clean(completion)
    if scorer not in WHOLE_RESPONSE_SCORERS:
        text = text[-ANSWER_CLIP:]
    _count("calls")
    pred, timed_out = None, False
    for ref in refs:  # a list reference: any accepted answer
        _count("symbolic")
        try:
            reply = get_pool().run({"scorer": scorer, "gold": ref, "pred": text}, timeout)
        except VerifierTimeout:
            _count("timeouts")
            timed_out = True
            continue
        except WorkerError:
            _count("errors")
            continue
        if "error" in reply:
            _count("errors")
        pred = reply.get("pred", pred)
        if reply.get("equal", False):
            return RewardResult(right, True, True, pred, False)
    return RewardResult(wrong, False, pred is not None, pred, timed_out)
