"""The trainer's sampling with the shared prefill's buffered KV cache against a growing one.

Usage:
    python benchmarks/bench_kv_cache.py --bf16          # ktae train --bf16's sampling
    python benchmarks/bench_kv_cache.py                 # float32

Samples the recipe's batch (``configs/smollm2-recipe.yaml``: its model with its LoRA
adapters, 4 prompts x 8 responses, its new tokens and temperature, one thread) the way
``KTAEGRPOTrainer`` does (one prefill per distinct prompt, the fused or merged adapter,
the one-variate draw), once with :class:`ktae.train.shared_prefill.BufferedLayer` (keys
and values written into a buffer; float32 under ``--bf16``, whose attention runs in
float32) and once with transformers' ``DynamicLayer`` (concatenated at every decoding
step, cast to float32 for attention at every step under ``--bf16``), alternating in one
process, from the same seed each time. Prints each setting's median wall seconds, their
ratio, and whether the two settings drew the same tokens.
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


def main(argv: list[str] | None = None) -> dict:
    import bench_step as B
    from peft import get_peft_model

    from ktae.models.generate import contiguous_head
    from ktae.train import shared_prefill as module
    from ktae.train.lora_forward import lora_for_sampling
    from ktae.train.sampling import fast_multinomial
    from ktae.train.session import _quiet, lora_config

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default=str(B.ROOT / "configs" / "smollm2-recipe.yaml"))
    p.add_argument("--bf16", action="store_true", help="ktae train --bf16's arithmetic")
    p.add_argument("--rounds", type=int, default=3, help="alternating turns of each setting")
    p.add_argument("--new-tokens", type=int, help="default: the recipe's max_new_tokens")
    p.add_argument("--json", help="write every number here")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error("--rounds: expected at least 1")
    _quiet()
    recipe, rows = B.read_recipe(a.recipe)
    torch.set_num_threads(recipe.torch_threads)
    new_tokens = a.new_tokens or recipe.max_new_tokens
    model, tokenizer = B.load_model(B.resolve_model(recipe.model), bf16=a.bf16, lora=True)
    model = get_peft_model(model, lora_config(recipe)).eval()
    prompts = [r["prompt"] for r in rows[:recipe.num_prompts]
               for _ in range(recipe.num_generations)]
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=True, temperature=recipe.temperature, top_p=1.0,
                              top_k=0, max_new_tokens=new_tokens,
                              eos_token_id=B.never_drawn(model),
                              pad_token_id=tokenizer.pad_token_id)
    real = module.buffered
    times: dict[str, list[float]] = {"buffered": [], "dynamic": []}
    drawn: dict[str, torch.Tensor] = {}

    def sample(setting: str) -> None:
        module.buffered = real if setting == "buffered" else (lambda *args, **kw: None)
        torch.manual_seed(0)
        with (torch.no_grad(), B.autocast(a.bf16), module.shared_prefill(model),
              fast_multinomial(), contiguous_head(model), lora_for_sampling(model)):
            start = time.perf_counter()
            out = model.generate(input_ids=enc["input_ids"],
                                 attention_mask=enc["attention_mask"], generation_config=config)
            times[setting].append(time.perf_counter() - start)
        drawn[setting] = out

    sample("dynamic")  # first calls' one-time costs, untimed
    times["dynamic"].clear()
    order = ("buffered", "dynamic")
    for turn in range(a.rounds):
        for setting in order if turn % 2 == 0 else order[::-1]:
            sample(setting)
            B.say(f"  {setting}: {times[setting][-1]:.2f} s (load {B.load()})")
    module.buffered = real
    result = {
        "bf16": a.bf16, "rows": len(prompts), "new_tokens": new_tokens, "rounds": a.rounds,
        "seconds": times,
        "median": {k: statistics.median(v) for k, v in times.items()},
        "same_tokens": bool(torch.equal(drawn["buffered"], drawn["dynamic"])),
    }
    result["ratio"] = result["median"]["buffered"] / result["median"]["dynamic"]
    B.say(f"\n{'bfloat16' if a.bf16 else 'float32'} sampling, {len(prompts)} rows x "
          f"{new_tokens} tokens, medians of {a.rounds}: buffered cache "
          f"{result['median']['buffered']:.2f} s, growing cache "
          f"{result['median']['dynamic']:.2f} s, ratio {result['ratio']:.3f}; "
          f"same tokens: {result['same_tokens']}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
