"""DAPO dynamic sampling: group filtering helpers and the refill rounds in a real run."""

from __future__ import annotations

import pytest
import torch
from test_train_helpers import read_jsonl, save_tiny_model, tiny_config

from ktae.train.dynamic_sampling import informative_groups, merge_rows, select_groups
from ktae.train.session import train
from ktae.train.trainer import KTAEGRPOTrainer


def test_informative_groups():
    correct = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool)
    assert informative_groups(correct, 2).tolist() == [True, False, False, False]
    assert informative_groups(correct, 4).tolist() == [True, True]
    with pytest.raises(ValueError, match="num_generations"):
        informative_groups(correct, 3)


def test_select_groups_prefers_informative_then_fills_in_order():
    info = [torch.tensor([False, True, False]), torch.tensor([True, False])]
    assert select_groups(info, 2) == [(0, 1), (1, 0)]
    assert select_groups(info, 4) == [(0, 1), (1, 0), (0, 0), (0, 2)]
    with pytest.raises(ValueError, match="need"):
        select_groups(info, 6)


def test_merge_rows_pads_prompts_left_and_completions_right():
    a = {"prompt_ids": torch.tensor([[5, 6], [7, 8]]), "prompt_mask": torch.ones(2, 2),
         "completion_ids": torch.tensor([[1, 2, 3], [4, 0, 0]]),
         "completion_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]), "advantages": torch.zeros(2)}
    b = {"prompt_ids": torch.tensor([[9, 9, 9]]), "prompt_mask": torch.ones(1, 3),
         "completion_ids": torch.tensor([[7]]), "completion_mask": torch.tensor([[1]]),
         "advantages": torch.zeros(1)}
    out = merge_rows([a, b], [torch.tensor([1]), torch.tensor([0])],
                     {"prompt_ids": -1, "completion_ids": -2})
    assert set(out) == {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask"}
    assert out["prompt_ids"].tolist() == [[-1, 7, 8], [9, 9, 9]]
    assert out["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert out["completion_ids"].tolist() == [[4, 0, 0], [7, -2, -2]]
    assert out["completion_mask"].tolist() == [[1, 0, 0], [1, 0, 0]]


class BatchRecorder(KTAEGRPOTrainer):
    batches: list

    def _finish_batch(self, batch, rewards, correct, mode, **kwargs):
        self.batches.append(correct.clone())
        self.rewards.append(rewards.clone())
        return super()._finish_batch(batch, rewards, correct, mode, **kwargs)


def first_char_is_digit(completions, **_):
    """Rare success (~10% of responses), so many groups are all-wrong and need refills."""
    return [1.0 if c[:1].isdigit() else 0.0 for c in completions]


@pytest.mark.slow
def test_refill_rounds_remove_zero_variance_groups(tmp_path):
    torch.set_num_threads(1)
    model = save_tiny_model(tmp_path / "model")
    batches: list = []
    rewards: list = []
    cls = type("R", (BatchRecorder,), {"batches": batches, "rewards": rewards})
    cfg = tiny_config(model, tmp_path / "run", algo="dapo", credit="ktae", max_steps=3,
                      max_generation_rounds=6)
    train(cfg, trainer_cls=cls, reward_funcs=[first_char_is_digit])
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert all(m["zero_variance_group_fraction"] > 0 for m in metrics)
    assert max(m["generation_rounds"] for m in metrics) > 1
    for m, correct in zip(metrics, batches, strict=True):
        assert correct.numel() == cfg.num_prompts * cfg.num_generations  # batch size kept
        info = informative_groups(correct, cfg.num_generations).float().mean().item()
        assert info == pytest.approx(m["informative_group_fraction"])
        if m["generation_rounds"] < cfg.max_generation_rounds:
            # stopped early: enough informative groups, so none without signal remain
            assert info == 1.0
    # every unprefixed metric describes the batch trained on; round 1 and the pooled
    # generation rounds have their own keys
    for m, correct, r in zip(metrics, batches, rewards, strict=True):
        assert m["accuracy"] == pytest.approx(correct.float().mean().item())
        assert m["reward"] == pytest.approx(r.mean().item())
        groups = r.view(-1, cfg.num_generations)
        zero_std = (groups.max(dim=1).values == groups.min(dim=1).values).float().mean()
        assert m["frac_reward_zero_std"] == pytest.approx(zero_std.item())
        assert m["frac_reward_zero_std"] == pytest.approx(1 - m["informative_group_fraction"])
        assert 0 <= m["round1_accuracy"] <= 1 and "generation_reward" in m
        if m["generation_rounds"] > 1:  # selection keeps the informative groups
            assert m["accuracy"] >= m["round1_accuracy"] - 1e-9
    # without dynamic sampling there is one round and the zero-variance groups stay
    batches.clear()
    rewards.clear()
    cfg = tiny_config(model, tmp_path / "run2", algo="dapo", credit="ktae", max_steps=2,
                      dynamic_sampling=False)
    train(cfg, trainer_cls=cls, reward_funcs=[first_char_is_digit])
    metrics = read_jsonl(tmp_path / "run2" / "metrics.jsonl")
    assert all(m["generation_rounds"] == 1 and "informative_group_fraction" not in m
               for m in metrics)
