"""Per-step CPU costs under CPU contention: KTAE against one sort, and the loss-time rules.

Usage:
    python benchmarks/bench_contention.py --preset large            # K = 0, 1, 2; 1 and 2 threads
    python benchmarks/bench_contention.py --preset paper --contend 0,2 --threads 2

For every number of competing busy processes K (``--contend``, started here and stopped at
the end, as ``bench_advantages.py --contend``) and every torch thread count (``--threads``),
times in paired rounds, in one process: one ``torch.sort`` of the batch's keys (the
floor), KTAE's exact and reference modes, and the other per-step costs a trainer or the
verl plugin runs on the CPU: TACO's calibration, STAPO's, GTPO's advantages and the policy
loss with its backward pass, on ``[B, T]`` tensors of the preset's shape. Prints the median
time of each and its median ratio to the sort in the same round, and the time relative to
the same K on one thread (above 1: the extra threads cost time).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_advantages import BusyProcesses, paired_rounds  # noqa: E402
from synthetic import PRESETS, make_batch  # noqa: E402

import ktae  # noqa: E402


def _runs(batch, V):
    kw = dict(rewards=batch.rewards, group=batch.group, token_ids=batch.token_ids, mask=batch.mask)
    keys = (batch.group[:, None] * V + batch.token_ids)[batch.mask]
    g = torch.Generator().manual_seed(0)
    shape = batch.mask.shape
    logp = -torch.rand(shape, generator=g) * 3
    ent = torch.rand(shape, generator=g) * 2
    old = logp + 0.01 * torch.randn(shape, generator=g)
    adv = ktae.compute_advantages("ktae", **kw)
    leaf = logp.clone().requires_grad_(True)

    def loss():
        out, _ = ktae.policy_loss(leaf, old, adv, batch.mask, clip_high=0.28)
        out.backward()

    return {
        "sort (floor)": lambda: torch.sort(keys),
        "ktae exact": lambda: ktae.compute_advantages("ktae", **kw),
        "ktae reference": lambda: ktae.compute_advantages("ktae", **kw, mode="reference"),
        "taco": lambda: ktae.calibrate_advantages("taco", adv, logprobs=logp, entropies=ent,
                                                  mask=batch.mask),
        "stapo": lambda: ktae.calibrate_advantages("stapo", adv, logprobs=logp, entropies=ent,
                                                   mask=batch.mask),
        "gtpo": lambda: ktae.compute_advantages("gtpo", **kw, entropies=ent),
        "policy loss + backward": loss,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="large")
    ap.add_argument("--contend", default="0,1,2", help="comma list of busy-process counts K")
    ap.add_argument("--threads", default="1,2", help="comma list of torch thread counts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ks = [int(x) for x in args.contend.split(",")]
    threads = [int(x) for x in args.threads.split(",")]
    P, G, L, V = PRESETS[args.preset]
    batch = make_batch(P, G, L, V, seed=args.seed, device="cpu")
    print(f"preset {args.preset}: {P} x {G} x <= {L}, {batch.num_tokens / 1e6:.2f}M real tokens; "
          f"{args.repeats} paired rounds per setting; machine: {torch.get_num_threads()} "
          f"default threads")
    rows = {}
    for k in ks:
        with BusyProcesses(k):
            for n in threads:
                torch.set_num_threads(n)
                runs = _runs(batch, V)
                for fn in runs.values():
                    fn()
                rows[k, n] = paired_rounds(runs, args.repeats, "cpu")
    names = list(next(iter(rows.values())))
    print(f"\n{'K':>2} {'thr':>3}  " + "  ".join(f"{n:>22}" for n in names))
    for (k, n), times in rows.items():
        floor = times["sort (floor)"]
        cells = []
        for name in names:
            med = statistics.median(times[name])
            ratio = statistics.median(t / f for t, f in zip(times[name], floor, strict=True))
            one = rows.get((k, 1))
            rel = med / statistics.median(one[name]) if one is not None else float("nan")
            cells.append(f"{med:7.2f}s {ratio:5.2f}x {rel:4.2f}")
        print(f"{k:>2} {n:>3}  " + "  ".join(f"{c:>22}" for c in cells))
    print("\neach cell: median seconds, median ratio to the sort, time / time at 1 thread")
    return 0


if __name__ == "__main__":
    sys.exit(main())
