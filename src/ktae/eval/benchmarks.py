"""Math benchmarks as one normalised record type (docs/method.md §13).

Each benchmark is read from its usual hub dataset through ``datasets.load_dataset``, or
from local data in the same schema: a JSONL/JSON/Parquet file, a directory holding
``<name>.jsonl`` / ``.json`` / ``.parquet``, the Qwen2.5-Math evaluation layout
``<dir>/<name>/test.jsonl``, or a directory saved with ``datasets``' ``save_to_disk``
(a Dataset, or a DatasetDict such as the KTAE / Oat-Zero evaluation suite, whose splits
are reported under the names of :data:`SAVED_SPLIT_NAMES`). Any other schema works with a
``field_map``. Reading and schema detection are :mod:`ktae.data`'s (answers from a
solution's last ``\\boxed{}`` where a row has no answer column). The package ships a
handful of records per benchmark in each dataset's own schema (:func:`fixture_path`), so
the loaders, ``ktae eval`` and their tests run offline.

``embedded`` is the project's procedural task (:mod:`ktae.tasks.embedded`, test split).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ktae.data import Rows, answer_text, load_examples, read_source
from ktae.data.sources import dataset_rows, read_saved_splits

FIXTURE_DIR = Path(__file__).with_name("fixtures")
EMBEDDED_DEFAULT_N = 200
RECORD_FIELDS = ("id", "problem", "answer")

__all__ = ["BENCHMARKS", "BENCHMARK_NAMES", "SAVED_SPLIT_NAMES", "BenchmarkRecord",
           "BenchmarkSpec", "answer_text", "benchmark_rows", "fixture_path", "gsm8k_answer",
           "load_benchmark", "saved_benchmarks"]


@dataclass(frozen=True)
class BenchmarkRecord:
    """One problem: ``answer`` is the bare reference answer (no ``\\boxed``)."""

    id: str
    problem: str
    answer: str
    source: str


def gsm8k_answer(value) -> str:
    """GSM8K's final answer: the text after the last ``####``, thousands commas removed."""
    if not isinstance(value, str):
        raise ValueError(f"answer: expected a GSM8K solution (a string), got "
                         f"{'null' if value is None else type(value).__name__}")
    text = value
    if "####" not in text:
        raise ValueError("answer: expected a GSM8K solution ending in '#### N', "
                         f"got {text[-80:]!r}")
    return text.rsplit("####", 1)[1].strip().replace(",", "")


@dataclass(frozen=True)
class BenchmarkSpec:
    """Where a benchmark lives on the hub and how its rows map to a record.

    ``fields`` maps record fields (id, problem, answer) to the dataset's columns; an id
    column of None numbers the rows ``0, 1, ...``.
    """

    name: str
    hub_path: str
    hub_config: str | None
    split: str
    fields: Mapping[str, str | None]
    size: int
    parse_answer: Callable[[object], str] = answer_text
    aliases: tuple[str, ...] = field(default=())


BENCHMARKS: dict[str, BenchmarkSpec] = {s.name: s for s in (
    BenchmarkSpec("math500", "HuggingFaceH4/MATH-500", None, "test",
                  {"id": "unique_id", "problem": "problem", "answer": "answer"}, 500),
    BenchmarkSpec("aime24", "HuggingFaceH4/aime_2024", None, "train",
                  {"id": "id", "problem": "problem", "answer": "answer"}, 30),
    BenchmarkSpec("aime25", "yentinglin/aime_2025", None, "train",
                  {"id": "id", "problem": "problem", "answer": "answer"}, 30),
    BenchmarkSpec("amc23", "math-ai/amc23", None, "test",
                  {"id": "id", "problem": "question", "answer": "answer"}, 40),
    BenchmarkSpec("minerva", "math-ai/minervamath", None, "test",
                  {"id": None, "problem": "question", "answer": "answer"}, 272),
    BenchmarkSpec("olympiadbench", "Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train",
                  {"id": "id", "problem": "question", "answer": "final_answer"}, 675),
    BenchmarkSpec("gsm8k", "openai/gsm8k", "main", "test",
                  {"id": None, "problem": "question", "answer": "answer"}, 1319,
                  parse_answer=gsm8k_answer),
)}
BENCHMARK_NAMES = (*BENCHMARKS, "embedded")
"""Every name :func:`load_benchmark` knows (others need ``path=``)."""

