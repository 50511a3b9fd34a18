"""What ``torch.compile`` buys the LoRA recipe's update on the CPU, against what it costs.

Usage:
    python benchmarks/bench_compile.py               # the recipe, --bf16's arithmetic
    python benchmarks/bench_compile.py --float32 --rounds 7 --json out.json
    python benchmarks/bench_compile.py --ktae        # the trainer's own update path

The recipe's model (``configs/smollm2-recipe.yaml``) with its LoRA adapters, loaded as
``ktae train --bf16`` loads it (the frozen base in bfloat16 under autocast, attention in
float32; ``--float32``: all float32), one thread. One micro-batch of the recipe's update
(``num_prompts x num_generations / gradient_accumulation_steps`` rows of a prompt and
``max_new_tokens`` new tokens, random ids, the first half of the rows left-padded by 4)
runs a forward pass (the log-probabilities of the new tokens, as the update scores them)
and its backward pass:

* **eager**: as PyTorch runs it, peft's LoRA forward;
* **compiled**: every decoder layer compiled (``torch.compile(layer, dynamic=True)``,
  regional compilation: layers alike reuse compiled code where their guards allow, and
  the sequence length may change without compiling again), the rest eager.

PyTorch keeps compiled code on disk (``TORCHINDUCTOR_CACHE_DIR``, by default under the
temporary directory): a process compiling what an earlier one compiled finishes sooner,
so the first pass is a cold cache's only on a fresh one.

With ``--ktae`` the pass is the trainer's own instead
(:func:`ktae.train.logprob_head.full_logps`: its fused LoRA forward, its log-prob head and
entropies, and the shared prefix), on a micro-batch of one prompt's responses, as the
trainer's update runs them (:mod:`ktae.train.micro_batches`): the prompt's pass and the
responses' pass on top of its cache each compile apart, and every layer's cache guards
its own; ``unique_graphs`` counts the compiled graphs.

The prompt length changes round by round (``--lengths``), as the update's micro-batches
do. The compiled variant's first pass holds the compilation, and its log-probs must be
eager's (their sums within 1e-3 of each other in float32, and within bfloat16's rounding,
2^-8, under ``--bf16``, where the compiled kernels round their fused intermediates
otherwise); then the two alternate round by round. Prints the first pass, the median
pass of each, their ratio, and after how many passes the compilation has paid for itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def one_pass(model, ids: torch.Tensor, mask: torch.Tensor, keep: int,
             bf16: bool, ktae: bool = False) -> tuple[float, float]:
    """Seconds of a forward pass (log-probs of the last ``keep`` tokens) and its backward,
    and the sum of those log-probs; ``ktae``: through the trainer's own head
    (:func:`ktae.train.logprob_head.full_logps`, entropies without gradient)."""
    from ktae.train.logprob_head import full_logps

    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        if ktae:
            logp = full_logps(model, ids, mask, keep, 1.0, compute_entropy=True,
                              entropy_grad=False)[0].sum()
        else:
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep + 1,
                           use_cache=False).logits
    if not ktae:
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, -keep:, None]).sum()
    logp.backward()
    return time.perf_counter() - start, logp.item()


def main(argv: list[str] | None = None) -> dict:
    import bench_step as B
    from peft import get_peft_model

    from ktae.train.allocator import keep_freed_memory
    from ktae.train.session import _quiet, lora_config

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=str(B.ROOT / "configs" / "smollm2-recipe.yaml"))
    p.add_argument("--float32", action="store_true", help="float32 throughout, not --bf16's")
    p.add_argument("--ktae", action="store_true",
                   help="the trainer's own update path on one prompt's responses, not peft's "
                        "forward on distinct rows")
    p.add_argument("--rounds", type=int, default=5, help="passes of each variant, alternating")
    p.add_argument("--lengths", default="56,60,52",
                   help="prompt lengths, one per round in turn (comma-separated)")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    try:
        lengths = [int(x) for x in a.lengths.split(",")]
    except ValueError:
        p.error(f"--lengths: expected comma-separated integers, got {a.lengths!r}")
    if a.rounds < 1 or min(lengths) < 8:
        p.error("--rounds: expected a positive integer; --lengths: each at least 8")
    _quiet()
    keep_freed_memory()
    recipe, _ = B.read_recipe(a.recipe)
    torch.set_num_threads(recipe.torch_threads)
    bf16 = not a.float32
    if bf16:
        from ktae.train.precision import check_bf16

        B.say(check_bf16("cpu"))
    model, _ = B.load_model(B.resolve_model(recipe.model), bf16=bf16, lora=True)
    torch.manual_seed(0)  # peft draws the adapters' A from the global generator
    model = get_peft_model(model, lora_config(recipe))
    for name, param in model.named_parameters():  # adapters that change the output
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.01, generator=torch.Generator().manual_seed(0))
    model.train()
    rows = recipe.num_prompts * recipe.num_generations // recipe.trl.get(
        "gradient_accumulation_steps", 1)
    keep = recipe.max_new_tokens
    gen = torch.Generator().manual_seed(0)

    def batch(prompt: int):
        ids = torch.randint(0, model.config.vocab_size, (rows, prompt + keep), generator=gen)
        mask = torch.ones_like(ids)
        if a.ktae:  # one prompt's responses, left-padded alike
            ids[:, :prompt] = ids[:1, :prompt]
            mask[:, :4] = 0
        else:
            mask[: rows // 2, :4] = 0
        return ids, mask

    # a layer's own attributes (its index) are guarded: each may compile once, and under
    # --ktae once for the prompt's pass and once for the responses' on its cache
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                               4 * model.config.num_hidden_layers)
    layers = model.get_base_model().model.layers
    eager = list(layers)
    compiled = [torch.compile(layer, dynamic=True) for layer in eager]

    def use(which: list) -> None:
        for i, layer in enumerate(which):
            layers[i] = layer

    B.say(f"{rows} rows of a prompt and {keep} new tokens, prompt lengths {lengths}, "
          f"{'bfloat16 products' if bf16 else 'float32'}, {recipe.torch_threads} thread(s), "
          + ("the trainer's path, one prompt's responses" if a.ktae else "peft's forward"))
    ids, mask = batch(lengths[0])
    _, want = one_pass(model, ids, mask, keep, bf16, a.ktae)  # eager's first-call costs
    model.zero_grad(set_to_none=True)
    use(compiled)
    first, got = one_pass(model, ids, mask, keep, bf16, a.ktae)
    model.zero_grad(set_to_none=True)
    if abs(got - want) > (2 ** -8 if bf16 else 1e-3) * abs(want):
        raise RuntimeError(f"the compiled layers' log-probs sum to {got}, eager's to {want}")
    B.say(f"compiled, first pass (compiling): {first:.1f} s; log-probs sum {got:.2f}, "
          f"eager's {want:.2f}")
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for r in range(a.rounds):
        ids, mask = batch(lengths[r % len(lengths)])
        for name, which in (("eager", eager), ("compiled", compiled))[:: 1 if r % 2 else -1]:
            use(which)
            times[name].append(one_pass(model, ids, mask, keep, bf16, a.ktae)[0])
            model.zero_grad(set_to_none=True)
        B.say(f"  round {r + 1}: eager {times['eager'][-1]:.2f} s, "
              f"compiled {times['compiled'][-1]:.2f} s (prompt {ids.size(1) - keep} tokens)")
    med = {name: statistics.median(ts) for name, ts in times.items()}
    saved = med["eager"] - med["compiled"]
    paid_after = (first - med["compiled"]) / saved if saved > 0 else None
    B.say(f"median pass: eager {med['eager']:.2f} s, compiled {med['compiled']:.2f} s "
          f"(compiled / eager {med['compiled'] / med['eager']:.2f}); the compilation pays "
          + (f"for itself after {paid_after:.0f} passes" if paid_after else "never"))
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    B.say(f"compiled graphs: {graphs}")
    result = {"rows": rows, "new_tokens": keep, "lengths": lengths, "bf16": bf16,
              "ktae_path": a.ktae, "unique_graphs": graphs,
              "first_compiled_s": first, "logp_sum": {"eager": want, "compiled": got},
              "times": times, "medians": med,
              "compiled_over_eager": med["compiled"] / med["eager"],
              "passes_to_pay": paid_after}
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
