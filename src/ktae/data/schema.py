"""From rows to examples: schema detection, field maps, filters, answers.

Schemas recognised (first match wins, field by field; a field map overrides any of them):

* **verl's RL schema** (DAPO-Math-17k, verl's preprocessed GSM8K/MATH parquet): ``prompt``
  is a list of chat messages (``{"role", "content"}``), the answer is
  ``reward_model.ground_truth``, ``data_source`` is kept per row and ``extra_info.index``
  (when present) is the id. The messages are kept verbatim; the problem text is the
  content of the last user message.
* **MATH** (``problem``, ``solution``, ``level``, ``type``): with no answer column, the
  answer is the content of the solution's last ``\\boxed{}`` (a solution without one is
  an error naming its row).
* **question / answer**: the problem is the first column among ``problem``, ``question``,
  ``prompt``; the answer the first among ``answer``, ``final_answer``, ``ground_truth``.

Answers become text (:func:`answer_text`: numbers without a spurious ``.0``,
surrounding whitespace and ``$`` removed). A list answer is a list of accepted
alternatives (the KTAE evaluation suite's Minerva: ``['0.01', '0.02']``): it becomes a
tuple of texts, any of which the rewards accept (a one-entry list is its entry; a list
inside a list is an error naming the row). Filters keep the rows whose
column takes one of the given values (compared as text). Every error is one line that
names the file and row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ktae.data.sources import Rows
from ktae.rewards.extract import extract_boxed

FIELDS = ("id", "problem", "answer", "solution", "data_source")
"""Fields a field map may name (``--task-field FIELD=COLUMN``)."""

GUESSES: dict[str, tuple[str, ...]] = {
    "id": ("id", "unique_id", "idx", "extra_info.index"),
    "problem": ("problem", "question", "prompt"),
    "answer": ("answer", "final_answer", "ground_truth", "reward_model.ground_truth"),
    "solution": ("solution",),
    "data_source": ("data_source",),
}
"""Columns tried for each field, in order, when no field map names one."""


@dataclass(frozen=True, slots=True)
class Example:
    """One problem read from a dataset.

    ``problem`` is the problem text (for chat rows: the last user message); ``messages``
    the row's own chat prompt, verbatim (verl schema), else None; ``answer`` the bare
    reference answer; ``data_source`` the row's source tag, where it has one.
    """

    id: str
    problem: str
    answer: str | tuple[str, ...]
    """A tuple: accepted alternatives, any of which is correct."""
    messages: list | None = None
    data_source: str | None = None


def _strip_dollars(s: str) -> str:
    s = s.strip()
    while len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s[1:-1].strip()
    return s


def answer_text(value) -> str | tuple[str, ...]:
    """A reference answer as text: numbers without a spurious ``.0``, surrounding
    whitespace and ``$`` removed. A list holds accepted alternatives and gives a tuple of
    their texts (one entry: that entry's text, e.g. OlympiadBench's ``final_answer``).

    Raises:
        ValueError: null, a boolean, a non-finite number, an empty list or a list inside
            a list (``[1, [2, 3]]``: which entries would be alternatives is unclear).
    """
    if value is None:
        raise ValueError("answer: expected a string, number or list, got null")
    if isinstance(value, bool):
        raise ValueError(f"answer: expected a string, number or list, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"answer: expected a finite number, got {value}")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("answer: expected at least one accepted answer, got []")
        nested = next((v for v in value if isinstance(v, (list, tuple))), None)
        if nested is not None:
            raise ValueError(f"answer: expected a list of accepted answers (strings or "
                             f"numbers), got a list inside a list: {list(value)!r}"[:300])
        texts = tuple(dict.fromkeys(answer_text(v) for v in value))
        return texts[0] if len(texts) == 1 else texts
    if isinstance(value, str):
        return _strip_dollars(value)
    raise ValueError(f"answer: expected a string, number or list, got {type(value).__name__}")


def boxed_answer(solution) -> str:
    """The content of a worked solution's last ``\\boxed{}`` (MATH's answers)."""
    if not isinstance(solution, str):
        raise ValueError("solution: expected a string, got "
                         f"{'null' if solution is None else type(solution).__name__}")
    box = extract_boxed(solution)
    if box is None or not box.strip():
        raise ValueError("solution: no answer column and the solution has no complete "
                         f"\\boxed{{}} (ends {solution[-60:]!r})")
    return box


def _is_messages(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and "content" in m for m in value)


def _user_text(messages: list, at: str) -> str:
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) \
                or not isinstance(m.get("role"), str):
            raise ValueError(f"{at}: expected chat messages with string 'role' and "
                             f"'content', got {m!r}"[:300])
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users or not users[-1].strip():
        raise ValueError(f"{at}: the chat prompt has no non-empty user message")
    return users[-1]


def cell_text(value) -> str:
    """A cell as filters compare it: numbers as :func:`answer_text` writes them."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, float)):
        return answer_text(value)
    return str(value)


