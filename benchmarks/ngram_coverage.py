"""How much of a response KTAE credits, by span length N, on the shipped default model.

Usage:
    python benchmarks/ngram_coverage.py                     # 40 prompts x 8 samples, N = 1..4
    python benchmarks/ngram_coverage.py --prompts 100 --json coverage.json

Samples ``--samples`` responses to each of ``--prompts`` held-out problems of the
embedded task (test split, seed 0) from the shipped warm-started model, as the trainer
does (compact prompt, temperature 1, 40 new tokens; ``ktae.models.generate.generate_hf``), scores
them with the strict boxed reward, then computes KTAE on these same groups for every
span length N and both ``ngram_reduce`` rules (exact mode, GRPO base, the trainer's
ignored ids: EOS and pad). Per row, over the real tokens (EOS included) of the groups
holding both correct and incorrect responses (the only groups KTAE credits):

- ``non-zero``: share of tokens whose key value is not 0;
- ``|v| >= 0.1``: share with a key value of magnitude at least 0.1 (a tenth of ``top``);
- ``mean |v|``: mean magnitude of the key values;
- ``blame``: on incorrect responses, the key value of the first character that departs
  from the correct worked solution minus the mean value of the response's other tokens
  (negative: the credit singles out the mistake), averaged over those responses;
- ``hit``: share of those responses whose first wrong character holds the response's
  lowest key value, and that value is negative (ties included);
- ``tied``: mean number of tokens sharing that lowest value in the hit responses
  (spans spread one value over several tokens).

The embedded task's tokenizer is one token per character, so character positions are
token positions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import ktae
from ktae.models.generate import SamplingConfig, generate_hf
from ktae.models.warmstart import default_model_path
from ktae.rewards import math_reward
from ktae.tasks.embedded import format_prompt, generate, worked_solution


def sample_groups(prompts: int, samples: int, *, seed: int, temperature: float,
                  max_new_tokens: int = 40) -> dict:
    """Sampled responses as a padded batch: ids, mask, rewards, group, problems, texts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    problems = generate(prompts, split="test", seed=0)
    gens = generate_hf(model, tok, [format_prompt(p, "compact") for p in problems],
                       SamplingConfig(k=samples, temperature=temperature,
                                      max_new_tokens=max_new_tokens, seed=seed))
    rows, rewards, group, texts, owner = [], [], [], [], []
    for i, (problem, outs) in enumerate(zip(problems, gens, strict=True)):
        for g in outs:
            ids = tok(g.text, add_special_tokens=False)["input_ids"]
            if g.num_tokens == len(ids) + 1:  # ended with EOS, which decoding drops
                ids = ids + [tok.eos_token_id]
            elif g.num_tokens != len(ids):
                raise RuntimeError(f"re-tokenised response has {len(ids)} tokens, generated "
                                   f"{g.num_tokens}: {g.text!r}")
            rows.append(ids)
            rewards.append(math_reward(g.text, problem.answer).score)
            group.append(i)
            texts.append(g.text)
            owner.append(problem)
    T = max(1, max(len(r) for r in rows))
    token_ids = torch.full((len(rows), T), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for j, r in enumerate(rows):
        token_ids[j, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[j, :len(r)] = True
    return dict(token_ids=token_ids, mask=mask, rewards=torch.tensor(rewards, dtype=torch.float64),
                group=torch.tensor(group), problems=owner, texts=texts,
                ignore=sorted({tok.eos_token_id, tok.pad_token_id}))


def first_error(text: str, problem) -> int | None:
    """Index of the first character of ``text`` that departs from the correct solution."""
    ref = worked_solution(problem)
    for i, (a, b) in enumerate(zip(text, ref, strict=False)):
        if a != b:
            return i
    return len(ref) if len(text) > len(ref) else None


def measure(batch: dict, ngram: int, reduce: str) -> dict:
    kw = dict(rewards=batch["rewards"], group=batch["group"], token_ids=batch["token_ids"],
              mask=batch["mask"])
    adv = ktae.compute_advantages("ktae", **kw, ngram=ngram, ngram_reduce=reduce,
                                  ignore_token_ids=batch["ignore"])
    base = ktae.compute_advantages("grpo", rewards=batch["rewards"], group=batch["group"])
    value = (adv - base[:, None]) * batch["mask"]
    correct = batch["rewards"] > 0
    g = batch["group"]
    n_groups = int(g.max()) + 1
    n_correct = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, g, correct.double())
    n_all = torch.bincount(g, minlength=n_groups).double()
    mixed_group = (n_correct > 0) & (n_correct < n_all)
    mixed = mixed_group[g][:, None] & batch["mask"]
    v = value[mixed]
    blame, hit, tied = [], [], []
    for row in (mixed_group[g] & ~correct).nonzero().flatten().tolist():
        err = first_error(batch["texts"][row], batch["problems"][row])
        length = int(batch["mask"][row].sum())
        if err is None or err >= length or length < 2:
            continue
        vals = value[row, :length]
        others = torch.cat([vals[:err], vals[err + 1:]])
        blame.append(float(vals[err] - others.mean()))
        low = vals.min()
        hit.append(bool(vals[err] <= low < 0))
        if hit[-1]:
            tied.append(int((vals == low).sum()))
    return {
        "ngram": ngram, "reduce": reduce,
        "nonzero_mixed": float((v != 0).double().mean()) if v.numel() else None,
        "nonzero_all": float((value[batch["mask"]] != 0).double().mean()),
        "strong_mixed": float((v.abs() >= 0.1).double().mean()) if v.numel() else None,
        "mean_abs_mixed": float(v.abs().mean()) if v.numel() else None,
        "blame": statistics.fmean(blame) if blame else None,
        "hit": statistics.fmean(hit) if hit else None,
        "tied": statistics.fmean(tied) if tied else None,
        "n_blame": len(blame),
    }


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--ngram", default="1,2,3,4", help="comma list of span lengths")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    ngrams = [int(x) for x in args.ngram.split(",") if x.strip()]
    t0 = time.perf_counter()
    batch = sample_groups(args.prompts, args.samples, seed=args.seed,
                          temperature=args.temperature)
    correct = batch["rewards"] > 0
    g = batch["group"]
    per_group = torch.zeros(args.prompts, dtype=torch.float64).index_add_(0, g, correct.double())
    n_mixed = int(((per_group > 0) & (per_group < args.samples)).sum())
    print(f"{args.prompts} held-out prompts x {args.samples} samples (temperature "
          f"{args.temperature}, seed {args.seed}): {int(batch['mask'].sum())} real tokens, "
          f"accuracy {100 * float(correct.double().mean()):.1f}%, {n_mixed} mixed groups "
          f"({time.perf_counter() - t0:.0f} s)\n")
    rows = [measure(batch, n, r) for n in ngrams for r in (["mean", "maxabs"] if n > 1
                                                          else ["mean"])]
    print("| N | reduce | non-zero (mixed groups) | non-zero (all) | abs(v) >= 0.1 | "
          "mean abs(v) | blame | hit | tied |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        reduce = r["reduce"] if r["ngram"] > 1 else "-"
        blame = "n/a" if r["blame"] is None else f"{r['blame']:+.3f}"
        print(f"| {r['ngram']} | {reduce} | {_pct(r['nonzero_mixed'])} | {_pct(r['nonzero_all'])} "
              f"| {_pct(r['strong_mixed'])} | "
              f"{'n/a' if r['mean_abs_mixed'] is None else format(r['mean_abs_mixed'], '.3f')} | "
              f"{blame} | {_pct(r['hit'])} | "
              f"{'n/a' if r['tied'] is None else format(r['tied'], '.1f')} |")
    print(f"\nblame/hit over {rows[0]['n_blame']} incorrect responses of mixed groups")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"prompts": args.prompts, "samples": args.samples, "seed": args.seed,
                       "mixed_groups": n_mixed, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
