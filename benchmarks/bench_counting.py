"""Time the ways KTAE counts one chunk's tokens, on both synthetic batches.

Usage:
    python benchmarks/bench_counting.py                     # the CPU's own kernel level
    python benchmarks/bench_counting.py --kernel default    # torch's portable kernels

One chunk of whole groups (``--groups`` of 16 responses, up to 3072 tokens each) from the
paper preset's batch (ids half from per-prompt topic vocabularies) and from the Zipf batch
(``benchmarks/synthetic.py``, ``zipf=True``), half of each group's responses correct.
Each round times, in rotation, on one thread:

- ``bitmap``: :func:`ktae.core.scatter_counts.count_units_scatter` with dense ids from
  presence bitmaps (what ``COUNTING = "auto"`` runs when the ids are dense): the tokens'
  ids, then the (group, token) pairs'; ``one pair bitmap``: the pairs' ids from one bitmap
  over the chunk's whole (group, token) range instead, a pass over the chunk fewer for a
  larger bitmap (not used by the library);
- ``mark pairs``: the presence bitmap of the chunk's (group, token) keys by
  :func:`ktae.core.scatter_counts.mark` (a scatter), against ``index_fill_ pairs``;
- ``sort``: :func:`ktae.core.token_counts.count_units`, one sort of the chunk's keys;
- ``hashed``: the bitmap path with ids spread over a range too wide for a bitmap (every
  id times a large odd number), so that the (group, token) pairs go through
  :func:`ktae.core.scatter_counts.hash_ids`; ``sort, wide ids``: the sort of the same ids
  (what "auto" runs there);
- ``row lengths``: :func:`ktae.core.token_counts.row_lengths` of a mask of the paper
  batch's shape (16384 x 3072, the chunk's rows repeated), against ``mask.sum(1)``.

Prints the median milliseconds over ``--repeats`` rounds (each round starts one row later
than the one before, so that no row always runs right after the same other) and each
row's median ratio to the sort of the same round; CPU time of the process (``time.process_time``), so that
other jobs on a shared machine move the figures less.

``--calls P`` times whole calls instead: ``compute_advantages("ktae")`` on a batch of ``P``
paper-shaped prompts of each kind (the chunks as the library cuts them: mixed groups only,
about 2**18 tokens each), counting as ``COUNTING = "auto"`` does and by one sort per chunk
(``"sort"``), in rotation with one sort of the batch's keys, on one thread.
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
from ktae.core.token_counts import (  # noqa: E402
    _ranks_in_groups,
    count_units,
    real_positions,
    row_lengths,
)

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
    return {
        "sort": lambda: count_units(tok.clone(), *rest),
        "bitmap": lambda: scatter_counts.count_units_scatter(tok, bound, *rest),
        "one pair bitmap": lambda: _one_pair_bitmap(tok, bound, *rest),
        "mark pairs": lambda: scatter_counts.mark(pairs, groups * bound),
        "index_fill_ pairs": lambda: torch.zeros(groups * bound, dtype=torch.bool).index_fill_(
            0, pairs, True),
        "hashed": lambda: scatter_counts.count_units_scatter(wide, int(wide.max()) + 1, *rest),
        "sort, wide ids": lambda: count_units(wide.clone(), *rest),
        "mask.sum(1)": lambda: mask.sum(1, dtype=torch.int32).long(),
        "row lengths": lambda: row_lengths(mask),
    }


def _one_pair_bitmap(tok, bound, row, row_len, gid, groups, correct):
    """The ids of the (group, token) pairs from one bitmap over ``groups x bound`` (no dense
    token ids first), then the same counting as ``count_units_scatter``: the variant that
    skips a pass over the chunk for a larger bitmap."""
    pair, inverse = scatter_counts.dense_ids(gid.index_select(0, row) * bound + tok,
                                             groups * bound)
    group = pair // bound
    sizes, rank = _ranks_in_groups(gid, groups)
    g_max, u = int(sizes.max()), pair.numel()
    incorrect = (~correct).long()
    cell = (incorrect * g_max + rank).mul_(u).index_select(0, row).add_(inverse)
    ab = scatter_counts.mark(cell, 2 * g_max * u).view(torch.uint8).view(2, g_max, u).sum(
        1, dtype=torch.uint8)
    occurrences = torch.bincount((incorrect * u).to(inverse.dtype).index_select(0, row)
                                 .add_(inverse), minlength=2 * u)
    return group, ab, occurrences


def _call_runs(prompts: int, zipf: bool, seed: int) -> tuple[int, dict]:
    """``--calls``: whole KTAE calls counting by bitmaps and by one sort per chunk."""
    import ktae
    from ktae.core import ktae as ktae_module

    P, G, L, V = PRESETS["paper"]
    batch = make_batch(prompts, G, L, V, seed=seed, zipf=zipf)
    kw = dict(rewards=batch.rewards, group=batch.group, token_ids=batch.token_ids,
              mask=batch.mask)
    keys = (batch.group[:, None] * V + batch.token_ids)[batch.mask]

    def call(counting: str):
        def run():
            saved, ktae_module.COUNTING = ktae_module.COUNTING, counting
            try:
                return ktae.compute_advantages("ktae", **kw)
            finally:
                ktae_module.COUNTING = saved
        return run

    return keys.numel(), {"sort": lambda: torch.sort(keys), "ktae": call("auto"),
                          "ktae, sort per chunk": call("sort")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=6, help="groups of 16 in the chunk")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernel", default=None, metavar="LEVEL",
                    help="torch's CPU kernel level (ATEN_CPU_CAPABILITY); the script runs "
                         "itself again with it set")
    ap.add_argument("--calls", type=int, default=0, metavar="P",
                    help="time whole KTAE calls on batches of P prompts instead of one chunk")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.kernel is not None and os.environ.get("ATEN_CPU_CAPABILITY") != args.kernel:
        env = {**os.environ, "ATEN_CPU_CAPABILITY": args.kernel}
        argv = sys.argv[1:] if argv is None else list(argv)
        return subprocess.run([sys.executable, __file__, *argv], env=env).returncode
    if args.groups < 1 or args.repeats < 1 or args.calls < 0:
        ap.error(f"--groups, --repeats, --calls: expected positive integers (--calls: 0 "
                 f"for one chunk), got {args.groups}, {args.repeats}, {args.calls}")
    torch.set_num_threads(1)
    capability = torch.backends.cpu.get_cpu_capability()
    load = [os.getloadavg()[0]]
    record = {"cpu": cpu_model(), "cpu_capability": capability, "groups": args.groups,
              "calls": args.calls, "repeats": args.repeats, "batches": {}}
    what = (f"whole calls on {args.calls} prompts" if args.calls
            else f"one chunk of {args.groups} groups x 16 responses")
    print(f"CPU {record['cpu']} at kernel level {capability}, 1 thread; {what}")
    for name, zipf in (("topics", False), ("zipf", True)):
        if args.calls:
            tokens, runs = _call_runs(args.calls, zipf, args.seed)
        else:
            batch, chunk = _chunk(zipf, args.groups, args.seed)
            tokens, runs = int(chunk[0].numel()), _runs(batch, chunk)
        for fn in runs.values():
            fn()
        times = {k: [] for k in runs}
        names = list(runs)
        for r in range(args.repeats):  # each round starts one row later: no row always
            for k in names[r % len(names):] + names[:r % len(names)]:  # follows another
                t0 = time.process_time()
                runs[k]()
                times[k].append(time.process_time() - t0)
        rows = {k: {"median_ms": 1000 * statistics.median(v),
                    "median_x_sort": statistics.median(
                        a / s for a, s in zip(v, times["sort"], strict=True))}
                for k, v in times.items()}
        record["batches"][name] = {"tokens": tokens, "rows": rows}
        print(f"\n{name}: {tokens} tokens in the {'batch' if args.calls else 'chunk'}")
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
