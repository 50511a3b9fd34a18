"""Attention's forward and backward at the update's shapes under PyTorch's two CPU kernels
for ``scaled_dot_product_attention``: the flash kernel (what sdpa picks) and the plain
"math" one (two batched products and a softmax), and the flash kernel reading grouped
keys and values itself (``enable_gqa``), side by side (studies/step-time/report.md).

Usage:
    python benchmarks/bench_attention_kernel.py                # SmolLM2-135M's heads
    python benchmarks/bench_attention_kernel.py --rounds 30 --json out.json
    python benchmarks/bench_attention_kernel.py --decoding     # a decoding step's attention

One layer's attention, float32 (what ``--bf16`` runs it in: ``float32_attention``), 8 rows,
SmolLM2-135M's 9 query heads over 3 key-value heads of 64 dimensions, a causal mask, at
three shapes: every position of a micro-batch (124 queries over 124 keys), the scored
positions over a shared prompt's cache (64 over 124), and a prompt alone (60 over 60).
``flash`` and ``math`` take the keys and values repeated to every query head, as
transformers' ``sdpa`` attention gives them when a mask is present (``repeat_kv``, timed
with the kernel: its copy forward, its sum backward); ``flash_gqa`` takes the 3 heads and
``enable_gqa``. Per shape the variants alternate round by round, after a check that their
outputs agree (within 1e-4); it prints the median CPU seconds of each (one thread), math's
over flash's and flash_gqa's over flash's.

``--decoding``: a decoding step's attention instead, forward only, without gradients: 32
rows (the recipe's batch), one query each over 60, 92 and 124 keys (a prompt, then the
response's first and last tokens), the keys and values of the bfloat16 KV cache a
``--bf16`` run keeps, a left-padding mask, both variants casting to float32 as
``float32_attention`` does: ``sdpa``, transformers' path (the groups folded into the
query, PyTorch's flash kernel) against ``matmul``, ktae's
(:func:`ktae.train.precision.decoding_attention`), with freed memory kept for reuse as
``ktae train`` keeps it (:mod:`ktae.train.allocator`). Per shape, the median CPU seconds of one
call (rounds of 50 calls, alternating) and matmul's over sdpa's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = ((124, 124), (64, 124), (60, 60))
"""(queries, keys): a whole micro-batch, the scored positions over a shared prefix, a prompt."""
VARIANTS = {"flash": (SDPBackend.FLASH_ATTENTION, False), "math": (SDPBackend.MATH, False),
            "flash_gqa": (SDPBackend.FLASH_ATTENTION, True)}
"""name: (kernel, whether it reads the grouped keys and values itself)."""


def attention(variant: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor) -> torch.Tensor:
    kernel, grouped = VARIANTS[variant]
    groups = q.size(1) // k.size(1)
    if not grouped:  # transformers' repeat_kv
        k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    with sdpa_kernel(kernel):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=grouped and groups > 1)


def one_pass(variant: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             mask: torch.Tensor) -> float:
    """CPU seconds of one forward and backward pass of ``variant``."""
    for t in (q, k, v):
        t.grad = None
    start = time.process_time()
    attention(variant, q, k, v, mask).sum().backward()
    return time.process_time() - start


def measure(queries: int, keys: int, *, rows: int, heads: int, kv_heads: int, dim: int,
            rounds: int, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, queries, dim, generator=gen).requires_grad_()
    k = torch.randn(rows, kv_heads, keys, dim, generator=gen).requires_grad_()
    v = torch.randn(rows, kv_heads, keys, dim, generator=gen).requires_grad_()
    # query i sits at position keys - queries + i and sees the keys up to it
    mask = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
    mask = mask[None, None].expand(rows, 1, queries, keys)
    with torch.no_grad():  # the variants compute the same attention
        outs = {name: attention(name, q, k, v, mask) for name in VARIANTS}
    difference = max((outs[n] - outs["flash"]).abs().max().item() for n in VARIANTS)
    if difference > 1e-4:
        raise RuntimeError(f"the kernels disagree by {difference:.2e}")
    times = {name: [] for name in VARIANTS}
    for r in range(rounds + 1):
        for name in VARIANTS:
            seconds = one_pass(name, q, k, v, mask)
            if r:  # the first round warms up
                times[name].append(seconds)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return {"queries": queries, "keys": keys, **{f"{n}_s": s for n, s in med.items()},
            "math_over_flash": med["math"] / med["flash"],
            "gqa_over_flash": med["flash_gqa"] / med["flash"], "largest_difference": difference}


DECODING_KEYS = (60, 92, 124)
"""Keys a decoding step attends to: a prompt's, then the response's first and last tokens'."""


