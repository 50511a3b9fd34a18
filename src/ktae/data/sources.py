"""Where a dataset comes from, and its rows read column by column.

A source is written as

* ``jsonl:PATH``, ``json:PATH`` (one object per line, or a JSON list), ``parquet:PATH``;
* a directory written by ``datasets``' ``save_to_disk`` (a ``Dataset`` or a
  ``DatasetDict``), as ``PATH`` or ``disk:PATH``, with ``@SPLIT`` for one split of a dict;
* ``hf:NAME[:CONFIG][@SPLIT]``: ``datasets.load_dataset(NAME, CONFIG, split=SPLIT)`` (the
  hub cache when ``HF_DATASETS_OFFLINE=1``, the network when the environment allows it);
* a bare ``PATH`` ending in ``.jsonl``, ``.json`` or ``.parquet``.

Reading gives :class:`Rows`: column names, a row count and each column as a Python list,
converted on first use. Parquet files, saved datasets and hub datasets stay in Arrow
memory until a column is asked for, and only the columns asked for are converted (once),
so a large Parquet file's unused columns never become Python objects. Every error is one
line that starts with the file (and the line or row, where there is one).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

FILE_KINDS = ("jsonl", "json", "parquet")
PARQUET_BATCH_ROWS = 8192
"""Rows of a Parquet column converted to Python at a time."""
KINDS = (*FILE_KINDS, "disk", "hf")


@dataclass(frozen=True)
class Source:
    """A parsed source: ``kind`` among :data:`KINDS`, ``path`` a file, directory or hub
    name, ``config`` a hub config, ``split`` a split of a hub dataset or saved dict."""

    kind: str
    path: str
    config: str | None = None
    split: str | None = None

    def describe(self) -> str:
        if self.kind == "hf":
            return "hf:" + self.path + (f":{self.config}" if self.config else "") + \
                (f"@{self.split}" if self.split else "")
        return self.path + (f"@{self.split}" if self.split else "")


def parse_source(text: str, *, name: str = "task") -> Source:
    """Read a source string (see the module docstring).

    Raises:
        ValueError: an empty string, an unknown prefix or suffix (naming ``name``).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{name}: expected a data source, got {text!r}")
    prefix, sep, rest = text.partition(":")
    if sep and prefix in KINDS:
        if not rest:
            raise ValueError(f"{name}: expected a path or name after '{prefix}:', got {text!r}")
        if prefix == "hf":
            body, _, split = rest.partition("@")
            hub, _, config = body.partition(":")
            if not hub:
                raise ValueError(f"{name}: expected hf:NAME[:CONFIG][@SPLIT], got {text!r}")
            return Source("hf", hub, config or None, split or None)
        if prefix == "disk":
            path, split = _split_suffix(rest)
            return Source("disk", path, None, split)
        return Source(prefix, rest)
    path, split = _split_suffix(text)
    if Path(path).is_dir():
        return Source("disk", path, None, split)
    suffix = Path(text).suffix.lstrip(".")
    if suffix in FILE_KINDS:
        return Source(suffix, text)
    raise ValueError(f"{name}: expected jsonl:PATH, json:PATH, parquet:PATH, a directory "
                     f"saved with save_to_disk, or hf:NAME[:CONFIG][@SPLIT], got {text!r}")


def _split_suffix(text: str) -> tuple[str, str | None]:
    """``"dir@test"`` -> ``("dir", "test")`` unless ``dir@test`` itself exists."""
    if "@" in text and not Path(text).exists():
        path, _, split = text.rpartition("@")
        return path, split or None
    return text, None


Getter = Callable[[str, "Sequence[int] | None"], list]
"""``get(name, rows)``: column ``name`` as a Python list, of the rows ``rows`` (increasing
source row numbers) or of every row (None)."""


