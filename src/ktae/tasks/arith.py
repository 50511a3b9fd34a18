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
stable hash of its *computation* in canonical form (:func:`canonical`: the kind and the
operands, commutative operands ordered), never of its wording or of the order its operands
are written in. So ``4 x 7`` and ``7 x 4`` share a split, and no held-out computation is
trained under other names or in the other order, at any level (:func:`split_of`; 40% test,
40% eval, 20% train: the held-out splits are the large ones, as a run trains on a few dozen
problems). Held-out problems are distinct computations, each once (:func:`generate`).

The prompt is the question followed by :data:`INSTRUCTION`, as the user message of the
model's chat template; the reward is ``number`` (the last number of the response,
:func:`ktae.rewards.answer_line.last_number`), the format SmolLM2-135M-Instruct answers
in ("... 14 + 6 = 20 pencils. The answer is 20."). The task name in commands is ``arith``
or ``arith@difficulty=N`` (:func:`parse_task_name`).
"""

from __future__ import annotations

import functools
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
    # temperature, with 242 test and 233 eval computations (docs/real-model.md)
    0: Level(first=(2, 30), second=(2, 12), factor=(2, 12), mix=(0.3, 0.2, 0.5, 0.0)),
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


def canonical(kind: str, operands: tuple[int, ...]) -> tuple[int, ...]:
    """The computation's canonical operands: ``add`` and ``mul`` sorted, the two added
    amounts of ``two-step`` sorted, ``sub`` as written (it does not commute)."""
    ops = tuple(operands)
    if kind in ("add", "mul"):
        return tuple(sorted(ops))
    if kind == "two-step":
        return (*sorted(ops[:2]), *ops[2:])
    return ops


SPLIT_BUCKETS = {"test": range(0, 4), "eval": range(4, 8), "train": range(8, 10)}
"""Ten hash buckets shared out: 40% test, 40% eval, 20% train."""


def split_of(kind: str, operands: tuple[int, ...]) -> str:
    """``train``, ``test`` or ``eval``, from a stable hash of the canonical computation
    alone (:func:`canonical`): every order of a computation's operands shares its split."""
    key = f"{kind}:{','.join(map(str, canonical(kind, operands)))}".encode()
    bucket = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % 10
    return next(name for name, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


@functools.lru_cache(maxsize=64)
def computations(difficulty: int, kind: str, split: str) -> tuple[tuple[int, ...], ...]:
    """Every canonical computation of ``kind`` that level ``difficulty`` can draw and that
    belongs to ``split``, sorted."""
    level = LEVELS[check_difficulty(difficulty)]
    if kind == "mul":
        lo, hi = level.factor
        found = {(a, b) for a in range(lo, hi + 1) for b in range(a, hi + 1)}
    else:
        pairs = {(a, b) for a in range(level.first[0], level.first[1] + 1)
                 for b in range(level.second[0], level.second[1] + 1)}
        if kind == "add":
            found = {canonical(kind, p) for p in pairs}
        elif kind == "sub":
            found = {(max(p), min(p)) for p in pairs}
        elif kind == "two-step":
            found = {(*canonical("add", p), c) for p in pairs for c in range(1, sum(p) + 1)}
        else:
            raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    return tuple(sorted(ops for ops in found if split_of(kind, ops) == split))


def _written_order(kind: str, ops: tuple[int, ...], level: Level,
                   rng: random.Random) -> tuple[int, ...]:
    """The canonical computation as a problem writes it: for ``add`` and ``two-step`` an
    order the level's ranges allow (the first amount from ``first``, the second from
    ``second``), for ``mul`` either order, chosen with ``rng``."""
    if kind == "mul":
        return ops if rng.random() < 0.5 else (ops[1], ops[0])
    if kind == "sub":
        return ops
    a, b, rest = ops[0], ops[1], ops[2:]
    orders = [(x, y) for x, y in ((a, b), (b, a))
              if level.first[0] <= x <= level.first[1] and level.second[0] <= y <= level.second[1]]
    x, y = orders[0] if len(orders) == 1 or rng.random() < 0.5 else orders[1]
    return (x, y, *rest)


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


def check_difficulty(difficulty) -> int:
    if isinstance(difficulty, bool) or difficulty not in LEVELS:
        raise ValueError(f"difficulty: expected one of {sorted(LEVELS)}, got {difficulty!r}")
    return int(difficulty)


def parse_mix(text: str) -> dict[str, float]:
    """The kinds' weights of ``"add=0.55,sub=0.34,mul=0.11"`` (kinds left out weigh 0).

    Raises:
        ValueError: an unknown kind, a weight that is not a non-negative number, a kind
            named twice, or weights that sum to 0.
    """
    out: dict[str, float] = {}
    for part in str(text).split(","):
        kind, eq, value = part.strip().partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not eq or kind not in KINDS or kind in out or not weight >= 0:
            raise ValueError(f"task_mix: expected KIND=WEIGHT,... with KIND among "
                             f"{', '.join(KINDS)} and WEIGHT >= 0, got {text!r}")
        out[kind] = weight
    if sum(out.values()) <= 0:
        raise ValueError(f"task_mix: expected a positive weight, got {text!r}")
    return {k: out.get(k, 0.0) for k in KINDS}


def generate(n: int, *, split: str = "train", seed: int = 0,
             difficulty: int = DEFAULT_DIFFICULTY, repeats: bool | None = None,
             mix: dict[str, float] | None = None) -> list[ArithProblem]:
    """``n`` problems of ``split``, drawn with ``seed``: each draw picks a kind by the
    level's weights, then that kind's next computation in a seeded shuffle of the split's
    computations (:func:`computations`), worded with a random name, object and operand
    order. Every computation appears once before any repeats.

    A kind whose computations are used up drops out of the draw. Then, with ``repeats``
    (the default for ``train``: training over several epochs repeats problems anyway), a
    fresh shuffle starts once every kind is used up; without it (the default for ``test``
    and ``eval``: a held-out set holds each computation once) asking for more problems
    than the split holds is an error.

    ``mix`` (:func:`parse_mix`) replaces the level's weights, and a kind then starts a fresh
    shuffle of its own computations as soon as they are used up (with repeats), so that
    the problems drawn follow ``mix`` however few computations a kind has. Without it, a
    kind with few computations (level 0's products) is drawn less often than its weight.

    Raises:
        ValueError: a bad ``n``, ``split`` or ``difficulty``, more problems than a split
            without repeats holds, or a ``mix`` without a weight for each kind.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n: expected a non-negative integer, got {n!r}")
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
    level = LEVELS[check_difficulty(difficulty)]
    repeats = split == "train" if repeats is None else bool(repeats)
    rng = random.Random(f"arith:{split}:{difficulty}:{seed}")
    weights = dict(zip(KINDS, level.mix, strict=True)) if mix is None else dict(mix)
    if mix is not None:
        if set(weights) != set(KINDS):
            raise ValueError(f"mix: expected a weight for each of {KINDS} (parse_mix), got "
                             f"{sorted(weights)}")
    pools: dict[str, list] = {}
    out: list[ArithProblem] = []
    while len(out) < n:
        if mix is not None and repeats:  # each kind refills alone: the draws follow mix
            for kind in [k for k, p in pools.items() if not p]:
                del pools[kind]
        live = [k for k in KINDS if weights[k] > 0 and (k not in pools or pools[k])]
        if not live:
            if not repeats:
                total = sum(len(computations(difficulty, k, split))
                            for k in KINDS if weights[k] > 0)
                raise ValueError(f"n: the {split} split of level {difficulty} holds {total} "
                                 f"distinct computations, {n} were asked for")
            pools.clear()  # every kind used up: start a fresh shuffle of each
            continue
        kind = rng.choices(live, weights=[weights[k] for k in live])[0]
        if kind not in pools:
            pools[kind] = list(computations(difficulty, kind, split))
            rng.shuffle(pools[kind])
        ops = _written_order(kind, pools[kind].pop(), level, rng)
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
