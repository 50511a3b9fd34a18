"""The ``arith`` task: short natural-language word problems a 135M chat model can learn.

Four kinds of problem, each one sentence or two about a person and some objects:

* ``add``: "Mia has 14 pencils. She buys 6 more. How many pencils does Mia have now?"
* ``sub``: "... She gives 6 to a friend. How many pencils does Mia have left?"
* ``mul``: "Mia has 4 boxes with 6 pencils in each box. How many pencils does Mia have in all?"
* ``two-step``: "... She buys 6 more and then gives 3 away. How many ... now?"

``difficulty`` (0, 1, 2 or 3) sets the operand ranges and the mix of kinds
(:data:`LEVELS`): level 0 is half times tables (factors up to 9) and half one-step sums
and differences, level 1 one-step problems with small numbers, level 2 (the default)
larger first operands and some two-step problems, level 3 two-digit operands throughout.
Every answer is a non-negative integer.

Splits: every problem belongs to exactly one of ``train``, ``test`` (the held-out set
``ktae train`` evaluates on) and ``eval`` (``ktae eval --benchmarks arith``), decided by a
stable hash of its *arithmetic* (kind and operands), not of its wording, so the same sum
never appears in two splits under different names (:func:`split_of`; 10% test, 10% eval).

The prompt is the question followed by :data:`INSTRUCTION`, as the user message of the
model's chat template; the reward is ``number`` (the last number of the response,
:func:`ktae.rewards.answer_line.last_number`), the format SmolLM2-135M-Instruct answers
in ("... 14 + 6 = 20 pencils. The answer is 20."). The task name in commands is ``arith``
or ``arith@difficulty=N`` (:func:`parse_task_name`).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

KINDS = ("add", "sub", "mul", "two-step")
SPLITS = ("train", "test", "eval")
INSTRUCTION = "Answer with the number only."
"""Appended to every question (measured: with it SmolLM2-135M-Instruct writes a short
worked line and the number; see docs/real-model.md)."""
DEFAULT_DIFFICULTY = 2
MAX_DUPLICATE_RETRIES = 2000
"""Already-seen draws after which :func:`generate` allows repeats."""
EVAL_SEED = 4321
"""Seed of the ``eval`` split's problems (``ktae eval --benchmarks arith``)."""
TEST_SEED = 1234
"""Seed of the held-out ``test`` problems ``ktae train`` evaluates on."""


@dataclass(frozen=True)
class Level:
    """Operand ranges (inclusive) and kind weights of one difficulty."""

    first: tuple[int, int]
    """The first operand of add/sub/two-step (the amount the person starts with)."""
    second: tuple[int, int]
    """The amount bought, given or taken away."""
    factor: tuple[int, int]
    """Both factors of ``mul``."""
    mix: tuple[float, float, float, float]
    """Weights of ``KINDS``."""


LEVELS = {
    # level 0: chosen so that SmolLM2-135M-Instruct starts inside 20-60% at the recipe's
    # temperature (docs/real-model.md, "Where the model starts")
    0: Level(first=(2, 20), second=(2, 9), factor=(2, 9), mix=(0.3, 0.2, 0.5, 0.0)),
    1: Level(first=(2, 20), second=(2, 9), factor=(2, 5), mix=(0.4, 0.3, 0.3, 0.0)),
    2: Level(first=(5, 40), second=(2, 15), factor=(2, 9), mix=(0.3, 0.3, 0.25, 0.15)),
    3: Level(first=(20, 99), second=(10, 49), factor=(3, 12), mix=(0.25, 0.25, 0.25, 0.25)),
}

_NAMES = (("Mia", "She"), ("Tom", "He"), ("Ana", "She"), ("Leo", "He"), ("Sara", "She"),
          ("Ben", "He"), ("Lily", "She"), ("Sam", "He"), ("Emma", "She"), ("Noah", "He"))
_OBJECTS = ("apples", "pencils", "stickers", "marbles", "books", "cookies", "cards", "shells",
            "coins", "stamps")


@dataclass(frozen=True)
class ArithProblem:
    """One problem: its wording, exact answer, kind and operands."""

    id: str
    question: str
    answer: str
    kind: str
    operands: tuple[int, ...]


def split_of(kind: str, operands: tuple[int, ...]) -> str:
    """``train``, ``test`` or ``eval``, from a stable hash of the arithmetic alone."""
    key = f"{kind}:{','.join(map(str, operands))}".encode()
    bucket = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % 10
    return "test" if bucket == 0 else "eval" if bucket == 1 else "train"


def _wording(kind: str, ops: tuple[int, ...], rng: random.Random) -> tuple[str, int]:
    name, pron = rng.choice(_NAMES)
    obj = rng.choice(_OBJECTS)
    if kind == "add":
        a, b = ops
        return (f"{name} has {a} {obj}. {pron} buys {b} more. "
                f"How many {obj} does {name} have now?", a + b)
    if kind == "sub":
        a, b = ops
        return (f"{name} has {a} {obj}. {pron} gives {b} to a friend. "
                f"How many {obj} does {name} have left?", a - b)
    if kind == "mul":
        a, b = ops
        return (f"{name} has {a} boxes with {b} {obj} in each box. "
                f"How many {obj} does {name} have in all?", a * b)
    a, b, c = ops
    return (f"{name} has {a} {obj}. {pron} buys {b} more and then gives {c} away. "
            f"How many {obj} does {name} have now?", a + b - c)


