"""The embedded task: seeded multi-step arithmetic, the offline default for training and eval.

Three difficulty levels (issue 5, "Embedded default model"):

* level 1: ``a±b``                      (one step)
* level 2: ``a±b±c``                    (two steps, left to right)
* level 3: ``a*b±c`` or ``c±a*b``       (product first, ``a`` and ``b`` single-digit)

Each free operand is a single digit (0-9) with probability 1/2, else uniform in 0-99;
the factors ``a, b`` of level 3 are uniform in 1-9. No intermediate or final result is
negative. Every distinct question belongs to exactly one split, decided by a stable hash
of its text (:func:`split_of`, about 10% test), so train and test never overlap whatever
the seeds.

A worked solution (:func:`worked_solution`) writes one equation per step and ends with
``\\boxed{answer}``; with ``carry_noise=p`` each step that carries (``+``) or borrows
(``-``) "forgets" it with probability ``p`` -- the systematic, fixable slip the default
model is warm-started on, so that RL has something to correct.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

TEMPLATES = ("compact", "qwen-math")
"""Prompt templates accepted by :func:`format_prompt`."""

SPLITS = ("train", "test")
TEST_FRACTION_BUCKETS = 10  # one bucket in ten is test: about 10% of questions
EVAL_SEED = 1234
"""Seed of the held-out embedded problems (``generate(n, split="test", seed=EVAL_SEED)``):
the set ``ktae train`` evaluates on for every run and seed, and the prompts ``ktae explain``
and ``ktae audit`` sample."""
QWEN_MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

_LEVELS = (1, 2, 3)
_MAX_DUPLICATE_RETRIES = 2000  # consecutive duplicate draws before duplicates are allowed


@dataclass(frozen=True)
class Problem:
    """One embedded problem: ``question`` like ``"37+45-18"``, exact ``answer`` like ``"64"``."""

    id: str
    question: str
    answer: str
    level: int


@dataclass(frozen=True)
class Step:
    """One written equation ``x op y = written``; ``slipped`` when it forgot a carry/borrow."""

    x: int
    op: str
    y: int
    written: int
    slipped: bool

    def text(self) -> str:
        return f"{self.x}{self.op}{self.y}={self.written}."


# --------------------------------------------------------------------------- evaluation


def _tokenize(question: str) -> list:
    if not isinstance(question, str) or not question:
        raise ValueError(f"question: expected a non-empty string, got {question!r}")
    tokens: list = []
    num = ""
    for ch in question:
        if ch.isdigit() and ch.isascii():
            num += ch
        elif ch in "+-*":
            if not num:
                raise ValueError(f"question: operator {ch!r} without a left operand "
                                 f"in {question!r}")
            tokens += [int(num), ch]
            num = ""
        else:
            raise ValueError(f"question: unexpected character {ch!r} in {question!r}; "
                             "expected digits and + - *")
    if not num:
        raise ValueError(f"question: ends with an operator: {question!r}")
    tokens.append(int(num))
    return tokens


def answer_for(question: str) -> str:
    """Exact value of an integer expression over ``+ - *`` (``*`` binds tighter), as text.

    Parses the string itself (no ``eval``): ``answer_for("5+3*4") == "17"``.
    Raises ValueError (naming ``question``) on anything else than digits and ``+ - *``.
    """
    tokens = _tokenize(question)
    terms: list[int] = []  # signed products, summed at the end
    sign, prod = 1, tokens[0]
    for op, val in zip(tokens[1::2], tokens[2::2], strict=True):
        if op == "*":
            prod *= val
        else:
            terms.append(sign * prod)
            sign, prod = (1 if op == "+" else -1), val
    terms.append(sign * prod)
    return str(sum(terms))


_PREV = None  # operand slot meaning "the previous step's written result"


def _plan(question: str) -> list[tuple[int | None, str, int | None]]:
    """The solution's operations in written order; ``None`` operands are the previous result.

    ``37+45-18`` -> ``[(37,'+',45), (None,'-',18)]``; ``5+3*4`` -> ``[(3,'*',4), (5,'+',None)]``.
    """
    t = _tokenize(question)
    ops = t[1::2]
    if ops.count("*") > 1:
        raise ValueError(f"question: at most one product supported, got {question!r}")
    if "*" not in ops:
        plan = [(t[0], ops[0], t[2])] if ops else []
        plan += [(_PREV, op, v) for op, v in zip(ops[1:], t[4::2], strict=True)]
        return plan
    if len(ops) != 2:
        raise ValueError(f"question: a product must come with exactly one + or -, "
                         f"got {question!r}")
    if ops[0] == "*":  # a*b±c
        return [(t[0], "*", t[2]), (_PREV, ops[1], t[4])]
    return [(t[2], "*", t[4]), (t[0], ops[0], _PREV)]  # c±a*b


def _correct_steps(question: str) -> list[tuple[int, str, int]]:
    """``(x, op, y)`` of every step of a correct solution."""
    out, acc = [], None
    for x, op, y in _plan(question):
        x, y = (acc if x is _PREV else x), (acc if y is _PREV else y)
        out.append((x, op, y))
        acc = _apply(x, op, y)
    return out


def _apply(x: int, op: str, y: int) -> int:
    return x + y if op == "+" else x - y if op == "-" else x * y


def _slip_delta(x: int, op: str, y: int) -> int:
    """-10 for a carrying ``+`` (units sum >= 10), +10 for a borrowing ``-``, else 0."""
    if op == "+" and x % 10 + y % 10 >= 10:
        return -10
    if op == "-" and x % 10 < y % 10:
        return 10
    return 0


def has_carry_or_borrow(problem: Problem | str) -> bool:
    """True when a correct solution of ``problem`` carries in a ``+`` or borrows in a ``-``."""
    question = problem.question if isinstance(problem, Problem) else problem
    return any(_slip_delta(*s) for s in _correct_steps(question))


# --------------------------------------------------------------------------- solutions


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def solution_steps(problem: Problem, *, carry_noise: float = 0.0,
                   rng: random.Random | None = None) -> list[Step]:
    """The written steps of :func:`worked_solution`, each marked ``slipped`` or not.

    Each ``+`` step whose units digits sum to >= 10 is written ``x+y-10`` and each ``-``
    step whose ``x`` has the smaller units digit is written ``x-y+10``, with probability
    ``carry_noise``; later steps use the written (wrong) value. Carry and borrow are judged
    on the values as written. A slip is skipped when it would make a later written number
    negative or bring the final answer back to the correct one, so the boxed answer is
    wrong exactly when some step slipped. One ``rng.random()`` draw per eligible step;
    ``rng=None`` seeds a generator from the question, so the output is deterministic.
    """
    if not isinstance(problem, Problem):
        raise ValueError(f"problem: expected a Problem, got {type(problem).__name__}")
    if not (isinstance(carry_noise, (int, float)) and 0.0 <= carry_noise <= 1.0):
        raise ValueError(f"carry_noise: expected a probability in [0, 1], got {carry_noise!r}")
    plan = _plan(problem.question)
    if not plan:
        raise ValueError(f"problem: question {problem.question!r} has no operation")
    truth = int(answer_for(problem.question))
    if carry_noise > 0 and rng is None:
        rng = random.Random(_stable_int("noise:" + problem.question))

    def finish(done: list[Step]) -> list[Step] | None:
        """Complete ``done`` with correct steps; None if a written value goes negative."""
        out = list(done)
        for x, op, y in plan[len(done):]:
            acc = out[-1].written if out else None
            x, y = (acc if x is _PREV else x), (acc if y is _PREV else y)
            value = _apply(x, op, y)
            if value < 0:
                return None
            out.append(Step(x, op, y, value, False))
        return out

    if finish([]) is None:
        raise ValueError(f"problem: question {problem.question!r} has a negative "
                         "intermediate result")
    steps: list[Step] = []
    for j in range(len(plan)):
        step = finish(steps)[j]  # not None: an accepted slip was checked to stay >= 0
        delta = _slip_delta(step.x, step.op, step.y) if step.op != "*" else 0
        if delta and carry_noise > 0 and rng.random() < carry_noise:
            slipped = Step(step.x, step.op, step.y, step.written + delta, True)
            tail = finish(steps + [slipped]) if slipped.written >= 0 else None
            if tail is not None and tail[-1].written != truth:
                step = slipped
        steps.append(step)
    return steps


def worked_solution(problem: Problem, *, carry_noise: float = 0.0,
                    rng: random.Random | None = None) -> str:
    """``"37+45=82. 82-18=64. \\boxed{64}"``; level 3 writes the product first.

    See :func:`solution_steps` for ``carry_noise`` (forgotten carries/borrows) and ``rng``.
    """
    steps = solution_steps(problem, carry_noise=carry_noise, rng=rng)
    return " ".join(s.text() for s in steps) + f" \\boxed{{{steps[-1].written}}}"


# --------------------------------------------------------------------------- prompts


def format_prompt(problem: Problem | str, template: str = "compact") -> str:
    """The prompt for ``problem``: ``"compact"`` -> ``"Q:37+45-18 A:"`` (the tiny default
    model's format); ``"qwen-math"`` -> ``"Compute 37+45-18.\\n"`` followed by the Qwen-Math
    instruction (for real models)."""
    question = problem.question if isinstance(problem, Problem) else problem
    if not isinstance(question, str) or not question:
        raise ValueError(f"problem: expected a Problem or a question string, got {problem!r}")
    if template == "compact":
        return f"Q:{question} A:"
    if template == "qwen-math":
        return f"Compute {question}.\n{QWEN_MATH_INSTRUCTION}"
    raise ValueError(f"template: expected one of {TEMPLATES}, got {template!r}")


# --------------------------------------------------------------------------- generation


def split_of(question: str) -> str:
    """``"test"`` for about one question in ten (stable hash of the text), else ``"train"``."""
    return "test" if _stable_int("split:" + question) % TEST_FRACTION_BUCKETS == 0 else "train"


def _operand(rng: random.Random) -> int:
    return rng.randrange(10) if rng.random() < 0.5 else rng.randrange(100)


def _draw_question(level: int, rng: random.Random) -> str:
    """One question of ``level`` with no negative intermediate or final result."""
    while True:
        if level == 1:
            q = f"{_operand(rng)}{rng.choice('+-')}{_operand(rng)}"
        elif level == 2:
            q = f"{_operand(rng)}{rng.choice('+-')}{_operand(rng)}{rng.choice('+-')}{_operand(rng)}"
        else:
            a, b, c, op = rng.randint(1, 9), rng.randint(1, 9), _operand(rng), rng.choice("+-")
            q = f"{a}*{b}{op}{c}" if rng.random() < 0.5 else f"{c}{op}{a}*{b}"
        if all(_apply(*s) >= 0 for s in _correct_steps(q)):
            return q


def _check_levels_mix(levels: Sequence[int], mix: Sequence[float] | None) -> list[float]:
    levels = tuple(levels)
    if not levels or any(lv not in _LEVELS for lv in levels) or len(set(levels)) != len(levels):
        raise ValueError(f"levels: expected distinct values among {_LEVELS}, got {levels!r}")
    if mix is None:
        return [1.0] * len(levels)
    mix = tuple(mix)
    if len(mix) == len(_LEVELS) and len(levels) != len(_LEVELS):
        mix = tuple(mix[lv - 1] for lv in levels)  # the default 3-level mix, restricted
    if len(mix) != len(levels):
        raise ValueError(f"mix: expected {len(levels)} weights (one per level), got {mix!r}")
    if any(not isinstance(w, (int, float)) or not w >= 0 for w in mix) or sum(mix) <= 0:
        raise ValueError(f"mix: expected non-negative weights with a positive sum, got {mix!r}")
    return [float(w) for w in mix]


def generate(n: int, *, split: str = "train", seed: int = 0,
             levels: Sequence[int] = (1, 2, 3),
             mix: Sequence[float] | None = (0.3, 0.4, 0.3),
             unique: bool = True) -> list[Problem]:
    """``n`` problems of ``split``, deterministic for ``(split, seed)``.

    Each problem's level is drawn with probabilities ``mix`` (one weight per entry of
    ``levels``; a 3-weight mix with fewer levels is restricted to them; ``None`` is
    uniform). Questions of the other split are redrawn (same level), so train and test
    never overlap. With ``unique`` no question repeats within the list unless its level's
    question space is exhausted (e.g. about 1.5k distinct level-1 test questions): after
    2000 duplicate draws in a row the level is deemed exhausted and accepts repeats from
    then on, rather than looping forever.
    ``unique=False`` samples i.i.d. (a training stream). ``n=0`` gives ``[]``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n: expected a non-negative integer, got {n!r}")
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: expected an integer, got {seed!r}")
    weights = _check_levels_mix(levels, mix)
    rng = random.Random(f"ktae-embedded:{split}:{seed}")
    seen: set[str] = set()
    exhausted: set[int] = set()
    out: list[Problem] = []
    for i in range(n):
        level = rng.choices(tuple(levels), weights=weights)[0]
        duplicates = 0
        while True:
            q = _draw_question(level, rng)
            if split_of(q) != split:
                continue
            if unique and q in seen and level not in exhausted:
                duplicates += 1
                if duplicates >= _MAX_DUPLICATE_RETRIES:
                    exhausted.add(level)
                continue
            break
        seen.add(q)
        out.append(Problem(id=f"embedded-{split}-{seed}-{i}", question=q,
                           answer=answer_for(q), level=level))
    return out


