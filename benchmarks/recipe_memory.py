"""Peak resident memory and time of the LoRA recipe's run at each size of the update's
micro-batches, in float32 and under ``--bf16``.

Usage:
    python benchmarks/recipe_memory.py                      # 1, 2 and 4 micro-batches, both precisions
    python benchmarks/recipe_memory.py --splits 1,4 --precisions float32 --json out.json

Runs ``ktae train --config configs/smollm2-recipe.yaml --max-steps 2 --eval-size 8
--save-every 0 --trl gradient_accumulation_steps=K`` once per split ``K`` and precision,
each in its own process, one after the other, and reads each process's peak resident set
(``ru_maxrss`` from ``os.wait4``) and wall time. ``K`` micro-batches split the recipe's
rows (``num_prompts x num_generations``: 32) into ``rows / K`` each; the step's gradient is the same
for every ``K`` to float rounding (``tests/test_micro_batches.py``), its memory and speed
are not. The peak includes the model, the evaluation and the two steps (studies/step-time/report.md,
"The recipe's update in one micro-batch"). Each run's steps (reward, loss, gradient norm,
from its ``metrics.jsonl``) are printed too, and, per precision, the largest relative
difference (absolute where the first is 0) of the loss and of the gradient norm from the
first split's, step by step:
the same samples (the rewards equal), the update's sums in another order.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def peak_run(cmd: list[str]) -> tuple[float, float, int]:
    """``(peak resident GB, wall seconds, exit status)`` of ``cmd`` run to its end."""
    start = time.perf_counter()
    with open(os.devnull, "wb") as quiet:
        proc = subprocess.Popen(cmd, stdout=quiet, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss * 1024 / 1e9, time.perf_counter() - start, proc.returncode


def _relative(value: float, reference: float) -> float:
    """``|value - reference| / |reference|``; the absolute difference where the reference
    is 0 (a step whose advantages are all 0 has a loss of 0)."""
    return abs(value - reference) / (abs(reference) or 1.0)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=str(ROOT / "configs" / "smollm2-recipe.yaml"))
    p.add_argument("--splits", default="1,2,4",
                   help="gradient_accumulation_steps values (comma-separated)")
    p.add_argument("--precisions", default="float32,bf16",
                   help="float32, bf16 or both (comma-separated)")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    try:
        splits = [int(x) for x in a.splits.split(",")]
    except ValueError:
        p.error(f"--splits: expected comma-separated integers, got {a.splits!r}")
    recipe = yaml.safe_load(Path(a.recipe).read_text()) or {}
    if not all(isinstance(recipe.get(key), int) for key in ("num_prompts", "num_generations")):
        p.error(f"--recipe: expected a config with num_prompts and num_generations, got {a.recipe}")
    batch = recipe["num_prompts"] * recipe["num_generations"]
    if any(k < 1 or batch % k for k in splits):
        p.error(f"--splits: expected divisors of the recipe's {batch} rows, got {a.splits!r}")
    precisions = a.precisions.split(",")
    if not set(precisions) <= {"float32", "bf16"}:
        p.error(f"--precisions: expected float32 and/or bf16, got {a.precisions!r}")
    ktae = str(Path(sys.executable).with_name("ktae"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for precision in precisions:
            for k in splits:
                out = Path(tmp) / f"{precision}-{k}"
                cmd = [ktae, "train", "--config", a.recipe, "--max-steps", "2",
                       "--eval-size", "8", "--save-every", "0",
                       "--trl", f"gradient_accumulation_steps={k}", "-o", str(out)]
                cmd += ["--bf16"] if precision == "bf16" else []
                peak, wall, rc = peak_run(cmd)
                if rc != 0:
                    sys.exit(f"ktae train exited with {rc}: {' '.join(cmd)}")
                steps = [{key: row[key] for key in ("step", "reward", "loss", "grad_norm")}
                         for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
                         if "grad_norm" in row]
                rows.append({"precision": precision, "micro_batches": k,
                             "rows_per_micro_batch": batch // k, "peak_gb": peak, "wall_s": wall,
                             "steps": steps})
                print(f"{precision:8s} {k} micro-batch(es) of {batch // k:2d} rows: "
                      f"peak {peak:.2f} GB, {wall:.0f} s (2 steps, load and evaluation included)",
                      flush=True)
                for step in steps:
                    print(f"  step {step['step']}: reward {step['reward']:.5f}, loss "
                          f"{step['loss']:.9g}, gradient norm {step['grad_norm']:.9g}")
            first = next(row for row in rows if row["precision"] == precision)
            for row in rows[-len(splits) + 1:] if len(splits) > 1 else ():
                pairs = list(zip(row["steps"], first["steps"], strict=True))
                same = all(x["reward"] == y["reward"] for x, y in pairs)
                worst = {key: max(_relative(x[key], y[key]) for x, y in pairs)
                         for key in ("loss", "grad_norm")}
                row["against_first"] = {"rewards_equal": same, **worst}
                print(f"{precision:8s} {row['micro_batches']} against {first['micro_batches']} "
                      f"micro-batch(es): rewards {'equal' if same else 'DIFFER'}; largest "
                      f"relative difference: loss {worst['loss']:.1e}, gradient norm "
                      f"{worst['grad_norm']:.1e}")
    result = {"recipe": a.recipe, "rows": rows}
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
