"""``ktae train``: GRPO / DAPO / Dr.GRPO with KTAE or TACO credit, on TRL.

With no arguments: the embedded arithmetic task, the warm-started tiny model that ships
inside the package, DAPO with KTAE credit, on CPU in fp32. Command-line
flags override a ``--config`` YAML, which overrides the defaults of
:class:`ktae.runs.config.TrainConfig`. Multi-GPU: ``accelerate launch -m ktae train ...``
(see docs/training.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys
import time
import typing
from pathlib import Path

from ktae import cli_common  # read at call time: tests stand in for set_interrupt_hint
from ktae.core.calibration import CALIBRATIONS
from ktae.core.estimators import ADVANTAGE_ESTIMATORS
from ktae.core.methods import option_value, setting_aliases
from ktae.plugins import PLUGIN_FLAG, split_plugin_args
from ktae.runs.config import ALGOS, TrainConfig
from ktae.runs.credit import credit_settings, parse_arm
from ktae.runs.fields import parse_text
from ktae.train.flags import TRAIN_FLAGS
from ktae.train.trl_args import parse_trl_pairs
from ktae.train.trl_version import UnsupportedTRLError, check_trl


def _shown(value) -> str:
    return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) \
        else str(value)


def default_texts() -> dict[str, str]:
    """``TrainConfig`` field -> the default its help shows: the field's own, the value
    :meth:`TrainConfig.resolve` gives each ``--algo`` (``depends on --algo: ...``), or, for
    a credit method's setting left None, the method's own default (its alias's
    ``default_text``, else the signatures of the methods it reaches)."""
    base = TrainConfig()
    per_algo = {a: dataclasses.replace(base, algo=a).resolve() for a in ALGOS}
    out = {}
    for f in dataclasses.fields(TrainConfig):
        value = getattr(base, f.name)
        if value is not None:
            out[f.name] = f"default {_shown(value)}"
            continue
        resolved = {a: getattr(c, f.name) for a, c in per_algo.items()}
        if f.name in ("output_dir", "model", "eval_task", "lora_alpha"):
            continue  # their help says it
        if f.name == "template":
            out[f.name] = ("default compact for the shipped tiny model, else chat for chat "
                           "prompts, the reward's own (dapo) or qwen-math")
        elif len(set(map(str, resolved.values()))) > 1:
            longer = dataclasses.replace(base, max_new_tokens=10 * base.max_new_tokens)
            parts = []
            for a, v in resolved.items():
                scaled = getattr(dataclasses.replace(longer, algo=a).resolve(), f.name)
                ratio = "" if scaled == v else f" (--max-new-tokens x {scaled / longer.max_new_tokens:g})"
                parts.append(f"{a} {_shown(v)}{ratio}")
            out[f.name] = "default depends on --algo: " + ", ".join(parts)
        elif next(iter(resolved.values())) is not None:
            out[f.name] = f"default {_shown(next(iter(resolved.values())))}"
    for record, alias in setting_aliases():
        if not alias.declared or alias.default is not None:
            continue
        if alias.default_text is not None:
            out[alias.name] = alias.default_text
            continue
        found = {}
        for other in _registry(record).records():
            if other.name != record.name and not alias.shared:
                continue
            param = inspect.signature(other.fn).parameters.get(alias.option)
            if param is not None and param.default is not inspect.Parameter.empty:
                found.setdefault(param.default, []).append(other.name)
        if len(found) == 1:
            out[alias.name] = f"default {next(iter(found))}"
        elif found:
            out[alias.name] = "default depends on the calibration: " + "; ".join(
                f"{v} ({', '.join(names)})" for v, names in found.items())
    return out


def _registry(record):
    return CALIBRATIONS if record.kind == CALIBRATIONS.kind else ADVANTAGE_ESTIMATORS


def _list_reader(name: str, hint):
    """argparse's ``type`` of a comma-separated list flag: its items read as ``hint``'s
    (:func:`ktae.runs.fields.parse_text`), a bad item an error naming the field."""
    def read(text: str):
        try:
            return parse_text(name, text, hint)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    read.__name__ = name
    return read


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``ktae train`` flags: one per ``TrainConfig`` field, as its metadata
    declares it (:mod:`ktae.train.flags`; defaults: see ``TrainConfig``)."""
    parser.add_argument("--config", help="YAML/JSON file of TrainConfig fields")
    texts = default_texts()
    hints = typing.get_type_hints(TrainConfig)
    for f in TRAIN_FLAGS:
        shown = f" ({texts[f.dest]})" if f.dest in texts else ""
        names = (f.short, f.name) if f.short else (f.name,)
        if f.kind == "value":
            parser.add_argument(*names, dest=f.dest, type=f.type, default=None,
                                help=f.help + shown)
        elif f.kind == "switch":  # the flag alone sets the opposite of the default
            parser.add_argument(*names, dest=f.dest, default=None, help=f.help,
                                action="store_false" if getattr(TrainConfig, f.dest) else "store_true")
        elif f.kind == "on_off":
            group = parser.add_mutually_exclusive_group()
            group.add_argument(*names, dest=f.dest, action="store_true", default=None,
                               help=f.help + shown)
            group.add_argument("--no-" + f.name[2:], dest=f.dest, action="store_false",
                               help=f.off_help)
        elif f.kind == "list":  # comma-separated, each item read as the field's type
            parser.add_argument(*names, dest=f.dest, default=None, help=f.help,
                                type=_list_reader(f.dest, hints[f.dest]))
        else:  # pairs: read by config_from_args
            parser.add_argument(*names, dest=f"{f.dest}_pairs", action="append", default=None,
                                metavar=f.metavar or "KEY=VALUE", help=f.help)


