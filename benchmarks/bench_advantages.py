"""Time KTAE (exact and reference modes) and GRPO against the floor of one sort.

Usage:
    python benchmarks/bench_advantages.py --preset small      # seconds
    python benchmarks/bench_advantages.py --preset paper      # 1024 x 16 x 3072
    python benchmarks/bench_advantages.py --ngram 1,3         # KTAE over spans too
    python benchmarks/bench_advantages.py --contend 2         # with 2 busy processes
    python benchmarks/bench_advantages.py --zipf              # heavy-tailed ids over the vocabulary
    python benchmarks/bench_advantages.py --rewards graded    # split="graded" side by side
    python benchmarks/bench_advantages.py --prefix-value --compare   # and the old algorithms

Prints the median of ``--repeats`` rounds (each function once per round, in rotation, in
one process, each round starting one function later), the median ratio to a single
``torch.sort`` of the batch's int64 keys (one key per real token) timed in the same
round, and the peak extra memory of one KTAE call (resident memory sampled in a fresh
process, or the CUDA allocator's peak) relative to the input tensors. Runs on CUDA when
available (``--device``). With ``--ngram 1,3`` KTAE's exact mode is also timed
with ``ngram=3`` in the same rounds, and a last column gives each row's median ratio to
``ngram=1`` (``ktae exact``) in the same round. With ``--rewards graded`` the batch's
rewards are graded (a correct response 1, a wrong one ``0.4 u`` with ``u`` uniform, as the
``digits`` reward scores), thresholded KTAE runs with ``reward_threshold=0.5`` and
``split="graded"`` is timed in the same rounds; the last column is then each KTAE row's
median ratio to thresholded KTAE (``ktae exact``) in the same round. ``--contend K``
starts K busy-loop processes (one Python ``while True`` each, at the default priority)
before the batch is built and stops them at the end, to measure under CPU contention as on
a busy training machine. ``--prefix-value`` also times the prefix-value credit
(``unit="token"``, ``apply="all"``) on the same batch. ``--zipf`` draws every token id
from one Zipf law over the vocabulary, with log-normal response lengths
(``benchmarks/synthetic.py``). ``--compare`` also times, in the same rounds, the
algorithms the current ones replaced, in rows marked ``[sort]`` (KTAE counting each
chunk's tokens with one sort, :func:`ktae.core.token_counts.count_units`), ``[torch]``
(where numba is installed and KTAE's chunks run in compiled loops,
:mod:`ktae.core.jit_counts`: the torch counting by scatters, ``COUNTING = "scatter"``;
on a batch under ``JIT_MIN_POSITIONS``, where the default takes the torch path, also
``[jit]``: the loops forced) and ``[unique]`` (prefix-value's classes from one
``torch.unique`` of every token's prefix hash); where numba runs prefix-value's chunks,
also ``[lcp]`` (prefix-value in torch, its classes from prefix hashes and common prefix
lengths, ``CLASSES = "lcp"``) and, under ``JIT_MIN_POSITIONS``, ``[jit]``. Their values
are the same.
"""

from __future__ import annotations

import argparse
import json
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
from ktae.core import ktae as ktae_module  # noqa: E402
from ktae.core import prefix_value  # noqa: E402

#: ``--compare``: the row suffix and the module switches of each algorithm.
ALGORITHMS = {"": ("auto", "auto"), " [sort]": ("sort", "lcp"), " [unique]": ("auto", "unique"),
              " [lcp]": ("auto", "lcp"), " [torch]": ("scatter", "lcp"), " [jit]": ("jit", "jit")}


