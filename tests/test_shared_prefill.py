"""One prefill per distinct prompt (ktae.train.shared_prefill): the same samples as
``generate``'s own prefill of every row, from the same seed."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from ktae.train.shared_prefill import repeated_rows, shared_prefill


def _llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)).float().eval()


def _prompts(repeat: int = 3):
    """Three left-padded prompts of 7, 5 and 3 tokens, each repeated ``repeat`` times."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [0, 0, 12, 13, 14, 15, 16],
                        [0, 0, 0, 0, 17, 18, 19]])
    mask = (ids != 0).long()
    return ids.repeat_interleave(repeat, 0), mask.repeat_interleave(repeat, 0)


def _config(**more):
    return GenerationConfig(do_sample=True, temperature=0.9, top_k=0, top_p=1.0,
                            max_new_tokens=10, pad_token_id=0, eos_token_id=2, **more)


def test_repeated_rows():
    ids, mask = _prompts(2)
    assert repeated_rows(ids, mask).tolist() == [0, 0, 1, 1, 2, 2]
    mask[1, 0] = 0  # same ids, another mask: another group
    assert repeated_rows(ids, mask).tolist() == [0, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_same_samples_as_generates_own_prefill(seed):
    model = _llama()
    ids, mask = _prompts()
    with torch.no_grad():
        torch.manual_seed(seed)
        plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=_config())
        rows = []
        hook = model.register_forward_pre_hook(
            lambda m, args, kwargs: rows.append(tuple(kwargs["input_ids"].shape)),
            with_kwargs=True)
        torch.manual_seed(seed)
        with shared_prefill(model):
            shared = model.generate(input_ids=ids, attention_mask=mask,
                                    generation_config=_config())
        hook.remove()
    assert torch.equal(shared, plain)
    # the distinct prompts' prefill (all tokens but the last), then every row a token a step
    assert rows[0] == (3, 6) and rows[1] == (9, 1) and all(r == (9, 1) for r in rows[1:])
    assert "generate" not in vars(model)


def test_calls_it_does_not_cover_run_generate_unchanged():
    model = _llama()
    ids, mask = _prompts()
    for config in (_config(num_return_sequences=2), _config(cache_implementation="static")):
        with torch.no_grad():
            torch.manual_seed(0)
            plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            rows = []
            hook = model.register_forward_pre_hook(
                lambda m, args, kwargs, rows=rows: rows.append(kwargs["input_ids"].shape[0]),
                with_kwargs=True)
            torch.manual_seed(0)
            with shared_prefill(model):
                again = model.generate(input_ids=ids, attention_mask=mask,
                                       generation_config=config)
            hook.remove()
        assert torch.equal(again, plain)
        assert rows[0] == plain.shape[0]  # every row prefilled: generate's own path


@pytest.mark.slow
def test_training_samples_the_same_with_one_prefill_per_prompt(tiny_model, tmp_path,
                                                               monkeypatch):
    """Two steps from one seed, the trainer's generation with and without the shared
    prefill: each step's prompts prefilled once, and the same responses, rewards and loss."""
    from contextlib import nullcontext

    from test_train_helpers import Recorder, contains_digit, read_jsonl, tiny_config

    from ktae.train import shared_prefill as module
    from ktae.train import trainer as trainer_module
    from ktae.train.session import train

    prefills = []
    real = module.shared_prefill_generate

    def counted(model, generate, **kwargs):
        prefills.append(kwargs["input_ids"].shape[0])
        return real(model, generate, **kwargs)

    runs = {}
    for shared in (True, False):
        monkeypatch.setattr(module, "shared_prefill_generate", counted)
        if not shared:
            monkeypatch.setattr(trainer_module, "shared_prefill", lambda model: nullcontext())
        prefills.clear()
        Recorder.seen = []
        cfg = tiny_config(tiny_model, tmp_path / str(shared), seed=5)
        train(cfg, trainer_cls=Recorder, reward_funcs=[contains_digit])
        runs[shared] = (read_jsonl(tmp_path / str(shared) / "metrics.jsonl"),
                        [s["ids"] for s in Recorder.seen])
        # every generate call of the run's sampling: 4 prompts x 4 samples, 2 steps
        assert (len(prefills) >= 2 and set(prefills) == {16}) if shared else not prefills
    (metrics, ids), (plain_metrics, plain_ids) = runs[True], runs[False]
    assert len(ids) == len(plain_ids) == 2
    assert all(torch.equal(a, b) for a, b in zip(ids, plain_ids, strict=True))
    for a, b in zip(metrics, plain_metrics, strict=True):
        for key in ("reward", "loss", "grad_norm"):
            assert a[key] == b[key], key
