"""Scoring generations and writing evaluation results (docs/method.md §13).

Per benchmark (:mod:`ktae.eval.metrics` defines the estimators): ``accuracy`` (greedy
pass@1, or avg@k: the mean over the k samples' accuracies) and ``accuracy_std`` (their
standard deviation), ``pass_at_k`` (fraction of problems with at least one correct
sample) and ``pass_at`` (unbiased pass@j for every j = 1..k, keys ``"1"``..``"k"``),
``maj_at_k`` (majority vote over equivalent answers, ties shared), ``mean_response_length``
/ ``max_response_length`` in tokens, ``truncation_rate`` (responses that hit the budget
without an end-of-sequence token), ``formatted_rate`` (a closed, non-empty ``\\boxed{}``;
for multiple-choice benchmarks a boxed letter), ``n`` problems, ``k`` samples each,
``timeouts`` of the verifier, ``generation_seconds`` (wall clock of generation) and
``long_prompts`` (prompts that do not fit in the model's context and the rule applied to
them, :mod:`ktae.eval.context`).
The results JSON also carries the KTAE authors' summary fields:
``results`` (accuracy per benchmark), ``avg`` (their unweighted mean), ``avg_lens``,
``max_lens`` and ``formatted``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ktae.eval.benchmarks import BenchmarkRecord
from ktae.eval.metrics import NO_ANSWER, avg_at_k, majority_at_k, pass_at_k
from ktae.models.generate import Generation
from ktae.rewards import RewardResult


def sample_rows(records: Sequence[BenchmarkRecord], prompts: Sequence[str],
                generations: Sequence[Sequence[Generation]],
                rewards: Sequence[RewardResult],
                classes: Sequence[int] | None = None) -> list[dict]:
    """One JSON-ready row per sample, problems in order, samples ``0..k-1`` within each.

    ``rewards`` and ``classes`` (each sample's class of equivalent answers within its
    problem, for maj@k; default: every answer its own class) are flat, in the same order
    (``len(records) * k`` entries).
    """
    rows, it = [], iter(rewards)
    cls = iter(classes) if classes is not None else None
    for i, (rec, prompt, gens) in enumerate(zip(records, prompts, generations, strict=True)):
        for j, g in enumerate(gens):
            r = next(it)
            c = next(cls) if cls is not None else (j if r.formatted else NO_ANSWER)
            rows.append({"index": i, "id": rec.id, "sample": j, "prompt": prompt,
                         "completion": g.text, "extracted": r.extracted,
                         "answer": rec.answer, "correct": r.correct,
                         "formatted": r.formatted, "timed_out": r.timed_out,
                         "response_tokens": g.num_tokens, "truncated": g.truncated,
                         "answer_class": c})
    return rows


def benchmark_metrics(rows: Sequence[dict], *, k: int) -> dict:
    """Aggregate metrics of one benchmark from its sample rows (see module docstring).

    Every problem must have exactly ``k`` rows (samples ``0..k-1``). An empty benchmark
    gives ``n == 0`` and zero for every rate and length.
    """
    index = sorted({r["index"] for r in rows})
    pos = {p: i for i, p in enumerate(index)}
    correct = np.zeros((len(index), k), dtype=bool)
    classes = np.full((len(index), k), NO_ANSWER, dtype=int)
    right = np.full(len(index), NO_ANSWER, dtype=int)
    seen = np.zeros((len(index), k), dtype=bool)
    for r in rows:
        p, j = pos[r["index"]], r["sample"]
        if not 0 <= j < k or seen[p, j]:
            raise ValueError(f"rows: sample {j} of problem {r['index']} is out of 0..{k - 1} "
                             "or repeated")
        seen[p, j] = True
        correct[p, j] = bool(r["correct"])
        classes[p, j] = r.get("answer_class", j if r["formatted"] else NO_ANSWER)
        if r["correct"]:
            right[p] = classes[p, j]
    if not seen.all():
        raise ValueError(f"rows: expected {k} samples for every problem")
    lengths = [r["response_tokens"] for r in rows]
    mean = (lambda xs: sum(xs) / len(xs) if xs else 0.0)  # noqa: E731
    accuracy, accuracy_std = avg_at_k(correct) if index else (0.0, 0.0)
    passes = pass_at_k(correct.sum(axis=1), k) if index else np.zeros(k)
    return {
        "accuracy": accuracy,
        "accuracy_std": accuracy_std,
        "pass_at_k": float(passes[-1]),
        "pass_at": {str(j + 1): float(v) for j, v in enumerate(passes)},
        "maj_at_k": majority_at_k(classes, right) if index else 0.0,
        "mean_response_length": mean(lengths),
        "max_response_length": max(lengths, default=0),
        "truncation_rate": mean([float(r.get("truncated", False)) for r in rows]),
        "formatted_rate": mean([float(r["formatted"]) for r in rows]),
        "n": len(index),
        "k": k,
        "num_samples": len(rows),
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


def unformatted_notice(results: Mapping) -> str | None:
    """One line naming the benchmarks on which no response was formatted (no answer in the
    form the grader reads, so every response scored as wrong); None when there is none."""
    names = [b for b, m in results["benchmarks"].items()
             if m.get("num_samples", m.get("n", 0)) and m["formatted_rate"] == 0]
    if not names:
        return None
    where = " and ".join(names) if len(names) < 3 else ", ".join(names)
    files = ", ".join(f"samples_{b}.jsonl" for b in names)
    return (f"no response was formatted on {where}: none gave its answer in the form the "
            f"benchmark is graded on (a final \\boxed{{}}; arith: a number), so every one "
            f"scored as wrong; check --template and the responses in {files}")


def results_table(results: Mapping):
    """A rich Table of the per-benchmark metrics and the average accuracy."""
    from rich import box
    from rich.table import Table

    table = Table(title="ktae eval", box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False,
                  caption="rates in %, ±std over the k samples; len, max: response tokens; "
                          "long: prompts longer than the model's context (and what was done "
                          "with them)")
    table.add_column("benchmark", no_wrap=True)
    for col in ("n", "k", "avg@k", "±std", "pass@k", "maj@k", "fmt", "trunc", "len", "max",
                "long"):
        table.add_column(col, justify="right", no_wrap=True)
    for name, m in results["benchmarks"].items():
        long = m.get("long_prompts") or {}
        long_cell = (f"{long['count']} {long['rule']}ped" if long.get("rule") == "skip"
                     else f"{long['count']} {long['rule']}d") if long.get("count") else "0"
        table.add_row(name, str(m["n"]), str(m["k"]), f"{100 * m['accuracy']:.1f}",
                      f"{100 * m.get('accuracy_std', 0.0):.1f}", f"{100 * m['pass_at_k']:.1f}",
                      f"{100 * m.get('maj_at_k', m['accuracy']):.1f}",
                      f"{100 * m['formatted_rate']:.1f}",
                      f"{100 * m.get('truncation_rate', 0.0):.1f}",
                      f"{m['mean_response_length']:.1f}", str(m["max_response_length"]),
                      long_cell)
    table.add_section()
    table.add_row("avg", "", "", f"{100 * results['avg']:.1f}", *[""] * 8)
    return table