# --------------------------------------------------------------------------- local-error labels

LABEL_RIGHT = "r"
"""Label of a character of an equation or boxed answer that is locally right."""
LABEL_WRONG = "w"
"""Label of a character of a number that is locally wrong."""
LABEL_OTHER = "."
"""Label of a character that is no part of an equation or a boxed number."""

_NUMBER_CHARS = "0123456789"
_EQUATION = re.compile(r"(?<![0-9=+\-*])(\d+)([+\-*])(\d+)=(-?\d+)(?![0-9=+\-*])")
_BOXED = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")


def _question_numbers(question: str) -> set[int]:
    return {t for t in _tokenize(question) if isinstance(t, int)}


def label_response(text: str, question: str | None = None) -> str:
    """Per-character local-error labels of a response: a string as long as ``text`` of
    :data:`LABEL_RIGHT` (``"r"``), :data:`LABEL_WRONG` (``"w"``) and :data:`LABEL_OTHER`
    (``"."``).

    What is read:

    * an *equation* is ``x op y = z`` (``x, y`` digits, ``op`` one of ``+ - *``, ``z``
      digits with an optional leading ``-``), not touching another digit, operator or
      ``=`` on either side (so ``3+4=7+1=8`` or ``3+=7`` is no equation);
    * a *boxed number* is ``\\boxed{v}`` with ``v`` an integer (spaces allowed around it).

    What is locally wrong (every other character of an equation or boxed number is right;
    every character outside them is :data:`LABEL_OTHER`):

    * the digits (and sign) of ``z`` when ``z != x op y`` computed from ``x`` and ``y``
      *as written* -- so a wrong value carried into a later step that is then computed
      correctly from it is **not** locally wrong there: only the step that made the
      error is;
    * with ``question`` given, the digits of an operand that is neither a number of the
      question nor the written result of an earlier equation of the response (a miscopy);
      operands are not checked without the question;
    * the digits of ``v`` in a boxed number when ``v`` differs from the written result of
      the last equation before it (a wrong copy into the box); with no equation before it,
      ``v`` is checked against the question's answer, and without a question it is not
      read (:data:`LABEL_OTHER`).

    Raises ValueError (naming the argument) when ``text`` is not a string or
    ``question`` is not a valid question (:func:`answer_for`).
    """
    if not isinstance(text, str):
        raise ValueError(f"text: expected a string, got {type(text).__name__}")
    allowed = _question_numbers(question) if question is not None else None
    labels = [LABEL_OTHER] * len(text)

    def mark(start: int, end: int, wrong: bool) -> None:
        for k in range(start, end):
            labels[k] = LABEL_WRONG if wrong else LABEL_RIGHT

    events = [(m.start(), "eq", m) for m in _EQUATION.finditer(text)]
    events += [(m.start(), "box", m) for m in _BOXED.finditer(text)]
    results: list[int] = []
    for _, kind, m in sorted(events, key=lambda e: e[0]):
        if kind == "eq":
            x, op, y, z = int(m[1]), m[2], int(m[3]), int(m[4])
            mark(m.start(), m.end(), False)
            for g, value in ((1, x), (3, y)):
                if allowed is not None and value not in allowed and value not in results:
                    mark(m.start(g), m.end(g), True)
            mark(m.start(4), m.end(4), z != _apply(x, op, y))
            results.append(z)
        else:
            v = int(m[1])
            if results:
                mark(m.start(1), m.end(1), v != results[-1])
            elif question is not None:
                mark(m.start(1), m.end(1), str(v) != answer_for(question))
    return "".join(labels)


