"""Starting pass rates of a model on the ``arith`` task, as RL will see them.

For each difficulty: N training-split problems, K samples each at the training temperature
(and one greedy response each), prompted and scored exactly as ``ktae train --task arith``
prompts and scores them (chat template, ``number`` reward). Prints and writes (``--json``)
the sampled pass rate, the share of mixed groups (some right, some wrong: the groups GRPO
learns from), the greedy accuracy, the truncation rate and the mean response length.

    python studies/smollm2-recipe/arith_baseline.py --model smollm2-135m --difficulty 1,2,3 --problems 24
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--difficulty", default="1,2,3")
    p.add_argument("--problems", type=int, default=24)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ktae.models.model_path import resolve_model_path
    from ktae.rewards.registry import get_reward
    from ktae.tasks import arith

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    path = resolve_model_path(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    score = get_reward("number").score
    eos = tok.eos_token_id

    def generate(prompts: list[str], sample: bool) -> tuple[list[str], list[bool]]:
        texts, truncated = [], []
        for i in range(0, len(prompts), args.batch):
            enc = tok(prompts[i:i + args.batch], return_tensors="pt", padding=True)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=args.max_new_tokens,
                                     do_sample=sample, temperature=args.temperature if sample
                                     else None, top_p=None, top_k=None,
                                     pad_token_id=tok.pad_token_id)
            new = out[:, enc.input_ids.shape[1]:]
            texts += tok.batch_decode(new, skip_special_tokens=True)
            truncated += [bool((row != eos).all()) for row in new]
        return texts, truncated

    results = {}
    for difficulty in [int(d) for d in args.difficulty.split(",")]:
        t0 = time.time()
        problems = arith.generate(args.problems, split="train", seed=args.seed,
                                  difficulty=difficulty)
        prompts = [tok.apply_chat_template([{"role": "user", "content": arith.user_message(q)}],
                                           tokenize=False, add_generation_prompt=True)
                   for q in problems]
        greedy, _ = generate(prompts, sample=False)
        greedy_ok = [r.correct for r in score(greedy, [q.answer for q in problems])]
        sampled, trunc = generate([x for x in prompts for _ in range(args.samples)], sample=True)
        answers = [q.answer for q in problems for _ in range(args.samples)]
        ok = [r.correct for r in score(sampled, answers)]
        groups = [ok[i:i + args.samples] for i in range(0, len(ok), args.samples)]
        mixed = sum(0 < sum(g) < len(g) for g in groups) / len(groups)
        lengths = [len(ids) for ids in tok(sampled)["input_ids"]]
        by_kind = {}
        for q, g in zip(problems, groups, strict=True):
            by_kind.setdefault(q.kind, []).extend(g)
        row = {"difficulty": difficulty, "problems": args.problems, "samples": args.samples,
               "temperature": args.temperature, "sampled_pass": sum(ok) / len(ok),
               "mixed_groups": mixed, "greedy_accuracy": sum(greedy_ok) / len(greedy_ok),
               "truncated": sum(trunc) / len(trunc), "mean_tokens": sum(lengths) / len(lengths),
               "pass_by_kind": {k: sum(v) / len(v) for k, v in by_kind.items()},
               "passes_per_problem": [sum(g) for g in groups],
               "seconds": round(time.time() - t0, 1)}
        results[difficulty] = row
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "max_new_tokens": args.max_new_tokens,
                       "seed": args.seed, "results": results}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
