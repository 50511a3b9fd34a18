"""Time KTAE (exact and reference modes) and GRPO against the floor of one sort.

Usage:
    python benchmarks/bench_advantages.py --preset small      # seconds
    python benchmarks/bench_advantages.py --preset paper      # 1024 x 16 x 3072

Prints the median of ``--repeats`` runs of each, side by side in one process, their
ratio to a single ``torch.sort`` of the batch's int64 keys (one key per real token), and
the peak extra resident memory of one KTAE call relative to the input tensors. Runs on
CUDA when available (``--device``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ktae  # noqa: E402
from synthetic import PRESETS, make_batch  # noqa: E402


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_time(fn, repeats: int, device: str) -> float:
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_extra_memory(fn, device: str) -> int:
    """Peak memory above the level before the call: CUDA allocator, or sampled RSS."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    base = _rss_bytes()
    peak = [base]
    done = threading.Event()

    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.0005)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    fn()
    done.set()
    th.join()
    peak[0] = max(peak[0], _rss_bytes())
    return peak[0] - base


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    P, G, L, V = PRESETS[args.preset]
    t0 = time.perf_counter()
    batch = make_batch(P, G, L, V, seed=args.seed, device=args.device)
    print(f"preset {args.preset}: {P} prompts x {G} responses x <= {L} tokens, vocab {V}, "
          f"{batch.num_tokens / 1e6:.2f}M real tokens, device {args.device}, "
          f"{torch.get_num_threads()} threads (built in {time.perf_counter() - t0:.1f} s)")
    kw = dict(rewards=batch.rewards, group=batch.group, token_ids=batch.token_ids, mask=batch.mask)
    keys = (batch.group[:, None] * V + batch.token_ids)[batch.mask]

    runs = {
        "sort (floor)": lambda: torch.sort(keys),
        "grpo": lambda: ktae.compute_advantages("grpo", **kw),
        "ktae exact": lambda: ktae.compute_advantages("ktae", **kw),
        "ktae reference": lambda: ktae.compute_advantages("ktae", mode="reference", **kw),
    }
    for fn in runs.values():  # warm-up (allocator, lazy init)
        fn()
    med = {name: median_time(fn, args.repeats, args.device) for name, fn in runs.items()}
    input_bytes = sum(t.element_size() * t.numel() for t in kw.values())
    mem = {name: peak_extra_memory(runs[name], args.device) for name in ("ktae exact", "ktae reference")}
    floor = med["sort (floor)"]
    print(f"\n{'what':<16}{'median s':>12}{'x sort':>10}{'peak extra / input':>22}")
    for name, t in med.items():
        m = f"{mem[name] / input_bytes:.2f}" if name in mem else ""
        print(f"{name:<16}{t:>12.4f}{t / floor:>10.2f}{m:>22}")
    print(f"\ninput tensors: {input_bytes / 2**20:.0f} MiB; median of {args.repeats} runs each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
