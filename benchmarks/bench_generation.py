"""Generation throughput, transformers against vLLM, on the same prompts and machine.

Two workloads: ``eval`` (the evaluation batch: ``--eval-batch`` distinct prompts, greedy)
and ``train`` (a training step's generation: ``--train-batch`` responses, ``--generations``
per prompt, sampled at temperature 1, as ``ktae train`` asks TRL for them). Prompts are
the embedded benchmark's in the model's chat template. Both engines run in one process, one
after the other within each round (so both see the same load), ``--rounds`` times; the
report gives each engine's median generated tokens per second and vLLM's ratio. With
``--contend N``, N busy processes (a pure-Python loop each) run during the measurement,
as on a shared machine; ``--contend 0,2`` measures both.

    python benchmarks/bench_generation.py --model smollm2-135m --contend 0,2 --json out.json

vLLM loads once (start-up is not timed; it is reported); transformers runs at
``--threads`` torch threads.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time


def _busy() -> None:
    while True:
        pass


def _prompts(tokenizer, n: int) -> list[str]:
    from ktae.eval.prompts import build_prompt, resolve_template
    from ktae.eval.runner import load_records

    records = load_records(["embedded"], limit=n)["embedded"]
    template = resolve_template("chat", tokenizer)
    return [build_prompt(r, template, tokenizer) for r in records]


def _run(engine, workload, args, model, llm, tokenizer) -> tuple[int, float]:
    """(generated tokens, seconds) of one batch of ``workload`` on ``engine``."""
    from ktae.eval.vllm_engine import generate_vllm
    from ktae.models.generate import SamplingConfig, generate_hf

    prompts, k, temperature = workload
    sampling = SamplingConfig(k=k, temperature=temperature, max_new_tokens=args.new_tokens,
                              seed=0)
    started = time.perf_counter()
    if engine == "hf":
        gens = generate_hf(model, tokenizer, prompts, sampling, batch_size=len(prompts),
                           add_special_tokens=False)
    else:
        gens = generate_vllm(llm, tokenizer, prompts, sampling, add_special_tokens=False)
    seconds = time.perf_counter() - started
    return sum(g.num_tokens for gs in gens for g in gs), seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32", help="both engines' dtype")
    parser.add_argument("--eval-batch", type=int, default=16)
    parser.add_argument("--train-batch", type=int, default=32, help="responses per step")
    parser.add_argument("--generations", type=int, default=4, help="responses per prompt")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="transformers' torch threads")
    parser.add_argument("--contend", default="0", help="busy processes, e.g. 0,2")
    parser.add_argument("--workloads", default="eval,train")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.train_batch % args.generations:
        parser.error("--train-batch: expected a multiple of --generations")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ktae.eval.vllm_engine import engine_settings, load_vllm
    from ktae.models.model_path import resolve_model_path

    torch.set_num_threads(args.threads)
    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    started = time.perf_counter()
    llm = load_vllm(path, dtype=args.dtype)
    startup = time.perf_counter() - started
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).eval()
    prompts = _prompts(tokenizer, max(args.eval_batch, args.train_batch // args.generations))
    workloads = {"eval": (prompts[:args.eval_batch], 1, 0.0),
                 "train": (prompts[:args.train_batch // args.generations], args.generations, 1.0)}
    _run("vllm", (prompts[:2], 1, 0.0), args, model, llm, tokenizer)  # warm both up
    _run("hf", (prompts[:2], 1, 0.0), args, model, llm, tokenizer)

    report = {"model": path, "engine": engine_settings(llm, requested_dtype=args.dtype),
              "vllm_startup_seconds": round(startup, 1), "threads": args.threads,
              "new_tokens": args.new_tokens, "cpus": os.cpu_count(), "results": []}
    for contend in [int(c) for c in args.contend.split(",")]:
        busy = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(contend)]
        for p in busy:
            p.start()
        try:
            for name in args.workloads.split(","):
                rates = {"hf": [], "vllm": []}
                for _ in range(args.rounds):
                    for engine in ("hf", "vllm"):
                        tokens, seconds = _run(engine, workloads[name], args, model, llm,
                                               tokenizer)
                        rates[engine].append(tokens / seconds)
                hf, vllm = statistics.median(rates["hf"]), statistics.median(rates["vllm"])
                row = {"contend": contend, "workload": name,
                       "responses": len(workloads[name][0]) * workloads[name][1],
                       "hf_tokens_per_s": round(hf, 1), "vllm_tokens_per_s": round(vllm, 1),
                       "ratio": round(vllm / hf, 2),
                       "rounds": {k: [round(r, 1) for r in v] for k, v in rates.items()}}
                report["results"].append(row)
                print(json.dumps(row), flush=True)
        finally:
            for p in busy:
                p.terminate()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":  # vLLM starts its engine in a new process
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
