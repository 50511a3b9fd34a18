"""The sampling step's pieces on the recipe's model: the draw, attention, and the LoRA forward.

Usage:
    python benchmarks/bench_sampling.py                          # a random adapter
    python benchmarks/bench_sampling.py --adapter runs/grpo-ktae-seed0/final --json s.json

Three measurements, each side by side in one process, one thread:

1. **the draw**: ``torch.multinomial(probs, 1)`` (one exponential variate per vocabulary
   entry) against :func:`ktae.train.sampling.categorical` (one uniform variate a row), on
   the recipe's 32 rows of the model's vocabulary; median milliseconds a call.
2. **attention**: ``scaled_dot_product_attention``'s forward and backward at the update's
   shapes (a micro-batch of the recipe's rows, the model's heads, prompt and completion tokens,
   causal), in bfloat16 and in float32 (``ktae.train.precision.float32_attention``'s
   casts included); median milliseconds a layer.
3. **the LoRA forward of sampling**: the log-probabilities of 32 sampled responses under
   each way of running the adapters, against float32 peft (the adapted map itself): the
   merged float32 weights (:func:`ktae.train.lora_forward.merged_lora`), and in bfloat16
   peft's forward (what sampling ran before), the update's fused forward (what it runs
   now) and merged bfloat16 weights (what it does not run); mean and largest absolute
   difference of the per-token log-probabilities, and each one's against the update's
   own bfloat16 arithmetic (the fused forward). ``--adapter``: a saved LoRA adapter (a
   recipe run's ``final``); without it, the recipe's adapter shapes with ``B`` drawn from
   ``N(0, 1e-3)`` (``A`` as peft initialises it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_step  # noqa: E402


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def draw_times(vocab: int, rows: int, repeats: int) -> dict:
    from ktae.train.sampling import categorical

    probs = torch.softmax(3 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)), -1)
    own = median_ms(lambda: torch.multinomial(probs, 1), repeats)
    ours = median_ms(lambda: categorical(probs), repeats)
    return {"rows": rows, "vocabulary": vocab, "torch_multinomial_ms": own,
            "categorical_ms": ours, "ratio": ours / own}


def attention_times(config, rows: int, length: int, repeats: int) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads, kv = config.num_attention_heads, config.num_key_value_heads
    dim = config.hidden_size // heads
    out = {"rows": rows, "tokens": length, "heads": heads, "key_value_heads": kv}
    g = torch.Generator().manual_seed(1)
    for name, cast in (("bfloat16", None), ("float32", torch.float32)):
        q, k, v = (torch.randn(rows, h, length, dim, generator=g).bfloat16().requires_grad_()
                   for h in (heads, kv, kv))

        def once(q=q, k=k, v=v, cast=cast):
            a, b, c = (t.to(cast) for t in (q, k, v)) if cast else (q, k, v)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(
                    a, b, c, is_causal=True, enable_gqa=True)
            o.to(torch.bfloat16).float().sum().backward()

        out[f"{name}_ms"] = median_ms(once, repeats)
    out["ratio"] = out["float32_ms"] / out["bfloat16_ms"]
    return out


def lora_agreement(path: str, adapter: str | None, recipe, rows: list[dict]) -> dict:
    from peft import PeftModel, get_peft_model

    from ktae.train.logprob_head import full_logps
    from ktae.train.lora_forward import merged_lora
    from ktae.train.session import lora_config

    def load(bf16: bool):
        model, tokenizer = bench_step.load_model(path, bf16=bf16, lora=True)
        if adapter:
            return PeftModel.from_pretrained(model, adapter), tokenizer
        model = get_peft_model(model, lora_config(recipe))
        g = torch.Generator().manual_seed(0)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.data.copy_(1e-3 * torch.randn(p.shape, generator=g))
        return model, tokenizer

    m32, tokenizer = load(False)
    m16, _ = load(True)
    tokenizer.padding_side = "left"
    prompts = [r["prompt"] for r in rows[:8] for _ in range(4)]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    new = 64
    torch.manual_seed(0)
    with torch.no_grad():
        ids = m32.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                           max_new_tokens=new, min_new_tokens=new,
                           pad_token_id=tokenizer.pad_token_id)
    mask = torch.cat([enc["attention_mask"], torch.ones(ids.size(0), new, dtype=torch.long)], 1)

    def logps(model, bf16: bool, how: str) -> torch.Tensor:
        # full_logps runs the fused forward itself; "peft" keeps peft's own forward
        import ktae.train.logprob_head as head

        fused = head.fused_lora
        if how == "peft":
            head.fused_lora = lambda m: nullcontext(0)
        try:
            with torch.no_grad(), bench_step.autocast(bf16), \
                    (merged_lora(model) if how == "merged" else nullcontext()):
                out, _ = full_logps(model, ids, mask, new, 1.0, compute_entropy=False,
                                    entropy_grad=False)
        finally:
            head.fused_lora = fused
        return out.float()

    truth = logps(m32, False, "peft")
    update = logps(m16, True, "fused")
    rows_out = {}
    for name, model, bf16, how in (("float32, merged", m32, False, "merged"),
                                   ("bfloat16, peft's forward", m16, True, "peft"),
                                   ("bfloat16, fused forward", m16, True, "fused"),
                                   ("bfloat16, merged", m16, True, "merged")):
        got = update if (bf16 and how == "fused") else logps(model, bf16, how)
        d, u = (got - truth).abs(), (got - update).abs()
        rows_out[name] = {"mean_vs_float32": float(d.mean()), "max_vs_float32": float(d.max()),
                          "mean_vs_update": float(u.mean()), "max_vs_update": float(u.max())}
    with m32.disable_adapter():
        base = logps(m32, False, "peft")
    return {"adapter": adapter or "random B ~ N(0, 1e-3)", "responses": int(ids.size(0)),
            "new_tokens": new, "adapter_effect_mean": float((truth - base).abs().mean()),
            "rows": rows_out}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--recipe", default=str(ROOT / "configs" / "smollm2-recipe.yaml"))
    p.add_argument("--adapter", help="a saved LoRA adapter directory")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--only", default="draw,attention,lora")
    p.add_argument("--json")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    only = set(a.only.split(","))
    recipe, rows = bench_step.read_recipe(a.recipe)
    path = bench_step.resolve_model(a.model)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    batch = recipe.num_prompts * recipe.num_generations
    out: dict = {"model": path, "threads": 1}
    if "draw" in only:
        d = out["draw"] = draw_times(config.vocab_size, batch, a.repeats)
        print(f"draw, {d['rows']} rows x {d['vocabulary']}: torch.multinomial "
              f"{d['torch_multinomial_ms']:.1f} ms, categorical {d['categorical_ms']:.1f} ms "
              f"({d['ratio']:.3f}x)")
    if "attention" in only:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        prompt = max(len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"])
                     for r in rows[:recipe.num_prompts])
        length = prompt + recipe.max_new_tokens  # a step's longest prompt + its responses
        micro = batch // int(recipe.trl.get("gradient_accumulation_steps", 1))
        t = out["attention"] = attention_times(config, micro, length, a.repeats)
        print(f"attention forward + backward, {t['rows']} rows x {t['tokens']} tokens: "
              f"bfloat16 {t['bfloat16_ms']:.1f} ms, float32 {t['float32_ms']:.1f} ms a layer "
              f"({t['ratio']:.2f}x)")
    if "lora" in only:
        agreement = out["lora"] = lora_agreement(path, a.adapter, recipe, rows)
        print(f"per-token log-probs of {agreement['responses']} responses x "
              f"{agreement['new_tokens']} tokens, adapter: {agreement['adapter']} (its own "
              f"effect: mean {agreement['adapter_effect_mean']:.3f})")
        print("| forward | mean vs float32 | max vs float32 | mean vs the update's | max vs the update's |")
        print("|---|---|---|---|---|")
        for name, r in agreement["rows"].items():
            print(f"| {name} | {r['mean_vs_float32']:.2e} | {r['max_vs_float32']:.2e} | "
                  f"{r['mean_vs_update']:.2e} | {r['max_vs_update']:.2e} |")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
