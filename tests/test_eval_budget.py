"""Every prompt has its own budget of new tokens, whatever else is in its batch."""

from __future__ import annotations

import warnings

import pytest
import torch

from ktae.models import build_char_tokenizer, build_tiny_model
from ktae.models.generate import SamplingConfig, context_length, generate_hf


@pytest.fixture(scope="module")
def short_context():
    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, intermediate_size=32,
                             num_heads=2, max_position_embeddings=40, seed=3)
    return model, tok


SHORT = ["Q:1+2 A:", "Q:3+4 A:", "Q:5+6 A:", "Q:7+1 A:", "Q:2+2 A:", "Q:9+9 A:"]
LONG = "Q:" + "+".join(["1"] * 15) + " A:"  # 35 tokens with BOS: 5 left in a context of 40


def test_prompt_budget_is_what_the_context_leaves():
    from ktae.models.generate import prompt_budget

    assert prompt_budget(10, 8, None) == 8
    assert prompt_budget(10, 8, 40) == 8
    assert prompt_budget(34, 8, 40) == 6
    assert prompt_budget(40, 8, 40) == 0 and prompt_budget(50, 8, 40) == 0


def test_one_long_prompt_does_not_cut_its_batch(short_context):
    model, tok = short_context
    assert context_length(model) == 40
    assert len(tok(LONG)["input_ids"]) == 35  # with the BOS token
    prompts = [*SHORT[:3], LONG, *SHORT[3:]]
    sampling = SamplingConfig(max_new_tokens=12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batched = generate_hf(model, tok, prompts, sampling, batch_size=len(prompts))
        alone = [generate_hf(model, tok, [p], sampling, batch_size=1)[0] for p in prompts]
    assert batched == alone  # greedy: the same samples batched and one by one
    for p, gens in zip(prompts, batched, strict=True):
        budget = 5 if p == LONG else 12
        assert gens[0].num_tokens <= budget
    # the short prompts got their whole budget (the random model never stops early)
    assert [g[0].num_tokens for p, g in zip(prompts, batched, strict=True) if p != LONG] \
        == [12] * len(SHORT)


def test_sampling_keeps_k_samples_per_prompt_in_a_mixed_batch(short_context):
    model, tok = short_context
    prompts = [SHORT[0], LONG, SHORT[1]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = generate_hf(model, tok, prompts,
                          SamplingConfig(k=3, temperature=1.0, max_new_tokens=10),
                          batch_size=3)
    assert [len(g) for g in out] == [3, 3, 3]
    assert all(g.num_tokens <= 5 for g in out[1])
    assert all(g.num_tokens == 10 or not g.truncated for gs in (out[0], out[2]) for g in gs)
