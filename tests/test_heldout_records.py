"""The held-out evaluation of ``ktae train`` keeps one record per problem."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ktae.train.evaluation import greedy_accuracy


def test_per_problem_records_add_up_to_the_summary(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    rows = [{"prompt": f"Q:{a}+{b} A:", "answer": str(a + b)} for a, b in
            [(1, 2), (3, 4), (10, 5), (7, 7), (2, 9), (6, 1)]]
    report = greedy_accuracy(model, tok, rows, max_new_tokens=6, batch_size=4,
                             reward="boxed")
    problems = report["problems"]
    assert len(problems) == report["n"] == len(rows)
    assert report["accuracy"] == sum(p["correct"] for p in problems) / len(rows)
    assert report["truncated"] == sum(p["truncated"] for p in problems) / len(rows)
    assert report["response_length"] == sum(p["tokens"] for p in problems) / len(rows)
    for p in problems:
        assert 0 <= p["tokens"] <= 6 and isinstance(p["response"], str)
        assert not p["truncated"] or p["tokens"] == 6  # out of budget: every token used
    # a random tiny model rarely stops within 6 tokens: truncation is seen and counted
    assert report["truncated"] > 0
