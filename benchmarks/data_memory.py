"""Peak resident memory of reading a large verl-schema Parquet file with ``ktae.data``.

Usage:
    python benchmarks/data_memory.py --rows 100000            # writes a file, then measures

Writes ``--rows`` rows in verl's RL schema (a one-message chat ``prompt`` of about
``--chars`` characters, ``reward_model.ground_truth``, ``data_source``, ``extra_info``)
to a temporary Parquet file, then, in a fresh process each, measures: the resident set
after the imports (``baseline``), the peak resident set (``ru_maxrss``) after
``load_examples`` (``ktae train``'s reading step), and after ``read_task`` plus
``format_task`` with the ``raw`` template (what ``ktae train`` holds before its
``datasets.Dataset``). Prints the text volume of the problems for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys
import pyarrow, datasets  # noqa: F401  (imports counted in the baseline)
import ktae.data, ktae.train.data
def rss_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
base = rss_kb()
path, mode = sys.argv[1], sys.argv[2]
if mode == "load":
    rows = ktae.data.load_examples("parquet:" + path)
    n = len(rows)
else:
    from ktae.train.data import format_task, read_task
    task = read_task("parquet:" + path, train_size=1, eval_size=300, seed=0)
    train, held = format_task(task, "raw")
    n = len(train) + len(held)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"rows": n, "baseline_mb": base / 1024, "peak_mb": peak / 1024}))
"""


def write(path: Path, rows: int, chars: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    filler = "Let x be a real number such that the following holds. " * (chars // 55 + 1)
    problems = [f"Problem {i}: {filler[:chars]}" for i in range(rows)]
    table = pa.table({
        "data_source": ["math_dapo"] * rows,
        "prompt": [[{"role": "user", "content": p}] for p in problems],
        "ability": ["MATH"] * rows,
        "reward_model": [{"style": "rule", "ground_truth": str(i % 997)} for i in range(rows)],
        "extra_info": [{"index": i, "split": "train"} for i in range(rows)],
    })
    pq.write_table(table, path)
    return sum(len(p) for p in problems)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--chars", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.parquet"
        text = write(path, args.rows, args.chars)
        print(f"{args.rows} rows, problems {text / 2**20:.1f} MiB of text, file "
              f"{path.stat().st_size / 2**20:.1f} MiB")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        for mode in ("load", "format"):
            out = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], check=True,
                                 capture_output=True, text=True, env=env).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"{mode:>6}: {r['rows']} rows, baseline {r['baseline_mb']:.0f} MiB, peak "
                  f"{r['peak_mb']:.0f} MiB (+{r['peak_mb'] - r['baseline_mb']:.0f} MiB)")


if __name__ == "__main__":
    main()
