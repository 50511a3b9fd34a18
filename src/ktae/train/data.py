"""Prompts and answers for ``ktae train``: the embedded task, MATH-500, or any dataset.

``--task`` is ``embedded``, ``arith`` (word problems for a small chat model,
:mod:`ktae.tasks.arith`; ``arith@difficulty=0|1|2|3``), ``math500`` or a source of
:mod:`ktae.data` (``jsonl:PATH``, ``json:PATH``, ``parquet:PATH``, a ``save_to_disk``
directory, ``hf:NAME[:CONFIG][@SPLIT]``) in verl's RL schema, the MATH schema or
question/answer JSON, with field maps (``--task-field problem=COL``) and filters
(``--task-filter level=Level 3,Level 4``).

Reading (:func:`read_task`, which checks everything a task can get wrong) is separate
from formatting the prompts (:func:`format_task`, which needs the template, known only once
the tokenizer is loaded), so a bad file fails before any model loads. Given the model and
the response budget, :func:`format_task` also checks every training and held-out prompt
against the model's context: a prompt of P tokens needs ``P + max_new_tokens`` positions,
and one that does not fit is refused with one line naming the row and its length, before
generation could spend the memory of a huge prefill on it (``long_prompts="skip"`` or
``"truncate"`` leave such rows out or cut them from the left instead; never by default).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ktae.data import Example, load_examples
from ktae.eval.context import LONG_PROMPT_RULES, truncate_prompt
from ktae.eval.prompts import render_prompt, resolve_template
from ktae.models.generate import context_length
from ktae.models.tokenizer import warn_unknown_characters
from ktae.rewards.registry import get_reward, warn_if_prompts_miss_the_format
from ktae.tasks import arith, format_prompt, generate, has_carry_or_borrow
from ktae.tasks.arith import parse_task_name
from ktae.tasks.embedded import EVAL_SEED
from ktae.tasks.embedded import TEMPLATES as EMBEDDED_TEMPLATES

MIN_EXTERNAL_PROBLEMS = 5
"""An external task needs this many problems: a fifth (at least one) is held out."""

MATH500_SOURCE = "hf:HuggingFaceH4/MATH-500@test"
"""What ``math500`` reads."""



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
              check: Callable | None = None, eval_split: str = "test",
              mix: str | None = None) -> TaskRows:
    """Read and check a task's problems (no model or tokenizer needed).

    Embedded: ``train_size`` train-split problems for ``seed`` and ``eval_size`` test-split
    problems (fixed seed, disjoint from train). ``arith``: the same, the held-out problems
    from ``eval_split`` (``test``, or ``eval`` for tuning without touching ``test``), the
    training problems drawn by ``mix`` when given (:func:`ktae.tasks.arith.parse_mix`).
    External tasks: ``fields`` and ``filters`` apply to the training source; the held-out
    set is the first ``eval_size`` problems of ``eval_task`` when given, else the last
    ``min(eval_size, n // 5)`` training problems.
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
        return TaskRows(generate(train_size, split="train", seed=seed),
                        generate(eval_size, split="test", seed=EVAL_SEED), embedded=True)

    difficulty = parse_task_name(task)
    if difficulty is not None:
        if fields or filters or eval_task:
            raise ValueError("task: the arith task takes no task_fields, task_filters or "
                             "eval_task (it has its own held-out split)")
        return TaskRows(_arith_examples(train_size, "train", seed, difficulty,
                                        None if mix is None else arith.parse_mix(mix)),
                        _arith_examples(eval_size, eval_split, None, difficulty),
                        embedded=False)
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


def _arith_examples(n: int, split: str, seed: int | None, difficulty: int,
                    mix: dict | None = None) -> list:
    """``arith`` problems as chat rows: the user message is the question and its instruction
    (the held-out ``test`` and ``eval`` problems use the task's fixed seed of their split,
    the same for every run)."""
    fixed = arith.TEST_SEED if split == "test" else arith.EVAL_SEED
    problems = arith.generate(n, split=split, difficulty=difficulty,
                              seed=fixed if seed is None else seed, mix=mix)
    return [Example(id=p.id, problem=p.question, answer=p.answer,
                    messages=[{"role": "user", "content": arith.user_message(p)}])
            for p in problems]


def default_template(rows: TaskRows, tokenizer, reward: str = "boxed") -> str:
    """The template of a run that names none: ``compact`` for character-level tokenizers
    (the shipped model); else ``chat`` for rows with their own chat prompts, the reward's
    own template (``dapo``) when the tokenizer has a chat template, or ``qwen-math``."""
    if len(tokenizer) < 1000:
        return "compact"
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if rows.has_messages and has_chat:
        return "chat"
    wanted = get_reward(reward).template
    if wanted is not None and not rows.embedded and has_chat:
        return wanted
    return "qwen-math"


def format_task(rows: TaskRows, template: str, tokenizer=None, reward: str = "boxed", *,
                model=None, max_new_tokens: int | None = None, long_prompts: str = "error"
                ) -> tuple[list[dict], list[dict]]:
    """``(train_rows, eval_rows)``: dicts with ``prompt`` and ``answer``, plus ``data_source``
    where the rows have one (the ``auto`` reward reads it) and, for the embedded task,
    ``carry`` (whether the problem needs a carry or borrow).

    Under ``chat``, rows without their own chat prompt (e.g. a MATH-500 ``--eval-task``
    beside DAPO-Math-17k) get the reward's own template where it has one (``dapo``: the
    answer-line instruction its scorer reads), else the ``qwen-math`` user message.

    With ``model``, ``tokenizer`` and ``max_new_tokens``, every prompt is checked against
    the model's context (:func:`check_context`; ``long_prompts`` is ``"error"``,
    ``"skip"`` or ``"truncate"``)."""
    train, held = _format(rows, template, tokenizer, reward)
    warn_if_prompts_miss_the_format(reward, [r["prompt"] for r in train], template)
    if tokenizer is not None:
        warn_unknown_characters([r["prompt"] for r in (*train, *held)], tokenizer)
    if model is None or tokenizer is None or max_new_tokens is None:
        return train, held

    context = context_length(model)
    return (check_context(train, tokenizer, context, max_new_tokens, long_prompts, "training"),
            check_context(held, tokenizer, context, max_new_tokens, long_prompts, "held-out"))


def check_context(rows: list[dict], tokenizer, context: int | None, max_new_tokens: int,
                  long_prompts: str = "error", which: str = "training") -> list[dict]:
    """``rows`` whose prompt of P tokens fits ``P + max_new_tokens <= context``.

    ``long_prompts``: ``"error"`` refuses the first row that does not fit (one line naming
    the row, its length, the budget and the context); ``"skip"`` leaves such rows out;
    ``"truncate"`` keeps the last ``context - max_new_tokens`` tokens of their prompts.

    Raises:
        ValueError: a row does not fit (``"error"``), ``max_new_tokens`` leaves no room
            for any prompt, no row is left, or an unknown ``long_prompts``.
    """
    if long_prompts not in LONG_PROMPT_RULES:
        raise ValueError(f"long_prompts: expected one of {', '.join(LONG_PROMPT_RULES)}, "
                         f"got {long_prompts!r}")
    if context is None or not rows:
        return rows
    room = context - max_new_tokens
    if room < 1:
        raise ValueError(f"max_new_tokens: {max_new_tokens} leaves no room for a prompt in the "
                         f"model's context of {context} tokens")
    lengths = [len(ids) for ids in tokenizer([r["prompt"] for r in rows],
                                             verbose=False)["input_ids"]]
    out = []
    for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        if n <= room:
            out.append(row)
        elif long_prompts == "error":
            raise ValueError(
                f"task: {which} row {i} has a prompt of {n} tokens; with max_new_tokens="
                f"{max_new_tokens} it does not fit in the model's context of {context} tokens "
                f"(prompts of at most {room} tokens fit; shorten or filter the data, or skip "
                "or truncate such rows)")
        elif long_prompts == "truncate":
            out.append({**row, "prompt": truncate_prompt(row["prompt"], tokenizer, room,
                                                         add_special_tokens=True)})
    if not out:
        raise ValueError(f"task: no {which} row fits in the model's context of {context} "
                         f"tokens with max_new_tokens={max_new_tokens}")
    return out


def _format(rows: TaskRows, template: str, tokenizer, reward: str
            ) -> tuple[list[dict], list[dict]]:
    if rows.embedded:
        if template not in EMBEDDED_TEMPLATES:
            raise ValueError(f"template: the embedded task takes {EMBEDDED_TEMPLATES}, "
                             f"got {template!r}")

        def fmt(problems):
            return [{"prompt": format_prompt(p, template), "answer": p.answer,
                     "carry": has_carry_or_borrow(p)} for p in problems]

        return fmt(rows.train), fmt(rows.eval)

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
