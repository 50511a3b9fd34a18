"""Sample a real model's free-text answers to arithmetic word problems, one JSON line each.

The output is the fixture that tests/test_claims.py labels with both claim labellers
(docs/claims.md). Each line holds the problem, its exact answer, the decoded response
the generated token ids (without padding or the end-of-turn token) and their texts, one
piece per token (``ktae.viz.tokens.token_pieces``).

    KTAE_CACHE=/work/ktae-cache HF_HUB_OFFLINE=1 nice -n 10 \
        python studies/claims/sample_arithmetic_responses.py \
        --model /work/ktae-cache/models/smollm2-135m-instruct-b179c9523d0e-v1 --count 500 \
        --out tests/data/smollm2_arithmetic_samples.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from fractions import Fraction

NAMES = ["Tom", "Anna", "Sam", "Maria", "Li", "Omar", "Kate", "Ben"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "coins"]


def make_problem(rng: random.Random) -> tuple[str, Fraction]:
    """One arithmetic word problem and its exact answer."""
    kind = rng.randrange(9)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    if kind == 0:
        return f"What is {a} + {b}?", Fraction(a + b)
    if kind == 1:
        a, b = max(a, b) + 50, min(a, b)
        return f"What is {a} - {b}?", Fraction(a - b)
    if kind == 2:
        a, b = rng.randint(3, 25), rng.randint(3, 25)
        return f"What is {a} * {b}?", Fraction(a * b)
    if kind == 3:
        b, q = rng.randint(2, 12), rng.randint(3, 30)
        return f"What is {b * q} / {b}?", Fraction(q)
    if kind == 4:
        return f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have?", Fraction(a + b)
    if kind == 5:
        a, b = max(a, b) + 20, min(a, b)
        return f"{name} has {a} {item} and gives away {b}. How many {item} are left?", Fraction(a - b)
    if kind == 6:
        n, k = rng.randint(3, 12), rng.randint(4, 15)
        text = f"There are {n} boxes with {k} {item} in each box. How many {item} are there in total?"
        return text, Fraction(n * k)
    if kind == 7:
        n, q = rng.randint(2, 9), rng.randint(4, 20)
        text = (f"{name} shares {n * q} {item} equally among {n} friends. "
                f"How many {item} does each friend get?")
        return text, Fraction(q)
    c = rng.randint(5, 40)
    text = (f"{name} has {a} {item}, buys {b} more and then gives {c} to a friend. "
            f"How many {item} does {name} have now?")
    return text, Fraction(a + b - c)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF model directory")
    parser.add_argument("--count", type=int, default=500, help="number of responses")
    parser.add_argument("--batch", type=int, default=25, help="prompts per generate call")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="new tokens per response")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature")
    parser.add_argument("--seed", type=int, default=0, help="problem and sampling seed")
    parser.add_argument("--out", required=True, help="output .jsonl or .jsonl.gz")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ktae.viz.tokens import token_pieces

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    rng = random.Random(args.seed)
    problems = [make_problem(rng) for _ in range(args.count)]
    opener = gzip.open if args.out.endswith(".gz") else open
    stop_ids = {tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    with opener(args.out, "wt", encoding="utf-8") as out:
        for start in range(0, args.count, args.batch):
            chunk = problems[start : start + args.batch]
            prompts = [
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
                )
                for text, _ in chunk
            ]
            enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                gen = model.generate(
                    **enc,
                    do_sample=True,
                    temperature=args.temperature,
                    top_p=1.0,
                    top_k=0,
                    max_new_tokens=args.max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                )
            new_tokens = gen[:, enc["input_ids"].shape[1] :]
            for offset, ((text, answer), row) in enumerate(zip(chunk, new_tokens, strict=True)):
                ids = []
                for token in row.tolist():
                    if token in stop_ids:
                        break
                    ids.append(token)
                record = {
                    "id": start + offset,
                    "problem": text,
                    "answer": str(answer),
                    "response": tokenizer.decode(ids),
                    "response_ids": ids,
                    "response_pieces": [p.text for p in token_pieces(tokenizer, ids)],
                }
                out.write(json.dumps(record) + "\n")
            out.flush()
            print(f"{min(start + args.batch, args.count)}/{args.count}", flush=True)


if __name__ == "__main__":
    main()