class Rows:
    """A table of rows read from a source: ``columns``, ``len()`` and :meth:`column`.

    ``column(name)`` is that column as a Python list (computed once, then cached); a
    dotted name (``reward_model.ground_truth``) reads a field of a struct column.
    :meth:`where` names row ``i`` in error messages (``"train.jsonl, line 7"``).
    :meth:`select` keeps some rows: their columns are then converted from the source for
    those rows only.
    """

    def __init__(self, origin: str, columns: Sequence[str], n: int, *, get: Getter,
                 fields: Callable[[str], Sequence[str]], where: Callable[[int], str],
                 rows: Sequence[int] | None = None,
                 absent: Callable[[str, int], bool] | None = None):
        self.origin = origin
        self.columns = tuple(columns)
        self._get, self._fields, self._where = get, fields, where
        self._absent = absent
        self._rows = None if rows is None else list(rows)
        self._n = n if rows is None else len(self._rows)
        self._cache: dict[str, list] = {}

    def __len__(self) -> int:
        return self._n

    def has(self, name: str) -> bool:
        """Whether ``name`` (a column, or ``column.field`` of a struct column) exists."""
        top, _, sub = name.partition(".")
        if top not in self.columns:
            return False
        return not sub or sub in self._fields(top)

    def column(self, name: str) -> list:
        if name not in self._cache:
            if not self.has(name):
                raise ValueError(f"{self.origin}: no column {name!r}; columns are "
                                 f"{list(self.columns)}")
            self._cache[name] = self._get(name, self._rows)
        return self._cache[name]

    def where(self, i: int) -> str:
        return self._where(i if self._rows is None else self._rows[i])

    def absent(self, name: str, i: int) -> bool:
        """Whether row ``i`` lacks ``name`` altogether (a JSON record without the key), as
        opposed to holding null; tables with a fixed schema never lack a column."""
        if self._absent is None:
            return False
        return self._absent(name, i if self._rows is None else self._rows[i])

    def dicts(self) -> list[dict]:
        """Every row as a dict of all its columns, for readers that parse whole rows."""
        columns = {c: self.column(c) for c in self.columns}
        return [{c: values[i] for c, values in columns.items()} for i in range(len(self))]

    def select(self, indices: Sequence[int]) -> Rows:
        """The rows ``indices`` (increasing positions in this table), keeping their
        original places in error messages."""
        indices = list(indices)
        if any(b <= a for a, b in zip(indices, indices[1:], strict=False)):
            raise ValueError("indices: expected increasing row positions")
        rows = indices if self._rows is None else [self._rows[i] for i in indices]
        return Rows(self.origin, self.columns, len(rows), get=self._get, fields=self._fields,
                    where=self._where, rows=rows, absent=self._absent)


# ----------------------------------------------------------------------------- JSON


def _json_fields(records: list[dict]) -> Callable[[str], Sequence[str]]:
    def fields(top: str) -> Sequence[str]:
        first = next((r[top] for r in records if r.get(top) is not None), None)
        return tuple(first) if isinstance(first, dict) else ()

    return fields


def _json_get(records: list[dict]) -> Getter:
    def get(name: str, rows: Sequence[int] | None) -> list:
        top, _, sub = name.partition(".")
        chosen = records if rows is None else [records[i] for i in rows]
        if not sub:
            return [r.get(top) for r in chosen]
        return [r[top].get(sub) if isinstance(r.get(top), dict) else None for r in chosen]

    return get


def _json_absent(records: list[dict]) -> Callable[[str, int], bool]:
    def absent(name: str, i: int) -> bool:
        top, _, sub = name.partition(".")
        rec = records[i]
        if top not in rec:
            return True
        return bool(sub) and isinstance(rec[top], dict) and sub not in rec[top]

    return absent


class _DuplicateKey(ValueError):
    pass


