"""``ktae train``: GRPO / DAPO / Dr.GRPO with KTAE or TACO credit, on TRL.

With no arguments: the embedded arithmetic task, the warm-started tiny model that ships
inside the package, DAPO with KTAE credit, on CPU in fp32. Command-line
flags override a ``--config`` YAML, which overrides the defaults of
:class:`ktae.train.config.TrainConfig`. Multi-GPU: ``accelerate launch -m ktae train ...``
(see docs/training.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys
import time
from pathlib import Path

from ktae.rewards.registry import REWARDS
from ktae.train.config import ALGOS, TrainConfig
from ktae.train.credit import credit_settings

# flag -> (TrainConfig field, type, help); defaults come from TrainConfig
_FLAGS = [
    ("--model", "model", str, "local path or hub id (default: the warm-started tiny model "
     "shipped inside ktae)"),
    ("--task", "task", str, "embedded | math500 | jsonl:PATH | json:PATH | parquet:PATH | "
     "a save_to_disk DIR[@SPLIT] | hf:NAME[:CONFIG][@SPLIT] (verl, MATH or question/answer "
     "schema)"),
    ("--eval-task", "eval_task", str, "held-out problems, a source as --task or math500 "
     "(default: the task's last fifth)"),
    ("--template", "template", str, "prompt template: compact | qwen-math | chat | "
     "qwen-math-system | ktae-train | dapo | raw (docs/training.md)"),
    ("--reward", "reward", str, f"reward of a response: {' | '.join(REWARDS)}"),
    ("--algo", "algo", str, f"one of {', '.join(ALGOS)}"),
    ("--credit", "credit", str, "none | ktae | taco | any estimator/calibration | est+calib"),
    ("--seed", "seed", int, "random seed"),
    ("--output-dir", "output_dir", str, "run directory (default runs/ALGO-CREDIT-seedS)"),
    ("--max-steps", "max_steps", int, "optimizer steps"),
    ("--num-prompts", "num_prompts", int, "prompts per step"),
    ("--num-generations", "num_generations", int, "responses per prompt (group size G)"),
    ("--max-new-tokens", "max_new_tokens", int, "response length budget L_max"),
    ("--temperature", "temperature", float, "sampling temperature"),
    ("--lr", "learning_rate", float, "learning rate"),
    ("--lr-scheduler", "lr_scheduler", str, "constant | cosine | linear | ..."),
    ("--warmup-steps", "warmup_steps", int, "linear warmup steps (optimizer steps)"),
    ("--warmup-ratio", "warmup_ratio", float, "linear warmup over this share of --max-steps "
     "(instead of --warmup-steps)"),
    ("--beta", "beta", float, "KL coefficient (0 = no reference model)"),
    ("--clip-low", "clip_low", float, "lower clip epsilon"),
    ("--clip-high", "clip_high", float, "upper clip epsilon (DAPO clip-higher)"),
    ("--loss-type", "loss_type", str, "loss aggregation: grpo | dapo | dr_grpo | bnpo"),
    ("--advantage-base", "advantage_base", str, "baseline under KTAE: grpo | drgrpo | rloo"),
    ("--max-generation-rounds", "max_generation_rounds", int, "dynamic sampling round bound"),
    ("--overlong-buffer", "overlong_buffer", int, "overlong shaping cache L_c (0 = off)"),
    ("--overlong-factor", "overlong_factor", float, "overlong penalty factor"),
    ("--ktae-h1", "ktae_h1", float, "KTAE Fisher weight h1"),
    ("--ktae-h2", "ktae_h2", float, "KTAE information-gain weight h2"),
    ("--ktae-h3", "ktae_h3", float, "KTAE term-frequency weight h3"),
    ("--ktae-mode", "ktae_mode", str, "exact | reference"),
    ("--ktae-ngram", "ktae_ngram", int, "KTAE span length N (1 = key tokens; docs/ngram.md)"),
    ("--ktae-ngram-reduce", "ktae_ngram_reduce", str, "span values -> token value: mean | maxabs"),
    ("--taco-alpha", "taco_alpha", float, "TACO tail threshold alpha"),
    ("--taco-lambda", "taco_lambda", float, "TACO damping lambda"),
    ("--eval-every", "eval_every", int, "held-out eval every N steps (0 = before/after only)"),
    ("--eval-size", "eval_size", int, "held-out problems per eval"),
    ("--save-every", "save_every", int, "checkpoint every N steps (0 = at the end)"),
    ("--save-total-limit", "save_total_limit", int, "complete checkpoints kept (0 = all)"),
    ("--train-size", "train_size", int, "embedded training problems"),
    ("--threads", "torch_threads", int, "torch CPU threads"),
    ("--rollout-every", "rollout_every", int, "keep rollouts for ktae explain every N steps (0 = off)"),
    ("--rollout-groups", "rollout_groups", int, "groups kept per recorded step"),
    ("--no-signal-steps", "no_signal_steps", int, "warn after this many steps with every group "
     "all right or all wrong, or most responses truncated (0 = never)"),
    ("--lora-r", "lora_r", int, "LoRA rank (0 = full fine-tuning; needs the peft extra)"),
    ("--lora-alpha", "lora_alpha", float, "LoRA alpha (default 2 * r)"),
    ("--lora-dropout", "lora_dropout", float, "LoRA dropout"),
]

# repeatable KEY=VALUE flags -> (TrainConfig mapping field, help)
_PAIR_FLAGS = [
    ("--trl", "trl", "any other trl.GRPOConfig field, e.g. --trl use_vllm=true (repeatable)"),
    ("--estimator-option", "estimator_options",
     "an option of the advantage estimator, e.g. --estimator-option top=0.5 (repeatable)"),
    ("--calibration-option", "calibration_options",
     "an option of the calibration, e.g. --calibration-option top_fraction=0.3 (repeatable)"),
]


def _shown(value) -> str:
    return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) \
        else str(value)


def default_texts() -> dict[str, str]:
    """``TrainConfig`` field -> the default its help shows: the field's own, the value
    :meth:`TrainConfig.resolve` gives each ``--algo`` (``depends on --algo: ...``), or the
    credit method's own default for the option fields left None."""
    import ktae
    from ktae.core.ktae_options import PAPER_DEFAULTS, RUNTIME_DEFAULTS

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
    for h in ("h1", "h2", "h3"):
        paper = ("" if PAPER_DEFAULTS[h] == RUNTIME_DEFAULTS[h]
                 else f"; {PAPER_DEFAULTS[h]:g} with --estimator-option variant=paper")
        out[f"ktae_{h}"] = f"default {RUNTIME_DEFAULTS[h]:g}{paper}"
    for dest, option in (("taco_alpha", "alpha"), ("taco_lambda", "lam")):
        found = {}
        for name in ktae.CALIBRATIONS.names():
            param = inspect.signature(ktae.CALIBRATIONS.get(name)).parameters.get(option)
            if param is not None and param.default is not inspect.Parameter.empty:
                found.setdefault(param.default, []).append(name)
        if len(found) == 1:
            out[dest] = f"default {next(iter(found))}"
        elif found:
            out[dest] = "default depends on the calibration: " + "; ".join(
                f"{v} ({', '.join(names)})" for v, names in found.items())
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``ktae train`` flags (defaults: see ``TrainConfig``)."""
    parser.add_argument("--config", help="YAML/JSON file of TrainConfig fields")
    texts = default_texts()
    for flag, dest, typ, help_text in _FLAGS:
        shown = f" ({texts[dest]})" if dest in texts else ""
        flags = ("-o", flag) if dest == "output_dir" else (flag,)  # -o as in explain/simulate
        parser.add_argument(*flags, dest=dest, type=typ, default=None, help=help_text + shown)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--dynamic-sampling", dest="dynamic_sampling", action="store_true",
                       default=None, help="force DAPO dynamic sampling on "
                       f"({texts['dynamic_sampling']})")
    group.add_argument("--no-dynamic-sampling", dest="dynamic_sampling", action="store_false",
                       help="force dynamic sampling off")
    parser.add_argument("--lora-target-modules", dest="lora_target_modules", default=None,
                        type=lambda text: [t.strip() for t in text.split(",") if t.strip()],
                        help="comma-separated module names that get LoRA adapters "
                             "(default all-linear)")
    for flag, dest, help_text in _PAIR_FLAGS:
        parser.add_argument(flag, dest=f"{dest}_pairs", action="append", default=None,
                            metavar="KEY=VALUE", help=help_text)
    parser.add_argument("--task-field", dest="task_field_pairs", action="append", default=None,
                        metavar="FIELD=COLUMN",
                        help="the task column holding a field (problem, answer, solution, id, "
                             "data_source), e.g. --task-field problem=query (repeatable)")
    parser.add_argument("--task-filter", dest="task_filter_pairs", action="append", default=None,
                        metavar="COLUMN=V1,V2",
                        help="keep the task rows whose COLUMN takes one of the values, e.g. "
                             "--task-filter 'level=Level 3,Level 4,Level 5' (repeatable)")
    parser.add_argument("--resume", action="store_true", default=None,
                        help="continue from the newest complete checkpoint in --output-dir")
    parser.add_argument("--bf16", action="store_true", default=None, help="bfloat16 (GPU)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                        help="no progress bar")


def _option_pairs(flag: str, pairs: list[str]) -> dict:
    """``["top=0.5"]`` -> ``{"top": 0.5}`` (values read as a method's settings are:
    :func:`ktae.core.methods.option_value`)."""
    from ktae.core.methods import option_value

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
    from ktae.train.trl_args import parse_trl_pairs

    cfg = TrainConfig.from_file(args.config) if getattr(args, "config", None) else TrainConfig()
    overrides = {}
    for f in dataclasses.fields(TrainConfig):
        value = getattr(args, f.name, None)
        if value is not None:
            overrides[f.name] = value
    for flag, dest, _ in _PAIR_FLAGS:
        pairs = getattr(args, f"{dest}_pairs", None)
        if pairs:
            parsed = parse_trl_pairs(pairs) if dest == "trl" else _option_pairs(flag, pairs)
            overrides[dest] = {**getattr(cfg, dest), **parsed}
    for flag, dest, split in (("--task-field", "task_fields", False),
                              ("--task-filter", "task_filters", True)):
        pairs = getattr(args, f"{dest[:-1]}_pairs", None)
        if pairs:
            overrides[dest] = {**getattr(cfg, dest), **_data_pairs(flag, pairs, split)}
    cfg = dataclasses.replace(cfg, **overrides).resolve()
    credit_settings(cfg)  # unknown credit names and options fail here, before any model loads
    return cfg


def resume_command(output_dir: str, argv: list[str] | None = None) -> str:
    """The command line that continues this run: the same flags, ``--resume -o DIR``;
    a ``--plugin`` given before ``train`` stays before it."""
    import shlex

    from ktae.plugins import PLUGIN_FLAG, split_plugin_args

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
    from ktae.cli_common import check_counts, check_output_dir, set_interrupt_hint

    try:  # the arguments first: trl and transformers load only once they are right
        cfg = config_from_args(args)
        check_counts(cfg, {"torch_threads": "--threads"})  # --config files included
        check_output_dir(cfg.output_dir)
    except ValueError as err:
        print(f"ktae train: {err}", file=sys.stderr)
        return 2
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
    set_interrupt_hint(f"continue with: {resume_command(cfg.output_dir)}")
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
