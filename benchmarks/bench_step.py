"""One training step of a real model against its physical floor, and against TRL's own step.

Usage:
    python benchmarks/bench_step.py                        # SmolLM2-135M, 4 x 8, 64 tokens
    python benchmarks/bench_step.py --prompts 2 --generations 4 --new-tokens 32 --rounds 3
    python benchmarks/bench_step.py --only matmul,generation --compile
    python benchmarks/bench_step.py --lora --kinds ktae      # the LoRA recipe's step
    python benchmarks/bench_step_ab.py OLD_SRC               # two ktae trees side by side

Five measurements, in one process, at one torch thread count (``--threads``):

1. **Matmul rate.** ``torch.mm`` in float32 on the model's own linear shapes (every layer's
   projections and the LM head): at M = the step's token count (the shapes of the update
   and of a log-prob pass) and at M = the batch (the shapes of one decoding step). A
   decoding step reads every weight once for a few rows, so its rate is measured over
   one matrix per layer, as the step reads them (``streamed``: 135M weights do not fit in
   the CPU's caches), and, for comparison, over one matrix per shape reused (``cached``),
   which flatters it.
1b. **The model's own passes** over the step's batch shape, no trainer: a forward pass, a
   forward pass with gradients (log-probabilities of the given tokens) and its backward,
   against ``2 N T``, ``2 N T`` and ``4 N T``: what the update would cost without the
   trainer's loss code and optimizer. With ``--lora``, 1c instead: the LoRA update's own
   passes through ktae's log-prob head (as the trainer's loss calls it), micro-batch by
   micro-batch, against the LoRA floor below.
2. **Generation backends.** The step's batch (``prompts x generations`` rows, left-padded)
   sampled with ``model.generate`` under each setting that works here: dynamic KV cache
   (TRL 1.16's HF path), static cache, other thread counts (``--other-threads``), and with
   ``--compile`` a static cache under ``torch.compile``. Every response is exactly ``--new-tokens`` long,
   so every setting and trainer does the same work: generation stops only at an
   end-of-sequence id that is never drawn (:func:`never_drawn`, the vocabulary's size).
   ``min_new_tokens`` would do the same with a logits processor at every decoding step
   (a copy of the ``[rows, vocabulary]`` scores and a ``where``) that training does not run.
3. **ktae's step by part** (generation, scoring, log-probs, advantages, update;
   :mod:`ktae.train.step_timing`), each against its floor: ``6 N T`` FLOPs for the update
   (forward and backward over the ``T`` tokens of the batch, ``N`` parameters), ``2 N T``
   for each log-prob pass (old policy, reference), ``2 N`` per prompt token (prefill, at
   the training shapes' rate) plus ``2 N`` per generated token (at the decoding shapes'
   streamed rate) for generation. Floors divide those FLOPs by the rates measured in 1.
4. **ktae against TRL.** ``KTAEGRPOTrainer`` (``--credit none``) and TRL's own
   ``GRPOTrainer`` on the same model (fresh copies of the same weights), batch, reward,
   ``GRPOConfig`` and backend, one optimizer step each, alternating for ``--rounds``
   rounds; medians and their ratio. Each step is timed by the same callback, from
   ``on_step_begin`` to ``on_step_end`` (optimizer step included).

**LoRA** (``--lora [RECIPE]``, default ``configs/smollm2-recipe.yaml``): the recipe's
model, batch (``num_prompts x num_generations``), ``max_new_tokens``, temperature, thread
count, ``trl`` settings (its micro-batches) and LoRA adapters (rank, alpha, targets,
dropout), on prompts of the recipe's task. Both trainers train the same adapters; 1b
measures the model with the adapters. The update's floor is then LoRA's
(:func:`lora_update_flops`): the frozen weights get no gradient, only the activations
and the adapters do::

    4 N_b T + 4 N_h T_c + 6 N_a T

* ``N_b T`` (the body): each frozen ``in x out`` matrix costs ``2 in out`` FLOPs a token
  forward and ``2 in out`` for the gradient of its input, none for its weight: ``4 N_b``
  a token over the ``T`` tokens of the batch (prompts included), ``N_b`` the parameters
  of every linear layer but the LM head (the input embedding is a lookup);
* ``N_h T_c`` (the LM head, ``vocab x hidden``): the same ``4 N_h`` a token, but only at
  the ``T_c`` scored positions (the responses' tokens: the log-prob head asks for the
  logits of those alone, ``logits_to_keep``);
* ``N_a T`` (the adapters ``A: in x r``, ``B: r x out`` of each target, ``N_a`` their
  parameters): ``2 N_a`` forward, and in the backward pass the gradients of ``A`` and
  ``B`` (``2 N_a``) and of their inputs (``2 N_a``): ``6 N_a`` a token.

Left out, as in ``6 N T``: attention's own products (``QK^T`` and the weighted sum, about
5% of the body at the recipe's 120 positions), elementwise work and the optimizer (AdamW
over ``N_a`` parameters: negligible). The table names each row's floor. ``--ktae-src``
imports ktae from another source tree (the code before a change, e.g. a ``git worktree``),
``--kinds ktae`` skips TRL's trainer; ``--kinds ktae,sdpo`` times ktae's step with
``--credit sdpo`` (its self-teacher pass) beside ``--credit none``, alternating, and prints
their ratio; ``benchmarks/bench_step_ab.py`` runs two trees'
steps alternately and prints them part by part against the floor.

The 1-minute load average is printed before each measurement: a shared machine is rarely
idle, and every ratio printed compares times taken side by side in the same run.
``--json PATH`` writes every number.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

PARTS = ("generation", "scoring", "logprobs", "advantages", "update")


def load() -> str:
    return open("/proc/loadavg").read().split()[0] if os.path.exists("/proc/loadavg") else "?"


def say(text: str) -> None:
    print(text, flush=True)


# ----------------------------------------------------------------------------- the model

def resolve_model(name: str) -> str:
    from ktae.models.named import is_named, named_model_path

    return str(named_model_path(name)) if is_named(name) else name


def load_model(path: str, *, bf16: bool = False, lora: bool = False):
    """The model as ``ktae train`` loads it; ``bf16``: a LoRA run's frozen base in
    bfloat16 (:func:`ktae.train.precision.stored_dtype`)."""
    from ktae.runs.config import TrainConfig
    from ktae.train.session import load_model as ktae_load

    cfg = TrainConfig(model=path, bf16=True, lora_r=int(lora)) if bf16 else TrainConfig(model=path)
    model, tokenizer, _ = ktae_load(cfg)
    return model, tokenizer


def autocast(bf16: bool):
    """The products in bfloat16 as ``ktae train --bf16`` runs them (accelerate's autocast)."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)


def parameter_count(model) -> int:
    """Parameters once each (a tied LM head is the embedding, counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def linear_shapes(model) -> list[tuple[int, int]]:
    """(in, out) of every matmul a token goes through: each ``nn.Linear`` and the LM head."""
    shapes = [(m.in_features, m.out_features) for m in model.modules()
              if isinstance(m, torch.nn.Linear)]
    return shapes


def prompts_of(tokenizer, count: int) -> list[dict]:
    """Natural-language arithmetic questions, in the model's chat template when it has one."""
    rows = []
    for i in range(count):
        a, b = 3 + (7 * i) % 17, 2 + (5 * i) % 9
        question = f"Tom has {a} apples and buys {b} more. How many apples does he have now?"
        if tokenizer.chat_template:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                   tokenize=False, add_generation_prompt=True)
        else:
            prompt = f"Q: {question}\nA:"
        rows.append({"prompt": prompt, "answer": str(a + b)})
    return rows


