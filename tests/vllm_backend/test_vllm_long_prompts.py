"""A prompt that fills a real vLLM engine's context (64 tokens, the shipped tiny model):
vLLM itself refuses it, failing every request of the call; ``generate_vllm`` and the
colocated training engine give it an empty, truncated response without sending it, give
the prompts that fit their own budget, and warn once per call, as the transformers
backend does."""

from __future__ import annotations

import gc
import types
import warnings

import pytest
import torch

from ktae.eval.vllm_engine import generate_vllm
from ktae.models.generate import Generation, SamplingConfig, context_cut_message

pytestmark = pytest.mark.slow

CONTEXT = 64


@pytest.fixture(scope="module")
def engine(default_model):
    """The tiny model in an engine of ``CONTEXT`` tokens (as ``load_vllm`` starts one, with
    a shorter context)."""
    from vllm import LLM

    from ktae.eval.vllm_engine import is_cpu_build, prepare_environment, vllm_distribution

    prepare_environment()
    llm = LLM(model=default_model, dtype="float32", seed=0, max_model_len=CONTEXT,
              enforce_eager=is_cpu_build(vllm_distribution()[0]), use_tqdm_on_load=False)
    yield llm
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def tokenizer(default_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model)


SHORT = ["Q:12+7 A:", "Q:30-4 A:"]


def _prompts(tokenizer):
    """A prompt of exactly CONTEXT tokens (BOS included) and one leaving 5."""
    full, near = "1" * (CONTEXT - 1), "2" * (CONTEXT - 6)
    lengths = [len(tokenizer(p)["input_ids"]) for p in (full, near)]
    assert lengths == [CONTEXT, CONTEXT - 5], lengths
    return full, near


def test_vllm_refuses_a_prompt_as_long_as_its_context(engine, tokenizer):
    """What the split avoids: one such prompt fails the whole call."""
    from vllm import SamplingParams

    full, _ = _prompts(tokenizer)
    requests = [{"prompt_token_ids": tokenizer(p)["input_ids"]} for p in (SHORT[0], full)]
    with pytest.raises(Exception, match="maximum model length of 64"):  # VLLMValidationError
        engine.generate(requests, SamplingParams(max_tokens=1), use_tqdm=False)


def test_generate_vllm_answers_a_full_prompt_empty_and_the_rest_as_alone(engine, tokenizer):
    full, near = _prompts(tokenizer)
    sampling = SamplingConfig(max_new_tokens=12)
    with pytest.warns(UserWarning) as caught:
        out = generate_vllm(engine, tokenizer, [SHORT[0], full, near, SHORT[1]], sampling)
    assert [str(w.message) for w in caught if "context" in str(w.message)] == \
        [context_cut_message([CONTEXT, CONTEXT - 5], 12, CONTEXT)]
    assert out[1] == [Generation("", 0, (), truncated=True)]
    assert 1 <= out[2][0].num_tokens <= 5
    assert out[2][0].truncated or out[2][0].token_ids[-1] == tokenizer.eos_token_id
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # nothing cut: no warning
        alone = generate_vllm(engine, tokenizer, SHORT, sampling)
    assert [out[0], out[3]] == alone  # greedy: the same as without the long prompts
    assert all(g[0].num_tokens > 0 for g in alone)

    sampled = generate_vllm(engine, tokenizer, [full, SHORT[0]],
                            SamplingConfig(k=3, temperature=1.0, max_new_tokens=12), warn=False)
    assert sampled[0] == [Generation("", 0, (), truncated=True)] * 3
    assert len(sampled[1]) == 3 and all(g.num_tokens > 0 for g in sampled[1])


def test_colocated_engine_answers_trl_with_an_empty_completion(engine, tokenizer):
    """TRL 1.16's colocated call (one ``SamplingParams`` with ``logprobs=0`` for prompts
    given as token ids) through the engine ``attach`` sets up; TRL's ``extract_logprobs``
    reads the result."""
    from trl.generation.vllm_generation import extract_logprobs
    from vllm import SamplingParams

    from ktae.train.vllm_colocate import colocated_engine_options

    full, near = _prompts(tokenizer)
    ids = [tokenizer(p)["input_ids"] for p in (SHORT[0], full, near)]
    requests = [{"prompt_token_ids": i} for i in ids]
    params = SamplingParams(n=1, temperature=0.0, max_tokens=12, logprobs=0)
    alone = engine.generate(requests[:1], params, use_tqdm=False)

    generation = types.SimpleNamespace(llm=engine, sync_weights=None)
    with colocated_engine_options({"use_vllm": True, "vllm_mode": "colocate"},
                                  torch.float32) as attach:
        attach(types.SimpleNamespace(vllm_generation=generation))
    try:
        assert "generate" in vars(engine)  # attach replaced the engine's generate
        with pytest.warns(UserWarning, match="generating at most 0 new tokens"):
            outs = engine.generate(requests, sampling_params=params, use_tqdm=False)
    finally:
        del engine.generate  # the class's own again, for the other tests
    assert [list(o.prompt_token_ids) for o in outs] == ids
    empty = outs[1].outputs[0]
    assert list(empty.token_ids) == [] and empty.text == "" and empty.finish_reason == "length"
    assert list(outs[0].outputs[0].token_ids) == list(alone[0].outputs[0].token_ids)
    assert 1 <= len(outs[2].outputs[0].token_ids) <= 5
    logprobs, _ = extract_logprobs(outs)
    assert logprobs[1] == []
    assert [len(x) for x in logprobs] == [len(o.outputs[0].token_ids) for o in outs]
