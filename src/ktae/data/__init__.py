"""Datasets of problems and answers for training (``ktae train --task``) and evaluation
(``ktae eval``): one reader for files, saved datasets and the hub, one schema layer.

Public API:
    parse_source(text) -> Source             # jsonl:/json:/parquet:/disk:/hf: or a path
    read_source(source) -> Rows              # columns, converted to Python on demand
    load_examples(source, *, fields, filters, limit, ...) -> list[Example]
    resolve_fields, apply_filters, to_examples, answer_text, boxed_answer
See :mod:`ktae.data.sources` (where data comes from) and :mod:`ktae.data.schema` (which
columns hold what).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ktae.data.schema import (
    FIELDS,
    GUESSES,
    Example,
    answer_text,
    apply_filters,
    boxed_answer,
    check_filters,
    fallback_columns,
    resolve_fields,
    to_examples,
)
from ktae.data.sources import (
    KINDS,
    Rows,
    Source,
    arrow_rows,
    parse_source,
    read_json,
    read_parquet,
    read_saved,
    read_saved_splits,
    read_source,
)


def load_examples(source: str | Source | Rows, *, fields: Mapping[str, str] | None = None,
                  filters: Mapping[str, Sequence[str]] | None = None, limit: int | None = None,
                  preferred: Mapping[str, str | None] | None = None,
                  parse_answer: Callable[[object], str] = answer_text,
                  check: Callable[[Example], None] | None = None, name: str = "task",
                  default_split: str = "train") -> list[Example]:
    """Examples of a source: read, filtered, mapped (see :mod:`ktae.data.schema`).

    Args:
        source: a source string or :class:`Source` (:func:`parse_source`), or rows
            already read.
        fields: field -> column overrides (fields among :data:`FIELDS`; a dotted column
            reads a struct field, e.g. ``reward_model.ground_truth``).
        filters: column -> values; rows whose column takes none of them are dropped.
        limit: keep the first ``limit`` rows (after filtering).
        preferred: field -> column of a known dataset, used where the column exists.
        parse_answer: turns an answer cell into text (default :func:`answer_text`).
        check: called on each example; its ValueError is reported with the row's place.
        name: the option the source came from, in messages about the source string.
        default_split: the split of a hub dataset or saved DatasetDict when none is given.

    Returns:
        The examples in the dataset's order (may be empty when the source has no rows).

    Raises:
        ValueError: one line naming the file (and row) of the first problem found.
    """
    rows = source if isinstance(source, Rows) else read_source(source, name=name,
                                                               default_split=default_split)
    if len(rows) == 0:
        return []
    rows = apply_filters(rows, check_filters(filters))
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    resolved = resolve_fields(rows, fields, preferred)
    return to_examples(rows, resolved, parse_answer=parse_answer, check=check,
                       fallbacks=fallback_columns(rows, resolved, fields))


__all__ = ["FIELDS", "GUESSES", "KINDS", "Example", "Rows", "Source", "answer_text",
           "apply_filters", "arrow_rows", "boxed_answer", "check_filters", "load_examples",
           "parse_source", "read_json", "read_parquet", "read_saved", "read_saved_splits",
           "read_source", "resolve_fields", "to_examples"]