SAVED_SPLIT_NAMES = {
    "aime": "aime24",  # AIME 2024, 30 problems
    "amc": "amc22-23",  # AMC 2022 and 2023, 83 problems (not the 40 of amc23)
    "math": "math500",  # MATH-500
    "minerva": "minerva",  # Minerva Math, 272 problems
    "olympiad_bench": "olympiadbench",  # OlympiadBench, 675 problems
}
"""Split of a saved evaluation suite (the KTAE / Oat-Zero ``evaluation_suite`` DatasetDict)
-> the name its results are reported under; other splits keep their own names."""

QWEN_MATH_DIRS = {"minerva": ("minerva_math",), "math500": ("math_500", "math_oai")}
"""Benchmark -> further folder names of the Qwen2.5-Math ``data/<name>/test.jsonl`` layout."""


def fixture_path(name: str) -> Path:
    """The shipped sample file of benchmark ``name`` (a few rows in the hub schema)."""
    path = FIXTURE_DIR / f"{name}.jsonl"
    if name not in BENCHMARKS or not path.is_file():
        raise ValueError(f"name: no fixture for {name!r}; expected one of {tuple(BENCHMARKS)}")
    return path


def _is_saved(path: Path) -> bool:
    """Whether ``path`` is a directory written by ``save_to_disk``."""
    return path.is_dir() and any((path / f).is_file() for f in
                                 ("dataset_dict.json", "state.json", "dataset_info.json"))


def saved_benchmarks(path: str | Path) -> dict[str, str | None] | None:
    """Benchmark name -> split of a saved DatasetDict at ``path`` (a saved Dataset: the
    empty mapping), or None when ``path`` is not a saved dataset.

    Split names are mapped by :data:`SAVED_SPLIT_NAMES` (``aime`` -> ``aime24``).
    """
    path = Path(path)
    if not _is_saved(path):
        return None
    if not (path / "dataset_dict.json").is_file():
        return {}
    try:
        splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
    except (ValueError, KeyError, TypeError, OSError):
        raise ValueError(f"path: {path / 'dataset_dict.json'} is not a DatasetDict index") \
            from None
    return {SAVED_SPLIT_NAMES.get(split, split): split for split in splits}


def _saved_rows(path: Path, name: str) -> Rows:
    """Rows of benchmark ``name`` in the saved dataset at ``path``: a Dataset is taken
    whole; a DatasetDict gives its split called ``name`` or mapped to ``name``."""
    names = saved_benchmarks(path)
    splits = read_saved_splits(path)
    if not names:
        return splits[None]
    split = names.get(name, name if name in splits else None)
    if split is None:
        raise ValueError(f"path: {path} holds no split for {name!r}; it holds "
                         + ", ".join(f"{b} (split {s})" if b != s else b
                                     for b, s in names.items()))
    return splits[split]


def _data_file(path: Path, name: str) -> Path:
    """``path`` itself, ``<name>.jsonl/.json/.parquet`` in the directory ``path``, or the
    Qwen2.5-Math layout ``path/<name>/test.jsonl`` (also under the folder names of
    :data:`QWEN_MATH_DIRS`)."""
    if path.is_dir():
        for suffix in (".jsonl", ".json", ".parquet"):
            if (path / f"{name}{suffix}").is_file():
                return path / f"{name}{suffix}"
        for folder in (name, *QWEN_MATH_DIRS.get(name, ())):
            for suffix in (".jsonl", ".json", ".parquet"):
                if (path / folder / f"test{suffix}").is_file():
                    return path / folder / f"test{suffix}"
            if _is_saved(path / folder):
                return path / folder
        raise ValueError(f"path: no {name}.jsonl/.json/.parquet or {name}/test.jsonl in "
                         f"directory {path}")
    if not path.is_file():
        raise ValueError(f"path: no such file: {path}")
    if path.suffix not in (".jsonl", ".json", ".parquet"):
        raise ValueError(f"path: expected a .jsonl, .json or .parquet file, got {path.name}")
    return path


