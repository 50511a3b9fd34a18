"""``ktae compare``: a credit x seed grid of ``ktae train`` runs, one table, one figure.

``ktae compare --credit none,ktae,taco --seeds 3 --max-steps N`` runs every (credit, seed)
sequentially under ``--output-dir`` (default ``runs/compare``), each in
``{credit}-seed{s}/``, then writes ``comparison.md`` (held-out accuracy mean ± std over
seeds before and after, carry/borrow accuracy, response length, step time, the share of
step time spent estimating advantages), ``comparison.json`` and ``curves.png`` (held-out
and sampled training accuracy over steps, mean over seeds). Finished runs are reused and
interrupted ones resumed, so the command can be re-run after a kill. All other
``ktae train`` flags apply to every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from ktae.train import cli_train
from ktae.train.rundir import RunDir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``ktae train`` flags, with ``--credit`` a comma list and ``--seeds N``."""
    cli_train.add_arguments(parser)
    parser.set_defaults(credit="none,ktae,taco")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per credit")
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


def summarize(root: Path, credits: list[str], seeds: list[int]) -> dict:
    """Per-credit lists of each seed's summary numbers, read from the run directories."""
    table = {}
    for credit in credits:
        rows = []
        for seed in seeds:
            run = root / f"{credit.replace('+', '-')}-seed{seed}"
            summary = json.loads((run / "summary.json").read_text())
            summary["evals"] = RunDir.read_jsonl(run / "eval.jsonl")
            summary["metrics"] = RunDir.read_jsonl(run / "metrics.jsonl")
            rows.append(summary)
        table[credit] = rows
    return table


def markdown_table(table: dict, *, algo: str, steps: int) -> str:
    """The comparison as a markdown table (accuracies in %, mean ± std over seeds)."""
    lines = [f"Held-out greedy accuracy on the embedded test split after {steps} steps of "
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
            ax2.plot(np.arange(k, n + 1), smooth, color=line.get_color(), label=credit)
    ax1.set(xlabel="step", ylabel="held-out accuracy (greedy)")
    ax2.set(xlabel="step", ylabel=f"sampled accuracy ({window}-step mean)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``ktae compare``."""
    credits = [c.strip() for c in str(args.credit).split(",") if c.strip()]
    if not credits:
        print("ktae compare: credit: expected a comma-separated list of names", file=sys.stderr)
        return 2
    if args.seeds < 1:
        print(f"ktae compare: seeds: expected >= 1, got {args.seeds}", file=sys.stderr)
        return 2
    root = Path(args.output_dir)
    seeds = list(range(args.seeds))
    base_args = argparse.Namespace(**vars(args))
    from ktae.train.session import train

    configs = []
    try:
        for credit in credits:
            for seed in seeds:
                ns = argparse.Namespace(**vars(base_args))
                ns.credit, ns.seed = credit, seed
                ns.output_dir = str(root / f"{credit.replace('+', '-')}-seed{seed}")
                ns.resume = None
                configs.append(cli_train.config_from_args(ns))
    except ValueError as err:
        print(f"ktae compare: {err}", file=sys.stderr)
        return 2
    for i, cfg in enumerate(configs):
        out = Path(cfg.output_dir)
        summary_path = out / "summary.json"
        if summary_path.exists() and json.loads(summary_path.read_text())["steps"] == cfg.max_steps:
            print(f"[{i + 1}/{len(configs)}] {out} done, reused", file=sys.stderr)
            continue
        resume = (out / "metrics.jsonl").exists()
        print(f"[{i + 1}/{len(configs)}] {cfg.credit} seed {cfg.seed} -> {out}", file=sys.stderr)
        train(dataclasses.replace(cfg, resume=resume))
    table = summarize(root, credits, seeds)
    text = markdown_table(table, algo=configs[0].algo, steps=configs[0].max_steps)
    (root / "comparison.md").write_text(text)
    (root / "comparison.json").write_text(json.dumps(
        {c: [{k: v for k, v in r.items() if k not in ("evals", "metrics")} for r in rows]
         for c, rows in table.items()}, indent=2) + "\n")
    plot_curves(table, root / "curves.png")
    print(text)
    print(f"ktae compare: wrote {root / 'comparison.md'} and {root / 'curves.png'}")
    return 0
