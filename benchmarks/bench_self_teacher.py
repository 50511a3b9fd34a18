"""What the self-teacher costs on the SmolLM2 recipe's batch, side by side with what it adds to.

Usage:
    python benchmarks/bench_self_teacher.py                  # 4 x 8 rows, 64 tokens, 3 rounds
    python benchmarks/bench_self_teacher.py --prompts 1 --rounds 4 \
        --out benchmarks/results/self-teacher-smollm2-8rows-b.json   # one micro-batch of 8

On the recipe's model (``configs/smollm2-recipe.yaml``: SmolLM2-135M-Instruct, 4 prompts x 8
responses of 64 tokens, one torch thread, float32), on embedded-task prompts rendered with
the chat template and responses of random tokens (the cost depends on the shapes only),
half of each group right, so every row has a teacher. Alternating, ``--rounds`` times:

* ``policy_pass``: one no-grad pass of the policy over prompt + response, 8 rows at a time
  (the log-prob pass the trainer makes for ``logprobs``);
* ``teacher_pass``: the self-teacher pass (need ``teacher_logprobs``,
  :func:`ktae.models.self_teacher.teacher_logprobs`) over the same rows, each after its
  privileged prompt (the template and a right response of its group);
* ``update_pass``: the forward and backward pass of the policy's log-probs over the batch,
  8 rows at a time (what the update's loss runs);
* ``sdpg_term``: SDPG's loss term on the same micro-batches, forward and backward
  (:func:`ktae.train.self_distill.distill_term`: the teacher's no-grad pass and the
  student's pass with gradient, the full-vocabulary KL).

Prints and writes the medians, their ratios ``teacher_pass / policy_pass`` and
``sdpg_term / update_pass``, and each round's own ratios; the machine may be shared, so
only ratios measured in the same process, alternating, are meant to be compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rows-per-pass", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from ktae.core.self_distill import SelfDistill
    from ktae.eval.prompts import render_prompt
    from ktae.groups.sampling import load_model
    from ktae.models.self_teacher import context_logprobs, teacher_logprobs
    from ktae.tasks.arith import generate, user_message
    from ktae.train.self_distill import distill_term, teacher_prompts

    model, tok, _ = load_model(args.model)
    model.float()
    problems = generate(args.prompts, seed=0, difficulty=0)
    texts = [render_prompt(user_message(pr), "chat", tok) for pr in problems]
    G, T = args.generations, args.new_tokens
    enc = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    P = max(len(e) for e in enc)
    b = args.prompts * G
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    prompt_ids = torch.full((b, P), pad, dtype=torch.long)
    prompt_mask = torch.zeros(b, P, dtype=torch.long)
    for i in range(b):
        e = enc[i // G]
        prompt_ids[i, P - len(e):] = torch.tensor(e)
        prompt_mask[i, P - len(e):] = 1
    g = torch.Generator().manual_seed(0)
    low = min(100, len(tok) // 4)  # clear of the special tokens at either end
    completion_ids = torch.randint(low, len(tok) - low, (b, T), generator=g)
    completion_mask = torch.ones(b, T, dtype=torch.long)
    correct = (torch.arange(b) % 2) == 0
    group = torch.arange(b) // G
    own = [prompt_ids[i][prompt_mask[i].bool()].tolist() for i in range(b)]

    def policy_pass():
        return context_logprobs(model, own, completion_ids, completion_mask, pad_id=pad,
                                rows_per_pass=args.rows_per_pass)

    student = policy_pass()

    def teacher_pass():
        return teacher_logprobs(model, tok, prompt_ids, prompt_mask, completion_ids,
                                completion_mask, correct=correct, group=group,
                                student_logprobs=student, rows_per_pass=args.rows_per_pass)

    from ktae.train.self_distill import completion_logits

    def update_pass():
        for s in range(0, b, args.rows_per_pass):
            rows = slice(s, s + args.rows_per_pass)
            z = completion_logits(model, prompt_ids[rows], prompt_mask[rows],
                                  completion_ids[rows], completion_mask[rows]).float()
            lp = torch.log_softmax(z, -1).gather(-1, completion_ids[rows][..., None])
            lp.sum().backward()
        model.zero_grad(set_to_none=True)

    settings = SelfDistill.parse("sdpg", {"teacher_source": "group"})
    batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
             "completion_ids": completion_ids, "completion_mask": completion_mask,
             "advantages": torch.ones(b)}
    batch.update(teacher_prompts(settings, tok, prompt_ids, prompt_mask, completion_ids,
                                 completion_mask, correct=correct, group=group,
                                 rows=[{}] * b))

    def sdpg_term():
        for s in range(0, b, args.rows_per_pass):
            micro = {k: v[s:s + args.rows_per_pass] for k, v in batch.items()}
            term, _ = distill_term(settings, model, micro, temperature=1.0, loss_type="grpo",
                                   step=0, total_steps=1)
            term.backward()
        model.zero_grad(set_to_none=True)

    parts = {"policy_pass": policy_pass, "teacher_pass": teacher_pass,
             "update_pass": update_pass, "sdpg_term": sdpg_term}
    times: dict[str, list[float]] = {k: [] for k in parts}
    for _ in range(args.rounds):
        for name, fn in parts.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    teacher_tokens = int(batch["ktae_teacher_prompt_mask"].sum()) + b * T
    result = {
        "model": args.model, "rows": b, "new_tokens": T, "prompt_tokens": P,
        "tokens_policy_pass": int(prompt_mask.sum()) + b * T,
        "tokens_teacher_pass": teacher_tokens, "threads": args.threads,
        "rounds": args.rounds, "seconds": times, "median_seconds": med,
        "teacher_over_policy": med["teacher_pass"] / med["policy_pass"],
        "sdpg_term_over_update": med["sdpg_term"] / med["update_pass"],
        # each round's own ratio: the two passes ran back to back, under the same load
        "teacher_over_policy_by_round": [t / p for t, p in zip(times["teacher_pass"],
                                                               times["policy_pass"], strict=True)],
        "sdpg_term_over_update_by_round": [t / u for t, u in zip(times["sdpg_term"],
                                                                 times["update_pass"],
                                                                 strict=True)],
    }
    print(json.dumps({k: v for k, v in result.items() if k != "seconds"}, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