def resolve_fields(rows: Rows, field_map: Mapping[str, str] | None = None,
                   preferred: Mapping[str, str | None] | None = None) -> dict[str, str | None]:
    """Field -> column for ``rows``: the field map, then ``preferred`` columns (a known
    benchmark's own schema) where present, then :data:`GUESSES`.

    Raises:
        ValueError: a field map with an unknown field or a column that is not there, or
            no column for the problem, or neither an answer nor a solution column.
    """
    field_map = dict(field_map or {})
    unknown = set(field_map) - set(FIELDS)
    if unknown:
        raise ValueError(f"field_map: unknown field(s) {sorted(unknown)}; expected among "
                         f"{FIELDS}")
    out: dict[str, str | None] = {}
    for key in FIELDS:
        if key in field_map:
            column = field_map[key]
            if not isinstance(column, str) or not rows.has(column):
                raise ValueError(f"field_map: {key}={column!r}: {rows.origin} has no such "
                                 f"column; columns are {list(rows.columns)}")
            out[key] = column
            continue
        want = (preferred or {}).get(key)
        if want is not None and rows.has(want):
            out[key] = want
            continue
        out[key] = next((c for c in GUESSES[key] if rows.has(c)), None)
    if out["problem"] is None:
        raise ValueError(f"field_map: {rows.origin} has no column for 'problem' (tried "
                         f"{', '.join(GUESSES['problem'])}); columns are "
                         f"{list(rows.columns)}; name one with problem=COLUMN")
    if out["answer"] is None and "answer" not in field_map and out["solution"] is None:
        raise ValueError(f"field_map: {rows.origin} has no column for 'answer' (tried "
                         f"{', '.join(GUESSES['answer'])}) and no 'solution' to read a "
                         f"\\boxed{{}} answer from; columns are {list(rows.columns)}; name "
                         "one with answer=COLUMN")
    if out["answer"] is not None:
        out["solution"] = None  # an answer column wins over the solution's box
    return out


def check_filters(filters) -> dict[str, tuple[str, ...]]:
    """``{column: values}`` checked: non-empty column names, non-empty lists of strings."""
    if filters is None:
        return {}
    if not isinstance(filters, Mapping):
        raise ValueError(f"filters: expected a mapping of column -> values, got {filters!r}")
    out = {}
    for column, values in filters.items():
        if isinstance(values, str | int | float) and not isinstance(values, bool):
            values = [values]
        if not isinstance(column, str) or not column or not isinstance(values, list | tuple) \
                or not values:
            raise ValueError(f"filters: expected COLUMN=VALUE[,VALUE...], got {column!r}: "
                             f"{values!r}")
        out[column] = tuple(cell_text(v) for v in values)
    return out


