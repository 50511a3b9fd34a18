"""Greedy completions of vLLM against transformers on the same prompts, and why they differ.

Both engines decode greedily from the same token ids (the embedded benchmark's prompts
in the model's chat template). For each prompt whose completions differ, the first
differing position is found and transformers' logits there (float32, the prompt and the
common prefix, no padding) give the top-2 gap: the lead of transformers' choice over the
runner-up. A small gap with vLLM's token as the runner-up is a near tie that rounding in
another kernel (or a lower dtype) can flip; the largest such gap is the threshold the
report gives.

    python benchmarks/vllm_agreement.py --model DIR --dtype float32 --limit 100

Writes one JSON document (``--out``) with the counts and every disagreement.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def first_difference(a, b) -> int | None:
    """First index where token lists ``a`` and ``b`` differ (a shorter list that is a
    prefix of the other differs at its end); None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_gap(model, prompt_ids, prefix, hf_token, vllm_token) -> dict:
    """transformers' logits after ``prompt_ids + prefix``: the gap between its top two
    tokens, and between its choice and vLLM's."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([list(prompt_ids) + list(prefix)])).logits[0, -1].float()
    top = torch.topk(logits, 2)
    out = {"top2_gap": float(top.values[0] - top.values[1]),
           "hf_token": hf_token, "vllm_token": vllm_token,
           "vllm_token_rank": None if vllm_token is None
           else int((logits > logits[vllm_token]).sum()) + 1}
    if hf_token is not None and vllm_token is not None:
        out["gap_hf_vs_vllm_token"] = float(logits[hf_token] - logits[vllm_token])
    return out


def _hf_cached(file, path, prompts, max_new_tokens):
    """transformers' token ids and seconds from ``file`` when it is for these prompts."""
    if not file or not os.path.exists(file):
        return None, None
    with open(file, encoding="utf-8") as f:
        saved = json.load(f)
    if (saved["model"], saved["prompts"], saved["max_new_tokens"]) != (path, prompts,
                                                                       max_new_tokens):
        return None, None
    return saved["token_ids"], saved["seconds"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="float32", help="vLLM's dtype")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=16, help="transformers' batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--hf-cache", default=None,
                        help="JSON file of transformers' completions: read when it holds these "
                             "prompts and budget, else written (compare several vLLM dtypes "
                             "against one transformers run)")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ktae.eval.prompts import build_prompt, resolve_template
    from ktae.eval.runner import load_records
    from ktae.eval.vllm_engine import engine_settings, generate_vllm, load_vllm
    from ktae.models.generate import SamplingConfig, generate_hf
    from ktae.models.model_path import resolve_model_path

    torch.set_num_threads(args.threads)
    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    records = load_records(["embedded"], limit=args.limit)["embedded"]
    template = resolve_template("chat", tokenizer)
    prompts = [build_prompt(r, template, tokenizer) for r in records]
    sampling = SamplingConfig(k=1, temperature=0, max_new_tokens=args.max_new_tokens)

    llm = load_vllm(path, dtype=args.dtype)
    engine = engine_settings(llm, requested_dtype=args.dtype)
    started = time.perf_counter()
    vgens = generate_vllm(llm, tokenizer, prompts, sampling, add_special_tokens=False)
    vllm_seconds = time.perf_counter() - started

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf_ids, hf_seconds = _hf_cached(args.hf_cache, path, prompts, args.max_new_tokens)
    if hf_ids is None:
        started = time.perf_counter()
        hgens = generate_hf(model, tokenizer, prompts, sampling, batch_size=args.batch_size,
                            add_special_tokens=False)
        hf_seconds = time.perf_counter() - started
        hf_ids = [list(g[0].token_ids) for g in hgens]
        if args.hf_cache:
            with open(args.hf_cache, "w", encoding="utf-8") as f:
                json.dump({"model": path, "prompts": prompts, "max_new_tokens":
                           args.max_new_tokens, "seconds": hf_seconds, "token_ids": hf_ids}, f)

    differ = []
    for i, (a, v) in enumerate(zip(hf_ids, vgens, strict=True)):
        b = list(v[0].token_ids)
        at = first_difference(a, b)
        if at is None:
            continue
        ids = tokenizer(prompts[i], add_special_tokens=False)["input_ids"]
        differ.append({"prompt": i, "position": at, "common_prefix": at,
                       **top2_gap(model, ids, a[:at], a[at] if at < len(a) else None,
                                  b[at] if at < len(b) else None),
                       "hf": tokenizer.decode(a[at:at + 8]), "vllm": tokenizer.decode(b[at:at + 8])})
    gaps = sorted(d["top2_gap"] for d in differ)
    report = {"model": path, "engine": engine, "prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens,
              "identical": len(prompts) - len(differ), "differ": len(differ),
              "vllm_token_is_hf_runner_up": sum(d["vllm_token_rank"] == 2 for d in differ),
              "largest_top2_gap_at_a_difference": gaps[-1] if gaps else None,
              "median_top2_gap_at_a_difference": gaps[len(gaps) // 2] if gaps else None,
              "seconds": {"vllm": round(vllm_seconds, 1), "hf": round(hf_seconds, 1)},
              "disagreements": differ}
    text = json.dumps(report, indent=2)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    summary = {k: v for k, v in report.items() if k != "disagreements"}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":  # vLLM starts its engine in a new process
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
