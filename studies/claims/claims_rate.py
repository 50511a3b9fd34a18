"""How often a right final answer comes with a false claim ("right answer, wrong tokens").

Reads a JSONL (optionally gzipped) of ``{"response": ..., "answer": ...}`` records, such as
``tests/data/smollm2_arithmetic_samples.jsonl.gz``, labels each response's claims
(``docs/claims.md``) and prints, for two readings of "the final answer is right":

* ``explicit``: the response's last answer claim (``answer is N``, ``Answer: N``,
  ``\\boxed{N}``) is true;
* ``number reward``: the project's ``number`` reward (the last number of the response
  equals the answer, :func:`ktae.rewards.answer_line.number_check`), the reward of the
  ``arith`` task,

how many right-answer responses make at least one false claim, with a 95% Wilson interval.

    python studies/claims/claims_rate.py tests/data/smollm2_arithmetic_samples.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import math

from ktae.rewards.answer_line import number_check
from ktae.tasks.claims import final_answer, find_claims


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a proportion ``k / n``."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="JSONL or JSONL.gz of {response, answer} records")
    args = parser.parse_args()
    opener = gzip.open if args.path.endswith(".gz") else open
    with opener(args.path, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    n_claims = n_false = with_claim = 0
    readings = {"explicit": [0, 0], "number reward": [0, 0]}  # [right, right with a false claim]
    for rec in records:
        text, answer = rec["response"], rec["answer"]
        claims = find_claims(text, answer)
        false = any(not c.correct for c in claims)
        n_claims += len(claims)
        n_false += sum(not c.correct for c in claims)
        with_claim += bool(claims)
        final = final_answer(text, answer)
        for name, right in (("explicit", final is not None and final.correct),
                            ("number reward", number_check(text, str(answer))[0])):
            readings[name][0] += right
            readings[name][1] += right and false
    print(f"{len(records)} responses, {with_claim} with a claim; {n_claims} claims, "
          f"{n_false} false ({n_false / max(n_claims, 1):.1%})")
    for name, (right, wrong_tokens) in readings.items():
        lo, hi = wilson(wrong_tokens, right)
        print(f"{name}: {right} right answers, {wrong_tokens} of them with a false claim "
              f"({wrong_tokens / max(right, 1):.1%}, 95% Wilson interval {lo:.1%} to {hi:.1%})")


if __name__ == "__main__":
    main()