def measure_decoding(keys: int, *, rows: int, heads: int, kv_heads: int, dim: int,
                     rounds: int, calls: int = 50, seed: int = 0) -> dict:
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from ktae.train.precision import decoding_attention

    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, 1, dim, generator=gen).bfloat16()
    k, v = (torch.randn(rows, kv_heads, keys, dim, generator=gen).bfloat16() for _ in "kv")
    mask = torch.ones(rows, 1, 1, keys, dtype=torch.bool)
    mask[: rows // 4, :, :, :10] = False  # left-padded rows
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    variants = {
        "sdpa": lambda: sdpa_attention_forward(module, q.float(), k.float(), v.float(), mask,
                                               scaling=dim ** -0.5)[0],
        "matmul": lambda: decoding_attention(q.float(), k.float(), v.float(), mask,
                                             dim ** -0.5),
    }
    with torch.no_grad():
        difference = (variants["matmul"]() - variants["sdpa"]()).abs().max().item()
        if difference > 1e-4:
            raise RuntimeError(f"the decoding variants disagree by {difference:.2e}")
        times = {name: [] for name in variants}
        for r in range(rounds + 1):
            for name, run in variants.items():
                start = time.process_time()
                for _ in range(calls):
                    run()
                if r:  # the first round warms up
                    times[name].append((time.process_time() - start) / calls)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return {"keys": keys, **{f"{n}_s": s for n, s in med.items()},
            "matmul_over_sdpa": med["matmul"] / med["sdpa"], "largest_difference": difference}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=None, help="rows (default 8; 32 with --decoding)")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--rounds", type=int, default=20, help="rounds measured, after one warm-up")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--decoding", action="store_true",
                   help="a decoding step's attention (module docstring); --rows defaults to 32")
    a = p.parse_args(argv)
    if a.rows is None:
        a.rows = 32 if a.decoding else 8
    for name, value in (("rows", a.rows), ("heads", a.heads), ("kv-heads", a.kv_heads),
                        ("dim", a.dim), ("rounds", a.rounds), ("threads", a.threads)):
        if value < 1:
            p.error(f"--{name}: expected a positive integer, got {value}")
    if a.heads % a.kv_heads:
        p.error(f"--kv-heads: expected a divisor of --heads ({a.heads}), got {a.kv_heads}")
    torch.set_num_threads(a.threads)
    if a.decoding:
        return decoding_table(a)
    rows = [measure(qn, kn, rows=a.rows, heads=a.heads, kv_heads=a.kv_heads, dim=a.dim,
                    rounds=a.rounds) for qn, kn in SHAPES]
    print(f"attention forward + backward, float32, {a.rows} rows x {a.heads} query heads over "
          f"{a.kv_heads} key-value heads x {a.dim}, {a.threads} thread(s), median of "
          f"{a.rounds} rounds (CPU ms)")
    print("| queries x keys | flash | math | flash_gqa | math / flash | flash_gqa / flash |\n"
          "|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['queries']} x {r['keys']} | {r['flash_s'] * 1e3:.2f} | "
              f"{r['math_s'] * 1e3:.2f} | {r['flash_gqa_s'] * 1e3:.2f} | "
              f"{r['math_over_flash']:.2f} | {r['gqa_over_flash']:.2f} |")
    write_json(a, rows)
    return rows


def write_json(a, rows: list[dict]) -> None:
    """The arguments and the measured rows to ``--json``, where it is given."""
    if a.json:
        a.json.write_text(json.dumps({"args": vars(a) | {"json": str(a.json)}, "rows": rows},
                                     indent=1) + "\n")


def decoding_table(a) -> list[dict]:
    from ktae.train.allocator import keep_freed_memory

    keep_freed_memory()  # as ktae train runs: the casts' buffers reused, not faulted in anew
    rows = [measure_decoding(kn, rows=a.rows, heads=a.heads, kv_heads=a.kv_heads, dim=a.dim,
                             rounds=a.rounds) for kn in DECODING_KEYS]
    print(f"decoding attention, one query a row over a bfloat16 cache, in float32, {a.rows} "
          f"rows x {a.heads} query heads over {a.kv_heads} key-value heads x {a.dim}, "
          f"{a.threads} thread(s), median of {a.rounds} rounds (CPU ms a call)")
    print("| keys | sdpa | matmul | matmul / sdpa |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['keys']} | {r['sdpa_s'] * 1e3:.3f} | {r['matmul_s'] * 1e3:.3f} | "
              f"{r['matmul_over_sdpa']:.2f} |")
    write_json(a, rows)
    return rows


if __name__ == "__main__":
    main()