def _draw(level: Level, rng: random.Random) -> tuple[str, tuple[int, ...]]:
    kind = rng.choices(KINDS, weights=level.mix)[0]
    if kind == "mul":
        return kind, (rng.randint(*level.factor), rng.randint(*level.factor))
    a, b = rng.randint(*level.first), rng.randint(*level.second)
    if kind == "add":
        return kind, (a, b)
    if kind == "sub":
        return kind, (max(a, b), min(a, b))  # never negative
    c = rng.randint(1, a + b)
    return kind, (a, b, c)


def check_difficulty(difficulty) -> int:
    if isinstance(difficulty, bool) or difficulty not in LEVELS:
        raise ValueError(f"difficulty: expected one of {sorted(LEVELS)}, got {difficulty!r}")
    return int(difficulty)


def generate(n: int, *, split: str = "train", seed: int = 0,
             difficulty: int = DEFAULT_DIFFICULTY) -> list[ArithProblem]:
    """``n`` problems of ``split``, drawn with ``seed``, distinct in their arithmetic while
    distinct ones remain: after :data:`MAX_DUPLICATE_RETRIES` draws that were seen already
    (the split at that difficulty is nearly exhausted), repeats are allowed, as training
    over several epochs repeats problems anyway.

    Raises:
        ValueError: a bad ``n``, ``split`` or ``difficulty``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n: expected a non-negative integer, got {n!r}")
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
    level = LEVELS[check_difficulty(difficulty)]
    rng = random.Random(f"arith:{split}:{difficulty}:{seed}")
    seen: set = set()
    out: list[ArithProblem] = []
    misses = 0
    while len(out) < n:
        kind, ops = _draw(level, rng)
        if split_of(kind, ops) != split:
            continue
        if (kind, ops) in seen and misses < MAX_DUPLICATE_RETRIES:
            misses += 1  # not reset: once the split is exhausted, repeats stay allowed
            continue
        seen.add((kind, ops))
        question, answer = _wording(kind, ops, rng)
        out.append(ArithProblem(id=f"arith-{split}-{difficulty}-{seed}-{len(out)}",
                                question=question, answer=str(answer), kind=kind,
                                operands=ops))
    return out


def user_message(problem: ArithProblem | str) -> str:
    """The user message of a problem: the question and :data:`INSTRUCTION`."""
    question = problem.question if isinstance(problem, ArithProblem) else problem
    return f"{question} {INSTRUCTION}"


def parse_task_name(task: str) -> int | None:
    """The difficulty of an ``arith`` / ``arith@difficulty=N`` task name; None for other tasks.

    Raises:
        ValueError: ``arith@...`` with another option or a bad difficulty.
    """
    if task == "arith":
        return DEFAULT_DIFFICULTY
    if not task.startswith("arith@"):
        return None
    key, _, value = task[len("arith@"):].partition("=")
    if key != "difficulty":
        raise ValueError(f"task: arith takes difficulty=0|1|2|3, got {task!r}")
    try:
        return check_difficulty(int(value))
    except ValueError:
        raise ValueError(f"task: arith takes difficulty=0|1|2|3, got {task!r}") from None


_WORD = r"([A-Z][a-z]+)"
_QUESTIONS = {
    "add": (r"{n} has (\d+) (\w+)\. (?:She|He) buys (\d+) more\. "
            r"How many \3 does \1 have now\?"),
    "sub": (r"{n} has (\d+) (\w+)\. (?:She|He) gives (\d+) to a friend\. "
            r"How many \3 does \1 have left\?"),
    "mul": (r"{n} has (\d+) boxes with (\d+) (\w+) in each box\. "
            r"How many \4 does \1 have in all\?"),
    "two-step": (r"{n} has (\d+) (\w+)\. (?:She|He) buys (\d+) more and then gives (\d+) "
                 r"away\. How many \3 does \1 have now\?"),
}
_QUESTION_RE = {k: re.compile(v.format(n=_WORD)) for k, v in _QUESTIONS.items()}


def problem_in(text: str) -> ArithProblem | None:
    """The arith problem whose question appears in ``text`` (a prompt, however rendered:
    a chat transcript, a decoded prompt without its special tokens), or None when no
    question of the task's wording does. Its ``id`` is ``""``: the wording alone does
    not say which draw it came from. The answer is recomputed from the operands."""
    for kind, pattern in _QUESTION_RE.items():
        m = pattern.search(text)
        if m is None:
            continue
        numbers = [int(g) for g in m.groups() if g.isdigit()]
        ops = tuple(numbers)
        answer = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
                  "mul": lambda a, b: a * b, "two-step": lambda a, b, c: a + b - c}[kind](*ops)
        return ArithProblem(id="", question=m.group(0), answer=str(answer), kind=kind,
                            operands=ops)
    return None
