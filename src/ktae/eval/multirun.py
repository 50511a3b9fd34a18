"""``ktae eval RUN_A RUN_B ...`` (or a ``ktae compare`` directory): one table over runs.

Each model is evaluated as usual into ``<output_dir>/<run>/`` (cached like any
evaluation, :mod:`ktae.eval.cache`). Runs are grouped by name, a ``-seed<N>`` suffix
removed (``ktae-seed0``, ``ktae-seed1`` -> ``ktae``), so a ``ktae compare`` directory gives
one row per credit arm. Per group and benchmark:

* ``mean`` and ``std`` of the runs' accuracies (avg@k): the spread **over runs** (training
  seeds), the standard deviation with ddof = 1 (0 for a single run);
* ``within_run_std``: the mean over runs of each run's ``accuracy_std``, the spread of
  the k samples **within** a run (:mod:`ktae.eval.metrics`), kept apart because it says
  nothing about how another training seed would do.

The average over benchmarks (each run's ``avg``, then mean and std over runs) is the last
column. Written as ``summary.json`` and ``summary.md`` (benchmarks as columns, accuracies
in %, ``mean ± std over runs``; a second table gives the within-run spread).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

AVG = "avg"
_SEED = re.compile(r"-seed\d+$")


def run_label(model: str | Path) -> str:
    """A run's name: the directory above ``final/`` (or ``checkpoint-N/``), else the
    model directory's own name."""
    path = Path(model)
    if path.name == "final" or path.name.startswith("checkpoint-"):
        return path.parent.name or path.name
    return path.name


def group_of(label: str) -> str:
    """The group of a run: its name without a ``-seed<N>`` suffix."""
    return _SEED.sub("", label)


def expand_models(models: Sequence[str]) -> list[str]:
    """MODEL arguments with every ``ktae compare`` directory (a directory holding run
    directories, each with a ``final/`` model) replaced by its runs' ``final/``, sorted."""
    out = []
    for model in models:
        path = Path(model)
        finals = sorted(p / "final" for p in path.iterdir()
                        if (p / "final" / "config.json").is_file()) \
            if path.is_dir() and not (path / "config.json").is_file() else []
        out.extend(str(p) for p in finals) if finals else out.append(model)
    return out


def unique_labels(models: Sequence[str]) -> list[str]:
    """One output sub-directory name per model (run names, numbered where repeated)."""
    labels, seen = [], {}
    for model in models:
        label = run_label(model)
        seen[label] = seen.get(label, 0) + 1
        labels.append(label if seen[label] == 1 else f"{label}-{seen[label]}")
    return labels


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def aggregate(results: Mapping[str, Mapping]) -> dict:
    """``{"benchmarks", "groups": {group: {"runs", AVG and each benchmark: {mean, std,
    within_run_std}}}}`` from each run's results document (keyed by run label)."""
    names = list(dict.fromkeys(b for r in results.values() for b in r["results"]))
    groups: dict[str, list[str]] = {}
    for label in results:
        groups.setdefault(group_of(label), []).append(label)
    out = {}
    for group, labels in groups.items():
        row: dict = {"runs": labels}
        for name in names:
            have = [results[lab] for lab in labels if name in results[lab]["results"]]
            if not have:
                continue
            mean, std = _mean_std([r["results"][name] for r in have])
            row[name] = {"mean": mean, "std": std, "n_runs": len(have),
                         "within_run_std": statistics.fmean(
                             r["benchmarks"][name].get("accuracy_std", 0.0) for r in have)}
        mean, std = _mean_std([results[lab]["avg"] for lab in labels])
        row[AVG] = {"mean": mean, "std": std, "n_runs": len(labels)}
        out[group] = row
    return {"benchmarks": names, "groups": out}


def summary_markdown(summary: Mapping) -> str:
    """The summary as markdown: benchmarks as columns, their average last (accuracy in %,
    mean ± std over runs), then the within-run spread."""
    names = summary["benchmarks"]

    def cell(row, name, key="std"):
        if name not in row:
            return "–"
        v = row[name]
        return f"{100 * v['mean']:.1f} ± {100 * v[key]:.1f}" if key == "std" \
            else f"{100 * v[key]:.1f}"

    head = "| runs | n | " + " | ".join(names) + " | avg |"
    rule = "|---|---|" + "---|" * (len(names) + 1)
    lines = ["Accuracy (avg@k, %): mean ± standard deviation over runs.", "", head, rule]
    for group, row in summary["groups"].items():
        lines.append(f"| {group} | {len(row['runs'])} | "
                     + " | ".join(cell(row, n) for n in names) + f" | {cell(row, AVG)} |")
    lines += ["", "Within-run spread: standard deviation over the k samples of a run "
              "(mean over runs, %; 0 for greedy k = 1).", "",
              "| runs | n | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for group, row in summary["groups"].items():
        lines.append(f"| {group} | {len(row['runs'])} | "
                     + " | ".join(cell(row, n, "within_run_std") for n in names) + " |")
    return "\n".join(lines) + "\n"
