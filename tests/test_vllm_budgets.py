"""Each prompt's budget against a vLLM engine's context, without vLLM: which prompts reach
the engine and with what budget, which get an empty response, and the one warning per call,
the same as the transformers backend's."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from ktae.eval.vllm_engine import generate_within_context, plan_budgets
from ktae.models.generate import SamplingConfig, context_cut_message, generate_hf


def test_plan_splits_the_prompts_by_what_the_context_leaves():
    plan = plan_budgets([10, 64, 59, 70, 52], 12, 64)
    assert plan.budgets == (12, 0, 5, 0, 12)
    assert plan.to_engine == [0, 2, 4] and plan.filled == [1, 3]
    assert plan.cut == [64, 59, 70]
    assert plan.warning() == context_cut_message([64, 59, 70], 12, 64)
    assert "after 3 prompt(s) of up to 70 tokens: generating at most 0 new tokens" \
        in plan.warning()


def test_plan_without_a_cut_has_no_warning():
    assert plan_budgets([10, 52], 12, 64).warning() is None
    unlimited = plan_budgets([10, 5000], 12, None)
    assert unlimited.budgets == (12, 12) and unlimited.filled == [] and unlimited.cut == []


@dataclasses.dataclass
class Params:
    """The part of ``vllm.SamplingParams`` the split reads: ``max_tokens`` and ``clone``."""

    max_tokens: int | None
    n: int = 1

    def clone(self):
        return dataclasses.replace(self)


class Engine:
    """Records what reaches it; answers each request with its prompt and budget."""

    def __init__(self):
        self.calls = []

    def generate(self, requests, params, **kwargs):
        self.calls.append(([r["prompt_token_ids"] for r in requests],
                           [p.max_tokens for p in params], kwargs))
        return [(r["prompt_token_ids"], p.max_tokens) for r, p in zip(requests, params,
                                                                      strict=True)]


def _requests(*lengths):
    return [{"prompt_token_ids": list(range(n))} for n in lengths]


def test_only_the_prompts_that_fit_reach_the_engine_with_their_budget():
    engine, params = Engine(), Params(max_tokens=12)
    requests = _requests(10, 64, 59, 70)
    with pytest.warns(UserWarning) as caught:
        out = generate_within_context(engine.generate, requests, params, context=64,
                                      use_tqdm=False)
    assert [str(w.message) for w in caught] == [context_cut_message([64, 59, 70], 12, 64)]
    assert engine.calls == [([list(range(10)), list(range(59))], [12, 5], {"use_tqdm": False})]
    assert out == [(list(range(10)), 12), None, (list(range(59)), 5), None]
    assert params.max_tokens == 12  # the caller's parameters are not changed


def test_no_engine_call_when_every_prompt_fills_the_context_and_warn_false_is_quiet():
    engine = Engine()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = generate_within_context(engine.generate, _requests(64, 65), Params(12),
                                      context=64, warn=False)
    assert out == [None, None] and engine.calls == []


def test_unset_max_tokens_means_up_to_the_context():
    engine = Engine()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing was asked that the context cut
        out = generate_within_context(engine.generate, _requests(10, 60), Params(None),
                                      context=64)
    assert out == [(list(range(10)), 54), (list(range(60)), 4)]
    with pytest.warns(UserWarning, match="after 1 prompt\\(s\\) of up to 64 tokens"):
        out = generate_within_context(engine.generate, _requests(10, 64), Params(None),
                                      context=64)
    assert out[1] is None


def test_the_transformers_backend_warns_the_same_and_answers_empty():
    """A prompt that fills the context: an empty, truncated response and the message the
    vLLM split gives for the same lengths."""
    from ktae.models import build_char_tokenizer, build_tiny_model

    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, intermediate_size=32,
                             num_heads=2, max_position_embeddings=40, seed=3)
    prompts = ["Q:1+2 A:", "1" * 39, "1" * 35]
    lengths = [len(tok(p)["input_ids"]) for p in prompts]
    assert lengths[1] == 40 and lengths[2] == 36
    with pytest.warns(UserWarning) as caught:
        out = generate_hf(model, tok, prompts, SamplingConfig(max_new_tokens=8), batch_size=3)
    assert [str(w.message) for w in caught] == [plan_budgets(lengths, 8, 40).warning()]
    assert out[1][0].text == "" and out[1][0].num_tokens == 0 and out[1][0].truncated
    assert out[2][0].num_tokens <= 4
