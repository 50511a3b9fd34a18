"""How far ``--bf16`` moves a model's greedy answers from float32's, and how much faster.

Usage:
    python benchmarks/bf16_drift.py                       # the recipe's first 100 held-out
    python benchmarks/bf16_drift.py --prompts 20 --json drift.json

The recipe's model (``configs/smollm2-recipe.yaml`` by default) answers the recipe's
held-out prompts (the run's own held-out split, as ``ktae train`` formats them) greedily,
at the recipe's ``max_new_tokens``, twice: in float32, and as ``ktae train --bf16`` runs
it (the frozen weights stored in bfloat16, the products under bfloat16 autocast). For
each prompt: whether the two completions are the same tokens, and where they first
differ; for each precision: accuracy under the recipe's reward, truncation, and the wall
seconds of the whole batch (the two timed in turn, ``--rounds`` times each, medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def held_out(recipe: str, count: int):
    """``(cfg, rows)``: the resolved recipe and its first ``count`` held-out rows."""
    from ktae.runs.config import TrainConfig
    from ktae.train.data import format_task
    from ktae.train.session import default_template, load_model, preflight

    cfg = TrainConfig.from_file(recipe).resolve()
    checked = preflight(cfg)
    model, tokenizer, _ = load_model(cfg, checked.model)
    template = cfg.template or default_template(checked.task, tokenizer, cfg.reward)
    _, rows = format_task(checked.task, template, tokenizer, cfg.reward, model=model,
                          max_new_tokens=cfg.max_new_tokens)
    if len(rows) < count:
        raise SystemExit(f"--prompts: the recipe's held-out split has {len(rows)} rows")
    return cfg, checked.model, rows[:count]


def answer(model, tokenizer, rows, max_new_tokens: int, bf16: bool):
    """Greedy generations of every row, and the wall seconds they took."""
    from ktae.models.generate import SamplingConfig, generate_hf

    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        gens = generate_hf(model, tokenizer, [r["prompt"] for r in rows],
                           SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens),
                           batch_size=len(rows))
    return [g[0] for g in gens], time.perf_counter() - start


def first_difference(a: tuple, b: tuple) -> int | None:
    """The first position where token sequences ``a`` and ``b`` differ; None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default=str(ROOT / "configs" / "smollm2-recipe.yaml"))
    p.add_argument("--prompts", type=int, default=100)
    p.add_argument("--rounds", type=int, default=1, help="timed runs of each precision")
    p.add_argument("--json", help="write every number here")
    a = p.parse_args(argv)
    from ktae.rewards.registry import get_reward
    from ktae.runs.config import TrainConfig
    from ktae.train.precision import check_bf16
    from ktae.train.session import _quiet, load_model

    _quiet()
    print(check_bf16("cpu"))
    cfg, path, rows = held_out(a.recipe, a.prompts)
    torch.set_num_threads(cfg.torch_threads or torch.get_num_threads())
    models = {}
    for name, bf16 in (("float32", False), ("bfloat16", True)):
        settings = TrainConfig(model=path, bf16=bf16, lora_r=cfg.lora_r)  # a LoRA run's base
        models[name] = (load_model(settings, path)[0].eval(), bf16)
    tokenizer = load_model(cfg, path)[1]
    gens, seconds = {}, {name: [] for name in models}
    for r in range(a.rounds):
        for name in (models if r % 2 == 0 else list(models)[::-1]):
            model, bf16 = models[name]
            print(f"round {r + 1}: {name}, load {os.getloadavg()[0]:.2f}", flush=True)
            gens[name], s = answer(model, tokenizer, rows, cfg.max_new_tokens, bf16)
            seconds[name].append(s)
    reward = get_reward(cfg.reward)
    result: dict = {"model": path, "prompts": len(rows), "max_new_tokens": cfg.max_new_tokens,
                    "threads": torch.get_num_threads(), "precisions": {}}
    correct = {}
    for name, out in gens.items():
        scores = reward.score([g.text for g in out], [r["answer"] for r in rows], num_workers=1)
        correct[name] = [s.correct for s in scores]
        result["precisions"][name] = {
            "accuracy": sum(correct[name]) / len(rows),
            "truncated": sum(g.truncated for g in out) / len(rows),
            "seconds": statistics.median(seconds[name]), "all_seconds": seconds[name]}
    diffs = [first_difference(x.token_ids, y.token_ids)
             for x, y in zip(gens["float32"], gens["bfloat16"], strict=True)]
    differ = [d for d in diffs if d is not None]
    result["identical"] = len(diffs) - len(differ)
    result["first_difference"] = differ
    result["first_difference_median"] = statistics.median(differ) if differ else None
    result["verdict_changed"] = sum(x != y for x, y in
                                    zip(correct["float32"], correct["bfloat16"], strict=True))
    f32, b16 = result["precisions"]["float32"], result["precisions"]["bfloat16"]
    result["speed_ratio"] = b16["seconds"] / f32["seconds"]
    print(f"\n{path}: {len(rows)} held-out prompts, greedy, {cfg.max_new_tokens} new tokens, "
          f"{result['threads']} thread(s)")
    print(f"identical completions: {result['identical']} of {len(rows)}; where they differ, "
          f"the first different token at position {result['first_difference_median']} "
          "(median)")
    print(f"answers judged differently: {result['verdict_changed']} of {len(rows)}")
    for name, r in result["precisions"].items():
        print(f"  {name:<9} accuracy {100 * r['accuracy']:5.1f}%  truncated "
              f"{100 * r['truncated']:5.1f}%  {r['seconds']:6.1f} s")
    print(f"bfloat16 / float32 time: {result['speed_ratio']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
