"""Does colocated vLLM pay in ``ktae train``? The recipe's step with transformers' and
with vLLM's generation side by side, and the parts of vLLM's cost measured alone.

Two modes (docs/vllm.md has the results):

``steps``: ``ktae train --config configs/smollm2-recipe.yaml`` (SmolLM2-135M, LoRA r16,
4 prompts x 8, 64 new tokens, one thread, the update in its micro-batches) for a few steps
with transformers' generation and with ``--trl use_vllm=true --trl vllm_mode=colocate``,
alternating (hf, vllm, hf, ... for ``--rounds``), each run in its own process. Prints each
backend's median step parts (generation, which holds vLLM's weight sync; the log-prob
pass; the update), the vLLM/transformers ratio of the medians, the colocated engine's
log-prob checks (:func:`ktae.train.vllm_colocate.skip_old_policy_pass_when_exact`) and the
1-minute load average at each run's start and end. Step 0 of a vLLM run checks vLLM's
log-probs with the old-policy pass; later steps skip it, so the medians show the
skipping; ``--keep-old-pass`` makes every step run it (TRL's default behaviour).

``parts``: in one process, the recipe's policy (LoRA r16 on every linear layer, adapters
set to random values so that the merged weights differ from the base) and a colocated
float32 engine: the time of each sync into the engine, alternating the full one (every
parameter) and the one of the weights that can change (frozen embeddings left out);
then the recipe's batch sampled by vLLM (32 responses, 64 new tokens, temperature 0.6),
the trainer's float32 log-probs of the sampled tokens against vLLM's after each kind of
sync (max and median absolute difference), and the time of that old-policy pass. With
``--vllm-lora`` the engine has vLLM's LoRA layers instead and each sync sends the adapters
alone (saved, then loaded as a new adapter): the deltas' sync.

    python benchmarks/bench_vllm_step.py parts --out OUT.json
    python benchmarks/bench_vllm_step.py parts --vllm-lora --out OUT-lora.json
    python benchmarks/bench_vllm_step.py steps --out-dir OUT --steps 3 --rounds 1

Run it with the Python of a vLLM environment (docs/vllm.md); vLLM's CPU build wants
``VLLM_CPU_KVCACHE_SPACE`` (GiB) small beside other jobs (1 or 2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "configs" / "smollm2-recipe.yaml"
PARTS = ("step_time", "generation_seconds", "logprob_seconds", "update_seconds",
         "other_seconds")


def load_average() -> float:
    return os.getloadavg()[0]


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def wait_for_memory(gib: float, *, every: float = 60.0, limit: float = 3600.0) -> None:
    """Sleep until ``gib`` GiB are available (an engine beside other jobs)."""
    waited = 0.0
    while available_gib() < gib:
        if waited >= limit:
            raise SystemExit(f"fewer than {gib} GiB available after {limit:.0f} s")
        print(f"waiting: {available_gib():.1f} GiB available, want {gib}", flush=True)
        time.sleep(every)
        waited += every


# ------------------------------------------------------------------------------ steps

def train_once(out: Path, backend: str, *, steps: int, keep_old_pass: bool,
               min_gib: float) -> dict:
    """One ``ktae train`` of the recipe; its metrics.jsonl rows and the vLLM check lines."""
    cmd = [sys.executable, "-m", "ktae", "train", "--config", str(RECIPE),
           "--max-steps", str(steps), "--eval-size", "4", "--eval-every", "0",
           "--save-every", "0", "--no-progress", "--output-dir", str(out)]
    if backend == "vllm":
        cmd += ["--trl", "use_vllm=true", "--trl", "vllm_mode=colocate"]
        if keep_old_pass:
            cmd += ["--trl", "vllm_importance_sampling_correction=true"]
        wait_for_memory(min_gib)
    load_start, started = load_average(), time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{backend} run failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("step_time") is not None]
    checks = [ln for ln in done.stdout.splitlines() if ln.startswith("vllm: step")]
    return {"backend": backend, "rows": rows, "checks": checks, "wall_seconds": wall,
            "load_start": load_start, "load_end": load_average()}


def median_parts(runs: list[dict], backend: str, *, skip_first: bool) -> dict[str, float]:
    rows = [r for run in runs if run["backend"] == backend
            for r in (run["rows"][1:] if skip_first else run["rows"])]
    return {k: statistics.median(r.get(k, 0.0) for r in rows) for k in PARTS}


def steps_mode(args) -> None:
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pair = ("vllm", "hf") if args.first == "vllm" else ("hf", "vllm")
    order = [b for _ in range(args.rounds) for b in pair] + [pair[0]] * args.bracket
    runs = []
    for i, backend in enumerate(order):
        run_dir = out / f"{i}-{backend}"
        if run_dir.exists():
            raise SystemExit(f"{run_dir} exists; give a new --out-dir")
        run = train_once(run_dir, backend, steps=args.steps, keep_old_pass=args.keep_old_pass,
                         min_gib=args.min_gib)
        runs.append(run)
        print(f"{backend:5s} run {i}: load {run['load_start']:.1f} -> {run['load_end']:.1f}, "
              f"wall {run['wall_seconds']:.0f} s", flush=True)
        for r in run["rows"]:
            print("   " + "  ".join(f"{k.removesuffix('_seconds')} {r.get(k, 0.0):6.1f}"
                                    for k in PARTS), flush=True)
        for line in run["checks"]:
            print("   " + line, flush=True)
    summary = {"runs": runs}
    for label, skip_first in (("all steps", False), ("steps after the first", True)):
        hf = median_parts(runs, "hf", skip_first=skip_first)
        vllm = median_parts(runs, "vllm", skip_first=skip_first)
        summary[label] = {"hf": hf, "vllm": vllm,
                          "ratio": vllm["step_time"] / hf["step_time"]}
        print(f"medians, {label}:")
        for k in PARTS:
            print(f"   {k:20s} hf {hf[k]:7.2f}   vllm {vllm[k]:7.2f}")
        print(f"   vllm / hf step: {vllm['step_time'] / hf['step_time']:.2f}")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


# ------------------------------------------------------------------------------ parts

def recipe_prompts(tokenizer, count: int) -> list[list[int]]:
    from ktae.train.data import format_task, read_task

    rows, _ = format_task(read_task("arith@difficulty=0", train_size=2000, eval_size=4,
                                    seed=0), "chat", tokenizer, "number")
    out = []
    for row in rows[:count]:
        prompt = row["prompt"]
        if isinstance(prompt, str):
            out.append(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        else:
            text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True,
                                                 tokenize=False)
            out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def policy_logps(model, prompt, completions, temperature: float):
    """The trainer's float32 log-probs of each completion's tokens (logits / temperature,
    as TRL's pass), one row per completion; returns (list of tensors, seconds)."""
    import torch

    width = max(len(c) for c in completions)
    ids = torch.zeros(len(completions), len(prompt) + width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, c in enumerate(completions):
        ids[i, :len(prompt) + len(c)] = torch.tensor(prompt + c)
        mask[i, :len(prompt) + len(c)] = 1
    started = time.perf_counter()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, len(prompt) - 1:-1].float()
    logps = torch.log_softmax(logits / temperature, -1).gather(
        -1, ids[:, len(prompt):, None])[..., 0]
    return [logps[i, :len(c)] for i, c in enumerate(completions)], time.perf_counter() - started


def send_adapter(llm, model, folder: Path, round_: int):
    """vLLM's own LoRA: the adapters saved (peft's format) and loaded by the engine as a
    new adapter; ``(timing, LoRARequest)``."""
    from vllm.lora.request import LoRARequest

    started = time.perf_counter()
    path = folder / f"adapter-{round_}"
    model.save_pretrained(path)
    request = LoRARequest(f"policy-{round_}", round_ + 1, str(path))
    llm.llm_engine.add_lora(request)
    if round_ > 0:
        llm.llm_engine.remove_lora(round_)
    tensors = sum(1 for n, _ in model.named_parameters() if "lora_" in n)
    return {"seconds": time.perf_counter() - started, "tensors": tensors,
            "embeddings_packed": False}, request


def parts_mode(args) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(args.port))):
        os.environ.setdefault(key, value)
    from ktae.eval import vllm_engine

    vllm_engine.prepare_environment()
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    from ktae.models.model_path import resolve_model_path
    from ktae.train.vllm_colocate import (
        merged_policy_weights,
        reload_into_engine,
        sampled_logp_difference,
    )

    torch.set_num_threads(1)
    path = resolve_model_path("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                            target_modules="all-linear", task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # adapters as after some training: merged weights differ from W
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * args.lora_scale)
    model.eval()
    wait_for_memory(args.min_gib)
    load_start = load_average()
    started = time.perf_counter()
    lora = {"enable_lora": True, "max_lora_rank": 16, "max_loras": 1} if args.vllm_lora else {}
    llm = LLM(model=path, dtype="float32", enforce_eager=True, max_num_batched_tokens=4096,
              logprobs_mode="processed_logprobs", seed=0,
              distributed_executor_backend="external_launcher", **lora)
    result = {"engine_start_seconds": time.perf_counter() - started, "load": [load_start]}
    prompts = recipe_prompts(tokenizer, args.prompts)
    params = SamplingParams(n=1, temperature=args.temperature, max_tokens=args.max_new_tokens,
                            logprobs=0, seed=0)
    kinds = ("lora-deltas",) if args.vllm_lora else ("all", "changing")
    sync = {k: [] for k in kinds}
    checks = {}
    for round_ in range(args.rounds):
        for kind in (kinds if round_ % 2 == 0 else kinds[::-1]):
            if kind == "lora-deltas":  # the adapters alone, to vLLM's own LoRA layers
                done, request = send_adapter(llm, model, Path(args.out_dir_lora), round_)
            else:
                done, request = reload_into_engine(llm, merged_policy_weights(
                    model, changing_only=kind == "changing")), None
            sync[kind].append(done["seconds"])
            print(f"sync {kind:8s}: {done['seconds']:.2f} s, {done['tensors']} tensors, "
                  f"embeddings packed: {done['embeddings_packed']}", flush=True)
            if round_ > 0:
                continue
            requests = [{"prompt_token_ids": p} for p in prompts for _ in range(args.samples)]
            started = time.perf_counter()
            outputs = llm.generate(requests, params, use_tqdm=False, lora_request=request)
            generation = time.perf_counter() - started
            diffs, pass_seconds = [], 0.0
            for i, p in enumerate(prompts):
                group = outputs[i * args.samples:(i + 1) * args.samples]
                completions = [list(o.outputs[0].token_ids) for o in group]
                sampled = [torch.tensor([next(iter(lp.values())).logprob
                                         for lp in o.outputs[0].logprobs]) for o in group]
                ours, seconds = policy_logps(model, p, completions, args.temperature)
                pass_seconds += seconds
                diffs += [(a - b) for a, b in zip(ours, sampled, strict=True)]
            flat = torch.cat(diffs)
            found = sampled_logp_difference(flat[None], torch.zeros_like(flat)[None],
                                            torch.ones_like(flat)[None])
            checks[kind] = {**found, "generation_seconds": generation,
                            "policy_pass_seconds": pass_seconds}
            print(f"after the {kind} sync: vLLM generated {found['tokens']} tokens in "
                  f"{generation:.1f} s; |policy - vLLM| log-prob max {found['max']:.3g}, "
                  f"median {found['median']:.3g}; the policy pass took {pass_seconds:.1f} s",
                  flush=True)
    result["load"].append(load_average())
    result.update(sync_seconds=sync, checks=checks,
                  sync_median={k: statistics.median(v) for k, v in sync.items()})
    print(json.dumps({k: result[k] for k in ("sync_median", "load", "engine_start_seconds")}))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    steps = sub.add_parser("steps", help="hf and vllm ktae train runs, alternating")
    steps.add_argument("--out-dir", required=True)
    steps.add_argument("--steps", type=int, default=3)
    steps.add_argument("--rounds", type=int, default=1, help="hf, vllm pairs")
    steps.add_argument("--bracket", type=int, default=1,
                       help="runs of the first backend after the last pair (1: hf, vllm, hf)")
    steps.add_argument("--first", choices=("hf", "vllm"), default="hf",
                       help="the backend each pair starts with")
    steps.add_argument("--keep-old-pass", action="store_true",
                       help="vLLM runs keep TRL's old-policy pass on every step")
    steps.add_argument("--min-gib", type=float, default=7.0,
                       help="wait for this much available memory before a vLLM run")
    parts = sub.add_parser("parts", help="sync costs and log-prob tolerance, in process")
    parts.add_argument("--out")
    parts.add_argument("--rounds", type=int, default=3, help="syncs of each kind")
    parts.add_argument("--prompts", type=int, default=4)
    parts.add_argument("--samples", type=int, default=8)
    parts.add_argument("--max-new-tokens", type=int, default=64)
    parts.add_argument("--temperature", type=float, default=0.6)
    parts.add_argument("--lora-scale", type=float, default=0.02,
                       help="std of the random lora_B values")
    parts.add_argument("--min-gib", type=float, default=7.0)
    parts.add_argument("--port", type=int, default=29517)
    parts.add_argument("--vllm-lora", action="store_true",
                       help="an engine with LoRA layers, given the adapters each sync "
                            "(the deltas), instead of the merged weights")
    parts.add_argument("--out-dir-lora", default="/tmp/ktae-bench-vllm-lora",
                       help="where --vllm-lora saves each sync's adapters")
    args = parser.parse_args()
    (steps_mode if args.mode == "steps" else parts_mode)(args)


if __name__ == "__main__":
    main()
