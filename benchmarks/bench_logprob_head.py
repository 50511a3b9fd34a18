"""The policy pass's forward and backward under TRL's fused LM head and under ktae's full
head, side by side, on a real model (studies/step-time/report.md, "The log-prob head").

Usage:
    python benchmarks/bench_logprob_head.py                      # SmolLM2-135M, 8 x (50 + 32)
    python benchmarks/bench_logprob_head.py --rows 8 --prompt 70 --completion 64 --json out.json

Per round, in turn: TRL 1.16's head (``fused_lm_head=True``, log-probs and entropies, as
its ``_compute_loss`` asks), ktae's ``full`` head (:func:`ktae.train.logprob_head.full_logps`),
and the backbone alone (its last hidden states, no vocabulary projection): each a forward
pass with gradients and its backward, full fine-tuning, one thread by default. Prints the
medians over the rounds after the first and each against ``6 N T``, ``T`` every position
of the batch, at the matmul rate measured in the same run; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt", type=int, default=50, help="prompt tokens a row")
    p.add_argument("--completion", type=int, default=32, help="completion tokens a row")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--rounds", type=int, default=4, help="rounds; the first warms up")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="write every number here")
    a = p.parse_args(argv)
    if a.rounds < 2:
        p.error("--rounds: expected at least 2 (the first warms up)")

    from bench_step import (
        linear_shapes,
        load_model,
        matmul_rate,
        parameter_count,
        resolve_model,
    )
    from trl.trainer.utils import add_fused_lm_head

    from ktae.train.logprob_head import full_logps

    torch.set_num_threads(a.threads)
    model, _ = load_model(resolve_model(a.model))
    model.train()
    add_fused_lm_head(model, temperature=a.temperature, outputs=("log_probs", "entropy"))
    n_params = parameter_count(model)
    keep, length = a.completion, a.prompt + a.completion
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (a.rows, length), generator=g)
    mask = torch.ones_like(ids)
    weights = torch.randn(a.rows, keep, generator=g)

    def trl_head():
        labels = ids.clone()
        labels[:, :-keep] = -100
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        return (out.log_probs[:, -keep:] * weights).sum()

    def full_head():
        lp, _ = full_logps(model, ids, mask, keep, a.temperature, compute_entropy=True,
                           entropy_grad=False)
        return (lp * weights).sum()

    def backbone():
        return model.model(input_ids=ids, attention_mask=mask).last_hidden_state.sum() * 1e-6

    passes = {"TRL's fused head": trl_head, "ktae's full head": full_head,
              "backbone alone": backbone}
    times: dict[str, dict[str, list[float]]] = {k: {"forward": [], "backward": []}
                                                for k in passes}
    load = [os.getloadavg()[0]]
    for r in range(a.rounds):
        for name, fn in passes.items():
            start = time.perf_counter()
            loss = fn()
            mid = time.perf_counter()
            loss.backward()
            end = time.perf_counter()
            model.zero_grad(set_to_none=True)
            if r:
                times[name]["forward"].append(mid - start)
                times[name]["backward"].append(end - mid)
    load.append(os.getloadavg()[0])
    rate = matmul_rate(linear_shapes(model), a.rows * length)
    floor = 6 * n_params * a.rows * length / rate
    result = {"model": a.model, "parameters": n_params, "rows": a.rows, "prompt": a.prompt,
              "completion": a.completion, "threads": a.threads, "rounds": a.rounds - 1,
              "matmul_flops": rate, "floor_6NT": floor, "load": load, "passes": {}}
    print(f"{a.model}: {a.rows} rows x ({a.prompt} + {a.completion}) tokens, {a.threads} "
          f"thread(s), {rate / 1e9:.0f} GFLOP/s, 6 N T = {floor:.2f} s; load {load[0]:.1f} -> "
          f"{load[1]:.1f}; medians of {a.rounds - 1} rounds")
    print(f"  {'pass':<18} {'forward':>8} {'backward':>9} {'total':>7} {'x 6NT':>6}")
    for name, t in times.items():
        fwd, bwd = statistics.median(t["forward"]), statistics.median(t["backward"])
        result["passes"][name] = {"forward": fwd, "backward": bwd, "total": fwd + bwd}
        print(f"  {name:<18} {fwd:8.2f} {bwd:9.2f} {fwd + bwd:7.2f} {(fwd + bwd) / floor:6.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
