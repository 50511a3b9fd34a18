"""Time the ways KTAE counts one chunk's tokens, on both synthetic batches.

Usage:
    python benchmarks/bench_counting.py                     # the CPU's own kernel level
    python benchmarks/bench_counting.py --kernel default    # torch's portable kernels

One chunk of whole groups (``--groups`` of 16 responses, up to 3072 tokens each) from the
paper preset's batch (ids half from per-prompt topic vocabularies) and from the Zipf batch
(``benchmarks/synthetic.py``, ``zipf=True``), half of each group's responses correct.
Each round times, in rotation, on one thread:

- ``bitmap``: :func:`ktae.core.scatter_counts.count_units_scatter` with dense ids from
  presence bitmaps (what ``COUNTING = "auto"`` runs when the ids are dense); ``bitmap, ids
  first``: the same with the tokens' dense ids made before the pairs' where one bitmap of
  the (group, token) pairs would do (``scatter_counts.DIRECT = False``);
- ``mark pairs``: the presence bitmap of the chunk's (group, token) keys by
  :func:`ktae.core.scatter_counts.mark` (a scatter), against ``index_fill_ pairs``;
- ``sort``: :func:`ktae.core.token_counts.count_units`, one sort of the chunk's keys;
- ``hashed``: the bitmap path with ids spread over a range too wide for a bitmap (every
  id times a large odd number), so that the (group, token) pairs go through
  :func:`ktae.core.scatter_counts.hash_ids`; ``sort, wide ids``: the sort of the same ids
  (what "auto" runs there);
- ``row lengths``: :func:`ktae.core.token_counts.row_lengths` of a mask of the paper
  batch's shape (16384 x 3072, the chunk's rows repeated), against ``mask.sum(1)``.

Prints the median milliseconds over ``--repeats`` rounds and each row's median ratio to
the sort of the same round; CPU time of the process (``time.process_time``), so that
other jobs on a shared machine move the figures less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_advantages import cpu_model  # noqa: E402
from synthetic import PRESETS, make_batch  # noqa: E402

from ktae.core import scatter_counts  # noqa: E402
from ktae.core.token_counts import count_units, real_positions, row_lengths  # noqa: E402

#: ``hashed``: the multiplier that spreads the ids (odd, so that distinct ids stay distinct).
SPREAD = 1_000_003


def _chunk(zipf: bool, groups: int, seed: int):
    P, G, L, V = PRESETS["paper"]
    batch = make_batch(groups, G, L, V, seed=seed, zipf=zipf)
    flat, row, row_len = real_positions(batch.mask)
    tok = batch.token_ids.reshape(-1).index_select(0, flat)
    correct = torch.arange(batch.group.numel()) % 2 == 0
    return batch, (tok, row, row_len, batch.group, groups, correct)


def _runs(batch, chunk) -> dict:
    tok, row, row_len, gid, groups, correct = chunk
    wide = tok * SPREAD
    B = PRESETS["paper"][0] * PRESETS["paper"][1]  # the chunk's mask repeated: the batch's shape
    mask = batch.mask.repeat(-(-B // batch.mask.shape[0]), 1)[:B].contiguous()
    rest = (row, row_len, gid, groups, correct)
    bound = int(tok.max()) + 1
    pairs = gid.index_select(0, row) * bound + tok

    def ids_first():  # the tokens' dense ids, then the pairs' (scatter_counts.DIRECT off)
        saved, scatter_counts.DIRECT = scatter_counts.DIRECT, False
        try:
            return scatter_counts.count_units_scatter(tok, bound, *rest)
        finally:
            scatter_counts.DIRECT = saved

    return {
        "sort": lambda: count_units(tok.clone(), *rest),
        "bitmap": lambda: scatter_counts.count_units_scatter(tok, bound, *rest),
        "bitmap, ids first": ids_first,
        "mark pairs": lambda: scatter_counts.mark(pairs, groups * bound),
        "index_fill_ pairs": lambda: torch.zeros(groups * bound, dtype=torch.bool).index_fill_(
            0, pairs, True),
        "hashed": lambda: scatter_counts.count_units_scatter(wide, int(wide.max()) + 1, *rest),
        "sort, wide ids": lambda: count_units(wide.clone(), *rest),
        "mask.sum(1)": lambda: mask.sum(1, dtype=torch.int32).long(),
        "row lengths": lambda: row_lengths(mask),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=6, help="groups of 16 in the chunk")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernel", default=None, metavar="LEVEL",
                    help="torch's CPU kernel level (ATEN_CPU_CAPABILITY); the script runs "
                         "itself again with it set")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.kernel is not None and os.environ.get("ATEN_CPU_CAPABILITY") != args.kernel:
        env = {**os.environ, "ATEN_CPU_CAPABILITY": args.kernel}
        argv = sys.argv[1:] if argv is None else list(argv)
        return subprocess.run([sys.executable, __file__, *argv], env=env).returncode
    if args.groups < 1 or args.repeats < 1:
        ap.error(f"--groups, --repeats: expected positive integers, got {args.groups}, "
                 f"{args.repeats}")
    torch.set_num_threads(1)
    capability = torch.backends.cpu.get_cpu_capability()
    load = [os.getloadavg()[0]]
    record = {"cpu": cpu_model(), "cpu_capability": capability, "groups": args.groups,
              "repeats": args.repeats, "batches": {}}
    print(f"CPU {record['cpu']} at kernel level {capability}, 1 thread; one chunk of "
          f"{args.groups} groups x 16 responses")
    for name, zipf in (("topics", False), ("zipf", True)):
        batch, chunk = _chunk(zipf, args.groups, args.seed)
        runs = _runs(batch, chunk)
        for fn in runs.values():
            fn()
        times = {k: [] for k in runs}
        for _ in range(args.repeats):
            for k, fn in runs.items():
                t0 = time.process_time()
                fn()
                times[k].append(time.process_time() - t0)
        rows = {k: {"median_ms": 1000 * statistics.median(v),
                    "median_x_sort": statistics.median(
                        a / s for a, s in zip(v, times["sort"], strict=True))}
                for k, v in times.items()}
        record["batches"][name] = {"tokens": int(chunk[0].numel()), "rows": rows}
        print(f"\n{name}: {chunk[0].numel()} tokens in the chunk")
        for k, r in rows.items():
            print(f"  {k:<20}{r['median_ms']:>9.2f} ms{r['median_x_sort']:>8.2f}x sort")
    load.append(os.getloadavg()[0])
    record["load_average"] = load
    print(f"\n1-minute load average at start, end: {load[0]:.1f}, {load[1]:.1f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