def _option_pairs(flag: str, pairs: list[str]) -> dict:
    """``["top=0.5"]`` -> ``{"top": 0.5}`` (values read as a method's settings are:
    :func:`ktae.core.methods.option_value`)."""
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag}: expected KEY=VALUE, got {pair!r}")
        out[key.strip()] = option_value(text)
    return out


def _data_pairs(flag: str, pairs: list[str], split: bool) -> dict:
    """``["level=Level 3,Level 4"]`` -> ``{"level": ["Level 3", "Level 4"]}`` (``split``),
    ``["problem=query"]`` -> ``{"problem": "query"}``; a key given twice is an error."""
    out: dict = {}
    for pair in pairs:
        key, sep, text = (p.strip() for p in pair.partition("="))
        if not sep or not key or not text:
            raise ValueError(f"{flag}: expected {'COLUMN=V1,V2' if split else 'FIELD=COLUMN'}, "
                             f"got {pair!r}")
        if key in out:
            raise ValueError(f"{flag}: {key} given twice; give all its values in one "
                             f"{flag} {key}=V1,V2" if split else f"{flag}: {key} given twice")
        out[key] = [v.strip() for v in text.split(",") if v.strip()] if split else text
    return out


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Defaults < ``--config`` file < explicit flags; resolved and validated (types, ranges,
    credit options, TRL settings; see :func:`ktae.train.session.preflight` for the rest)."""
    cfg = TrainConfig.from_file(args.config) if getattr(args, "config", None) else TrainConfig()
    overrides = {}
    for f in dataclasses.fields(TrainConfig):
        value = getattr(args, f.name, None)
        if value is not None:
            overrides[f.name] = value
    for f in TRAIN_FLAGS:
        pairs = getattr(args, f"{f.dest}_pairs", None) if f.kind == "pairs" else None
        if not pairs:
            continue
        if f.dest == "trl":
            parsed = parse_trl_pairs(pairs)
        elif f.dest in ("task_fields", "task_filters"):
            parsed = _data_pairs(f.name, pairs, split=f.dest == "task_filters")
        else:
            parsed = _option_pairs(f.name, pairs)
        overrides[f.dest] = {**getattr(cfg, f.dest), **parsed}
    cfg = credit_with_settings(dataclasses.replace(cfg, **overrides)).resolve()
    credit_settings(cfg)  # unknown credit names and options fail here, before any model loads
    return cfg


def credit_with_settings(cfg: TrainConfig) -> TrainConfig:
    """``credit: ktae@ngram=3`` (flag or config file) read as ``ktae compare`` reads one
    entry (:func:`ktae.runs.credit.parse_arm`): ``credit: ktae`` with ``ktae_ngram: 3``;
    a KEY that is no setting is an option of the estimator or calibration. A setting also
    given its own value (flag, field or option) is a one-line error."""
    if "@" not in str(cfg.credit):
        return cfg
    arm = parse_arm(cfg.credit)
    changes: dict = {"credit": arm.credit}
    defaults = TrainConfig()
    for key, value in arm.overrides.items():
        if key in ("estimator_options", "calibration_options"):
            both = sorted(set(getattr(cfg, key)) & set(value))
            if both:
                raise ValueError(f"credit: {both[0]!r} is set in {cfg.credit!r} and in {key}")
            changes[key] = {**getattr(cfg, key), **value}
        elif getattr(cfg, key) != getattr(defaults, key):
            raise ValueError(f"credit: {key} is set in {cfg.credit!r} and as "
                             f"{key} = {getattr(cfg, key)!r}; give it once")
        else:
            changes[key] = value
    if cfg.output_dir is None:
        changes["output_dir"] = f"runs/{cfg.algo}-{arm.dirname}-seed{cfg.seed}"
    return dataclasses.replace(cfg, **changes)


def resume_command(output_dir: str, argv: list[str] | None = None) -> str:
    """The command line that continues this run: the same flags, ``--resume -o DIR``;
    a ``--plugin`` given before ``train`` stays before it."""
    import shlex

    argv = list(sys.argv[1:] if argv is None else argv)
    at = argv.index("train") + 1 if "train" in argv else 0
    # ``ktae --plugin X train ...``: the rules the run's credit names must load again
    plugins, _ = split_plugin_args(argv[:max(at - 1, 0)])
    kept, skip = [], False
    for arg in argv[at:]:
        if skip:
            skip = False
        elif arg in ("-o", "--output-dir"):
            skip = True
        elif arg != "--resume" and not arg.startswith("--output-dir="):
            kept.append(arg)
    before = [x for p in plugins for x in (PLUGIN_FLAG, p)]
    return shlex.join(["ktae", *before, "train", *kept, "--resume", "-o", str(output_dir)])


def run(args: argparse.Namespace) -> int:
    """Entry point of ``ktae train``."""
    try:  # the arguments first: trl and transformers load only once they are right
        cfg = config_from_args(args)
        cli_common.check_counts(cfg, {"torch_threads": "--threads"})  # --config files included
        cli_common.check_output_dir(cfg.output_dir)
    except ValueError as err:
        print(f"ktae train: {err}", file=sys.stderr)
        return 2
    try:  # the TRL release next, before the trainer's module imports it
        check_trl()
    except UnsupportedTRLError as err:
        print(f"ktae train: {err}", file=sys.stderr)
        return 2
    # TRL and transformers: imported once the arguments are right (``ktae train --help``
    # stays light)
    from ktae.train.session import plan_run, preflight, train
    from ktae.train.trainer import DiskFullError

    try:
        checked = preflight(cfg)
        plan = plan_run(cfg)
    except ValueError as err:
        print(f"ktae train: {err}", file=sys.stderr)
        return 2
    if plan.complete:
        print(f"ktae train: --resume: {cfg.output_dir} is complete ({cfg.max_steps} steps); "
              "nothing to do", file=sys.stderr)
        return 0
    if cfg.bf16:
        print(f"ktae train: {checked.precision}", file=sys.stderr)
    cli_common.set_interrupt_hint(f"continue with: {resume_command(cfg.output_dir)}")
    start = time.perf_counter()
    try:
        summary = train(cfg, checked=checked)
    except DiskFullError as err:
        print(f"ktae train: {err.strerror}", file=sys.stderr)
        return 1
    if summary.get("is_main", True):
        before, after = summary.get("heldout_before"), summary.get("heldout_after")
        out = Path(cfg.output_dir)
        print(f"ktae train: {summary['steps']} steps in {time.perf_counter() - start:.0f} s; "
              f"held-out accuracy {_pct(before)} -> {_pct(after)}; run directory: {out}")
    return 0


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"