def with_algorithm(suffix: str, fn):
    """``fn`` run with the counting and prefix-class algorithms of a row suffix."""
    counting, classes = ALGORITHMS[suffix]

    def run():
        saved = ktae_module.COUNTING, prefix_value.CLASSES
        ktae_module.COUNTING, prefix_value.CLASSES = counting, classes
        try:
            return fn()
        finally:
            ktae_module.COUNTING, prefix_value.CLASSES = saved

    return run


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def paired_rounds(runs: dict, repeats: int, device: str) -> dict[str, list[float]]:
    """Time every function once per round, in rotation, so that all of them see the same
    machine load (this machine is shared): per-round ratios are then meaningful. Each round
    starts one function later than the one before, so that no function always runs right
    after the same other (whose freed memory or evicted caches it would inherit)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            _sync(device)
            t0 = time.perf_counter()
            runs[name]()
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


def graded_rewards(rewards: torch.Tensor, seed: int) -> torch.Tensor:
    """Correct responses 1, wrong ones ``0.4 u`` (u uniform in [0, 1)): ``digits``-like."""
    gen = torch.Generator().manual_seed(seed + 1)
    u = torch.rand(rewards.shape, generator=gen).to(rewards.device)
    return torch.where(rewards > 0, torch.ones_like(rewards), 0.4 * u)


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; else the platform's processor)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def _inputs(args):
    P, G, L, V = PRESETS[args.preset]
    batch = make_batch(P, G, L, V, seed=args.seed, zipf=args.zipf, device=args.device)
    rewards = batch.rewards if args.rewards == "binary" else graded_rewards(batch.rewards,
                                                                            args.seed)
    kw = dict(rewards=rewards, group=batch.group, token_ids=batch.token_ids, mask=batch.mask)
    return batch, kw


def _threshold(args) -> dict:
    """Thresholded KTAE's rule on this batch's rewards (graded: between wrong and right)."""
    return {"reward_threshold": 0.5} if args.rewards == "graded" else {}


def _memory_probe(args) -> int:
    """Child process: peak extra memory of one call, relative to the input tensors."""
    _, kw = _inputs(args)
    input_bytes = sum(t.element_size() * t.numel() for t in kw.values())
    mode, _, rest = args.memory_probe.partition(":")
    ngram, _, suffix = rest.partition(":")
    if mode == "prefix-value":
        name, opts = "prefix-value", {"apply": "all"}
    else:
        name, opts = "ktae", {"ngram": int(ngram or 1), "ngram_reduce": args.ngram_reduce}
        opts.update({"split": "graded"} if mode == "graded" else {"mode": mode})
        if mode == "exact":
            opts.update(_threshold(args))
    # load code pages first, numba and its compiled loops included where the measured call
    # runs them (a tiny batch is under JIT_MIN_POSITIONS: the loops are forced for it)
    tiny = make_batch(4, 4, 16, 100, seed=1, device=args.device)
    mixed = (torch.arange(tiny.rewards.numel(), device=args.device) % 2).to(tiny.rewards.dtype)
    least = ktae_module.JIT_MIN_POSITIONS, prefix_value.JIT_MIN_POSITIONS
    ktae_module.JIT_MIN_POSITIONS = prefix_value.JIT_MIN_POSITIONS = 0
    try:  # every group mixed, so that its chunks run
        with_algorithm(suffix, lambda: ktae.compute_advantages(
            name, rewards=mixed, group=tiny.group, token_ids=tiny.token_ids,
            mask=tiny.mask, **opts))()
    finally:
        ktae_module.JIT_MIN_POSITIONS, prefix_value.JIT_MIN_POSITIONS = least
    if args.chunk_tokens and name == "ktae":
        opts["chunk_tokens"] = args.chunk_tokens
    extra = peak_extra_memory(with_algorithm(suffix, lambda: ktae.compute_advantages(
        name, **kw, **opts)), args.device)
    print(f"{extra / input_bytes:.3f}")
    return 0


def _measure_memory(args, probe: str) -> float:
    """Peak extra memory / input of one call in a fresh process (``probe``:
    mode[:ngram[:row suffix]], mode ``prefix-value`` for that estimator)."""
    cmd = [sys.executable, __file__, "--preset", args.preset, "--device", args.device,
           "--seed", str(args.seed), "--memory-probe", probe, *(["--zipf"] if args.zipf else []),
           "--ngram-reduce", args.ngram_reduce, "--rewards", args.rewards]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.chunk_tokens:
        cmd += ["--chunk-tokens", str(args.chunk_tokens)]
    # Large blocks straight from mmap, returned on free: resident memory tracks live tensors.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return float(out.strip().splitlines()[-1])


class BusyProcesses:
    """``k`` processes that spin on the CPU until the context exits (then killed)."""

    def __init__(self, k: int):
        self.k, self.procs = k, []

    def __enter__(self):
        cmd = [sys.executable, "-c", "while True: pass"]
        self.procs = [subprocess.Popen(cmd) for _ in range(self.k)]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        return False


def _use_kernel(level: str, argv: list[str], ap: argparse.ArgumentParser) -> None:
    """Run this script again with ``ATEN_CPU_CAPABILITY=level`` unless it is set (torch
    reads it when loaded); refuse a level torch did not take."""
    if os.environ.get("ATEN_CPU_CAPABILITY") != level:
        env = {**os.environ, "ATEN_CPU_CAPABILITY": level}
        sys.exit(subprocess.run([sys.executable, __file__, *argv], env=env).returncode)
    got = torch.backends.cpu.get_cpu_capability()
    if got.lower() != level.lower():
        ap.error(f"--kernel: expected a kernel level torch offers on this CPU "
                 f"(default, avx2, ..., {got.lower()}), got {level!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernel", default=None, metavar="LEVEL",
                    help="torch's CPU kernel level (ATEN_CPU_CAPABILITY: default, avx2, "
                         "avx512, ... up to the CPU's own); the script runs itself again "
                         "with it set (default: the CPU's own level)")
    ap.add_argument("--zipf", action="store_true",
                    help="every token id from one Zipf law over the vocabulary, log-normal "
                         "response lengths (benchmarks/synthetic.py), instead of the preset's "
                         "mix with per-prompt topic vocabularies")
    ap.add_argument("--chunk-tokens", type=int, default=None,
                    help="KTAE's chunk_tokens option (default: the library's)")
    ap.add_argument("--loop-baseline", action="store_true",
                    help="also time a per-group, per-token Python loop in the released runtime's "
                         "style (tests/oracle.py:runtime_ktae), once; slow beyond --preset small")
    ap.add_argument("--ngram", default="1",
                    help="comma list of KTAE span lengths for the exact mode, e.g. 1,3 "
                         "(1 is always timed: the ratios refer to it)")
    ap.add_argument("--ngram-reduce", default="mean", choices=["mean", "maxabs"],
                    help="KTAE's ngram_reduce for span lengths > 1")
    ap.add_argument("--rewards", default="binary", choices=["binary", "graded"],
                    help="binary 0/1 rewards, or graded ones with split='graded' timed too")
    ap.add_argument("--contend", type=int, default=0, metavar="K",
                    help="run with K busy-loop processes competing for the CPU")
    ap.add_argument("--prefix-value", action="store_true",
                    help="also time the prefix-value credit (unit='token', apply='all')")
    ap.add_argument("--compare", action="store_true",
                    help="also time the algorithms the current ones replaced ([sort] and "
                         "[unique] rows), in the same rounds")
    ap.add_argument("--no-reference", action="store_true",
                    help="skip KTAE's reference mode (shorter rounds)")
    ap.add_argument("--no-memory", action="store_true",
                    help="skip the peak-memory probes (fresh processes)")
    ap.add_argument("--json", type=Path, default=None,
                    help="also write every median, ratio and memory figure here")
    ap.add_argument("--memory-probe", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.kernel is not None:
        _use_kernel(args.kernel, sys.argv[1:] if argv is None else list(argv), ap)
    try:
        ngrams = sorted({1} | {int(x) for x in args.ngram.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--ngram: expected a comma list of positive integers, got {args.ngram!r}")
    if ngrams[0] < 1:
        ap.error(f"--ngram: expected positive integers, got {args.ngram!r}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        return _memory_probe(args)
    if args.contend < 0:
        ap.error(f"--contend: expected a number of processes >= 0, got {args.contend}")
    with BusyProcesses(args.contend):
        return _run(args, ngrams)


def _run(args, ngrams) -> int:
    P, G, L, V = PRESETS[args.preset]
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    batch, kw = _inputs(args)
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"preset {args.preset}{' (zipf ids)' if args.zipf else ''}: {P} prompts x {G} "
          f"responses x <= {L} tokens, vocab {V}, "
          f"{batch.num_tokens / 1e6:.2f}M real tokens, {args.rewards} rewards, "
          f"CPU {cpu_model()} at kernel level {capability}, "
          f"device {args.device}, {torch.get_num_threads()} threads, {args.contend} competing "
          f"busy processes on {os.cpu_count()} cores (built in {time.perf_counter() - t0:.1f} s)")
    # The floor: one sort of the batch's int64 keys, one key per real token.
    keys = (batch.group[:, None] * V + batch.token_ids)[batch.mask]
    opts = {"chunk_tokens": args.chunk_tokens} if args.chunk_tokens else {}
    runs = {
        "sort (floor)": lambda: torch.sort(keys),
        "grpo": lambda: ktae.compute_advantages("grpo", **kw),
    }
    probes = {}
    ktae_suffixes = ["", " [sort]"] if args.compare else [""]
    # where numba runs KTAE's chunks (ktae.core.jit_counts), the torch counting too
    torch_row = [" [torch]"] if args.compare and "jit" in ktae_module.COUNTINGS else []
    if torch_row and batch.mask.numel() < ktae_module.JIT_MIN_POSITIONS:
        torch_row.append(" [jit]")  # a batch where "auto" takes the torch path
    for sfx in ktae_suffixes + torch_row:
        runs["ktae exact" + sfx] = with_algorithm(sfx, lambda: ktae.compute_advantages(
            "ktae", **kw, **opts, **_threshold(args)))
        probes["ktae exact" + sfx] = f"exact:1:{sfx}"
    for sfx in [] if args.no_reference else ktae_suffixes:
        runs["ktae reference" + sfx] = with_algorithm(sfx, lambda: ktae.compute_advantages(
            "ktae", mode="reference", **kw, **opts))
        probes["ktae reference" + sfx] = f"reference:1:{sfx}"
    if args.rewards == "graded":
        runs["ktae graded"] = lambda: ktae.compute_advantages("ktae", **kw, **opts,
                                                              split="graded")
        probes["ktae graded"] = "graded"
    for n in ngrams[1:]:
        for sfx in ktae_suffixes + torch_row:
            runs[f"ktae ngram={n}{sfx}"] = with_algorithm(sfx, lambda n=n: ktae.compute_advantages(
                "ktae", **kw, **opts, ngram=n, ngram_reduce=args.ngram_reduce))
            probes[f"ktae ngram={n}{sfx}"] = f"exact:{n}:{sfx}"
    if args.prefix_value:
        # where numba runs prefix-value's chunks, the torch classes too
        prefix_rows = ["", " [unique]"] if args.compare else [""]
        if args.compare and "jit" in prefix_value.CLASSES_ALL:
            prefix_rows.append(" [lcp]")
            if batch.mask.numel() < prefix_value.JIT_MIN_POSITIONS:
                prefix_rows.append(" [jit]")
        for sfx in prefix_rows:
            runs["prefix-value" + sfx] = with_algorithm(sfx, lambda: ktae.compute_advantages(
                "prefix-value", **kw, apply="all"))
            probes["prefix-value" + sfx] = f"prefix-value:1:{sfx}"
    for fn in runs.values():  # warm-up (allocator, lazy init)
        fn()
    times = paired_rounds(runs, args.repeats, args.device)
    floor, unigram = times["sort (floor)"], times["ktae exact"]
    input_bytes = sum(t.element_size() * t.numel() for t in kw.values())
    mem = {} if args.no_memory else {name: _measure_memory(args, probe)
                                     for name, probe in probes.items()}
    width = max(16, *(len(name) + 2 for name in runs))
    extra_col = len(ngrams) > 1 or args.rewards == "graded"
    ref_name = "x threshold" if args.rewards == "graded" else "x ngram=1"
    rows = {}
    print(f"\n{'what':<{width}}{'median s':>10}{'median x sort':>15}{'peak extra / input':>20}"
          + (f"{ref_name:>12}" if extra_col else ""))
    for name, ts in times.items():
        ratio = statistics.median(t / f for t, f in zip(ts, floor, strict=True))
        rows[name] = {"seconds": ts, "median_seconds": statistics.median(ts),
                      "median_x_sort": ratio, "peak_extra_x_input": mem.get(name)}
        m = f"{mem[name]:.2f}" if name in mem else ""
        line = f"{name:<{width}}{statistics.median(ts):>10.4f}{ratio:>15.2f}{m:>20}"
        if extra_col and name.startswith("ktae"):  # against the unigram of the same algorithm
            ref = times.get("ktae exact" + name.partition(" [")[1] + name.partition(" [")[2],
                            unigram)
            line += f"{statistics.median(t / u for t, u in zip(ts, ref, strict=True)):>12.2f}"
        print(line)
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
          f"from one call in a fresh process"
          + (f"; span lengths > 1 with ngram_reduce={args.ngram_reduce!r}" if len(ngrams) > 1
             else "")
          + ("; thresholded KTAE at reward_threshold=0.5" if args.rewards == "graded" else ""))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "preset": args.preset, "zipf": args.zipf, "shape": [P, G, L, V],
            "real_tokens": int(batch.num_tokens), "cpu": cpu_model(),
            "cpu_capability": capability,
            "threads": torch.get_num_threads(), "contend": args.contend,
            "cpu_count": os.cpu_count(), "device": args.device, "repeats": args.repeats,
            "ngram_reduce": args.ngram_reduce,
            "load_average": [load_start, os.getloadavg()[0]], "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
