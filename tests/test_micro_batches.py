"""The update's micro-batches hold whole prompt groups where the gradient allows
(``ktae.train.micro_batches``): when that applies, that TRL's random stream is kept, and
that a step's weights are those of TRL's shuffled split within float rounding."""

from __future__ import annotations

import pytest
import torch

from ktae.train.micro_batches import (
    KEEPS_GRADIENT,
    keeps_gradient,
    micro_batches_by_prompt,
    prompt_ordered,
)

trl = pytest.importorskip("trl")

PLAIN = dict(one_step=True, calibration=None, top_entropy_quantile=1.0, entropy_bonus=False,
             aux_loss=False)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_losses_summed_over_micro_batches_keep_the_gradient(loss_type):
    assert loss_type in KEEPS_GRADIENT
    assert keeps_gradient(loss_type, **PLAIN)


@pytest.mark.parametrize("change", [
    dict(loss_type="bnpo"),  # each micro-batch divides by its own token count
    dict(one_step=False),  # several optimizer steps per batch: the split picks their rows
    dict(calibration="taco"),
    dict(top_entropy_quantile=0.8),
    dict(entropy_bonus=True),
    dict(aux_loss=True),
])
def test_anything_read_per_micro_batch_keeps_trls_shuffle(change):
    settings = {**PLAIN, "loss_type": "dapo", **change}
    assert not keeps_gradient(settings.pop("loss_type"), **settings)


def test_prompt_order_draws_what_trls_shuffle_draws():
    from trl.trainer.utils import shuffle_sequence_dict

    batch = {"ids": torch.arange(12).view(6, 2), "text": list("abcdef"), "n": torch.tensor(6),
             "none": None}
    torch.manual_seed(5)
    shuffled = shuffle_sequence_dict(batch)
    after_trl = torch.rand(3)
    torch.manual_seed(5)
    kept = prompt_ordered(batch)
    assert torch.equal(torch.rand(3), after_trl)
    assert kept is batch and kept["text"] == list("abcdef")
    assert not torch.equal(shuffled["ids"], batch["ids"])  # seed 5 moves rows


def test_the_shuffle_is_replaced_in_the_block_only():
    from trl.trainer import grpo_trainer

    trls = grpo_trainer.shuffle_sequence_dict
    with micro_batches_by_prompt() as on:
        assert on and grpo_trainer.shuffle_sequence_dict is prompt_ordered
    assert grpo_trainer.shuffle_sequence_dict is trls
    with micro_batches_by_prompt(False) as on:
        assert not on and grpo_trainer.shuffle_sequence_dict is trls
    with pytest.raises(RuntimeError), micro_batches_by_prompt():
        raise RuntimeError
    assert grpo_trainer.shuffle_sequence_dict is trls


def _micro_batches(tiny_model, out, monkeypatch, **overrides):
    """Train one step (2 prompts x 4 responses, 2 micro-batches unless ``trl`` says
    otherwise); the prompt rows of each micro-batch the loss saw, the weights after the
    step and the step's metrics."""
    from test_train_helpers import contains_digit, read_jsonl, tiny_config
    from transformers import AutoModelForCausalLM

    from ktae.train import trainer as trainer_module
    from ktae.train.session import train

    seen = []
    compute_loss = trainer_module.KTAEGRPOTrainer._compute_loss

    def recorded(self, model, inputs):
        seen.append(inputs["prompt_ids"].clone())
        return compute_loss(self, model, inputs)

    monkeypatch.setattr(trainer_module.KTAEGRPOTrainer, "_compute_loss", recorded)
    trl_settings = overrides.pop("trl", {"gradient_accumulation_steps": 2})
    cfg = tiny_config(tiny_model, out, max_steps=1, num_prompts=2, seed=4, save_every=1,
                      trl=trl_settings, **overrides)
    train(cfg, reward_funcs=[contains_digit])
    weights = AutoModelForCausalLM.from_pretrained(out / "checkpoint-1").state_dict()
    return seen, weights, read_jsonl(out / "metrics.jsonl")[-1]


def _assert_same_step(tiny_model, metrics, weights, other_metrics, other_weights) -> None:
    """The same samples; loss, gradient norm and every weight's move equal within float
    rounding (the sums' order differs: about 1e-6 apart)."""
    from transformers import AutoModelForCausalLM

    assert metrics["reward"] == other_metrics["reward"]  # the same samples
    for key in ("loss", "grad_norm"):
        assert metrics[key] == pytest.approx(other_metrics[key], rel=1e-5), key
    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    assert set(weights) == set(other_weights)
    for name, w in other_weights.items():  # each weight's move, to two float32 ulps at 1.0
        torch.testing.assert_close(weights[name] - before[name], w - before[name], rtol=1e-3,
                                   atol=2.5e-7, msg=name)
    assert max((w - before[name]).abs().max() for name, w in weights.items()) > 1e-5


def _one_prompt_each(seen) -> list[bool]:
    return [bool((rows == rows[:1]).all()) for rows in seen]


@pytest.mark.slow
def test_a_step_in_prompt_order_equals_trls_shuffled_step(tiny_model, tmp_path, monkeypatch):
    """``dapo``: each micro-batch holds one prompt's 4 responses, and the step's loss,
    gradient norm and every weight's move are those of TRL's shuffled split (forced here)
    to float rounding; ``bnpo`` keeps the shuffle, which with this seed mixes the prompts."""
    from ktae.train import trainer as trainer_module

    seen, grouped, grouped_metrics = _micro_batches(tiny_model, tmp_path / "grouped",
                                                    monkeypatch, loss_type="dapo")
    assert len(seen) == 2 and all(_one_prompt_each(seen))
    assert not torch.equal(seen[0][0], seen[1][0])  # two prompts
    with monkeypatch.context() as m:
        m.setattr(trainer_module, "keeps_gradient", lambda *a, **k: False)
        seen, shuffled, shuffled_metrics = _micro_batches(tiny_model, tmp_path / "shuffled",
                                                          monkeypatch, loss_type="dapo")
    assert not all(_one_prompt_each(seen))
    _assert_same_step(tiny_model, grouped_metrics, grouped, shuffled_metrics, shuffled)
    seen, _, _ = _micro_batches(tiny_model, tmp_path / "bnpo", monkeypatch, loss_type="bnpo")
    assert not all(_one_prompt_each(seen))


@pytest.mark.slow
def test_the_micro_batch_size_leaves_the_step_unchanged(tiny_model, tmp_path, monkeypatch):
    """``grpo`` (the recipe's loss): the update in one micro-batch of both prompts'
    responses is the update in two of one prompt each, to float rounding, from the same
    samples: the recipe's micro-batch size is a matter of memory and speed alone."""
    seen, split, split_metrics = _micro_batches(tiny_model, tmp_path / "two", monkeypatch,
                                                loss_type="grpo")
    assert len(seen) == 2 and all(_one_prompt_each(seen))
    seen, whole, whole_metrics = _micro_batches(tiny_model, tmp_path / "one", monkeypatch,
                                                loss_type="grpo",
                                                trl={"gradient_accumulation_steps": 1})
    assert len(seen) == 1 and seen[0].size(0) == 8 and not _one_prompt_each(seen)[0]
    _assert_same_step(tiny_model, split_metrics, split, whole_metrics, whole)