def _local_rows(path: Path, name: str) -> Rows:
    if _is_saved(path):
        return _saved_rows(path, name)
    file = _data_file(path, name)
    if file.is_dir():
        return _saved_rows(file, name)
    return read_source(f"{file.suffix.lstrip('.')}:{file}", name="path")


def _load_hub(spec: BenchmarkSpec, split: str) -> Rows:
    import datasets

    ds = datasets.load_dataset(spec.hub_path, spec.hub_config, split=split)
    return dataset_rows(ds, f"{spec.hub_path} ({split} split)")


def benchmark_rows(name: str, spec=None, *, path: str | Path | None = None,
                   split: str | None = None) -> Rows:
    """Rows of benchmark ``name`` before they become records: from ``path`` (any local
    layout :func:`load_benchmark` reads: a file, ``<name>.jsonl`` or ``<name>/test.jsonl``
    in a directory, a saved Dataset or a DatasetDict split), else from the hub dataset of
    ``spec`` (anything with ``hub_path``, ``hub_config`` and ``split``, such as a
    :class:`BenchmarkSpec`).

    Raises:
        ValueError: no rows, or a file or dataset that cannot be read (one line naming it).
    """
    if path is not None:
        rows = _local_rows(Path(path), name)
    elif spec is None:
        raise ValueError(f"name: unknown benchmark {name!r}; expected one of "
                         f"{BENCHMARK_NAMES} or a local path=")
    else:
        rows = _load_hub(spec, split or spec.split)
    if len(rows) == 0:
        raise ValueError(f"{rows.origin}: no records for benchmark {name!r}")
    return rows


def _load_embedded(split: str | None, limit: int | None) -> list[BenchmarkRecord]:
    from ktae.tasks.embedded import generate

    problems = generate(limit if limit is not None else EMBEDDED_DEFAULT_N,
                        split=split or "test", seed=0)
    return [BenchmarkRecord(id=p.id, problem=p.question, answer=p.answer, source="embedded")
            for p in problems]


def load_benchmark(name: str, *, path: str | Path | None = None, split: str | None = None,
                   limit: int | None = None, field_map: Mapping[str, str] | None = None
                   ) -> list[BenchmarkRecord]:
    """Records of benchmark ``name``, in the dataset's order.

    Args:
        name: one of :data:`BENCHMARK_NAMES`, or any label when ``path`` is given.
        path: local ``.jsonl``/``.json``/``.parquet`` file, a directory holding
            ``<name>.jsonl`` etc. or ``<name>/test.jsonl`` (Qwen2.5-Math layout), or a
            ``save_to_disk`` directory (a Dataset, or a DatasetDict whose split is
            ``name`` or maps to it by :data:`SAVED_SPLIT_NAMES`); default: the hub
            dataset (network or hub cache).
        split: hub split (default: the benchmark's evaluation split); for ``embedded``,
            ``"test"`` (default) or ``"train"``. Ignored for local files.
        limit: keep the first ``limit`` records (``embedded``: generate that many;
            default 200).
        field_map: record field -> column, e.g. ``{"problem": "question"}``; overrides
            the benchmark's own mapping. Unknown benchmarks guess common column names.

    Returns:
        ``list[BenchmarkRecord]`` with ``source == name``.

    Raises:
        ValueError: an empty file or split, invalid UTF-8 or JSON, a row that is not an
            object, or a missing/empty problem or answer (``null`` included); the message
            starts with the file and line (or the dataset and row).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a benchmark name, got {name!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit: expected a positive integer or None, got {limit!r}")
    spec = BENCHMARKS.get(name)
    if name == "embedded" and path is None:
        return _load_embedded(split, limit)
    rows = benchmark_rows(name, spec, path=path, split=split)
    if field_map is not None and not isinstance(field_map, Mapping):
        raise ValueError(f"field_map: expected a mapping with keys among {RECORD_FIELDS}, "
                         f"got {field_map!r}")
    parse = spec.parse_answer if spec and (field_map or {}).get("answer") is None else answer_text
    examples = load_examples(rows, fields=field_map, limit=limit,
                             preferred=spec.fields if spec else None, parse_answer=parse)
    return [BenchmarkRecord(id=e.id, problem=e.problem, answer=e.answer, source=name)
            for e in examples]
