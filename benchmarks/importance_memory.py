"""The memory and time of OAR-G's input-gradient importance on the recipe's rollout batch.

Usage:
    python benchmarks/importance_memory.py                 # 8 rows a pass, then all at once
    python benchmarks/importance_memory.py --rows 8 --new-tokens 128 --json OUT.json

The recipe's policy (configs/smollm2-recipe.yaml: SmolLM2-135M-Instruct with its LoRA
adapters, float32, one thread) and a batch like a rollout of the recipe at the study's
longer budget: its first ``--prompts`` prompts, ``--generations`` responses each of
``--new-tokens`` random tokens (every one as long as the budget allows: the worst case),
each prompt's reference answer appended as the trainer appends it
(``ktae.models.input_grad_importance.response_importance``). Each setting of
``rows_per_pass`` runs in its own process, which reports its peak resident memory
(``ru_maxrss``) after the model and the batch are built and after the importance, and the
importance's seconds; the difference of the two peaks is what the importance added.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def one(rows: int | None, prompts: int, generations: int, new_tokens: int, recipe: str) -> dict:
    import torch
    from peft import get_peft_model

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_step as B

    from ktae.models.input_grad_importance import answer_tokens, response_importance
    from ktae.train.session import _quiet, lora_config

    _quiet()
    torch.set_num_threads(1)
    recipe, task_rows = B.read_recipe(recipe)
    model, tokenizer = B.load_model(B.resolve_model(recipe.model), lora=True)
    model = get_peft_model(model, lora_config(recipe))
    model.eval()
    tokenizer.padding_side = "left"
    chosen = [task_rows[i] for i in range(prompts) for _ in range(generations)]
    enc = tokenizer([r["prompt"] for r in chosen], return_tensors="pt", padding=True,
                    add_special_tokens=False)
    g = torch.Generator().manual_seed(0)
    low = min(100, len(tokenizer) // 4)  # clear of the special tokens at either end
    responses = torch.randint(low, min(40000, len(tokenizer) - low), (len(chosen), new_tokens),
                              generator=g)
    conclusion, answers = answer_tokens(tokenizer, [r["answer"] for r in chosen])
    before = peak_gib()
    started = time.perf_counter()
    s = response_importance(model, enc.input_ids, enc.attention_mask, responses,
                            torch.ones_like(responses), answers, tokenizer.pad_token_id,
                            conclusion=conclusion, generator=torch.Generator().manual_seed(1),
                            rows_per_pass=rows)
    seconds = time.perf_counter() - started
    return {"rows_per_pass": rows, "batch": len(chosen), "new_tokens": new_tokens,
            "prompt_tokens": enc.input_ids.shape[1], "peak_before_gib": before,
            "peak_after_gib": peak_gib(), "added_gib": peak_gib() - before,
            "seconds": seconds, "importance_sum": float(s.sum())}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="8,all", help="rows_per_pass settings (comma-separated; all = None)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--json")
    p.add_argument("--recipe", default=str(ROOT / "configs" / "smollm2-recipe.yaml"),
                   help="the training recipe whose model, LoRA and prompts are measured")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child process's setting
    a = p.parse_args(argv)
    if a.one is not None:
        rows = None if a.one == "all" else int(a.one)
        print(json.dumps(one(rows, a.prompts, a.generations, a.new_tokens, a.recipe)))
        return []
    results = []
    for setting in a.rows.split(","):
        done = subprocess.run([sys.executable, __file__, "--one", setting, "--prompts",
                               str(a.prompts), "--generations", str(a.generations),
                               "--new-tokens", str(a.new_tokens), "--recipe", a.recipe],
                              capture_output=True, text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        print(f"rows per pass {setting:>4}: {result['batch']} rows of {result['prompt_tokens']} "
              f"prompt + {result['new_tokens']} response tokens; peak memory "
              f"{result['peak_before_gib']:.2f} GiB before, {result['peak_after_gib']:.2f} GiB "
              f"after (+{result['added_gib']:.2f}); {result['seconds']:.1f} s", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
