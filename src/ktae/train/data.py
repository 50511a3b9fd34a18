"""Prompts and answers for ``ktae train``: the embedded task, MATH-500, or a JSONL file.

Reading (:func:`read_task`, which checks everything a task file can get wrong) is separate
from formatting the prompts (:func:`format_task`, which needs the template, known only once
the tokenizer is loaded), so a bad file fails before any model loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

EVAL_SEED = 1234
"""Seed of the held-out embedded problems: the same set for every run and seed."""

MIN_EXTERNAL_PROBLEMS = 5
"""An external task needs this many problems: a fifth (at least one) is held out."""


@dataclass(frozen=True)
class TaskRows:
    """Problems of a task before prompt formatting: embedded ``Problem`` objects, or dicts
    with ``question`` and ``answer`` strings (``embedded`` tells which)."""

    train: list
    eval: list
    embedded: bool


def _jsonl(path: str) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"task: JSONL file not found: {path}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"task: {path} is not UTF-8 text (byte {err.start}: {err.reason})") \
            from None
    rows = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        where = f"task: line {i + 1} of {path}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: invalid JSON ({err.msg}, column {err.colno})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        question = rec.get("prompt", rec.get("question", rec.get("problem")))
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: expected a non-empty 'question' (or 'problem' / "
                             "'prompt') string")
        answer = rec.get("answer")
        if isinstance(answer, bool) or not isinstance(answer, str | int | float) or \
                not str(answer).strip():
            raise ValueError(f"{where}: expected an 'answer' string or number, got "
                             f"{answer!r}")
        rows.append({"question": question, "answer": str(answer)})
    if not rows:
        raise ValueError(f"task: {path} holds no problems")
    return rows


def _math500() -> list[dict]:
    try:
        from datasets import load_dataset

        ds = load_dataset("HuggingFaceH4/MATH-500", split="test")
    except Exception as err:  # offline machines: say what to do instead
        raise ValueError("task: MATH-500 could not be loaded (no hub access?); export it to a "
                         "JSONL file with 'problem' and 'answer' fields and pass "
                         f"--task jsonl:PATH ({err})") from err
    return [{"question": r["problem"], "answer": r["answer"]} for r in ds]


def read_task(task: str, *, train_size: int, eval_size: int, seed: int) -> TaskRows:
    """Read and check a task's problems (no model or tokenizer needed).

    Embedded: ``train_size`` train-split problems for ``seed`` and ``eval_size`` test-split
    problems (fixed seed, disjoint from train). External tasks: the last
    ``min(eval_size, n // 5)`` problems are held out.

    Raises:
        ValueError: a missing, empty, non-UTF-8 or malformed file (naming the line), or
            fewer than :data:`MIN_EXTERNAL_PROBLEMS` problems.
    """
    if task == "embedded":
        from ktae.tasks import generate

        return TaskRows(generate(train_size, split="train", seed=seed),
                        generate(eval_size, split="test", seed=EVAL_SEED), embedded=True)
    source = "MATH-500" if task == "math500" else task[len("jsonl:"):]
    rows = _math500() if task == "math500" else _jsonl(source)
    if len(rows) < MIN_EXTERNAL_PROBLEMS:
        raise ValueError(f"task: {source} holds {len(rows)} problem(s); at least "
                         f"{MIN_EXTERNAL_PROBLEMS} are needed (a fifth is held out for "
                         "evaluation)")
    n_eval = min(eval_size, len(rows) // 5)
    return TaskRows(rows[: len(rows) - n_eval], rows[len(rows) - n_eval:], embedded=False)


def format_task(rows: TaskRows, template: str) -> tuple[list[dict], list[dict]]:
    """``(train_rows, eval_rows)``: dicts with ``prompt`` and ``answer`` (and, for the
    embedded task, ``carry``: whether the problem needs a carry or borrow)."""
    if rows.embedded:
        from ktae.tasks import format_prompt, has_carry_or_borrow

        def fmt(problems):
            return [{"prompt": format_prompt(p, template), "answer": p.answer,
                     "carry": has_carry_or_borrow(p)} for p in problems]

        return fmt(rows.train), fmt(rows.eval)
    from ktae.tasks.embedded import QWEN_MATH_INSTRUCTION

    def fmt_external(problems):
        if template == "qwen-math":
            return [{"prompt": f"{r['question']}\n{QWEN_MATH_INSTRUCTION}", "answer": r["answer"]}
                    for r in problems]
        return [{"prompt": f"Q:{r['question']} A:", "answer": r["answer"]} for r in problems]

    return fmt_external(rows.train), fmt_external(rows.eval)


def load_task(task: str, *, template: str, train_size: int, eval_size: int, seed: int):
    """:func:`read_task` then :func:`format_task`."""
    return format_task(read_task(task, train_size=train_size, eval_size=eval_size, seed=seed),
                       template)