def apply_filters(rows: Rows, filters: Mapping[str, Sequence[str]]) -> Rows:
    """The rows whose every filtered column takes one of its values.

    Raises:
        ValueError: a filtered column that is not there, or no row left.
    """
    if not filters:
        return rows
    keep = list(range(len(rows)))
    for column, values in filters.items():
        if not rows.has(column):
            raise ValueError(f"filter {column}=...: {rows.origin} has no column {column!r}; "
                             f"columns are {list(rows.columns)}")
        wanted = set(values)
        cells = rows.column(column)
        kept = [i for i in keep if cell_text(cells[i]) in wanted]
        if not kept:
            seen = sorted({cell_text(cells[i]) for i in keep})
            shown = ", ".join(repr(v) for v in seen[:12]) + (", ..." if len(seen) > 12 else "")
            raise ValueError(f"filter {column}={','.join(values)}: no row of {rows.origin} "
                             f"is left (of {len(keep)}); {column} takes {shown}")
        keep = kept
    return rows.select(keep)


def fallback_columns(rows: Rows, fields: Mapping[str, str | None],
                     field_map: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """For problem and answer (unless field-mapped): the other guessed columns present,
    read where a row has no value in the chosen one (JSON rows of mixed schemas)."""
    return {key: [c for c in GUESSES[key] if c != fields[key] and rows.has(c)]
            for key in ("problem", "answer")
            if key not in (field_map or {}) and fields[key] is not None}


def _fill(values: list, rows: Rows, columns: Sequence[str]) -> list:
    """``values`` with each None replaced by the first non-None of ``columns``."""
    if not columns or all(v is not None for v in values):
        return values
    others = [rows.column(c) for c in columns]
    return [v if v is not None else next((o[i] for o in others if o[i] is not None), None)
            for i, v in enumerate(values)]


def to_examples(rows: Rows, fields: Mapping[str, str | None], *,
                parse_answer: Callable[[object], str] = answer_text,
                check: Callable[[Example], None] | None = None,
                fallbacks: Mapping[str, Sequence[str]] | None = None) -> list[Example]:
    """Examples of ``rows`` under resolved ``fields``; errors start with the row's place.

    ``check(example)`` may raise ValueError for a row the caller cannot use; the message
    is prefixed with the row's place. ``fallbacks`` (:func:`fallback_columns`) fill rows
    with no value in the chosen problem or answer column.
    """
    n = len(rows)
    fallbacks = fallbacks or {}
    problems = _fill(rows.column(fields["problem"]), rows, fallbacks.get("problem", ()))
    answers = _fill(rows.column(fields["answer"]), rows, fallbacks.get("answer", ())) \
        if fields["answer"] else None
    solutions = rows.column(fields["solution"]) if fields.get("solution") else None
    ids = rows.column(fields["id"]) if fields.get("id") else None
    sources = rows.column(fields["data_source"]) if fields.get("data_source") else None
    out = []
    for i in range(n):
        value = problems[i]
        messages = None
        if _is_messages(value):
            messages = value
            problem = _user_text(value, rows.where(i))
        elif isinstance(value, str) and value.strip():
            problem = value
        else:
            raise ValueError(f"{rows.where(i)}: expected a non-empty problem, got "
                             f"{value!r}"[:300])
        if answers is not None and answers[i] is None and rows.absent(fields["answer"], i) \
                and all(rows.absent(c, i) for c in fallbacks.get("answer", ())):
            raise ValueError(f"{rows.where(i)}: answer: the row has no key "
                             f"{fields['answer']!r} (other rows have it)")
        try:
            answer = parse_answer(answers[i]) if answers is not None else \
                boxed_answer(solutions[i])
        except ValueError as e:
            raise ValueError(f"{rows.where(i)}: {e}") from None
        if not all(a.strip() for a in ((answer,) if isinstance(answer, str) else answer)):
            raise ValueError(f"{rows.where(i)}: answer: expected a non-empty answer, got "
                             f"{answers[i] if answers is not None else solutions[i]!r}")
        source = sources[i] if sources is not None else None
        if source is not None and not isinstance(source, str):
            raise ValueError(f"{rows.where(i)}: data_source: expected a string, got "
                             f"{type(source).__name__}")
        rid = str(ids[i]) if ids is not None and ids[i] is not None else str(i)
        example = Example(rid, problem, answer, messages, source)
        if check is not None:
            try:
                check(example)
            except ValueError as e:
                raise ValueError(f"{rows.where(i)}: {e}") from None
        out.append(example)
    return out
