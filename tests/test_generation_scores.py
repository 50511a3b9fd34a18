"""Log-probs and entropies read from the sampling steps (``generate_hf(scores=T)``) equal
those of a forward pass over prompt and response, row by row, for prompts of different
lengths in one batch (left padding) and responses that stop early or run to the budget."""

import pytest
import torch

from ktae.core.entropy import categorical_entropy
from ktae.models.generate import SamplingConfig, generate_hf, raw_logits_seen
from ktae.models.input_grad_importance import response_logits

TOL = {"rtol": 1e-4, "atol": 1e-5}
"""float32: the incremental decoding orders a few sums differently from one forward pass."""


@pytest.fixture(scope="module")
def tiny():
    from ktae.groups.sampling import load_model

    model, tok, _ = load_model("default")
    return model, tok


def _prompts(n):
    from ktae.tasks import format_prompt, generate

    return [format_prompt(p, "compact") for p in generate(n, split="test", seed=3)]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampling_scores_equal_a_forward_pass(tiny, temperature):
    model, tok = tiny
    prompts = _prompts(5)
    assert len({len(tok(p)["input_ids"]) for p in prompts}) > 1  # padding exercised
    sampling = SamplingConfig(k=3, temperature=0.9, max_new_tokens=24, seed=5)
    out = generate_hf(model, tok, prompts, sampling, batch_size=4, scores=temperature)
    stopped = budget = 0
    for prompt, gens in zip(prompts, out, strict=True):
        logits = response_logits(model, tok(prompt)["input_ids"],
                                 [list(g.token_ids) for g in gens], tok.pad_token_id or 0)
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        entropy = categorical_entropy(logp)
        for i, g in enumerate(gens):
            n = len(g.token_ids)
            stopped += not g.truncated
            budget += g.truncated
            assert len(g.logprobs) == len(g.entropies) == n
            want = logp[i, torch.arange(n), torch.tensor(g.token_ids)]
            torch.testing.assert_close(torch.tensor(g.logprobs), want, **TOL)
            torch.testing.assert_close(torch.tensor(g.entropies), entropy[i, :n], **TOL)
    assert stopped and budget  # both kinds of ending were compared


def test_sampling_is_unchanged_by_the_scores(tiny):
    model, tok = tiny
    sampling = SamplingConfig(k=2, temperature=0.9, max_new_tokens=16, seed=1)
    plain = generate_hf(model, tok, _prompts(3), sampling)
    scored = generate_hf(model, tok, _prompts(3), sampling, scores=1.0)
    assert [[g.token_ids for g in gs] for gs in plain] == \
        [[g.token_ids for g in gs] for gs in scored]
    assert all(g.logprobs is None for gs in plain for g in gs)


def test_no_scores_when_the_generation_config_changes_the_logits_first(tiny):
    model, tok = tiny
    old = model.generation_config.repetition_penalty
    model.generation_config.repetition_penalty = 1.3
    try:
        assert not raw_logits_seen(model)
        out = generate_hf(model, tok, _prompts(1),
                          SamplingConfig(k=2, temperature=0.9, max_new_tokens=8, seed=1),
                          scores=1.0)
    finally:
        model.generation_config.repetition_penalty = old
    assert raw_logits_seen(model)
    assert all(g.logprobs is None and g.entropies is None for g in out[0])


@pytest.mark.parametrize("bad", [0, -1.0, True, "1"])
def test_scores_must_be_a_positive_temperature(tiny, bad):
    model, tok = tiny
    with pytest.raises(ValueError, match="^scores: expected a positive temperature"):
        generate_hf(model, tok, _prompts(1), SamplingConfig(k=1, max_new_tokens=4),
                    scores=bad)


def test_tails_continue_the_sampling_cache_as_a_forward_pass_would(tiny):
    """Each generation continued by its prompt's tail from the sampling's cache: the tail's
    logits equal a plain forward pass over prompt + response + tail, for prompts of
    different lengths (left padding), responses that stop early (masked columns after their
    end) or run to the budget, and tails of different lengths."""
    model, tok = tiny
    prompts = _prompts(5)
    tails = [tok(t, add_special_tokens=False)["input_ids"] for t in
             ("=12", "=7", "=1000", "=3", "=45")]
    seen = {}
    out = generate_hf(model, tok, prompts, SamplingConfig(k=3, temperature=0.9,
                                                          max_new_tokens=20, seed=2),
                      batch_size=3, tails=tails,
                      on_tail=lambda i, gens, logits: seen.setdefault(i, (gens, logits)))
    assert sorted(seen) == list(range(5))
    kinds = set()
    for i, (prompt, gens) in enumerate(zip(prompts, out, strict=True)):
        assert seen[i][0] == gens
        logits = seen[i][1]
        assert logits.shape[:2] == (3, len(tails[i]))
        for j, g in enumerate(gens):
            kinds.add(g.truncated)
            ids = tok(prompt)["input_ids"] + list(g.token_ids) + tails[i]
            with torch.no_grad():
                want = model(input_ids=torch.tensor([ids])).logits[0, -len(tails[i]):]
            torch.testing.assert_close(logits[j, :len(tails[i])], want, **TOL)
    assert kinds == {True, False}


def test_no_tail_call_without_a_cache(tiny):
    model, tok = tiny
    calls = []
    old = model.generation_config.use_cache
    model.generation_config.use_cache = False
    try:
        out = generate_hf(model, tok, _prompts(2), SamplingConfig(k=2, temperature=0.9,
                                                                  max_new_tokens=6, seed=1),
                          tails=[[5], [6]], on_tail=lambda *a: calls.append(a))
    finally:
        model.generation_config.use_cache = old
    assert len(out) == 2 and calls == []
