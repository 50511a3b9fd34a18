"""Which ``checkpoint-N`` directories of a ``ktae train`` run are complete.

The reading side of the trainer's checkpoint protocol, shared by every command that reads
a run directory (``ktae train --resume``, ``ktae eval --checkpoints``, ``ktae explain``):
standard library only, so that evaluation and the explainers need not import the trainer.
The writing side (claiming a directory, writing the marker last, rotation) is
:mod:`ktae.runs.rundir`.

A checkpoint is complete when it holds :data:`COMPLETE_MARKER`, which the trainer writes
last (write-to-temp + fsync + rename), every file the marker lists, and
``trainer_state.json``; a checkpoint cut short by a kill, or whose weights were removed
since, is not.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

COMPLETE_MARKER = "ktae_checkpoint.json"
"""File written last into a checkpoint directory once it is complete."""

CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
"""Name of a checkpoint directory; group 1 is its global step."""


def is_complete_checkpoint(folder: str | os.PathLike) -> bool:
    """True when ``folder`` holds the marker and every file the marker lists."""
    folder = Path(folder)
    marker = folder / COMPLETE_MARKER
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(info, dict) or not isinstance(info.get("files"), list):
        return False
    return all((folder / name).is_file() for name in info["files"]) and \
        (folder / "trainer_state.json").is_file()


def checkpoint_dirs(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``checkpoint-N`` directory of ``output_dir``, complete or
    not, by step (empty when ``output_dir`` is not a directory)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in output_dir.iterdir()
                  if (m := CHECKPOINT_NAME.match(p.name)) and p.is_dir())


def latest_complete_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The complete ``checkpoint-N`` with the largest N in ``output_dir``, or None."""
    found = [p for _, p in checkpoint_dirs(output_dir) if is_complete_checkpoint(p)]
    return found[-1] if found else None


def checkpoint_step(folder: str | os.PathLike) -> int:
    """Global step of a checkpoint directory (from its marker)."""
    return int(json.loads((Path(folder) / COMPLETE_MARKER).read_text())["step"])