def contains_answer(completions, answer, **_):
    """1.0 when the response holds the answer's digits (the same cheap reward for both)."""
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer, strict=True)]


# ----------------------------------------------------------------------------- 1. matmul

def matmul_rate(shapes: list[tuple[int, int]], rows: int, repeats: int = 3,
                dtype: torch.dtype = torch.float32, *, streamed: bool = False) -> float:
    """FLOP/s of ``torch.mm`` in ``dtype`` over ``shapes`` with ``rows`` rows (median of
    ``repeats``).

    ``streamed``: one weight matrix per entry of ``shapes``, multiplied in their order, as a
    forward pass reads the model's own weights (every layer its own); otherwise one matrix
    per distinct shape, multiplied as many times as the shape occurs, which stays in the
    CPU's caches. A decoding step's few rows make few FLOPs per weight read: there the
    streamed rate is the one a step can reach (studies/step-time/report.md, "generation's true
    floor")."""
    distinct = {}
    for s in shapes:
        distinct[s] = distinct.get(s, 0) + 1
    inputs = {i: torch.randn(rows, i, dtype=dtype) for i, _ in distinct}
    if streamed:
        order = [(inputs[i], torch.randn(i, o, dtype=dtype)) for i, o in shapes]
    else:
        one = {s: torch.randn(*s, dtype=dtype) for s in distinct}
        order = [(inputs[s[0]], one[s]) for s, n in distinct.items() for _ in range(n)]
    flops = sum(2 * rows * i * o for i, o in shapes)
    for a, b in order:  # warm-up
        torch.mm(a, b)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for a, b in order:
            torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return flops / statistics.median(times)


