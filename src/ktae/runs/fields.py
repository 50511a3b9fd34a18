"""Typed values for config fields: checked from YAML, parsed from command-line text.

``ktae train`` reads settings from three places: YAML files (values already typed by the
YAML parser), command-line flags and ``--trl KEY=VALUE`` pairs (text). Both paths check a
value against the field's type annotation, so a wrong type is a one-line error naming the
field instead of a traceback later (or, worse, a silent misreading: ``"no"`` is a truthy
string). Booleans are strict: only ``true``/``false`` (YAML) or ``true``/``false``/``1``/``0``
(text) count, and ``null`` (or ``none`` for a field that takes no string) is None.

Supported annotations: ``bool``, ``int``, ``float``, ``str``, ``None``, unions of these
(``X | None``), ``list[X]``, ``dict[...]``, ``Literal[...]``, ``Any`` and ``enum.Enum``
subclasses (given by value or name, as strings).

A field's ``ktae train`` flag is declared next to it, in its metadata (:func:`flag`);
:mod:`ktae.train.flags` reads the flags from there.
"""

from __future__ import annotations

import difflib
import enum
import math
import types
import typing
from typing import Any

_NONE_TEXT = ("none", "null", "~")
_TRUE_TEXT = ("true", "1")
_FALSE_TEXT = ("false", "0")


class FieldError(ValueError):
    """A value that does not fit its field's type (the message names the field)."""


def closest(name: str, candidates, n: int = 3) -> str:
    """``"; did you mean 'a', 'b'?"`` for the candidates closest to ``name`` (or "")."""
    hits = difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.6)
    return f"; did you mean {', '.join(repr(h) for h in hits)}?" if hits else ""


FLAG_KINDS = ("value", "switch", "on_off", "pairs", "list")
"""How a flag sets its field: ``value`` (``--max-steps 100``, typed as the field), ``switch``
(a flag alone sets the opposite of the default: ``--resume``, ``--no-progress``), ``on_off``
(``--NAME`` and ``--no-NAME``), ``pairs`` (repeatable ``KEY=VALUE`` into a mapping),
``list`` (comma-separated names)."""


def flag(help: str, *, name: str | None = None, kind: str = "value", short: str | None = None,
         metavar: str | None = None, off_help: str | None = None) -> dict:
    """Field metadata declaring the field's command-line flag: its ``help`` text, its
    ``name`` (default: ``--`` and the field name with dashes), how it sets the field
    (:data:`FLAG_KINDS`), a ``short`` alias, the ``metavar`` of ``pairs`` (default
    ``KEY=VALUE``) and, for ``on_off``, the help of ``--no-NAME``."""
    if kind not in FLAG_KINDS:
        raise ValueError(f"kind: expected one of {FLAG_KINDS}, got {kind!r}")
    return {"flag": {"help": help, "name": name, "kind": kind, "short": short,
                     "metavar": metavar, "off_help": off_help}}


def value_type(hint) -> type:
    """``int``/``float``/``str`` of an annotation such as ``float | None``: what the text
    of a value flag is read as."""
    members = [m for m in typing.get_args(hint) or (hint,) if m is not type(None)]
    (only,) = members
    return only


def _members(hint) -> tuple:
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return typing.get_args(hint)
    return (hint,)


def describe(hint) -> str:
    """A short human name of a type annotation (``"a number or null"``)."""
    names = []
    for m in _members(hint):
        origin = typing.get_origin(m)
        if m is type(None):
            names.append("null")
        elif m is bool:
            names.append("true/false")
        elif m is int:
            names.append("an integer")
        elif m is float:
            names.append("a number")
        elif m is str:
            names.append("a string")
        elif origin is list or m is list:
            names.append("a list")
        elif origin is dict or m is dict:
            names.append("a mapping")
        elif origin is typing.Literal:
            names.append("one of " + ", ".join(repr(a) for a in typing.get_args(m)))
        elif isinstance(m, type) and issubclass(m, enum.Enum):
            names.append("one of " + ", ".join(repr(e.value) for e in m))
        else:
            names.append(getattr(m, "__name__", str(m)))
    return " or ".join(dict.fromkeys(names))


def _float_from(value) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        out = float(value)
    elif isinstance(value, str):
        try:  # YAML 1.1 reads "3e-5" (no dot) as a string
            out = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return out if math.isfinite(out) else None


def _one(value, hint):
    """``(ok, converted)`` for one non-union annotation."""
    origin = typing.get_origin(hint)
    if hint is Any or hint is object:
        return True, value
    if hint is type(None):
        return value is None, None
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return True, value
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        return False, None
    if hint is float:
        out = _float_from(value)
        return out is not None, out
    if hint is str:
        if isinstance(value, str):
            return True, value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True, str(value)
        return False, None
    if origin is typing.Literal:
        return value in typing.get_args(hint), value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        for e in hint:
            if value in (e, e.value, e.name):
                return True, e.value
        return False, None
    if origin is list or hint is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            return False, None
        (item,) = typing.get_args(hint) or (Any,)
        out = []
        for v in value:
            ok, conv = _check(v, item)
            if not ok:
                return False, None
            out.append(conv)
        return True, out
    if origin is dict or hint is dict:
        return isinstance(value, dict), value
    return False, None


def _check(value, hint):
    for member in _members(hint):
        ok, conv = _one(value, member)
        if ok:
            return True, conv
    return False, None


def check_value(name: str, value, hint):
    """``value`` converted to ``hint`` (ints to floats, numeric strings to floats).

    Raises:
        FieldError: the value does not fit (names the field and the expected type).
    """
    ok, conv = _check(value, hint)
    if not ok:
        raise FieldError(f"{name}: expected {describe(hint)}, got {value!r} "
                         f"({type(value).__name__})")
    return conv


def _text_candidates(text: str, hint) -> list:
    """Typed readings of command-line ``text`` worth trying against ``hint``."""
    members = _members(hint)
    low = text.strip().lower()
    out: list = []
    # "null"/"~" always read as None; "none" only where the field takes no string
    # (``report_to=none`` is the string transformers expects)
    if type(None) in members and (low in _NONE_TEXT[1:] or (low == "none" and str not in members)):
        out.append(None)
    if bool in members and low in _TRUE_TEXT + _FALSE_TEXT:
        out.append(low in _TRUE_TEXT)
    if any(m in (int, float) for m in members):
        for conv in (int, float):
            try:
                out.append(conv(text.strip()))
            except ValueError:
                pass
    if any(typing.get_origin(m) in (list, dict) or m in (list, dict) for m in members):
        import yaml

        try:
            parsed = yaml.safe_load(text)
        except yaml.YAMLError:
            parsed = None
        if isinstance(parsed, list | dict):
            out.append(parsed)
    out.append(text)
    if any(typing.get_origin(m) is list or m is list for m in members):
        parts = [t.strip() for t in text.split(",") if t.strip()]
        out.append(parts)  # "a,b" for a list
        try:
            out.append([int(t) for t in parts])  # "24,30" for a list of integers
        except ValueError:
            pass
    return out


def parse_text(name: str, text: str, hint):
    """Read command-line ``text`` as a value of ``hint`` (``"true"``, ``"3e-5"``, ``"a,b"``).

    Raises:
        FieldError: no reading of the text fits the type.
    """
    for candidate in _text_candidates(text, hint):
        if bool in _members(hint) and isinstance(candidate, str) and str not in _members(hint):
            continue
        ok, conv = _check(candidate, hint)
        if ok:
            return conv
    raise FieldError(f"{name}: expected {describe(hint)}, got {text!r}")
