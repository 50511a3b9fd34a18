"""The ``ktae train`` flags, read from the metadata of :class:`ktae.runs.config.TrainConfig`'s
fields (:func:`ktae.runs.fields.flag`): a field's flag name, help text and type are
written once, next to the field, and ``ktae train``, ``ktae compare`` and the resume
messages read them here.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import NamedTuple

from ktae.runs.config import TrainConfig
from ktae.runs.fields import value_type


class Flag(NamedTuple):
    """One command-line flag of a :class:`TrainConfig` field."""

    name: str
    """The flag (``--lr``)."""
    dest: str
    """The field it sets (``learning_rate``)."""
    type: type | None
    """What a ``value`` flag's text is read as (``int``, ``float`` or ``str``; None for the
    other kinds)."""
    help: str
    """The help text (without the default, which ``ktae train --help`` adds)."""
    kind: str = "value"
    """How it sets the field (:data:`ktae.runs.fields.FLAG_KINDS`)."""
    short: str | None = None
    """A short alias (``-o``), or None."""
    metavar: str | None = None
    """The metavar of a ``pairs`` flag."""
    off_help: str | None = None
    """The help of ``--no-NAME`` (``on_off``)."""


def _flags() -> tuple[Flag, ...]:
    hints = typing.get_type_hints(TrainConfig)
    out = []
    for f in dataclasses.fields(TrainConfig):
        spec = f.metadata.get("flag")
        if spec is None:
            continue
        kind = spec["kind"]
        out.append(Flag(name=spec["name"] or "--" + f.name.replace("_", "-"), dest=f.name,
                        type=value_type(hints[f.name]) if kind == "value" else None,
                        help=spec["help"], kind=kind, short=spec["short"],
                        metavar=spec["metavar"], off_help=spec["off_help"]))
    return tuple(out)


TRAIN_FLAGS: tuple[Flag, ...] = _flags()
"""Every flag of a :class:`TrainConfig` field, in field order."""

VALUE_FLAGS: tuple[Flag, ...] = tuple(f for f in TRAIN_FLAGS if f.kind == "value")
"""The flags that take a typed value (``--max-steps 100``)."""


def flag_names() -> dict[str, str]:
    """Field -> its value flag without the dashes (``{"learning_rate": "lr", ...}``)."""
    return {f.dest: f.name.lstrip("-") for f in VALUE_FLAGS}
