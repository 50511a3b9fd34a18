"""The update's vocabulary-sized work with glibc's default ``malloc`` and with freed memory
kept for reuse (:mod:`ktae.train.allocator`), side by side (studies/step-time/report.md).

Usage:
    python benchmarks/bench_allocator.py                 # 3 processes of each, alternating
    python benchmarks/bench_allocator.py --processes 5 --json out.json
    python benchmarks/bench_allocator.py --dtype float32 # a CPU without native bfloat16
    python benchmarks/bench_allocator.py --hidden 64     # a quick check that it runs (the tests)

One micro-batch of the recipe's update, from the last hidden states on: the LM head's
product in bfloat16 (``[8, 65, 576]`` against SmolLM2-135M's ``[49152, 576]``, random
weights; ``--dtype float32`` for a CPU that would emulate bfloat16 products, minutes a
pass), the target tokens' log-probabilities and the entropy through
:class:`ktae.train.logprob_head.TokenLogProbs`, and the backward pass to the hidden
states: eight passes in one process, the first a warm-up. ``--hidden`` narrows the hidden
states and the head (576 by default): the products get cheaper, the vocabulary-sized
tensors whose pages the setting is about keep their size. Each setting runs in its own
process (the setting is process-wide), the two alternating; prints, per setting, the
median over processes of each process's median CPU seconds a pass and its minor page
faults a pass, and kept over default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ktae.train.allocator import ENV  # noqa: E402

ONE = """
import json, resource, statistics, sys, time, torch
sys.path.insert(0, sys.argv[2])
dtype = getattr(torch, sys.argv[3])
width = int(sys.argv[4])
from ktae.train.allocator import keep_freed_memory
from ktae.train.logprob_head import TokenLogProbs
kept = keep_freed_memory() if sys.argv[1] == "kept" else False
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
hidden = torch.randn(8, 65, width, generator=gen).to(dtype).requires_grad_()
head = (torch.randn(49152, width, generator=gen) * 0.05).to(dtype)
targets = torch.randint(0, 49152, (8, 64), generator=gen)
seconds, faults = [], []
for i in range(8):
    hidden.grad = None
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
    logp_t, entropy = TokenLogProbs.apply(hidden @ head.t(), targets, 0.6, True)
    logp_t.sum().backward()
    if i:
        seconds.append(time.process_time() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(json.dumps({"kept": kept, "dtype": str(head.dtype), "seconds": statistics.median(seconds),
                  "faults": statistics.median(faults)}))
"""


DTYPES = ("bfloat16", "float32")
HIDDEN = 576
"""SmolLM2-135M's hidden size: the recipe's LM head is ``[49152, HIDDEN]``."""


def one_process(setting: str, dtype: str = "bfloat16", hidden: int = HIDDEN) -> dict:
    env = {**os.environ, ENV: "1"}  # the setting is asked for here alone
    out = subprocess.run([sys.executable, "-c", ONE, setting, str(ROOT / "src"), dtype,
                          str(hidden)],
                         env=env, capture_output=True, text=True, check=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=3, help="processes of each setting")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                   help="the hidden states' and head's dtype (default: the recipe's bfloat16)")
    p.add_argument("--hidden", type=int, default=HIDDEN,
                   help=f"the hidden size (default {HIDDEN}, the recipe's); smaller only for a "
                        "quick check that the benchmark runs")
    a = p.parse_args(argv)
    for name, value in (("processes", a.processes), ("hidden", a.hidden)):
        if value < 1:
            p.error(f"--{name}: expected a positive integer, got {value}")
    runs = {"default": [], "kept": []}
    for r in range(a.processes):
        for setting in (("default", "kept") if r % 2 == 0 else ("kept", "default")):
            runs[setting].append(one_process(setting, a.dtype, a.hidden))
            print(f"process {r + 1}, {setting}: {runs[setting][-1]}", file=sys.stderr, flush=True)
    if not all(run["kept"] for run in runs["kept"]):
        raise SystemExit("bench_allocator: this C library refused the setting (not glibc?)")
    med = {s: {k: statistics.median(run[k] for run in rs) for k in ("seconds", "faults")}
           for s, rs in runs.items()}
    ratio = med["kept"]["seconds"] / med["default"]["seconds"]
    shapes = "recipe shapes" if a.hidden == HIDDEN else f"hidden size {a.hidden}"
    print(f"one micro-batch's LM head, log-softmax, entropy and backward pass ({shapes}, "
          f"{a.dtype} head, one thread); medians over {a.processes} processes of each")
    print("| malloc | CPU ms a pass | minor page faults a pass |\n|---|---|---|")
    for s in runs:
        print(f"| {s} | {med[s]['seconds'] * 1e3:.0f} | {med[s]['faults']:.0f} |")
    print(f"kept / default: {ratio:.2f}")
    result = {"processes": a.processes, "dtype": a.dtype, "hidden": a.hidden, "runs": runs,
              "medians": med, "kept_over_default": ratio}
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