def _no_duplicate_keys(pairs: list) -> dict:
    """``object_pairs_hook`` of json.loads: a key given twice in one object is an error
    (json keeps the last silently)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _missing_file(path: Path) -> ValueError:
    if path.is_dir():
        return ValueError(f"{path}: is a directory, expected a file (a directory saved "
                          "with save_to_disk is read as disk:PATH)")
    return ValueError(f"{path}: no such file")


def read_json(path: str | Path) -> Rows:
    """Rows of a ``.jsonl`` file (one object per line; blank lines skipped) or a ``.json``
    file (a list of objects, or one object per line). UTF-8, with or without a byte-order
    mark; a key given twice in one object is an error."""
    path = Path(path)
    if not path.is_file():
        raise _missing_file(path)
    raw = path.read_bytes()
    if raw.startswith(codecs.BOM_UTF8):  # written by some Windows tools
        raw = raw[len(codecs.BOM_UTF8):]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}, line {line}: not valid UTF-8 (byte {e.start})") from None
    del raw
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            records = json.loads(text, object_pairs_hook=_no_duplicate_keys)
        except _DuplicateKey as e:
            raise ValueError(f"{path}: key {e.args[0]!r} appears twice in one object") \
                from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {e.lineno}: invalid JSON ({e.msg})") from None
        numbers = list(range(len(records)))
        unit = "record"
    else:
        records, numbers, unit = [], [], "line"
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line, object_pairs_hook=_no_duplicate_keys))
            except _DuplicateKey as e:
                raise ValueError(f"{path}, line {number}: key {e.args[0]!r} appears twice") \
                    from None
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {number}: invalid JSON ({e.msg}, column "
                                 f"{e.colno})") from None
            numbers.append(number)
    for rec, number in zip(records, numbers, strict=True):
        if not isinstance(rec, dict):
            raise ValueError(f"{path}, {unit} {number}: expected a JSON object, "
                             f"got {type(rec).__name__}")
    columns = list(dict.fromkeys(k for r in records for k in r))
    return Rows(str(path), columns, len(records), get=_json_get(records),
                fields=_json_fields(records), where=lambda i: f"{path}, {unit} {numbers[i]}",
                absent=_json_absent(records))


# ----------------------------------------------------------------------------- Arrow


def _check_unique_columns(names: Sequence[str], origin: str) -> None:
    """A column name given twice would be read from its first column only: refuse it."""
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{origin}: column {name!r} appears twice; rename one")
        seen.add(name)


def arrow_rows(table, origin: str, *, unit: str = "row") -> Rows:
    """Rows over a ``pyarrow.Table``; columns become Python lists only when asked for."""
    import pyarrow as pa
    import pyarrow.compute as pc

    _check_unique_columns(table.column_names, origin)

    def fields(top: str) -> Sequence[str]:
        typ = table.schema.field(top).type
        return tuple(typ.field(i).name for i in range(typ.num_fields)) \
            if pa.types.is_struct(typ) else ()

    def get(name: str, rows: Sequence[int] | None) -> list:
        top, _, sub = name.partition(".")
        column = table.column(top)
        if rows is not None:
            column = column.take(pa.array(rows, type=pa.int64()))
        if sub:
            column = pc.struct_field(column, sub)
        return column.to_pylist()

    return Rows(origin, table.column_names, table.num_rows, get=get, fields=fields,
                where=lambda i: f"{origin}, {unit} {i}")


def read_parquet(path: str | Path) -> Rows:
    """Rows of a Parquet file; each column is read from the file when first asked for."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise _missing_file(path)
    try:
        file = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: not a Parquet file ({_first_line(e)})") from None
    schema = file.schema_arrow
    _check_unique_columns(schema.names, str(path))
    origin = str(path)

    def fields(top: str) -> Sequence[str]:
        typ = schema.field(top).type
        return tuple(typ.field(i).name for i in range(typ.num_fields)) \
            if pa.types.is_struct(typ) else ()

    def get(name: str, rows: Sequence[int] | None) -> list:
        import numpy as np
        import pyarrow.compute as pc

        # batch by batch, so that at most one batch of the column is in Arrow memory
        # beside the Python values; of a selection, only its rows are converted
        top, _, sub = name.partition(".")
        wanted = None if rows is None else np.asarray(rows, dtype=np.int64)
        out: list = []
        if wanted is not None and not len(wanted):
            return out
        start = 0
        try:
            for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[top]):
                column = batch.column(0)
                end = start + len(column)
                if wanted is not None:
                    lo, hi = np.searchsorted(wanted, [start, end])
                    column = column.take(pa.array(wanted[lo:hi] - start))
                start = end
                out.extend((pc.struct_field(column, sub) if sub else column).to_pylist())
                if wanted is not None and start > wanted[-1]:
                    break
        except (pa.ArrowException, OSError) as e:
            raise ValueError(f"{path}: column {top!r} cannot be read ({_first_line(e)})") \
                from None
        return out

    return Rows(origin, schema.names, file.metadata.num_rows, get=get, fields=fields,
                where=lambda i: f"{origin}, row {i}")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def dataset_rows(ds, origin: str) -> Rows:
    """Rows of a ``datasets.Dataset`` (its Arrow table, indices mapping applied)."""
    if getattr(ds, "_indices", None) is not None:
        ds = ds.flatten_indices()
    return arrow_rows(ds.data.table, origin)


