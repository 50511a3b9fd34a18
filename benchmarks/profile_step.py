"""Where the LoRA recipe's training step spends its CPU time, by PyTorch operator.

Usage:
    python benchmarks/profile_step.py            # float32
    python benchmarks/profile_step.py --bf16     # ktae train --bf16's arithmetic
    python benchmarks/profile_step.py --bf16 --part update   # the update alone
    python benchmarks/profile_step.py --bf16 --part generation   # its sampling alone

Builds ``KTAEGRPOTrainer`` on the recipe (``configs/smollm2-recipe.yaml``: its model, batch,
tokens, temperature, micro-batches and LoRA adapters; ``--credit none``; one thread), runs
two optimizer steps and profiles the second with ``torch.profiler`` (CPU activities): the
first step pays one-time costs (AdamW's state, first-call allocations). Freed memory is
kept for reuse, as in ``ktae train``'s process (:mod:`ktae.train.allocator`). Prints the step's
parts (``ktae.train.step_timing``), its CPU seconds, and the operators by self CPU time,
with the share of matrix products (``aten::mm``, ``addmm``, ``bmm``) in the profiled
total, and the profiled time by kind (:func:`by_kind`): products, attention kernels,
vocabulary-sized operations, the rest. The profiler adds its own overhead, so its total
exceeds the step's CPU time; read the shares, not the seconds, against bench_step.py's
measurements (the overhead is per operation: the many small ones of "the rest" gain most).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

PRODUCTS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm")


def main(argv: list[str] | None = None) -> dict:
    import bench_step as B
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from ktae.train.allocator import keep_freed_memory
    from ktae.train.session import _quiet, lora_config
    from ktae.train.trainer import KTAEGRPOTrainer

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default=str(B.ROOT / "configs" / "smollm2-recipe.yaml"))
    p.add_argument("--bf16", action="store_true", help="ktae train --bf16's arithmetic")
    p.add_argument("--part", choices=("step", "update", "generation"), default="step",
                   help="what is profiled: the whole second step, its update alone or its "
                        "generation alone")
    p.add_argument("--rows", type=int, default=30, help="operators printed")
    p.add_argument("--shapes", action="store_true",
                   help="one row per operator and input shapes (the profiler records them)")
    a = p.parse_args(argv)
    _quiet()
    keep_freed_memory()  # as ktae train's process runs (ktae.train.allocator)
    recipe, rows = B.read_recipe(a.recipe)
    torch.set_num_threads(recipe.torch_threads)
    path = B.resolve_model(recipe.model)
    peft = lora_config(recipe)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  record_shapes=True)
    cpu = {}

    def start():
        prof.__enter__()
        cpu["start"] = time.process_time()

    class Profile(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == 1 and a.part == "step":
                start()

        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2 and a.part != "generation":
                cpu["step"] = time.process_time() - cpu["start"]
                prof.__exit__(None, None, None)

    timer = B.StepTimes()
    with tempfile.TemporaryDirectory(prefix="profile-step-") as tmp:
        model, tokenizer = B.load_model(path, bf16=a.bf16, lora=True)
        args, credit = B.trainer_args(
            path, tmp, prompts=recipe.num_prompts, generations=recipe.num_generations,
            new_tokens=recipe.max_new_tokens, threads=recipe.torch_threads, steps=2,
            trl={**recipe.trl, "beta": 0.0}, temperature=recipe.temperature, bf16=a.bf16,
            stop=B.never_drawn(model))
        trainer = KTAEGRPOTrainer(
            credit=credit, model=model, reward_funcs=[B.contains_answer], args=args,
            train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
            callbacks=[timer.callback, Profile()], peft_config=peft)
        trainer.remove_callback(PrinterCallback)
        if a.part == "update":
            compute_loss = trainer.compute_loss

            def first_loss_starts(*args, **kw):  # step 2's first micro-batch: the update
                if trainer.state.global_step == 1 and "start" not in cpu:
                    start()
                return compute_loss(*args, **kw)

            trainer.compute_loss = first_loss_starts
        if a.part == "generation":
            generate = trainer._generate_single_turn

            def second_generation(*args, **kw):  # step 2's sampling alone
                if trainer.state.global_step != 1:
                    return generate(*args, **kw)
                start()
                try:
                    return generate(*args, **kw)
                finally:
                    cpu["step"] = time.process_time() - cpu["start"]
                    prof.__exit__(None, None, None)

            trainer._generate_single_turn = second_generation
        trainer.train()
    events = prof.key_averages(group_by_input_shape=a.shapes)
    total = sum(e.self_cpu_time_total for e in events)
    products = sum(e.self_cpu_time_total for e in events if e.key in PRODUCTS)
    parts = timer.parts[-1]
    print(f"{'bfloat16' if a.bf16 else 'float32'} step 2: {parts['step']:.1f} s wall; "
          f"{cpu['step']:.1f} s CPU profiled ({a.part}); " + ", ".join(
              f"{k} {parts[k]:.1f} s" for k in ("generation", "update")))
    print(f"profiled self CPU time {total / 1e6:.1f} s; matrix products "
          f"({', '.join(PRODUCTS)}) {products / total:.1%} of it\n")
    kinds = by_kind(prof.key_averages(group_by_input_shape=True), model.config.vocab_size)
    print("self CPU time by kind: " + ", ".join(
        f"{kind} {seconds:.2f} s ({seconds / (total / 1e6):.0%})" for kind, seconds in kinds.items()))
    print(f"  products + attention + vocabulary-sized: {sum(list(kinds.values())[:3]):.2f} s, "
          "what the part would take with every other operation fused away\n")
    print(events.table(sort_by="self_cpu_time_total", row_limit=a.rows))
    return {"parts": parts, "cpu": cpu["step"], "products_share": products / total,
            "kinds": kinds}


def by_kind(events, vocab: int) -> dict[str, float]:
    """Self CPU seconds of profiled ``events`` (grouped by input shape) by kind: matrix
    products (:data:`PRODUCTS`), the attention kernels (forward and backward), operations on
    vocabulary-sized tensors (an input whose last dimension is ``vocab``: the log-prob
    head's softmax, its gradient, casts of the logits) and the rest (elementwise work,
    copies, views, autograd's bookkeeping)."""
    kinds = dict.fromkeys(("products", "attention", "vocabulary-sized", "the rest"), 0.0)
    for e in events:
        if e.key in PRODUCTS:
            kind = "products"
        elif "scaled_dot_product" in e.key:
            kind = "attention"
        elif any(isinstance(shape, list) and shape and shape[-1] == vocab
                 for shape in e.input_shapes):
            kind = "vocabulary-sized"
        else:
            kind = "the rest"
        kinds[kind] += e.self_cpu_time_total / 1e6
    return kinds


if __name__ == "__main__":
    main()
