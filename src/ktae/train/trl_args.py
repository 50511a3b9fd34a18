"""``--trl KEY=VALUE`` / the ``trl:`` mapping: any other ``trl.GRPOConfig`` setting.

``ktae train`` builds TRL's ``GRPOConfig`` from :class:`ktae.runs.config.TrainConfig`
(:func:`ktae.train.session.grpo_config`). Every other GRPOConfig field (vLLM generation,
gradient checkpointing, DeepSpeed/FSDP, logging, ...) can be set here, checked against the
field's own type annotation in TRL 1.16 before any model loads. There is one way to set
each thing: fields that ``ktae train`` owns are refused with the flag to use instead, and
settings whose effect ktae replaces (TRL's advantage computation) are refused or warned
about at start-up.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
import warnings

from ktae.runs.fields import FieldError, check_value, closest, parse_text

#: GRPOConfig field -> what to use instead (ktae owns it).
OWNED = {
    "output_dir": "--output-dir",
    "max_steps": "--max-steps",
    "num_train_epochs": "--max-steps",
    "seed": "--seed",
    "per_device_train_batch_size": "--num-prompts (with --num-generations; the global batch is "
                                   "num_prompts * num_generations responses)",
    "generation_batch_size": "--num-prompts (one generation batch per optimizer step)",
    "steps_per_generation": "gradient_accumulation_steps (ktae generates one batch per "
                            "optimizer step)",
    "num_generations": "--num-generations",
    "max_completion_length": "--max-new-tokens",
    "temperature": "--temperature",
    "learning_rate": "--lr",
    "lr_scheduler_type": "--lr-scheduler",
    "warmup_steps": "--warmup-steps",
    "beta": "--beta",
    "epsilon": "--clip-low",
    "epsilon_high": "--clip-high",
    "loss_type": "--loss-type",
    "bf16": "--bf16",
    "save_steps": "--save-every",
    "save_strategy": "--save-every",
    "eval_strategy": "--eval-every (ktae runs its own held-out evaluation)",
    "remove_unused_columns": "nothing: ktae needs the dataset's answer column",
    "disable_tqdm": "--no-progress",
}

#: GRPOConfig fields whose effect ktae replaces: setting them only warns.
NO_EFFECT = {
    "scale_rewards": "ktae computes the advantages (--credit, --advantage-base)",
    "multi_objective_aggregation": "ktae sums the weighted rewards and computes the "
                                   "advantages itself (--credit)",
}


@functools.cache
def _grpo_fields() -> dict[str, typing.Any]:
    from trl import GRPOConfig

    hints = typing.get_type_hints(GRPOConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(GRPOConfig) if f.init}


def _check_name(name: str) -> typing.Any:
    fields = _grpo_fields()
    if name in OWNED:
        raise ValueError(f"trl: {name} is set by ktae train; use {OWNED[name]}")
    if name not in fields:
        raise ValueError(f"trl: {name!r} is not a trl.GRPOConfig field{closest(name, fields)}")
    return fields[name]


def parse_trl_pairs(pairs: list[str]) -> dict[str, typing.Any]:
    """``["use_vllm=true", "logging_steps=5"]`` -> typed, checked values.

    Raises:
        ValueError: a pair without ``=``, an owned or unknown field, a badly typed value.
    """
    out: dict[str, typing.Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"trl: expected KEY=VALUE, got {pair!r}")
        hint = _check_name(name)
        try:
            out[name] = parse_text(f"trl: {name}", text, hint)
        except FieldError as err:
            raise ValueError(str(err)) from None
    return out


def check_trl_settings(settings: dict[str, typing.Any]) -> dict[str, typing.Any]:
    """Check a ``trl:`` mapping (typed values, e.g. from YAML); returns converted values.

    Warns once per setting that has no effect under ktae (``scale_rewards``, ...).
    """
    out = {}
    for name, value in settings.items():
        hint = _check_name(str(name))
        try:
            out[name] = check_value(f"trl: {name}", value, hint)
        except FieldError as err:
            raise ValueError(str(err)) from None
    if "report_to" in out:
        _check_report_to(out["report_to"])
    for name in sorted(set(out) & set(NO_EFFECT)):
        warnings.warn(f"trl: {name} has no effect under ktae train: {NO_EFFECT[name]}",
                      stacklevel=2)
    return out


def _check_report_to(value) -> None:
    """Every ``report_to`` integration is one transformers knows and is installed (else
    the trainer would fail only after the model has loaded)."""
    from transformers.integrations import integration_utils

    names = [value] if isinstance(value, str) else list(value or [])
    known = integration_utils.INTEGRATION_TO_CALLBACK
    for name in names:
        if name in ("none", "all"):
            continue
        if name not in known:
            raise ValueError(f"trl: report_to: {name!r} is not a logging integration of "
                             f"transformers{closest(name, list(known))}")
        available = getattr(integration_utils, f"is_{name}_available", None)
        if available is not None and not available():
            raise ValueError(f"trl: report_to: {name!r} needs its package installed "
                             f"(e.g. pip install {name})")
