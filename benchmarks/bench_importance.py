"""The audit's input-gradient importance on SmolLM2's own sampled groups, three ways side by
side: the two-pass path (a clean and a noised forward pass, then the backward pass), the
clean pass read from the sampling's cache, and that with the rows split by length
(:func:`ktae.models.input_grad_importance.length_chunks`).

Usage:
    python benchmarks/bench_importance.py [--prompts 6] [--samples 8] [--rounds 3]

Each round times every way once over the same groups, alternating; the table gives
medians of wall and CPU seconds and their ratios to the two-pass path, with the
1-minute load average (the machine is shared: compare within a run). Needs the prepared
model (``ktae models prepare smollm2-135m``)."""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from ktae.credit_audit import arith_input
from ktae.groups.sampling import load_model
from ktae.models.input_grad_importance import answer_tokens, group_importance, length_chunks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default="smollm2-135m", help="a named model or a directory")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="sampled tokens a response")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, where = load_model(args.model)
    data = arith_input.sampled_input(model, tok, where, difficulty=1, prompts=args.prompts,
                                     samples=args.samples, seed=0, max_new_tokens=args.max_new_tokens,
                                     temperature=0.7, references=lambda r: True)
    groups = [g.group for g in data.groups]
    rows = []
    for g in groups:
        conclusion, (answer,) = answer_tokens(tok, [g.answer])
        rows.append((tok(g.prompt)["input_ids"], [list(r) for r in g.responses], answer,
                     conclusion, data.references.get(id(g))))
    lengths = [len(r) for _, rs, *_ in rows for r in rs]
    padded = sum(len(rs) * max(len(r) for r in rs) for _, rs, *_ in rows)
    split = sum(sum(len(c) * max(len(rs[i]) for i in c)
                    for c in length_chunks([len(r) for r in rs], len(a) + len(c0)))
                for _, rs, a, c0, _ in rows)
    print(f"{len(groups)} groups, {len(lengths)} responses, mean length "
          f"{statistics.mean(lengths):.1f}; padded positions {padded}, split {split}")
    ways = {"two passes": dict(split=False, ref=False), "cache": dict(split=False, ref=True),
            "cache, split": dict(split=True, ref=True)}
    wall = {k: [] for k in ways}
    cpu = {k: [] for k in ways}
    for rnd in range(args.rounds):
        print(f"round {rnd + 1}/{args.rounds}, load {os.getloadavg()[0]:.2f}", flush=True)
        for name, way in ways.items():
            g = torch.Generator().manual_seed(rnd)
            t, c = time.perf_counter(), time.process_time()
            for prompt, responses, answer, conclusion, ref in rows:
                group_importance(model, prompt, responses, answer, tok.pad_token_id or 0,
                                 conclusion=conclusion, generator=g, split=way["split"],
                                 reference=ref if way["ref"] else None)
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    base_w, base_c = statistics.median(wall["two passes"]), statistics.median(cpu["two passes"])
    print(f"{'way':14s} {'wall s':>8s} {'CPU s':>8s} {'wall ratio':>11s} {'CPU ratio':>10s}")
    for name in ways:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"{name:14s} {w:8.1f} {c:8.1f} {w / base_w:11.2f} {c / base_c:10.2f}")
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
