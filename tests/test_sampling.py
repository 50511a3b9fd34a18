"""The sampler of ``ktae.train.sampling``: one categorical draw per row by the inverse of
the cumulative distribution, in two levels; checked against the probabilities themselves
(a chi-square test at a fixed seed), zero-probability entries, and PyTorch's own
``torch.multinomial`` for every call it does not take."""

from __future__ import annotations

import contextlib

import pytest
import torch

from ktae.train.sampling import BLOCK, categorical, fast_multinomial

CHUNKS = 8


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs / probs.sum() * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


@pytest.mark.parametrize("n", [5, BLOCK, 3 * BLOCK + 17])
def test_draws_follow_the_probabilities(n):
    """200,000 draws from one row (repeated) of ``n`` unnormalised weights, some zero:
    no zero-weight entry drawn, and the counts within the chi-square test's 0.999 bound."""
    g = torch.Generator().manual_seed(n)
    weights = torch.rand(n, generator=g) ** 4 * 3
    weights[::3] = 0.0
    torch.manual_seed(0)
    counts = torch.zeros(n, dtype=torch.float64)
    for _ in range(CHUNKS):  # in parts: the rows' cumulative sums of 200,000 rows at once
        draws = categorical(weights.repeat(200_000 // CHUNKS, 1))  # would hold gigabytes
        assert draws.shape == (200_000 // CHUNKS, 1) and draws.dtype == torch.int64
        counts += torch.bincount(draws.flatten(), minlength=n).double()
    assert counts[weights == 0].sum() == 0
    # the chi-square distribution's 0.999 quantile with k - 1 degrees of freedom, from
    # its Wilson-Hilferty approximation (within 1% at these sizes)
    k = int((weights > 0).sum()) - 1
    bound = k * (1 - 2 / (9 * k) + 3.09 * (2 / (9 * k)) ** 0.5) ** 3
    assert _chi_square(counts, weights.double()) < bound


def test_small_probabilities_after_large_ones_keep_their_mass():
    """An entry of 1e-4 in the second block, after 0.9999 of the mass in the first, is
    drawn at its rate over 2,000,000 draws (200 expected), in parts of 100,000 rows."""
    probs = torch.zeros(2_000_000 // 20, 2 * BLOCK)
    probs[:, 0] = 1.0 - 1e-4
    probs[:, BLOCK + 5] = 1e-4
    torch.manual_seed(1)
    hits = sum(int((categorical(probs) == BLOCK + 5).sum()) for _ in range(20))
    assert abs(hits - 200) < 4 * 200 ** 0.5


def test_one_hot_rows_and_the_same_draws_from_the_same_seed():
    probs = torch.zeros(6, 40)
    probs[torch.arange(6), torch.tensor([0, 39, 7, 7, 20, 1])] = 0.3
    assert categorical(probs).flatten().tolist() == [0, 39, 7, 7, 20, 1]
    p = torch.softmax(torch.randn(8, 1000), -1)
    torch.manual_seed(3)
    a = categorical(p)
    torch.manual_seed(3)
    assert torch.equal(a, categorical(p))


def test_fast_multinomial_takes_single_draws_only_and_restores_torch():
    own = torch.multinomial
    p = torch.softmax(torch.randn(4, 300), -1)
    with fast_multinomial():
        assert torch.multinomial is not own
        torch.manual_seed(2)
        fast = torch.multinomial(p, num_samples=1)
        torch.manual_seed(2)
        assert torch.equal(fast, categorical(p))
        g = torch.Generator().manual_seed(5)
        # a generator, several samples or a 1-D input: PyTorch's own sampler
        assert torch.equal(torch.multinomial(p, 1, generator=g),
                           own(p, 1, generator=torch.Generator().manual_seed(5)))
        torch.manual_seed(4)
        many = torch.multinomial(p, 3)
        torch.manual_seed(4)
        assert torch.equal(many, own(p, 3))
        torch.manual_seed(4)
        one_d = torch.multinomial(p[0], 1)
        torch.manual_seed(4)
        assert torch.equal(one_d, own(p[0], 1))
    assert torch.multinomial is own


def test_the_trainers_sampling_draws_with_it_and_merges_lora(tiny_model, tmp_path,
                                                            monkeypatch):
    """A LoRA run's sampling: every generate call of both steps draws through
    :func:`categorical` and runs the merged float32 adapters; so does its greedy
    held-out evaluation."""
    from test_train_helpers import tiny_config

    from ktae.train import callbacks, sampling
    from ktae.train import trainer as trainer_module
    from ktae.train.session import train

    draws, ways = [], []
    real_draw, real_lora = sampling.categorical, trainer_module.lora_for_sampling

    def counted_draw(probs):
        draws.append(probs.shape[0])
        return real_draw(probs)

    from contextlib import contextmanager

    def recorder(into: list):
        @contextmanager
        def recorded(model):
            with real_lora(model) as how:
                into.append(how)
                yield how
        return recorded

    evals: list = []
    monkeypatch.setattr(sampling, "categorical", counted_draw)
    monkeypatch.setattr(trainer_module, "lora_for_sampling", recorder(ways))
    monkeypatch.setattr(callbacks, "lora_for_sampling", recorder(evals))
    train(tiny_config(tiny_model, tmp_path / "run", lora_r=4, seed=3))
    assert len(ways) >= 2 and set(ways) == {"merged"}
    assert evals == ["merged", "merged"]  # the held-out evaluation before and after
    assert len(draws) >= 2 * 8 and set(draws) == {16}  # 4 prompts x 4, 8 new tokens


def test_contiguous_head_gives_one_rows_last_position_standard_strides():
    """One row's last position, ``[1, 1, hidden]`` sliced from ``[1, T, hidden]``, counts
    as contiguous with its parent's strides, and PyTorch's product with a frozen weight (a
    LoRA model's head) then takes the batched path, copying the weight out; within
    ``contiguous_head`` the input gets standard strides and the head runs one matrix
    product, with the same logits."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import LlamaConfig, LlamaForCausalLM

    from ktae.models.generate import contiguous_head, standard_strides

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    model.requires_grad_(False)
    ids = torch.randint(3, 61, (1, 9))
    strides = []
    model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: strides.append(args[0].stride()))

    def head_products(block):
        with profile(activities=[ProfilerActivity.CPU]) as prof, block:
            logits = model(input_ids=ids, logits_to_keep=1).logits
        return logits, {e.name for e in prof.events()} & {"aten::bmm", "aten::mm"}

    plain, ops = head_products(contextlib.nullcontext())
    assert strides[-1] == (9 * 32, 32, 1) and "aten::bmm" in ops  # the case arises
    fixed, ops = head_products(contiguous_head(model))
    assert strides[-1] == standard_strides((1, 1, 32)) == (32, 32, 1)
    assert "aten::bmm" not in ops and "aten::mm" in ops
    torch.testing.assert_close(fixed, plain)
    assert standard_strides((2, 0, 3)) == (3, 3, 1)


def test_contiguous_head_gives_the_lm_head_contiguous_input():
    """``generate``'s prefill hands the LM head a strided slice of the hidden states (the
    last position of each row); within ``contiguous_head`` it gets it contiguous, and the
    sampled tokens are the same."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from ktae.models.generate import contiguous_head

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)).eval()
    seen = []
    model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: seen.append(args[0].is_contiguous()))
    ids = torch.randint(3, 61, (4, 7))
    kwargs = dict(do_sample=True, max_new_tokens=5, min_new_tokens=5, pad_token_id=0)
    torch.manual_seed(1)
    plain = model.generate(input_ids=ids, **kwargs)
    assert False in seen  # the case arises
    seen.clear()
    with contiguous_head(model):
        torch.manual_seed(1)
        contiguous = model.generate(input_ids=ids, **kwargs)
    assert seen and all(seen)
    assert torch.equal(plain, contiguous)
    seen.clear()
    model.generate(input_ids=ids, **kwargs)
    assert False in seen  # the hook is gone after the block
