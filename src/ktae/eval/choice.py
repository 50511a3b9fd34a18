"""Multiple-choice science benchmarks: MMLU-Pro and GPQA-Diamond (TACO, Appendix A).

A record's ``problem`` is the question followed by its options, one per line as
``(A) ...``, ``(B) ...``, and a line asking for the letter; its ``answer`` is the right
option's letter. The prompt template (:mod:`ktae.eval.prompts`) then adds the usual
instruction to put the final answer in ``\\boxed{}``.

* ``mmlu_pro``: ``TIGER-Lab/MMLU-Pro``, test split (12,032 questions, up to ten options,
  columns ``question_id, question, options, answer, answer_index, category, ...``),
  options in the dataset's order.
* ``gpqa_diamond``: ``Idavidrein/gpqa``, config ``gpqa_diamond``, its only split
  ``train`` (198 questions; columns ``Record ID, Question, Correct Answer, Incorrect
  Answer 1..3, ...``; the hub dataset is gated: accept its terms and log in). The correct
  answer is always the dataset's first option, so the four options are shuffled, per
  question, by a generator seeded with ``"<seed>:<Record ID>"`` (:data:`GPQA_SHUFFLE_SEED`
  by default; recorded in ``results.json`` as ``config.gpqa_shuffle_seed``): the same
  order on every machine and run, independent of which other rows are loaded.

Scoring (:func:`letter_reward`): a response is correct only when its final ``\\boxed{}``
(:func:`ktae.rewards.extract_boxed`) holds exactly one letter, optionally inside
``\\text{}``, in either case, equal to the answer: ``\\boxed{B}``, ``\\boxed{b}`` and
``\\boxed{\\text{B}}`` count as B; ``\\boxed{(B)}``, ``\\boxed{B. 4}``, ``\\boxed{AB}``, an
unboxed "the answer is B" and a box of the option's text do not.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ktae.eval.benchmarks import FIXTURE_DIR, BenchmarkRecord, benchmark_rows
from ktae.rewards import RewardResult, extract_boxed

GPQA_SHUFFLE_SEED = 0
LETTERS = string.ascii_uppercase
CHOICE_INSTRUCTION = "Answer with the letter of the correct option."
_LETTER = re.compile(r"\s*(?:\\text\s*\{\s*([A-Za-z])\s*\}|([A-Za-z]))\s*")


@dataclass(frozen=True)
class ChoiceSpec:
    name: str
    hub_path: str
    hub_config: str | None
    split: str
    size: int


CHOICE_BENCHMARKS: dict[str, ChoiceSpec] = {s.name: s for s in (
    ChoiceSpec("mmlu_pro", "TIGER-Lab/MMLU-Pro", None, "test", 12032),
    ChoiceSpec("gpqa_diamond", "Idavidrein/gpqa", "gpqa_diamond", "train", 198),
)}


def choice_problem(question: str, options: Sequence[str]) -> str:
    """The question, its lettered options and :data:`CHOICE_INSTRUCTION`."""
    lines = [f"({LETTERS[i]}) {str(o).strip()}" for i, o in enumerate(options)]
    return f"{question.strip()}\n\n" + "\n".join(lines) + f"\n\n{CHOICE_INSTRUCTION}"


def boxed_letter(completion: str) -> str | None:
    """The upper-case letter in the final ``\\boxed{}`` of ``completion``, or None (see the
    module docstring for what counts as a letter)."""
    box = extract_boxed(completion)
    if box is None:
        return None
    m = _LETTER.fullmatch(box)
    if m is None:
        return None
    return (m.group(1) or m.group(2)).upper()


def letter_reward(completion: str, answer: str) -> RewardResult:
    """1.0 when the boxed letter of ``completion`` is ``answer`` (a letter).

    ``formatted``: the final box holds one letter; ``extracted``: that letter, or the raw
    box content when it is not a letter (None without a closed box).
    """
    if not isinstance(completion, str):
        raise ValueError(f"completion: expected a string, got {type(completion).__name__}")
    if not isinstance(answer, str) or len(answer.strip()) != 1 or \
            answer.strip().upper() not in LETTERS:
        raise ValueError(f"answer: expected one option letter, got {answer!r}")
    letter = boxed_letter(completion)
    if letter is None:
        return RewardResult(0.0, False, False, extract_boxed(completion), False)
    correct = letter == answer.strip().upper()
    return RewardResult(1.0 if correct else 0.0, correct, True, letter, False)


def fixture_path(name: str) -> Path:
    """The shipped sample file of choice benchmark ``name`` (a few rows, hub schema)."""
    path = FIXTURE_DIR / f"{name}.jsonl"
    if name not in CHOICE_BENCHMARKS or not path.is_file():
        raise ValueError(f"name: no fixture for {name!r}; expected one of "
                         f"{tuple(CHOICE_BENCHMARKS)}")
    return path


def _text(row: dict, column: str, at: str) -> str:
    if column not in row:
        raise ValueError(f"{at}: no column {column!r}; columns are {sorted(row)}")
    value = row[column]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{at}: {column}: expected a non-empty string, got {value!r}")
    return value


def _mmlu_pro(row: dict, at: str, i: int, seed: int) -> BenchmarkRecord:
    question = _text(row, "question", at)
    options = row.get("options")
    if not isinstance(options, (list, tuple)) or not 2 <= len(options) <= len(LETTERS) or \
            not all(isinstance(o, str) and o.strip() for o in options):
        raise ValueError(f"{at}: options: expected a list of 2 to 26 non-empty strings, "
                         f"got {options!r}")
    answer = _text(row, "answer", at).strip().upper()
    if answer not in LETTERS[:len(options)]:
        raise ValueError(f"{at}: answer: expected a letter among A..{LETTERS[len(options) - 1]}"
                         f", got {row['answer']!r}")
    index = row.get("answer_index")
    if index is not None and index != LETTERS.index(answer):
        raise ValueError(f"{at}: answer {answer!r} and answer_index {index!r} disagree")
    qid = row.get("question_id")
    rid = str(i if qid is None else qid)
    return BenchmarkRecord(rid, choice_problem(question, options), answer, "mmlu_pro")


def gpqa_order(record_id: str, seed: int = GPQA_SHUFFLE_SEED) -> list[int]:
    """The shuffled order of GPQA's four options for one question: ``order[j]`` is the
    dataset option shown as letter ``j`` (0 = the correct answer)."""
    order = [0, 1, 2, 3]
    random.Random(f"{seed}:{record_id}").shuffle(order)
    return order


def _gpqa(row: dict, at: str, i: int, seed: int) -> BenchmarkRecord:
    question = _text(row, "Question", at)
    options = [_text(row, "Correct Answer", at)] + [
        _text(row, f"Incorrect Answer {j}", at) for j in (1, 2, 3)]
    rid = str(row.get("Record ID") or i)
    order = gpqa_order(rid, seed)
    shown = [options[j] for j in order]
    return BenchmarkRecord(rid, choice_problem(question, shown), LETTERS[order.index(0)],
                           "gpqa_diamond")


_PARSERS = {"mmlu_pro": _mmlu_pro, "gpqa_diamond": _gpqa}


def load_choice_benchmark(name: str, *, path: str | Path | None = None,
                          split: str | None = None, limit: int | None = None,
                          seed: int = GPQA_SHUFFLE_SEED) -> list[BenchmarkRecord]:
    """Records of ``mmlu_pro`` or ``gpqa_diamond``, in the dataset's order.

    Args:
        name: a key of :data:`CHOICE_BENCHMARKS`.
        path: local data in the hub schema, in any layout
            :func:`ktae.eval.benchmarks.load_benchmark` reads (a ``.jsonl``/``.json``/
            ``.parquet`` file, ``<name>.jsonl`` etc. or ``<name>/test.jsonl`` in a
            directory, a saved Dataset, or a split ``name`` of a saved DatasetDict);
            default: the hub.
        split: hub split (default: the benchmark's); ignored for local files.
        limit: keep the first ``limit`` rows.
        seed: GPQA's option shuffle (see the module docstring); unused by MMLU-Pro.

    Raises:
        ValueError: an unknown name, an empty file or split, a row without the question,
            options or a valid answer letter; the message names the file and line.
    """
    if name not in CHOICE_BENCHMARKS:
        raise ValueError(f"name: expected one of {tuple(CHOICE_BENCHMARKS)}, got {name!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit: expected a positive integer or None, got {limit!r}")
    rows = benchmark_rows(name, CHOICE_BENCHMARKS[name], path=path, split=split)
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    parse = _PARSERS[name]
    return [parse(row, rows.where(i), i, seed) for i, row in enumerate(rows.dicts())]
