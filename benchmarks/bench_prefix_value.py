"""Time the prefix-value credit against the floor of one sort of the same size.

Usage:
    python benchmarks/bench_prefix_value.py --preset small     # seconds
    python benchmarks/bench_prefix_value.py --preset paper     # 1024 x 16 x 3072

The batch is the synthetic one of ``bench_advantages.py`` (``synthetic.py``), except that
each response first copies a prefix of its group's first response, of a length uniform in
``[0, --shared * its length]`` (responses to one prompt share their opening, so prefixes
branch at many depths, as real rollouts do). Prints the median of ``--repeats`` rounds
(each function once per round, in rotation, in one process) and the median ratio to one
``torch.sort`` of the batch's int64 keys (one key per real token) timed in the same round,
as ``bench_advantages.py`` does. Rows: GRPO, prefix-value with ``unit="token"`` (all
responses) and ``unit="span"``; with ``--compare`` also, in the same rounds, the same rows
with the classes of the algorithm the current one replaced (``[unique]``: one
``torch.unique`` of every token's prefix hash; the values are the same). Runs on CUDA when
available (``--device``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_advantages import paired_rounds, with_algorithm  # noqa: E402
from synthetic import PRESETS, make_batch  # noqa: E402

import ktae  # noqa: E402


def share_prefixes(token_ids: torch.Tensor, mask: torch.Tensor, group: torch.Tensor,
                   shared: float, seed: int) -> torch.Tensor:
    """Each response's first ``k`` tokens copied from its group's first response,
    ``k ~ U[0, shared * min(both lengths)]``; ``group`` is contiguous (synthetic batches)."""
    gen = torch.Generator().manual_seed(seed + 7)
    B, T = token_ids.shape
    first = torch.zeros(int(group.max()) + 1, dtype=torch.long).scatter_reduce(
        0, group.cpu(), torch.arange(B), "amin", include_self=False).to(token_ids.device)
    lengths = mask.sum(dim=1)
    lead = first[group]
    limit = torch.minimum(lengths, lengths[lead]).float()
    k = (shared * limit * torch.rand(B, generator=gen).to(limit.device)).long()
    copy = torch.arange(T, device=token_ids.device)[None, :] < k[:, None]
    return torch.where(copy, token_ids[lead], token_ids)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shared", type=float, default=0.5,
                    help="most share of a response copied from its group's first one")
    ap.add_argument("--compare", action="store_true",
                    help="also time the classes by one torch.unique ([unique] rows)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not 0 <= args.shared <= 1:
        ap.error(f"--shared: expected a share in [0, 1], got {args.shared}")
    P, G, L, V = PRESETS[args.preset]
    t0 = time.perf_counter()
    batch = make_batch(P, G, L, V, seed=args.seed, device=args.device)
    ids = share_prefixes(batch.token_ids, batch.mask, batch.group, args.shared, args.seed)
    kw = dict(rewards=batch.rewards, group=batch.group, token_ids=ids, mask=batch.mask)
    print(f"preset {args.preset}: {P} prompts x {G} responses x <= {L} tokens, vocab {V}, "
          f"{batch.num_tokens / 1e6:.2f}M real tokens, prefixes shared up to "
          f"{args.shared:.0%}, device {args.device}, {torch.get_num_threads()} threads on "
          f"{os.cpu_count()} cores (built in {time.perf_counter() - t0:.1f} s)")
    keys = (batch.group[:, None] * V + ids)[batch.mask]  # the floor: one sort, one key per token
    runs = {
        "sort (floor)": lambda: torch.sort(keys),
        "grpo": lambda: ktae.compute_advantages("grpo", **kw),
    }
    for sfx in ["", " [unique]"] if args.compare else [""]:
        for unit in ("token", "span"):
            runs[f"prefix-value {unit}{sfx}"] = with_algorithm(
                sfx, lambda unit=unit: ktae.compute_advantages("prefix-value", **kw, apply="all",
                                                               unit=unit))
    for fn in runs.values():  # warm-up (allocator, lazy init)
        fn()
    times = paired_rounds(runs, args.repeats, args.device)
    floor = times["sort (floor)"]
    width = max(len(name) for name in runs) + 2
    print(f"\n{'what':<{width}}{'median s':>10}{'median x sort':>15}")
    for name, ts in times.items():
        ratio = statistics.median(t / f for t, f in zip(ts, floor, strict=True))
        print(f"{name:<{width}}{statistics.median(ts):>10.4f}{ratio:>15.2f}")
    print(f"\n{args.repeats} paired rounds (ratio = median over rounds of time / sort time in "
          "the same round)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
