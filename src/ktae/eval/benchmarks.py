"""Math benchmarks as one normalised record type (SPEC section 7).

Each benchmark is read from its usual hub dataset through ``datasets.load_dataset``, or
from a local JSONL/JSON/Parquet file (or a directory holding ``<name>.jsonl`` /
``<name>.parquet``) in the same schema, or in any schema with a ``field_map``. The
package ships a handful of records per benchmark in each dataset's own schema
(:func:`fixture_path`), so the loaders, ``ktae eval`` and their tests run offline.

``embedded`` is the project's procedural task (:mod:`ktae.tasks.embedded`, test split).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

FIXTURE_DIR = Path(__file__).with_name("fixtures")
EMBEDDED_DEFAULT_N = 200
RECORD_FIELDS = ("id", "problem", "answer")


@dataclass(frozen=True)
class BenchmarkRecord:
    """One problem: ``answer`` is the bare reference answer (no ``\\boxed``)."""

    id: str
    problem: str
    answer: str
    source: str


def _strip_dollars(s: str) -> str:
    s = s.strip()
    while len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s[1:-1].strip()
    return s


def answer_text(value) -> str:
    """A reference answer as text: numbers without a spurious ``.0``, lists joined by
    ``", "`` (OlympiadBench's ``final_answer``), surrounding ``$`` removed."""
    if value is None:
        raise ValueError("answer: expected a string, number or list, got null")
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"answer: expected a finite number, got {value}")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(answer_text(v) for v in value)
    if isinstance(value, str):
        return _strip_dollars(value)
    raise ValueError(f"answer: expected a string, number or list, got {type(value).__name__}")


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

_GUESS = {"id": ("id", "unique_id", "idx"), "problem": ("problem", "question", "prompt"),
          "answer": ("answer", "final_answer", "ground_truth", "solution")}


def fixture_path(name: str) -> Path:
    """The shipped sample file of benchmark ``name`` (a few rows in the hub schema)."""
    path = FIXTURE_DIR / f"{name}.jsonl"
    if name not in BENCHMARKS or not path.is_file():
        raise ValueError(f"name: no fixture for {name!r}; expected one of {tuple(BENCHMARKS)}")
    return path


def _data_file(path: Path, name: str) -> Path:
    """``path`` itself, or ``<name>.jsonl/.json/.parquet`` in the directory ``path``."""
    if path.is_dir():
        for suffix in (".jsonl", ".json", ".parquet"):
            if (path / f"{name}{suffix}").is_file():
                return path / f"{name}{suffix}"
        raise ValueError(f"path: no {name}.jsonl/.json/.parquet in directory {path}")
    if not path.is_file():
        raise ValueError(f"path: no such file: {path}")
    return path


def _read_rows(path: Path) -> tuple[list[dict], list[str]]:
    """Rows of a local file and where each comes from (``"<file>, line 7"``)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
        return rows, [f"{path}, row {i}" for i in range(len(rows))]
    if path.suffix not in (".jsonl", ".json"):
        raise ValueError(f"path: expected a .jsonl, .json or .parquet file, got {path.name}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}, line {line}: not valid UTF-8 (byte {e.start})") from None
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {e.lineno}: invalid JSON ({e.msg})") from None
        where = [f"{path}, record {i}" for i in range(len(rows))]
    else:
        rows, where = [], []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {number}: invalid JSON ({e.msg})") from None
            where.append(f"{path}, line {number}")
    for row, at in zip(rows, where, strict=True):
        if not isinstance(row, dict):
            raise ValueError(f"{at}: expected a JSON object, got {type(row).__name__}")
    return rows, where


def _load_hub(spec: BenchmarkSpec, split: str) -> list[dict]:
    import datasets

    ds = datasets.load_dataset(spec.hub_path, spec.hub_config, split=split)
    return [dict(row) for row in ds]


def _resolve_fields(spec: BenchmarkSpec | None, field_map, columns: set[str]) -> dict:
    if field_map is not None:
        if not isinstance(field_map, Mapping) or set(field_map) - set(RECORD_FIELDS):
            raise ValueError(f"field_map: expected a mapping with keys among {RECORD_FIELDS}, "
                             f"got {field_map!r}")
    fields = dict(spec.fields) if spec else {}
    fields.update(field_map or {})
    if fields.get("id") not in columns and "id" not in (field_map or {}):
        fields.pop("id", None)  # ids are optional: guess a column or number the rows
    for key in RECORD_FIELDS:
        if key not in fields:
            fields[key] = next((c for c in _GUESS[key] if c in columns), None)
        if key != "id" and fields[key] is None:
            raise ValueError(f"field_map: no column for {key!r}; columns are {sorted(columns)}")
    return fields


def _to_records(rows: list[dict], where: list[str], source: str, fields: dict,
                parse_answer: Callable[[object], str]) -> list[BenchmarkRecord]:
    """Records of ``rows``; errors start with the row's place (``where[i]``)."""
    out = []
    for i, (row, at) in enumerate(zip(rows, where, strict=True)):
        for key, column in fields.items():
            if column is not None and column not in row:
                raise ValueError(f"{at}: no column {column!r} (for {key!r}; see field_map); "
                                 f"columns are {sorted(row)}")
        problem = row[fields["problem"]]
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(f"{at}: expected a non-empty problem, got {problem!r}")
        try:
            answer = parse_answer(row[fields["answer"]])
        except ValueError as e:
            raise ValueError(f"{at}: {e}") from None
        if not answer.strip():
            raise ValueError(f"{at}: answer: expected a non-empty answer, "
                             f"got {row[fields['answer']]!r}")
        rid = str(row[fields["id"]]) if fields["id"] is not None else str(i)
        out.append(BenchmarkRecord(id=rid, problem=problem, answer=answer, source=source))
    return out


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
        path: local ``.jsonl``/``.json``/``.parquet`` file, or a directory holding
            ``<name>.jsonl`` etc.; default: the hub dataset (network or hub cache).
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
    if path is not None:
        file = _data_file(Path(path), name)
        rows, where = _read_rows(file)
        origin = str(file)
    elif spec is None:
        raise ValueError(f"name: unknown benchmark {name!r}; expected one of "
                         f"{BENCHMARK_NAMES} or a local path=")
    else:
        split = split or spec.split
        rows = _load_hub(spec, split)
        origin = f"{spec.hub_path} ({split} split)"
        where = [f"{origin}, row {i}" for i in range(len(rows))]
    if not rows:
        raise ValueError(f"{origin}: no records for benchmark {name!r}")
    if limit is not None:
        rows, where = rows[:limit], where[:limit]
    columns = set().union(*(r.keys() for r in rows))
    fields = _resolve_fields(spec, field_map, columns)
    parse = spec.parse_answer if spec and (field_map or {}).get("answer") is None else answer_text
    return _to_records(rows, where, name, fields, parse)
