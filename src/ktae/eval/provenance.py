"""Where a benchmark's problems came from, recorded in ``results.json`` under ``data``.

Per benchmark: ``source`` (``hub``, ``file``, ``saved`` for a ``save_to_disk`` directory,
``fixture`` or ``embedded``), where exactly (the hub dataset, config, split and, when it
was read from the local hub cache, the revision; or the absolute path and the sha256 of
its content), ``rows`` (the problems evaluated) and ``sha256``, a hash of those problems
(id, problem and answer of each, in order). Two results were computed on the same data
only when their ``sha256`` agree.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from ktae.eval import choice
from ktae.eval.benchmarks import BENCHMARKS, _data_file, _is_saved, fixture_path
from ktae.models.model_path import hub_cache_dir
from ktae.tasks.arith import DEFAULT_DIFFICULTY, EVAL_SEED

_CHUNK = 1 << 20


def records_sha256(records: Sequence) -> str:
    """sha256 of the problems used (each record's id, problem and answer, in order)."""
    h = hashlib.sha256()
    for r in records:
        h.update(json.dumps([r.id, r.problem, r.answer], ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def tree_sha256(path: Path) -> str:
    """sha256 over every file under ``path`` (relative names and contents, sorted)."""
    h = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(file.relative_to(path)).encode() + b"\0")
        h.update(file_sha256(file).encode())
    return h.hexdigest()


def _local(path: Path, name: str) -> dict:
    found = path if _is_saved(path) else _data_file(path, name)
    if found.is_dir():
        return {"source": "saved", "directory": str(found.resolve()),
                "content_sha256": tree_sha256(found)}
    return {"source": "file", "file": str(found.resolve()), "content_sha256": file_sha256(found)}


def _hub_revision(hub_path: str) -> str | None:
    """The commit of ``hub_path`` in the local hub cache (``refs/main``), if there."""
    ref = Path(hub_cache_dir()) / f"datasets--{hub_path.replace('/', '--')}" / "refs" / "main"
    try:
        return ref.read_text().strip() or None
    except OSError:
        return None


def data_origin(name: str, *, data_dir: str | Path | None = None, fixtures: bool = False,
                split: str | None = None) -> dict:
    """Where :func:`ktae.eval.runner.load_records` reads benchmark ``name`` from (same
    arguments); see the module docstring."""
    if name == "embedded":
        return {"source": "embedded", "split": split or "test", "seed": 0}
    if name == "arith":
        return {"source": "arith", "split": split or "eval", "seed": EVAL_SEED,
                "difficulty": DEFAULT_DIFFICULTY}
    if fixtures:
        path = choice.fixture_path(name) if name in choice.CHOICE_BENCHMARKS \
            else fixture_path(name)
        return {"source": "fixture", "file": str(path), "content_sha256": file_sha256(path)}
    if data_dir is not None:
        return _local(Path(data_dir), name)
    spec = BENCHMARKS.get(name) or choice.CHOICE_BENCHMARKS[name]
    return {"source": "hub", "hub_path": spec.hub_path, "config": spec.hub_config,
            "split": split or spec.split, "revision": _hub_revision(spec.hub_path)}
