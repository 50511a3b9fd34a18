"""``ktae eval RUN_DIR --checkpoints all``: every checkpoint of a run, once each.

A run's checkpoints are its complete ``checkpoint-N`` directories (those holding the
trainer's completion marker; ``ktae train`` keeps the latest two and always saves one at
the last step, so the last is the model of ``final/``). Each is evaluated with the same
settings into ``<output_dir>/checkpoint-N/`` (``results.json``, ``samples_*.jsonl``). A
checkpoint is read back instead of evaluated again only when its ``results.json``
records the same ``cache_key`` (:mod:`ktae.eval.cache`: the checkpoint's path, label,
step and weight files' sizes and modification times, the sha256 of the problems used,
and every setting) and its samples are all there; retraining into the same run
directory, changed weights, data or settings, or a deleted samples file evaluate it
afresh. ``checkpoint-N`` directories that are not complete (no weights or no completion
marker) are named on the console and left out.

The checkpoint reported is the one with the best accuracy (avg@k) on the validation
benchmark (``--select-on BENCH``; default: the mean accuracy over the benchmarks, the
``avg`` of ``results.json``), the earliest step on a tie, as TACO reports its checkpoint.
``checkpoints.json`` lists every checkpoint's accuracies and names the best, and
``checkpoints.png`` draws the curves (accuracy per benchmark over steps, the best marked).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ktae.checkpoints import checkpoint_dirs, is_complete_checkpoint
from ktae.eval.cache import cached_results

AVG = "avg"


@dataclass(frozen=True)
class Checkpoint:
    label: str
    step: int
    path: Path


def run_checkpoints(run_dir: str | Path, which: str = "all") -> list[Checkpoint]:
    """The complete checkpoints of ``run_dir``, by step: ``which`` is ``"all"`` or
    comma-separated steps (``"2,4"``). Errors name ``--checkpoints`` or RUN_DIR."""
    if not Path(run_dir).is_dir():
        raise ValueError(f"RUN_DIR: no such directory: {run_dir}")
    found = [(s, p) for s, p in checkpoint_dirs(run_dir) if is_complete_checkpoint(p)]
    if not found:
        raise ValueError(f"RUN_DIR: {run_dir} holds no complete checkpoint-N directory "
                         "(a ktae train run saves them with --save-every)")
    if which != "all":
        try:
            steps = [int(s) for s in which.split(",") if s.strip()]
        except ValueError:
            steps = []
        if not steps:
            raise ValueError(f"--checkpoints: expected 'all' or comma-separated steps, "
                             f"got {which!r}")
        have = {s for s, _ in found}
        missing = [s for s in steps if s not in have]
        if missing:
            raise ValueError(f"--checkpoints: no complete checkpoint for step(s) "
                             f"{', '.join(map(str, missing))}; the run has "
                             f"{', '.join(map(str, sorted(have)))}")
        found = [(s, p) for s, p in found if s in steps]
    return [Checkpoint(p.name, s, p) for s, p in found]


def incomplete_checkpoints(run_dir: str | Path) -> list[str]:
    """Names of the ``checkpoint-N`` directories of ``run_dir`` that are not complete
    (the trainer died while saving, or the weights were removed), by step."""
    return [p.name for _, p in checkpoint_dirs(run_dir) if not is_complete_checkpoint(p)]


def score(results: Mapping, select_on: str) -> float:
    """The validation score of one checkpoint's results: ``avg`` or a benchmark's
    accuracy."""
    return float(results["avg"] if select_on == AVG else results["results"][select_on])


def best_checkpoint(rows: Sequence[Mapping], select_on: str) -> Mapping:
    """The row with the highest ``score`` on ``select_on``; the earliest step on a tie."""
    return max(rows, key=lambda r: (r["scores"][select_on], -r["step"]))


def sweep(checkpoints: Sequence[Checkpoint], output_dir: Path,
          key_of: Callable[[Checkpoint], Mapping],
          evaluate_one: Callable[[Checkpoint, Path], dict], *, benchmarks: Sequence[str],
          select_on: str = AVG,
          on_result: Callable[[Checkpoint, dict, bool], None] | None = None) -> dict:
    """Evaluate (or read back) every checkpoint; write ``checkpoints.json`` and the PNG.

    ``key_of(checkpoint)`` is the checkpoint's cache key (:func:`ktae.eval.cache.cache_key`);
    ``evaluate_one(checkpoint, out_dir)`` evaluates one checkpoint into ``out_dir``
    (recording that key as ``config.cache_key``) and returns its results document;
    results are read back instead when :func:`ktae.eval.cache.cached_results` finds them
    for every name of ``benchmarks``. ``on_result(checkpoint, results, cached)`` is told
    about each (console output).

    Returns ``{"select_on", "checkpoints": [{label, step, path, cached, scores}],
    "best": {...}}`` (also written to ``output_dir/checkpoints.json``).
    """
    rows = []
    for ck in checkpoints:
        out = output_dir / ck.label
        results = cached_results(out, key_of(ck), benchmarks)
        cached = results is not None
        if results is None:
            results = evaluate_one(ck, out)
        if on_result is not None:
            on_result(ck, results, cached)
        scores = {AVG: float(results["avg"]),
                  **{b: float(v) for b, v in results["results"].items()}}
        rows.append({"label": ck.label, "step": ck.step, "path": str(ck.path),
                     "cached": cached, "scores": scores})
    best = best_checkpoint(rows, select_on)
    summary = {"select_on": select_on, "checkpoints": rows, "best": best}
    (output_dir / "checkpoints.json").write_text(json.dumps(summary, indent=2) + "\n",
                                                 encoding="utf-8")
    curve_png(summary, output_dir / "checkpoints.png")
    return summary


def curve_png(summary: Mapping, path: Path) -> Path:
    """Accuracy (%) of each benchmark (and their mean) over the checkpoints' steps; the
    validation curve drawn thick, the selected checkpoint circled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["checkpoints"]
    steps = [r["step"] for r in rows]
    names = list(rows[0]["scores"])
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for name in names:
        thick = name == summary["select_on"]
        ax.plot(steps, [100 * r["scores"][name] for r in rows], marker="o",
                linewidth=2.5 if thick else 1.2, linestyle="-" if name != AVG else "--",
                label=f"{name} (validation)" if thick else name)
    best = summary["best"]
    ax.scatter([best["step"]], [100 * best["scores"][summary["select_on"]]], s=220,
               facecolors="none", edgecolors="black", linewidths=1.5, zorder=5,
               label=f"best: {best['label']}")
    ax.set_xlabel("training step")
    ax.set_ylabel("accuracy (%)")
    ax.set_xticks(steps)
    top = max(100 * v for r in rows for v in r["scores"].values())
    ax.set_ylim(0, max(5.0, 1.15 * top))
    ax.set_title("ktae eval --checkpoints")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
