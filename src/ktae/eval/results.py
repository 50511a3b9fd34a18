"""Scoring generations and writing evaluation results (SPEC section 7).

Per benchmark: ``accuracy`` (greedy pass@1, or avg@k: the mean over all k samples of
all problems), ``pass_at_k`` (fraction of problems with at least one correct sample),
``mean_response_length`` / ``max_response_length`` in tokens, ``formatted_rate`` (a
closed, non-empty ``\\boxed{}``), ``n`` problems, ``k`` samples each, and ``timeouts``
of the verifier. The results JSON also carries the KTAE authors' summary fields:
``results`` (accuracy per benchmark), ``avg`` (their unweighted mean), ``avg_lens``,
``max_lens`` and ``formatted``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ktae.eval.benchmarks import BenchmarkRecord
from ktae.eval.generate import Generation
from ktae.rewards import RewardResult


def sample_rows(records: Sequence[BenchmarkRecord], prompts: Sequence[str],
                generations: Sequence[Sequence[Generation]],
                rewards: Sequence[RewardResult]) -> list[dict]:
    """One JSON-ready row per sample, problems in order, samples ``0..k-1`` within each.

    ``rewards`` is flat, in the same order (``len(records) * k`` entries).
    """
    rows, it = [], iter(rewards)
    for i, (rec, prompt, gens) in enumerate(zip(records, prompts, generations, strict=True)):
        for j, g in enumerate(gens):
            r = next(it)
            rows.append({"index": i, "id": rec.id, "sample": j, "prompt": prompt,
                         "completion": g.text, "extracted": r.extracted,
                         "answer": rec.answer, "correct": r.correct,
                         "formatted": r.formatted, "timed_out": r.timed_out,
                         "response_tokens": g.num_tokens})
    return rows


def benchmark_metrics(rows: Sequence[dict], *, k: int) -> dict:
    """Aggregate metrics of one benchmark from its sample rows (see module docstring).

    An empty benchmark gives ``n == 0`` and zero for every rate and length.
    """
    n_samples = len(rows)
    per_problem: dict[int, bool] = {}
    for r in rows:
        per_problem[r["index"]] = per_problem.get(r["index"], False) or r["correct"]
    lengths = [r["response_tokens"] for r in rows]
    mean = (lambda xs: sum(xs) / len(xs) if xs else 0.0)  # noqa: E731
    return {
        "accuracy": mean([float(r["correct"]) for r in rows]),
        "pass_at_k": mean([float(v) for v in per_problem.values()]),
        "mean_response_length": mean(lengths),
        "max_response_length": max(lengths, default=0),
        "formatted_rate": mean([float(r["formatted"]) for r in rows]),
        "n": len(per_problem),
        "k": k,
        "num_samples": n_samples,
        "timeouts": sum(bool(r["timed_out"]) for r in rows),
    }


def summarize(per_benchmark: Mapping[str, dict], config: Mapping | None = None) -> dict:
    """The results document: per-benchmark metrics plus the authors' summary fields."""
    names = list(per_benchmark)
    accs = [per_benchmark[b]["accuracy"] for b in names]
    return {
        "config": dict(config or {}),
        "benchmarks": {b: dict(per_benchmark[b]) for b in names},
        "results": {b: per_benchmark[b]["accuracy"] for b in names},
        "avg": sum(accs) / len(accs) if accs else 0.0,
        "avg_lens": {b: per_benchmark[b]["mean_response_length"] for b in names},
        "max_lens": {b: per_benchmark[b]["max_response_length"] for b in names},
        "formatted": {b: per_benchmark[b]["formatted_rate"] for b in names},
    }


def prepare_output_dir(path, name: str = "output_dir") -> Path:
    """Create the results directory now (before any model is loaded or anything is
    generated), so that a path that is a file or cannot be written fails at once."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{name}: {out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{name}: cannot create {out} ({e.strerror or e})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: {out} is not writable")
    return out


def write_samples(path: Path, rows: Sequence[dict]) -> None:
    """One JSON object per line (UTF-8; unencodable characters replaced)."""
    with open(path, "w", encoding="utf-8", errors="replace") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_results(path: Path, results: Mapping) -> None:
    with open(path, "w", encoding="utf-8", errors="replace") as f:
        json.dump(results, f, indent=2, ensure_ascii=False)
        f.write("\n")


def results_table(results: Mapping):
    """A rich Table of the per-benchmark metrics and the average accuracy."""
    from rich.table import Table

    table = Table(title="ktae eval")
    for col, justify in (("benchmark", "left"), ("n", "right"), ("k", "right"),
                         ("accuracy", "right"), ("pass@k", "right"),
                         ("formatted", "right"), ("mean len", "right"), ("max len", "right")):
        table.add_column(col, justify=justify)
    for name, m in results["benchmarks"].items():
        table.add_row(name, str(m["n"]), str(m["k"]), f"{100 * m['accuracy']:.1f}",
                      f"{100 * m['pass_at_k']:.1f}", f"{100 * m['formatted_rate']:.1f}",
                      f"{m['mean_response_length']:.1f}", str(m["max_response_length"]))
    table.add_section()
    table.add_row("avg", "", "", f"{100 * results['avg']:.1f}", "", "", "", "")
    return table
