"""Time KTAE (exact and reference modes) and GRPO against the floor of one sort.

Usage:
    python benchmarks/bench_advantages.py --preset small      # seconds
    python benchmarks/bench_advantages.py --preset paper      # 1024 x 16 x 3072

Prints the median of ``--repeats`` rounds (each function once per round, in rotation, in
one process), the median ratio to a single ``torch.sort`` of the batch's int64 keys (one
key per real token) timed in the same round, and the peak extra memory of one KTAE call
(resident memory sampled in a fresh process, or the CUDA allocator's peak) relative to
the input tensors. Runs on
CUDA when available (``--device``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic import PRESETS, make_batch  # noqa: E402

import ktae  # noqa: E402


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def paired_rounds(runs: dict, repeats: int, device: str) -> dict[str, list[float]]:
    """Time every function once per round, in rotation, so that all of them see the same
    machine load (this machine is shared): per-round ratios are then meaningful."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    return times


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


def _inputs(args):
    P, G, L, V = PRESETS[args.preset]
    batch = make_batch(P, G, L, V, seed=args.seed, device=args.device)
    kw = dict(rewards=batch.rewards, group=batch.group, token_ids=batch.token_ids, mask=batch.mask)
    return batch, kw


def _memory_probe(args) -> int:
    """Child process: peak extra memory of one call, relative to the input tensors."""
    _, kw = _inputs(args)
    input_bytes = sum(t.element_size() * t.numel() for t in kw.values())
    mode = args.memory_probe
    tiny = make_batch(4, 4, 16, 100, seed=1, device=args.device)  # load code pages first
    ktae.compute_advantages("ktae", mode=mode, rewards=tiny.rewards, group=tiny.group,
                            token_ids=tiny.token_ids, mask=tiny.mask)
    opts = {"chunk_tokens": args.chunk_tokens} if args.chunk_tokens else {}
    extra = peak_extra_memory(lambda: ktae.compute_advantages("ktae", mode=mode, **kw, **opts),
                              args.device)
    print(f"{extra / input_bytes:.3f}")
    return 0


def _measure_memory(args, mode: str) -> float:
    cmd = [sys.executable, __file__, "--preset", args.preset, "--device", args.device,
           "--seed", str(args.seed), "--memory-probe", mode]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.chunk_tokens:
        cmd += ["--chunk-tokens", str(args.chunk_tokens)]
    # Large blocks straight from mmap, returned on free: resident memory tracks live tensors.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return float(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk-tokens", type=int, default=None,
                    help="KTAE's chunk_tokens option (default: the library's)")
    ap.add_argument("--loop-baseline", action="store_true",
                    help="also time a per-group, per-token Python loop in the released runtime's "
                         "style (tests/oracle.py:runtime_ktae), once; slow beyond --preset small")
    ap.add_argument("--memory-probe", choices=["exact", "reference"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        return _memory_probe(args)
    P, G, L, V = PRESETS[args.preset]
    t0 = time.perf_counter()
    batch, kw = _inputs(args)
    print(f"preset {args.preset}: {P} prompts x {G} responses x <= {L} tokens, vocab {V}, "
          f"{batch.num_tokens / 1e6:.2f}M real tokens, device {args.device}, "
          f"{torch.get_num_threads()} threads (built in {time.perf_counter() - t0:.1f} s)")
    # The floor: one sort of the batch's int64 keys, one key per real token.
    keys = (batch.group[:, None] * V + batch.token_ids)[batch.mask]
    opts = {"chunk_tokens": args.chunk_tokens} if args.chunk_tokens else {}
    runs = {
        "sort (floor)": lambda: torch.sort(keys),
        "grpo": lambda: ktae.compute_advantages("grpo", **kw),
        "ktae exact": lambda: ktae.compute_advantages("ktae", **kw, **opts),
        "ktae reference": lambda: ktae.compute_advantages("ktae", mode="reference", **kw, **opts),
    }
    for fn in runs.values():  # warm-up (allocator, lazy init)
        fn()
    times = paired_rounds(runs, args.repeats, args.device)
    floor = times["sort (floor)"]
    input_bytes = sum(t.element_size() * t.numel() for t in kw.values())
    mem = {f"ktae {m}": _measure_memory(args, m) for m in ("exact", "reference")}
    print(f"\n{'what':<16}{'median s':>10}{'median x sort':>15}{'peak extra / input':>20}")
    for name, ts in times.items():
        ratio = statistics.median(t / f for t, f in zip(ts, floor, strict=True))
        m = f"{mem[name]:.2f}" if name in mem else ""
        print(f"{name:<16}{statistics.median(ts):>10.4f}{ratio:>15.2f}{m:>20}")
    if args.loop_baseline:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from oracle import runtime_ktae

        t0 = time.perf_counter()
        runtime_ktae(**{k: v.cpu() for k, v in kw.items()})
        loop = time.perf_counter() - t0
        fast = statistics.median(times["ktae reference"])
        print(f"{'python loop':<16}{loop:>10.4f}   (one run; {loop / fast:.0f}x the vectorised "
              f"reference mode, which matches it)")
    print(f"\ninput tensors {input_bytes / 2**20:.0f} MiB; {args.repeats} paired rounds "
          f"(ratio = median over rounds of time / sort time in the same round); peak memory "
          f"from one call in a fresh process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
