"""Prompts and answers for ``ktae train``: the embedded task, MATH-500, or any dataset.

``--task`` is ``embedded``, ``math500`` or a source of :mod:`ktae.data` (``jsonl:PATH``,
``json:PATH``, ``parquet:PATH``, a ``save_to_disk`` directory, ``hf:NAME[:CONFIG][@SPLIT]``)
in verl's RL schema, the MATH schema or question/answer JSON, with field maps
(``--task-field problem=COL``) and filters (``--task-filter level=Level 3,Level 4``).

Reading (:func:`read_task`, which checks everything a task can get wrong) is separate
from formatting the prompts (:func:`format_task`, which needs the template, known only once
the tokenizer is loaded), so a bad file fails before any model loads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

EVAL_SEED = 1234
"""Seed of the held-out embedded problems: the same set for every run and seed."""

MIN_EXTERNAL_PROBLEMS = 5
"""An external task needs this many problems: a fifth (at least one) is held out."""

MATH500_SOURCE = "hf:HuggingFaceH4/MATH-500@test"
"""What ``math500`` reads."""

EMBEDDED_TEMPLATES = ("compact", "qwen-math")
"""Templates of the embedded task (:func:`ktae.tasks.format_prompt`)."""


@dataclass(frozen=True)
class TaskRows:
    """Problems of a task before prompt formatting: embedded ``Problem`` objects, or
    :class:`ktae.data.Example` rows (``embedded`` tells which)."""

    train: list
    eval: list
    embedded: bool

    @property
    def has_messages(self) -> bool:
        """Whether the rows carry their own chat prompts (verl's RL schema)."""
        return not self.embedded and any(e.messages for e in self.train[:1])


def _source(task: str) -> str:
    return MATH500_SOURCE if task == "math500" else task


def _load(task: str, *, option: str, fields=None, filters=None, check=None) -> list:
    from ktae.data import load_examples

    source = _source(task)
    try:
        examples = load_examples(source, fields=fields, filters=filters, check=check,
                                 name=option)
    except ValueError as err:
        text = str(err)
        if task == "math500" and "cannot be loaded" in text:
            text = ("MATH-500 could not be loaded (no hub access?); export it to a JSONL file "
                    "with 'problem' and 'answer' fields and pass "
                    f"--{option.replace('_', '-')} jsonl:PATH ({text})")
        raise ValueError(text if text.startswith(f"{option}:") else f"{option}: {text}") \
            from None
    if not examples:
        raise ValueError(f"{option}: {source} holds no problems")
    return examples


def read_task(task: str, *, train_size: int, eval_size: int, seed: int,
              fields: Mapping[str, str] | None = None,
              filters: Mapping[str, Sequence[str]] | None = None, eval_task: str | None = None,
              check: Callable | None = None) -> TaskRows:
    """Read and check a task's problems (no model or tokenizer needed).

    Embedded: ``train_size`` train-split problems for ``seed`` and ``eval_size`` test-split
    problems (fixed seed, disjoint from train). External tasks: ``fields`` and ``filters``
    apply to the training source; the held-out set is the first ``eval_size`` problems of
    ``eval_task`` when given, else the last ``min(eval_size, n // 5)`` training problems.
    ``check(example)`` may refuse a row (ValueError; reported with the row's place).

    Raises:
        ValueError: a missing, empty, non-UTF-8 or malformed file (naming the line or row),
            a missing column, a filter that keeps nothing, or fewer than
            :data:`MIN_EXTERNAL_PROBLEMS` problems.
    """
    if task == "embedded":
        if fields or filters or eval_task:
            raise ValueError("task: the embedded task takes no task_fields, task_filters or "
                             "eval_task (it has its own held-out split)")
        from ktae.tasks import generate

        return TaskRows(generate(train_size, split="train", seed=seed),
                        generate(eval_size, split="test", seed=EVAL_SEED), embedded=True)
    rows = _load(task, option="task", fields=fields, filters=filters, check=check)
    if eval_task is not None:
        held = _load(eval_task, option="eval_task", check=check)
        return TaskRows(rows, held[:eval_size], embedded=False)
    if len(rows) < MIN_EXTERNAL_PROBLEMS:
        raise ValueError(f"task: {_source(task)} holds {len(rows)} problem(s); at least "
                         f"{MIN_EXTERNAL_PROBLEMS} are needed (a fifth is held out for "
                         "evaluation; or give --eval-task)")
    n_eval = min(eval_size, len(rows) // 5)
    return TaskRows(rows[: len(rows) - n_eval], rows[len(rows) - n_eval:], embedded=False)


def default_template(rows: TaskRows, tokenizer, reward: str = "boxed") -> str:
    """The template of a run that names none: ``compact`` for character-level tokenizers
    (the shipped model); else ``chat`` for rows with their own chat prompts, the reward's
    own template (``dapo``) when the tokenizer has a chat template, or ``qwen-math``."""
    from ktae.rewards.registry import get_reward

    if len(tokenizer) < 1000:
        return "compact"
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if rows.has_messages and has_chat:
        return "chat"
    wanted = get_reward(reward).template
    if wanted is not None and not rows.embedded and has_chat:
        return wanted
    return "qwen-math"


def format_task(rows: TaskRows, template: str, tokenizer=None, reward: str = "boxed"
                ) -> tuple[list[dict], list[dict]]:
    """``(train_rows, eval_rows)``: dicts with ``prompt`` and ``answer``, plus ``data_source``
    where the rows have one (the ``auto`` reward reads it) and, for the embedded task,
    ``carry`` (whether the problem needs a carry or borrow).

    Under ``chat``, rows without their own chat prompt (e.g. a MATH-500 ``--eval-task``
    beside DAPO-Math-17k) get the reward's own template where it has one (``dapo``: the
    answer-line instruction its scorer reads), else the ``qwen-math`` user message."""
    if rows.embedded:
        from ktae.tasks import format_prompt, has_carry_or_borrow

        if template not in EMBEDDED_TEMPLATES:
            raise ValueError(f"template: the embedded task takes {EMBEDDED_TEMPLATES}, "
                             f"got {template!r}")

        def fmt(problems):
            return [{"prompt": format_prompt(p, template), "answer": p.answer,
                     "carry": has_carry_or_borrow(p)} for p in problems]

        return fmt(rows.train), fmt(rows.eval)
    from ktae.eval.prompts import render_prompt, resolve_template
    from ktae.rewards.registry import get_reward

    template = resolve_template(template, tokenizer)
    plain = get_reward(reward).template if template == "chat" else None
    with_source = any(e.data_source is not None for e in (*rows.train, *rows.eval))

    def fmt_external(examples):
        out = []
        for e in examples:
            use = plain if plain and not e.messages else template
            row = {"prompt": render_prompt(e.problem, use, tokenizer, messages=e.messages),
                   "answer": e.answer}
            if with_source:
                row["data_source"] = e.data_source
            out.append(row)
        if any(isinstance(r["answer"], tuple) for r in out):  # alternatives: one Arrow type
            for r in out:
                r["answer"] = list(r["answer"]) if isinstance(r["answer"], tuple) else [r["answer"]]
        return out

    return fmt_external(rows.train), fmt_external(rows.eval)


def load_task(task: str, *, template: str, train_size: int, eval_size: int, seed: int,
              tokenizer=None, **options):
    """:func:`read_task` then :func:`format_task`."""
    return format_task(read_task(task, train_size=train_size, eval_size=eval_size, seed=seed,
                                 **options), template, tokenizer)