def model_passes(model, batch: int, length: int, repeats: int = 3) -> dict[str, float]:
    """Median seconds of the model's own passes over ``batch`` random rows of ``length``
    tokens: a forward without gradients, and a forward with them (the log-probabilities
    of the given tokens) followed by its backward; no trainer in between."""
    ids = torch.randint(0, model.config.vocab_size, (batch, length),
                        generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {"forward": [], "forward, with gradients": [],
                                     "backward": []}
    for r in range(repeats + 1):  # the first round warms up
        start = time.perf_counter()
        with torch.no_grad():
            model(ids)
        t0 = time.perf_counter()
        logits = model(ids).logits
        logp = torch.log_softmax(logits, -1).gather(-1, ids[..., None]).sum()
        t1 = time.perf_counter()
        logp.backward()
        t2 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        if r:
            for key, seconds in zip(times, (t0 - start, t1 - t0, t2 - t1), strict=True):
                times[key].append(seconds)
    return {k: statistics.median(v) for k, v in times.items()}


def lora_update_passes(model, batch: int, prompt_tokens: int, new_tokens: int,
                       micro_batches: int, temperature: float, repeats: int = 1
                       ) -> dict[str, float]:
    """Median seconds of the LoRA update's own passes, no trainer: ktae's log-prob head
    (:func:`ktae.train.logprob_head.full_logps`, entropies without gradient, as in the
    trainer's loss) forward and backward over ``batch`` random rows of ``prompt_tokens +
    new_tokens`` tokens, scoring the last ``new_tokens``, in ``micro_batches`` parts."""
    from ktae.train.logprob_head import full_logps

    ids = torch.randint(0, model.config.vocab_size, (batch, prompt_tokens + new_tokens),
                        generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    rows = batch // micro_batches
    times: dict[str, list[float]] = {"forward": [], "backward": []}
    for r in range(repeats + 1):  # the first round (one micro-batch) warms up
        fwd = bwd = 0.0
        for start in range(0, rows if r == 0 else batch, rows):
            t0 = time.perf_counter()
            logps, _ = full_logps(model, ids[start:start + rows], mask[start:start + rows],
                                  new_tokens, temperature, compute_entropy=True,
                                  entropy_grad=False)
            t1 = time.perf_counter()
            logps.sum().backward()
            t2 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            fwd, bwd = fwd + t1 - t0, bwd + t2 - t1
        if r:
            times["forward"].append(fwd)
            times["backward"].append(bwd)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["total"] = out["forward"] + out["backward"]
    return out


# ----------------------------------------------------------------------------- 2. generation

def never_drawn(model) -> list[int]:
    """An end-of-sequence id no draw can give: the vocabulary's size (the logits have one
    entry per id below it). Generation with it stops at its budget alone, with no logits
    processor (``min_new_tokens`` would add one)."""
    return [model.config.vocab_size]


def generation_seconds(model, tokenizer, prompts: list[str], new_tokens: int, *,
                       cache: str | None = None, repeats: int = 1) -> float:
    """Median wall seconds of sampling every prompt once, exactly ``new_tokens`` tokens."""
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                  max_new_tokens=new_tokens, eos_token_id=never_drawn(model),
                  pad_token_id=tokenizer.pad_token_id)
    if cache is not None:
        kwargs["cache_implementation"] = cache
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            out = model.generate(**enc, **kwargs)
            times.append(time.perf_counter() - start)
    assert out.shape[1] == enc["input_ids"].shape[1] + new_tokens
    return statistics.median(times)


def generation_backends(model, tokenizer, prompts, new_tokens, threads, *, compile_: bool,
                        repeats: int, other_threads: list[int]) -> dict[str, float]:
    out = {}
    say(f"  load {load()}: dynamic cache (TRL's HF path), {threads} thread(s)")
    out["dynamic cache"] = generation_seconds(model, tokenizer, prompts, new_tokens,
                                              repeats=repeats)
    say(f"  load {load()}: static cache")
    out["static cache"] = generation_seconds(model, tokenizer, prompts, new_tokens,
                                             cache="static", repeats=repeats)
    for other in other_threads:
        say(f"  load {load()}: dynamic cache, {other} thread(s)")
        torch.set_num_threads(other)
        try:
            out[f"dynamic cache, {other} thread(s)"] = generation_seconds(
                model, tokenizer, prompts, new_tokens, repeats=repeats)
        finally:
            torch.set_num_threads(threads)
    if compile_:
        say(f"  load {load()}: static cache + torch.compile (compiling first)")
        try:
            model.forward = torch.compile(model.forward, mode="reduce-overhead")
            start = time.perf_counter()
            generation_seconds(model, tokenizer, prompts, new_tokens, cache="static")
            out["compile time"] = time.perf_counter() - start
            out["static cache + compile"] = generation_seconds(
                model, tokenizer, prompts, new_tokens, cache="static", repeats=repeats)
        except Exception as err:  # a compiler this machine lacks: say so, keep the rest
            say(f"  torch.compile failed here: {type(err).__name__}: {str(err)[:200]}")
        finally:
            model.forward = type(model).forward.__get__(model)
    return out


# ----------------------------------------------------------------------------- 3-4. steps

#: TRL 1.16's own profiled sections (``trl.extras.profiling``), recorded for both trainers.
PROFILED = ("_prepare_inputs", "transformers.generate", "_calculate_rewards",
            "_get_per_token_logps_and_entropies", "compute_loss")
_profiled: dict[str, float] = {}


def record_trl_profiling() -> None:
    """Make TRL's ``ProfilingContext`` (which reports only to wandb/mlflow/trackio) add
    each section's seconds to :data:`_profiled`, keyed by the section's method name."""
    from trl.extras.profiling import ProfilingContext

    def log(self, duration):
        key = self.name.split(".", 1)[1]
        _profiled[key] = _profiled.get(key, 0.0) + duration

    ProfilingContext._log_metrics = log


class StepTimes:
    """Same callback for both trainers: step wall time (begin to end), TRL's profiled
    sections of the step, and ktae's parts."""

    def __init__(self):
        from transformers import TrainerCallback

        outer = self
        self.steps: list[float] = []
        self.cpu: list[float] = []
        self.parts: list[dict] = []
        self.profiled: list[dict] = []

        class _CB(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                _profiled.clear()
                outer._t0, outer._c0 = time.perf_counter(), time.process_time()

            def on_step_end(self, args, state, control, **kw):
                outer.steps.append(time.perf_counter() - outer._t0)
                outer.cpu.append(time.process_time() - outer._c0)
                outer.profiled.append(dict(_profiled))

            def on_log(self, args, state, control, logs=None, **kw):
                from ktae.train.step_timing import PART_KEYS

                if logs and "ktae/step_seconds" in logs:
                    outer.parts.append({p: logs[f"ktae/{k}"] for p, k in PART_KEYS.items()}
                                       | {"step": logs["ktae/step_seconds"],
                                          "tokens": logs.get("completions/mean_length")})

        self.callback = _CB()


def trainer_args(path: str, out: str, *, prompts: int, generations: int, new_tokens: int,
                 threads: int, steps: int, trl: dict, temperature: float | None = None,
                 bf16: bool = False, stop: list[int] | None = None, credit: str = "none"):
    """GRPOConfig and credit settings of a ``--credit CREDIT`` run; ``stop``: the end-of-
    sequence ids generation stops at (:func:`never_drawn`: none, every response
    ``new_tokens`` long)."""
    from ktae.runs.config import TrainConfig
    from ktae.runs.credit import credit_settings
    from ktae.train.session import grpo_config

    more = {} if temperature is None else {"temperature": temperature}
    if bf16:
        more["bf16"] = True
    cfg = TrainConfig(model=path, algo="grpo", credit=credit, num_prompts=prompts,
                      num_generations=generations, max_new_tokens=new_tokens,
                      max_steps=steps, output_dir=out, torch_threads=threads,
                      save_every=0, eval_every=0, progress=False, **more).resolve()
    fixed = {"min_new_tokens": new_tokens} if stop is None else {"eos_token_id": stop}
    settings = {"generation_kwargs": fixed, "save_strategy": "no", **trl}
    return grpo_config(cfg, 1, settings), credit_settings(cfg)


KINDS = ("ktae", "trl", "sdpo")
"""The trainers of 3-4, in the order of each round (reversed every other round)."""


def run_steps(kind: str, state: dict, tokenizer, rows, args, credit, timer: StepTimes):
    """One fresh trainer of ``kind`` on a fresh copy of the weights: ``ktae`` and ``sdpo``
    (ktae's trainer with ``credit``), ``trl`` (TRL's own)."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    from ktae.train.trainer import KTAEGRPOTrainer

    model = state["factory"]()
    kwargs = dict(model=model, reward_funcs=[contains_answer], args=args,
                  train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                  callbacks=[timer.callback], peft_config=state.get("peft_config"))
    trainer = (GRPOTrainer(**kwargs) if kind == "trl"
               else KTAEGRPOTrainer(credit=credit, logprob_head=state["head"], **kwargs))
    if kind == "ktae":  # whether its update's micro-batches keep the batch's prompt order
        state["by_prompt"] = bool(getattr(trainer, "_micro_batches_by_prompt", False))
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    del trainer, model
    gc.collect()


def steady_steps(xs: list, per_turn: int) -> list:
    """Each turn's entries but its first (every entry when a turn has one step)."""
    return xs if per_turn == 1 else [x for i, x in enumerate(xs) if i % per_turn]


def floors(n_params: int, batch: int, prompt_tokens: int, new_tokens: int,
           rate_train: float, rate_decode: float, passes: int,
           lora_flops: float | None = None) -> dict[str, float]:
    """Seconds of each part's FLOPs at the measured rates; the update's are ``6 N T`` (full
    fine-tuning) or ``lora_flops`` (:func:`lora_update_flops`) when given."""
    tokens = batch * (prompt_tokens + new_tokens)
    update = 6 * n_params * tokens if lora_flops is None else lora_flops
    return {
        "generation": (2 * n_params * batch * prompt_tokens / rate_train
                       + 2 * n_params * batch * new_tokens / rate_decode),
        "logprobs": passes * 2 * n_params * tokens / rate_train,
        "update": update / rate_train,
    }


#: What each part's floor counts (``N`` parameters, ``T`` tokens of the batch).
FLOOR_OF = {"generation": "2 N a prompt token + 2 N a new token",
            "logprobs": "2 N T a pass", "update": "6 N T (full fine-tuning)"}
LORA_FLOOR_OF = "4 N_b T + 4 N_h T_c + 6 N_a T (LoRA)"


def lora_sizes(model) -> dict[str, int]:
    """``N_b``, ``N_h`` and ``N_a`` of a peft LoRA model (module docstring): the frozen
    linear layers' parameters but the LM head's, the LM head's, the adapters'."""
    head = model.get_output_embeddings()
    adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    body = sum(m.weight.numel() for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and m is not head and "lora_" not in n)
    return {"body": body, "head": head.weight.numel(), "adapters": adapters}


def lora_update_flops(sizes: dict[str, int], tokens: int, scored: int) -> float:
    """FLOPs of a LoRA update over ``tokens`` tokens of which ``scored`` are scored:
    ``4 N_b T + 4 N_h T_c + 6 N_a T`` (the derivation is in the module docstring)."""
    return 4 * sizes["body"] * tokens + 4 * sizes["head"] * scored + 6 * sizes["adapters"] * tokens


def read_recipe(path: str):
    """``(cfg, rows)``: the resolved recipe and its task's first 64 training prompts
    (``prompt`` and ``answer``, as ``ktae train`` formats them)."""
    from ktae.runs.config import TrainConfig
    from ktae.train.data import format_task
    from ktae.train.session import default_template, preflight

    cfg = TrainConfig.from_file(path).resolve()
    checked = preflight(cfg)
    model, tokenizer = load_model(checked.model)
    template = cfg.template or default_template(checked.task, tokenizer, cfg.reward)
    rows, _ = format_task(checked.task, template, tokenizer, cfg.reward, model=model,
                          max_new_tokens=cfg.max_new_tokens)
    return cfg, [{"prompt": r["prompt"], "answer": str(r["answer"])} for r in rows[:64]]


def use_ktae_from(src: str | None) -> None:
    """Import ktae from the source tree ``src`` (a directory holding ``ktae/``)."""
    if src is None:
        return
    if not (Path(src) / "ktae" / "__init__.py").is_file():
        raise SystemExit(f"--ktae-src: {src} holds no ktae package")
    if "ktae" in sys.modules:
        raise SystemExit("--ktae-src: ktae is already imported")
    sys.path.insert(0, str(Path(src).resolve()))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="a model name or directory")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--rounds", type=int, default=3, help="alternating ktae/TRL turns each")
    p.add_argument("--steps", type=int, default=1,
                   help="optimizer steps per trainer per turn; with more than one, the "
                        "medians leave out each turn's first step (a fresh trainer's, which "
                        "creates AdamW's state) and time the steps a run repeats")
    p.add_argument("--repeats", type=int, default=1, help="runs per generation setting")
    p.add_argument("--compile", action="store_true", help="also try torch.compile")
    p.add_argument("--other-threads", type=lambda t: [int(x) for x in t.split(",")], default=[],
                   help="also generate at these thread counts (comma-separated)")
    p.add_argument("--beta", type=float, default=0.0,
                   help="KL coefficient (> 0 adds the reference log-prob pass)")
    p.add_argument("--trl", action="append", default=[], metavar="KEY=VALUE",
                   help="a GRPOConfig setting for both trainers (e.g. "
                        "gradient_checkpointing=true)")
    p.add_argument("--only", default="matmul,passes,generation,step",
                   help="comma-separated: matmul, passes, generation, step")
    p.add_argument("--logprob-head", default="auto", choices=("auto", "full", "chunked"),
                   help="ktae's log-prob head (docs/step-time.md); TRL's is its fused head")
    p.add_argument("--lora", nargs="?", const=str(ROOT / "configs" / "smollm2-recipe.yaml"),
                   metavar="RECIPE", help="the LoRA recipe's step (module docstring): its "
                   "model, batch, tokens, temperature, threads, trl settings, adapters and "
                   "prompts, against the LoRA floor (default recipe: configs/smollm2-recipe.yaml)")
    p.add_argument("--kinds", default="ktae,trl",
                   help="the trainers of 3-4: ktae (--credit none), trl (TRL's own), sdpo "
                        "(ktae's with --credit sdpo: the self-teacher pass), comma-separated")
    p.add_argument("--ktae-src", help="import ktae from this source directory (holding ktae/)")
    p.add_argument("--rate-repeats", type=int, default=3,
                   help="timed rounds of the matmul rate at the step's shapes")
    p.add_argument("--bf16", action="store_true",
                   help="ktae train --bf16: products in bfloat16 (autocast), a LoRA run's "
                        "frozen base stored in bfloat16; floors at the bfloat16 matmul rate")
    p.add_argument("--default-malloc", action="store_true",
                   help="leave malloc as it is, where ktae train keeps freed memory for reuse "
                        "(ktae.train.allocator; a tree from before it always leaves it)")
    p.add_argument("--json", help="write every number here")
    a = p.parse_args(argv)
    use_ktae_from(a.ktae_src)
    only = set(a.only.split(","))
    kinds = [k for k in KINDS if k in a.kinds.split(",")]
    if "ktae" not in kinds or set(a.kinds.split(",")) - set(KINDS):
        p.error("--kinds: expected ktae, optionally with trl and sdpo (e.g. ktae,trl)")
    from ktae.train.session import _quiet
    from ktae.train.trl_args import parse_trl_pairs

    _quiet()
    trl = parse_trl_pairs(a.trl)
    recipe, temperature, peft_config = None, None, None
    if a.lora:
        from ktae.train.session import lora_config

        recipe, rows = read_recipe(a.lora)
        a.model, a.prompts, a.generations = recipe.model, recipe.num_prompts, recipe.num_generations
        a.new_tokens, a.threads, temperature = (recipe.max_new_tokens, recipe.torch_threads,
                                                recipe.temperature)
        trl = {**recipe.trl, **trl}
        peft_config = lora_config(recipe)
    trl["beta"] = a.beta
    torch.set_num_threads(a.threads)
    try:  # what the tree's ktae train does (ktae.train.session.train)
        from ktae.train.allocator import keep_freed_memory
    except ImportError:  # a tree from before it
        keep_freed_memory = None
    kept = bool(keep_freed_memory and not a.default_malloc and keep_freed_memory())
    path = resolve_model(a.model)
    if a.bf16:
        from ktae.train.precision import check_bf16

        say(check_bf16("cpu"))
    model, tokenizer = load_model(path, bf16=a.bf16, lora=peft_config is not None)
    model.eval()
    n_params = parameter_count(model)
    stop = never_drawn(model)
    batch = a.prompts * a.generations
    if recipe is None:
        rows = prompts_of(tokenizer, 64)
    sample = [r["prompt"] for r in rows[:a.prompts] for _ in range(a.generations)]
    prompt_tokens = max(len(tokenizer(s, add_special_tokens=False)["input_ids"]) for s in sample)
    result: dict = {"model": path, "parameters": n_params, "threads": a.threads,
                    "load_start": load(), "logprob_head": a.logprob_head,
                    "batch": batch, "prompts": a.prompts, "prompt_tokens": prompt_tokens,
                    "new_tokens": a.new_tokens, "stop_ids": stop,
                    "lora": a.lora, "bf16": a.bf16, "keeps_freed_memory": kept,
                    "ktae_src": str(Path(find_spec("ktae").origin).parent),
                    "trl_settings": {k: v for k, v in trl.items() if k != "beta"}}
    lora_flops = None
    tokens = batch * (prompt_tokens + a.new_tokens)
    shapes = linear_shapes(model)  # the frozen weights' (no adapter's)
    if peft_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)
        model.eval()
        sizes = lora_sizes(model)
        lora_flops = lora_update_flops(sizes, tokens, batch * a.new_tokens)
        result["lora_sizes"] = sizes
        result["lora_update_flops"] = lora_flops
        say(f"LoRA r={peft_config.r}, alpha={peft_config.lora_alpha}, targets "
            f"{peft_config.target_modules}: N_b {sizes['body'] / 1e6:.1f}M, N_h "
            f"{sizes['head'] / 1e6:.1f}M, N_a {sizes['adapters'] / 1e6:.2f}M; micro-batches: "
            f"{trl.get('gradient_accumulation_steps', 1)}")
    say(f"{path}: {n_params / 1e6:.1f}M parameters; {a.prompts} prompts x {a.generations} = "
        f"{batch} responses of {a.new_tokens} tokens after prompts of <= {prompt_tokens}; "
        f"{a.threads} thread(s); load {load()}")

    dtype = torch.bfloat16 if a.bf16 else torch.float32
    say(f"\n1. {str(dtype).removeprefix('torch.')} matmul rate (the model's {len(shapes)} "
        "linear shapes)")
    rate_train = matmul_rate(shapes, tokens, repeats=a.rate_repeats, dtype=dtype)
    rate_cached = matmul_rate(shapes, batch, repeats=5, dtype=dtype)
    rate_decode = matmul_rate(shapes, batch, repeats=5, dtype=dtype, streamed=True)
    result["matmul"] = {"train_rows": tokens, "train_flops": rate_train,
                        "decode_rows": batch, "decode_flops": rate_cached,
                        "decode_streamed_flops": rate_decode}
    say(f"  M = {tokens} rows (update, log-prob passes): {rate_train / 1e9:.1f} GFLOP/s")
    say(f"  M = {batch} rows (one decoding step):      {rate_decode / 1e9:.1f} GFLOP/s over "
        f"the model's own weights ({rate_cached / 1e9:.1f} with one matrix per shape, in "
        "the CPU's caches)")
    passes = 1 if a.beta > 0 else 0
    floor = floors(n_params, batch, prompt_tokens, a.new_tokens, rate_train, rate_decode,
                   passes, lora_flops)
    result["generation_floor_cached"] = floors(
        n_params, batch, prompt_tokens, a.new_tokens, rate_train, rate_cached, passes,
        lora_flops)["generation"]
    floor_of = dict(FLOOR_OF, update=LORA_FLOOR_OF if lora_flops else FLOOR_OF["update"])
    result["floors"] = floor
    result["floor_of"] = floor_of
    update_flops = lora_flops or 6 * n_params * tokens
    say(f"  floors: generation {floor['generation']:.1f} s, update {floor['update']:.1f} s "
        f"({floor_of['update']}, T = {tokens} tokens: {update_flops / 1e12:.2f} TFLOP)"
        + (f", log-probs {floor['logprobs']:.1f} s" if passes else ""))

    if "passes" in only and peft_config is not None:
        micro = int(trl.get("gradient_accumulation_steps", 1))
        say(f"\n1c. the LoRA update's own passes: ktae's log-prob head, {batch} rows in {micro} "
            f"micro-batch(es), no trainer")
        with autocast(a.bf16):
            own = lora_update_passes(model, batch, prompt_tokens, a.new_tokens, micro,
                                     temperature or 1.0)
        own["x_floor"] = own["total"] / floor["update"]
        result["lora_passes"] = own
        say(f"  forward {own['forward']:.2f} s, backward {own['backward']:.2f} s: "
            f"{own['total']:.2f} s, x{own['x_floor']:.2f} of the update's floor "
            f"({floor_of['update']})")
    if "passes" in only and peft_config is None:
        length = prompt_tokens + a.new_tokens
        say(f"\n1b. the model's own passes ({batch} rows x {length} tokens, no trainer)")
        passes_s = model_passes(model, batch, length)
        result["passes"] = passes_s
        pass_floor = {"forward": 2, "forward, with gradients": 2, "backward": 4}
        for name, seconds in passes_s.items():
            f = pass_floor[name] * n_params * tokens / rate_train
            what = f"{pass_floor[name]} N T"
            if lora_flops and name == "backward":  # activations' and adapters' gradients
                f = (2 * n_params + 4 * result["lora_sizes"]["adapters"]) * tokens / rate_train
                what = "2 N T + 4 N_a T"
            say(f"  {name:<28} {seconds:7.2f} s  x{seconds / f:.2f} of its floor ({what})")

    if "generation" in only:
        say(f"\n2. generation backends ({batch} rows x {a.new_tokens} tokens, sampled)")
        with autocast(a.bf16):
            gens = generation_backends(model, tokenizer, sample, a.new_tokens, a.threads,
                                       compile_=a.compile, repeats=a.repeats,
                                       other_threads=[t for t in a.other_threads
                                                      if t != a.threads])
        result["generation"] = gens
        best = min(v for k, v in gens.items() if k != "compile time")
        for name, seconds in gens.items():
            extra = "" if name == "compile time" else \
                f"  x{seconds / best:.2f} of the best, x{seconds / floor['generation']:.2f} " \
                "of the floor"
            say(f"  {name:<28} {seconds:7.1f} s{extra}")
        result["generation_best"] = best
    del model
    gc.collect()

    if "step" in only:
        say(f"\n3-4. {' and '.join(kinds)} (ktae: --credit none), {a.steps} step(s) each, "
            f"alternating for {a.rounds} rounds")
        lora = peft_config is not None
        weights = {k: v.clone() for k, v in
                   load_model(path, bf16=a.bf16, lora=lora)[0].state_dict().items()}

        def factory():
            m, _ = load_model(path, bf16=a.bf16, lora=lora)
            m.load_state_dict(weights)
            return m

        state = {"factory": factory, "head": a.logprob_head, "peft_config": peft_config}
        record_trl_profiling()
        timers = {k: StepTimes() for k in kinds}
        with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
            configs = {}
            for kind in kinds:
                configs[kind] = trainer_args(
                    path, tmp, prompts=a.prompts, generations=a.generations,
                    new_tokens=a.new_tokens, threads=a.threads, steps=a.steps, trl=trl,
                    temperature=temperature, bf16=a.bf16, stop=stop,
                    credit="sdpo" if kind == "sdpo" else "none")
            for r in range(a.rounds):
                order = kinds if r % 2 == 0 else kinds[::-1]
                for kind in order:
                    say(f"  round {r + 1}: {kind}, load {load()}")
                    run_steps(kind, state, tokenizer, rows, *configs[kind], timers[kind])
                    say(f"    step {timers[kind].steps[-1]:.1f} s")
        def steady(xs: list) -> list:
            return steady_steps(xs, a.steps)

        med = {k: statistics.median(steady(t.steps)) for k, t in timers.items()}
        result["steps_per_turn"] = a.steps
        result["first_step_medians"] = {k: statistics.median(t.steps[::a.steps])
                                        for k, t in timers.items()}
        say("\n  TRL's profiled sections, median seconds per step: "
            + " ".join(f"{k:>9}" for k in kinds))
        for section in PROFILED:
            cells = [statistics.median(p.get(section, 0.0) for p in steady(timers[k].profiled))
                     for k in kinds]
            say(f"  {section:<48} " + " ".join(f"{c:9.3g}" for c in cells))
        result["trl_profiled"] = {k: t.profiled for k, t in timers.items()}
        parts = {p: statistics.median(x[p] for x in steady(timers["ktae"].parts))
                 for p in (*PARTS, "other", "step")}
        result["steps"] = {k: t.steps for k, t in timers.items()}
        result["step_cpu"] = {k: t.cpu for k, t in timers.items()}
        result["step_cpu_median"] = {k: statistics.median(steady(t.cpu))
                                     for k, t in timers.items()}
        result["ktae_parts"] = timers["ktae"].parts
        if "by_prompt" in state:
            result["micro_batches_by_prompt"] = state["by_prompt"]
        if a.steps > 1:
            say("\n  first steps of each turn (left out below), medians: " + ", ".join(
                f"{k} {result['first_step_medians'][k]:.1f} s" for k in kinds))
        say(f"\n  ktae step (median of {len(steady(timers['ktae'].steps))}): "
            f"{med['ktae']:.1f} s" + (f"; TRL's: {med['trl']:.1f} s" if "trl" in med else "")
            + f"; CPU time {result['step_cpu_median']['ktae']:.1f} s (the process's, "
            "which other jobs on the machine slow far less than the wall time)")
        if "trl" in med:
            result["ratio"] = med["ktae"] / med["trl"]
            say(f"  ktae/TRL = {result['ratio']:.3f}")
        if "sdpo" in med:  # the self-teacher pass's share of the whole step
            result["ratio_sdpo"] = med["sdpo"] / med["ktae"]
            result["sdpo_parts"] = timers["sdpo"].parts
            cpu = result["step_cpu_median"]
            result["ratio_sdpo_cpu"] = cpu["sdpo"] / cpu["ktae"]
            say(f"  --credit sdpo: {med['sdpo']:.1f} s; sdpo/none = {result['ratio_sdpo']:.3f}; "
                f"in CPU time {cpu['sdpo']:.1f} s, sdpo/none = {result['ratio_sdpo_cpu']:.3f}")
        say(f"\n  {'part':<12} {'seconds':>9} {'floor':>9} {'x floor':>9}  floor of")
        for part in (*PARTS, "other"):
            f = floor.get(part)
            cells = f" {f:9.3g} {parts[part] / f:9.3g}  {floor_of[part]}" if f else ""
            say(f"  {part:<12} {parts[part]:9.3g}{cells}")
        say(f"  {'step':<12} {parts['step']:9.3g}")
        if "generation_best" in result:
            say(f"  generation in the step / best backend above: "
                f"x{parts['generation'] / result['generation_best']:.2f}")
        result["ktae_part_medians"] = parts
    result["load_end"] = load()
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