def token_labels(labels: str, pieces: Sequence[str]) -> list[str]:
    """One label per token from per-character ``labels`` and the tokens' texts ``pieces``
    (which concatenate to the labelled text): :data:`LABEL_WRONG` when any of the token's
    characters is wrong, else :data:`LABEL_RIGHT` when any is right, else
    :data:`LABEL_OTHER` (also for a token with no characters)."""
    total = sum(len(p) for p in pieces)
    if total != len(labels):
        raise ValueError(f"pieces: their texts hold {total} characters, the labels {len(labels)}")
    out, pos = [], 0
    for p in pieces:
        chunk = labels[pos:pos + len(p)]
        pos += len(p)
        out.append(LABEL_WRONG if LABEL_WRONG in chunk else
                   LABEL_RIGHT if LABEL_RIGHT in chunk else LABEL_OTHER)
    return out


def question_of(prompt: str) -> str | None:
    """The embedded question in a prompt of :func:`format_prompt` (either template), or
    None when ``prompt`` is not one."""
    for pattern in (r"^Q:([0-9+\-*]+) A:$", r"^Compute ([0-9+\-*]+)\.\n"):
        m = re.match(pattern, prompt)
        if m:
            try:
                answer_for(m[1])
            except ValueError:
                return None
            return m[1]
    return None


def level_of(question: str) -> int:
    """The difficulty level of a question (1: one ``±``, 2: two, 3: with a product)."""
    ops = [t for t in _tokenize(question) if isinstance(t, str)]
    return 3 if "*" in ops else min(len(ops), 2)
