"""``ktae compare``: a credit x seed grid of ``ktae train`` runs, one table, one figure.

``ktae compare --credit none,ktae,taco --seeds 3 --max-steps N`` runs every (credit, seed)
sequentially under ``--output-dir`` (default ``runs/compare``), each in
``{credit}-seed{s}/``, then writes ``comparison.md`` (held-out accuracy mean ± std over
seeds before and after, carry/borrow accuracy, response length, step time, the share of
step time spent estimating advantages), ``comparison.json`` and ``curves.png`` (held-out
and sampled training accuracy over steps, mean over seeds). Finished runs are reused and
interrupted ones resumed, so the command can be re-run after a kill; a run directory
holding a run of other settings (which a resume refuses: see ``ktae train --resume``)
stops the command before anything trains, naming the directory and the settings. All other
``ktae train`` flags apply to every run.

An entry of ``--credit`` may change settings for its own runs only:
``CREDIT@KEY=VALUE[@KEY=VALUE...]``, where KEY is a ``ktae train`` setting (its
``TrainConfig`` field name, e.g. ``ktae_ngram``, ``taco_lambda``, ``learning_rate``), a
setting a credit in the entry declares, written without its prefix (``ktae@ngram=3``
sets ``ktae_ngram``; ``taco@lambda=0.5`` sets ``taco_lambda``), or an option of the
entry's advantage estimator or calibration (``prefix-value@weight=0.5``, a user rule's
``mine@scale=2``: as ``--estimator-option`` / ``--calibration-option``, after the common
ones); entries are read by :func:`ktae.runs.credit.parse_arm`, through
:mod:`ktae.core.methods`, as every command reads a method. So
``--credit none,ktae,ktae@ngram=3`` compares GRPO, KTAE and KTAE over trigrams; that
arm's runs live in ``ktae-ngram=3-seed{s}/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from ktae import cli_common  # read at call time: tests stand in for set_interrupt_hint
from ktae.runs.credit import Arm, parse_arm
from ktae.runs.rundir import RunDir
from ktae.train import cli_train
from ktae.train.trl_version import UnsupportedTRLError, check_trl


def parse_arms(spec: str) -> list[Arm]:
    """The comma list of ``--credit`` as arms; duplicate run directories are refused."""
    arms = [parse_arm(c) for c in str(spec).split(",") if c.strip()]
    if not arms:
        raise ValueError("credit: expected a comma-separated list of names")
    seen: dict[str, str] = {}
    for arm in arms:
        if arm.dirname in seen:
            raise ValueError(f"credit: {seen[arm.dirname]!r} and {arm.label!r} would share the "
                             f"run directory {arm.dirname}-seed*")
        seen[arm.dirname] = arm.label
    return arms


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``ktae train`` flags, with ``--credit`` a comma list and ``--seeds N``."""
    cli_train.add_arguments(parser)
    parser.set_defaults(credit="none,ktae,taco")
    for action in parser._actions:
        if action.dest == "credit":
            action.help = ("comma list of credits, each optionally with its own settings: "
                           "CREDIT@KEY=VALUE[@...], e.g. none,ktae,ktae@ngram=3 (KEY: a ktae "
                           "train setting, its name without the credit's prefix, or an "
                           "option of the credit's estimator, e.g. prefix-value@weight=0.5) "
                           "(default "
                           "none,ktae,taco)")
        elif action.dest == "output_dir":
            action.help = ("folder of the runs ({credit}-seed{s}/), comparison.md and "
                           "curves.png (default runs/compare)")
        elif action.dest in ("seed", "resume"):
            action.help = argparse.SUPPRESS  # the grid sets them; refused in run()
    parser.add_argument("--seeds", type=int, default=3,
                        help="seeds 0..N-1 per credit (default 3); finished runs are reused "
                             "and interrupted ones resumed")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the grid's first seed: seeds K..K+N-1 with --seeds N (default "
                             "0); e.g. seeds kept aside for a final table")
    parser.set_defaults(output_dir="runs/compare")


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _fmt(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    mean, std = _mean_std(values)
    if mean is None:
        return "n/a"
    return f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}"