def read_saved(path: str | Path, split: str | None = None, *,
               default_split: str | None = None) -> Rows:
    """Rows of a ``save_to_disk`` directory: a Dataset, or split ``split`` of a DatasetDict
    (default ``default_split`` when it has one, or its only split)."""
    splits = read_saved_splits(path)
    if list(splits) == [None]:
        if split is not None:
            raise ValueError(f"{path}: a Dataset with no splits; drop '@{split}'")
        return splits[None]
    names = list(splits)
    if split is None:
        if default_split in splits:
            split = default_split
        elif len(names) == 1:
            split = names[0]
        else:
            raise ValueError(f"{path}: a DatasetDict with splits {names}; choose one with "
                             f"{path}@SPLIT")
    if split not in splits:
        raise ValueError(f"{path}: no split {split!r}; splits are {names}")
    return splits[split]


def read_saved_splits(path: str | Path) -> dict[str | None, Rows]:
    """Every split of a ``save_to_disk`` directory (``{None: rows}`` for a Dataset)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: no such directory")
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as e:
        raise ValueError(f"{path}: not a dataset saved with save_to_disk ({_first_line(e)})") \
            from None
    if isinstance(ds, datasets.DatasetDict):
        return {name: dataset_rows(d, f"{path}@{name}") for name, d in ds.items()}
    return {None: dataset_rows(ds, str(path))}


def read_hub(name: str, config: str | None = None, split: str | None = None, *,
             default_split: str = "train") -> Rows:
    """Rows of a hub dataset through ``datasets.load_dataset`` (its cache when offline)."""
    import datasets

    split = split or default_split
    origin = f"hf:{name}" + (f":{config}" if config else "") + f"@{split}"
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # noqa: BLE001 - hub, network and cache errors of every kind
        raise ValueError(f"{origin}: cannot be loaded ({_first_line(e)}); offline, export it "
                         "to a file or a save_to_disk directory and pass that") from None
    return dataset_rows(ds, origin)


def read_source(source: str | Source, *, name: str = "task",
                default_split: str = "train") -> Rows:
    """Rows of a source (a string is parsed with :func:`parse_source`)."""
    src = parse_source(source, name=name) if isinstance(source, str) else source
    if src.kind in ("jsonl", "json"):
        return read_json(src.path)
    if src.kind == "parquet":
        return read_parquet(src.path)
    if src.kind == "disk":
        return read_saved(src.path, src.split, default_split=default_split)
    return read_hub(src.path, src.config, src.split, default_split=default_split)
