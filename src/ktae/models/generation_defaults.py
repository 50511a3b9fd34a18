"""How a model is meant to be prompted: ``ktae_generation.json`` in its directory.

A model trained by ``ktae train`` (its ``final/`` and checkpoint directories) and the
shipped default model carry ``{"template": "compact", "max_new_tokens": 40}``: the prompt
template and response budget they were trained with. ``ktae eval`` and
:func:`ktae.eval.evaluate` use them unless told otherwise, so a model is evaluated the
way it was trained. This module is the one place that knows the file's format: writers
call :func:`save_generation_defaults`, readers :func:`generation_defaults` (or
:func:`resolve_generation`, which also applies the caller's overrides).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

GENERATION_FILE = "ktae_generation.json"
SAVED_TEMPLATES = ("compact", "qwen-math", "chat", "qwen-math-system", "ktae-train", "dapo",
                   "raw")
"""Templates a model can be saved with (``auto`` is decided at evaluation time)."""
FALLBACK_TEMPLATE = "auto"
FALLBACK_MAX_NEW_TOKENS = 1024
"""Used for models without the file (real models: chat or Qwen-Math prompt, long answers)."""


def _check_template(value, where: str) -> str:
    if not isinstance(value, str) or value not in SAVED_TEMPLATES:
        raise ValueError(f"{where}: expected one of {SAVED_TEMPLATES}, got {value!r}")
    return value


def _check_max_new_tokens(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: expected a positive integer, got {value!r}")
    return value


def generation_defaults(model_path) -> dict:
    """``{"template": ..., "max_new_tokens": ...}`` saved with the model at ``model_path``.

    Returns ``{}`` when ``model_path`` is None, not a local directory (a hub id), or has no
    :data:`GENERATION_FILE`. Keys the file does not set are absent; unknown keys are
    ignored. A file that is not a JSON object with valid values raises ``ValueError``
    naming the file and the key.
    """
    if model_path is None:
        return {}
    path = Path(model_path) / GENERATION_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    out = {}
    if "template" in data:
        out["template"] = _check_template(data["template"], f"{path}: template")
    if "max_new_tokens" in data:
        out["max_new_tokens"] = _check_max_new_tokens(data["max_new_tokens"],
                                                      f"{path}: max_new_tokens")
    return out


def save_generation_defaults(directory, *, template: str, max_new_tokens: int) -> Path:
    """Write :data:`GENERATION_FILE` into the model ``directory`` (atomically); returns its
    path. ``template``: one of :data:`SAVED_TEMPLATES`; ``max_new_tokens``: the response
    budget the model was trained with."""
    data = {"template": _check_template(template, "template"),
            "max_new_tokens": _check_max_new_tokens(max_new_tokens, "max_new_tokens")}
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"directory: expected an existing model directory, got {directory}")
    path = directory / GENERATION_FILE
    tmp = directory / f".{GENERATION_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class GenerationChoice:
    """The template and budget an evaluation uses, and where each came from: ``"given"``
    (the caller), the path of the model's :data:`GENERATION_FILE`, or ``"default"``."""

    template: str
    max_new_tokens: int
    template_source: str
    max_new_tokens_source: str

    def describe(self) -> str:
        """One line for the console, e.g. ``template compact, 40 new tokens (from ...)``."""
        if self.template_source == self.max_new_tokens_source:
            return (f"template {self.template}, at most {self.max_new_tokens} new tokens "
                    f"({_source_words(self.template_source)})")
        return (f"template {self.template} ({_source_words(self.template_source)}), "
                f"at most {self.max_new_tokens} new tokens "
                f"({_source_words(self.max_new_tokens_source)})")


def _source_words(source: str) -> str:
    if source in ("given", "default") or source.startswith("protocol "):
        return source
    return f"from {source}"


def resolve_generation(model_path, *, template: str | None = None,
                       max_new_tokens: int | None = None) -> GenerationChoice:
    """What to generate with: the caller's values where given (not None), else the model's
    :data:`GENERATION_FILE`, else ``auto`` and :data:`FALLBACK_MAX_NEW_TOKENS`."""
    saved = generation_defaults(model_path)
    file = str(Path(model_path) / GENERATION_FILE) if saved else None

    def pick(given, key, fallback):
        if given is not None:
            return given, "given"
        if key in saved:
            return saved[key], file
        return fallback, "default"

    t, t_src = pick(template, "template", FALLBACK_TEMPLATE)
    n, n_src = pick(max_new_tokens, "max_new_tokens", FALLBACK_MAX_NEW_TOKENS)
    return GenerationChoice(t, n, t_src, n_src)