def summarize(root: Path, arms: list[Arm | str], seeds: list[int]) -> dict:
    """Per-arm lists of each seed's summary numbers, read from the run directories."""
    table = {}
    for arm in arms:
        arm = parse_arm(arm) if isinstance(arm, str) else arm
        rows = []
        for seed in seeds:
            run = root / f"{arm.dirname}-seed{seed}"
            summary = json.loads((run / "summary.json").read_text())
            summary["evals"] = RunDir.read_jsonl(run / "eval.jsonl")
            summary["metrics"] = RunDir.read_jsonl(run / "metrics.jsonl")
            rows.append(summary)
        table[arm.label] = rows
    return table


def markdown_table(table: dict, *, algo: str, steps: int, task: str = "embedded") -> str:
    """The comparison as a markdown table (accuracies in %, mean ± std over seeds)."""
    where = "the embedded test split" if task == "embedded" else f"the held-out part of {task}"
    lines = [f"Held-out greedy accuracy on {where} after {steps} steps of "
             f"{algo}, mean ± std over seeds.", "",
             "| credit | seeds | acc. before (%) | acc. after (%) | carry/borrow after (%) | "
             "response length | step time (s) | advantage share (%) |",
             "|---|---|---|---|---|---|---|---|"]
    for credit, rows in table.items():
        lines.append("| " + " | ".join([
            credit, str(len(rows)),
            _fmt([r.get("heldout_before") for r in rows]),
            _fmt([r.get("heldout_after") for r in rows]),
            _fmt([r.get("heldout_carry_after") for r in rows]),
            _fmt([r.get("final_response_length") for r in rows], scale=1.0),
            _fmt([r.get("mean_step_seconds") for r in rows], scale=1.0, digits=3),
            _fmt([r.get("advantage_share") for r in rows], digits=2),
        ]) + " |")
    return "\n".join(lines) + "\n"


