"""Prompts and answers for ``ktae train``: the embedded task, MATH-500, or a JSONL file."""

from __future__ import annotations

import json
from pathlib import Path

EVAL_SEED = 1234
"""Seed of the held-out embedded problems: the same set for every run and seed."""


def _embedded(n: int, *, split: str, seed: int, template: str) -> list[dict]:
    from ktae.tasks import format_prompt, generate, has_carry_or_borrow

    return [{"prompt": format_prompt(p, template), "answer": p.answer,
             "carry": has_carry_or_borrow(p)} for p in generate(n, split=split, seed=seed)]


def _jsonl(path: str) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"task: JSONL file not found: {path}")
    rows = []
    for i, line in enumerate(p.read_text().splitlines()):
        if not line.strip():
            continue
        rec = json.loads(line)
        question = rec.get("prompt", rec.get("question", rec.get("problem")))
        if not isinstance(question, str) or "answer" not in rec:
            raise ValueError(f"task: line {i + 1} of {path}: expected a 'question' (or 'problem' "
                             "/ 'prompt') string and an 'answer'")
        rows.append({"question": question, "answer": str(rec["answer"])})
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


def _format_external(rows: list[dict], template: str) -> list[dict]:
    from ktae.tasks.embedded import QWEN_MATH_INSTRUCTION

    if template == "qwen-math":
        return [{"prompt": f"{r['question']}\n{QWEN_MATH_INSTRUCTION}", "answer": r["answer"]}
                for r in rows]
    return [{"prompt": f"Q:{r['question']} A:", "answer": r["answer"]} for r in rows]


def load_task(task: str, *, template: str, train_size: int, eval_size: int, seed: int):
    """``(train_rows, eval_rows)``, lists of ``{"prompt", "answer"}`` dicts.

    Embedded: ``train_size`` train-split problems for ``seed`` and ``eval_size`` test-split
    problems (fixed seed, disjoint from train). External tasks: the last ``eval_size`` rows
    (at most a fifth) are held out.
    """
    if task == "embedded":
        return (_embedded(train_size, split="train", seed=seed, template=template),
                _embedded(eval_size, split="test", seed=EVAL_SEED, template=template))
    rows = _math500() if task == "math500" else _jsonl(task[len("jsonl:"):])
    rows = _format_external(rows, template)
    n_eval = min(eval_size, len(rows) // 5)
    return rows[: len(rows) - n_eval], rows[len(rows) - n_eval:]