def plot_curves(table: dict, path: Path, *, window: int = 20) -> None:
    """Held-out accuracy (left) and smoothed sampled accuracy (right), mean over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    used = set()  # moving-average lengths (shorter than ``window`` for short runs)
    for credit, rows in table.items():
        steps = sorted({e["step"] for r in rows for e in r["evals"]})
        means = []
        for s in steps:
            vals = [e["accuracy"] for r in rows for e in r["evals"] if e["step"] == s]
            means.append(float(np.mean(vals)))
        (line,) = ax1.plot(steps, means, "o-", label=credit)
        n = min(len(r["metrics"]) for r in rows)
        if n:
            acc = np.array([[m.get("round1_accuracy", m.get("accuracy", np.nan))
                             for m in r["metrics"][:n]] for r in rows])
            mean = np.nanmean(acc, axis=0)
            k = max(1, min(window, n))
            smooth = np.convolve(mean, np.ones(k) / k, mode="valid")
            ax2.plot(np.arange(k, n + 1), smooth, color=line.get_color(), label=credit,
                     marker="o" if len(smooth) == 1 else None)  # one point: no line to draw
            used.add(k)
    ax1.set(xlabel="step", ylabel="held-out accuracy (greedy)")
    mean_of = "/".join(str(k) for k in sorted(used)) if used else str(window)
    ax2.set(xlabel="step", ylabel=f"sampled accuracy ({mean_of}-step mean)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plan(cfg):
    """The :func:`ktae.train.session.plan_run` of a grid run (``cfg.resume`` set): a run
    already in its directory is reused when finished with these settings and resumed when
    not; one trained with other settings is refused, naming the directory.
    """
    from ktae.train.session import plan_run  # trl: only when a grid is planned

    try:
        return plan_run(cfg)
    except ValueError as err:
        text = str(err).removeprefix("--resume: ").removeprefix("output_dir: ")
        where = str(cfg.output_dir)
        raise ValueError(text if text.startswith(where) else f"{where}: {text}") from None


def run(args: argparse.Namespace) -> int:
    """Entry point of ``ktae compare``."""
    try:
        arms = _checked_arms(args)
        root = Path(args.output_dir)
        seeds = list(range(args.first_seed, args.first_seed + args.seeds))
        configs = _run_configs(args, arms, seeds, root)
        # the TRL release next, before the trainer's module imports it
        check_trl()
        configs, plans = _planned_runs(configs)
    except (ValueError, UnsupportedTRLError) as err:
        print(f"ktae compare: {err}", file=sys.stderr)
        return 2
    from ktae.train.session import train

    cli_common.set_interrupt_hint("finished runs are kept; run the same command again to continue")
    for i, (cfg, plan) in enumerate(zip(configs, plans, strict=True)):
        out = Path(cfg.output_dir)
        if plan.complete:
            print(f"[{i + 1}/{len(configs)}] {out} done, reused", file=sys.stderr)
            continue
        print(f"[{i + 1}/{len(configs)}] {arms[i // len(seeds)].label} seed {cfg.seed} -> {out}",
              file=sys.stderr)
        train(cfg)
    text = _write_comparison(root, arms, seeds, configs[0])
    print(text)
    print(f"ktae compare: wrote {root / 'comparison.md'} and {root / 'curves.png'}")
    return 0


def _checked_arms(args: argparse.Namespace) -> list[Arm]:
    """The arms of ``--credit``, after refusing a bad seed range and the flags the grid
    sets itself."""
    arms = parse_arms(args.credit)
    if args.seeds < 1:
        raise ValueError(f"seeds: expected >= 1, got {args.seeds}")
    if args.first_seed < 0:
        raise ValueError(f"first-seed: expected >= 0, got {args.first_seed}")
    for flag, dest in (("--seed", "seed"), ("--resume", "resume")):
        if getattr(args, dest, None) is not None:
            raise ValueError(f"{flag}: the grid sets it (seeds K..K+N-1 with --first-seed K "
                             "--seeds N; finished runs are reused, interrupted ones resumed)")
    return arms


def _run_configs(args: argparse.Namespace, arms: list[Arm], seeds: list[int], root: Path
                 ) -> list:
    """One training config per arm and seed (arm-major), each in its own directory."""
    base_args = argparse.Namespace(**vars(args))
    configs = []
    cli_common.check_output_dir(root)
    for arm in arms:
        for seed in seeds:
            ns = argparse.Namespace(**{**vars(base_args), **arm.overrides})
            for part in ("estimator_options", "calibration_options"):
                if part in arm.overrides:  # after the common ones
                    setattr(ns, part, None)
                    setattr(ns, f"{part}_pairs", [
                        *(getattr(base_args, f"{part}_pairs", None) or []),
                        *(f"{k}={json.dumps(v)}" for k, v in arm.overrides[part].items())])
            ns.credit, ns.seed = arm.credit, seed
            ns.output_dir = str(root / f"{arm.dirname}-seed{seed}")
            ns.resume = None
            configs.append(cli_train.config_from_args(ns))
            cli_common.check_counts(configs[-1], {"torch_threads": "--threads"})
    return configs


def _planned_runs(configs: list) -> tuple[list, list]:
    """``(configs set to resume, their run plans)``, once every distinct setting's data
    is checked (before any model loads) and every existing run directory holds a run
    of these settings."""
    from ktae.train.session import preflight  # trl: only once the arguments are right

    checked = set()  # the data of every distinct setting, read before any model loads
    for cfg in configs:
        key = json.dumps([cfg.task, cfg.task_fields, cfg.task_filters, cfg.eval_task,
                          cfg.reward, cfg.model])
        if key not in checked:
            preflight(cfg)
            checked.add(key)
    # every run directory already there must hold a run of these settings
    configs = [dataclasses.replace(cfg, resume=True) for cfg in configs]
    return configs, [_plan(cfg) for cfg in configs]


def _write_comparison(root: Path, arms: list[Arm], seeds: list[int], first) -> str:
    """Write ``comparison.md``, ``comparison.json`` and ``curves.png``; returns the
    markdown table (``first``: the grid's first config, for the table's caption)."""
    table = summarize(root, arms, seeds)
    text = markdown_table(table, algo=first.algo, steps=first.max_steps, task=first.task)
    (root / "comparison.md").write_text(text)
    (root / "comparison.json").write_text(json.dumps(
        {c: [{k: v for k, v in r.items() if k not in ("evals", "metrics")} for r in rows]
         for c, rows in table.items()}, indent=2) + "\n")
    plot_curves(table, root / "curves.png")
    return text
