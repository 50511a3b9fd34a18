"""Step time by part: the clock (fake time), the records it feeds, a real training run."""

from __future__ import annotations

import json

import pytest
import torch
from test_train_helpers import contains_digit, read_jsonl, tiny_config

from ktae.train.batch_metrics import mixed_group_fraction
from ktae.train.step_timing import (
    PART_KEYS,
    PARTS,
    StepClock,
    describe_step,
    mean_step_seconds,
)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


def test_nested_parts_count_each_second_once_in_the_innermost_part():
    t = FakeClock()
    clock = StepClock(t)
    with clock.part("update"):  # before any step: not counted
        t.tick(5)
    clock.start_step()
    t.tick(0.5)  # unmeasured: other
    with clock.part("update"):
        t.tick(1)
        with clock.part("generation"):
            t.tick(4)
            with clock.part("scoring"):
                t.tick(2)
            t.tick(1)
        with clock.part("logprobs"):
            t.tick(3)
        with clock.part("advantages"):
            t.tick(0.25)
        t.tick(2)
    clock.begin("update")  # the optimizer step, opened and closed by callbacks
    t.tick(0.75)
    clock.end("update")
    t.tick(0.5)
    out = clock.finish_step()
    assert out == {"generation": 5, "scoring": 2, "logprobs": 3, "advantages": 0.25,
                   "update": 3.75, "other": 1.0, "step": 15.0}
    assert sum(out[p] for p in (*PARTS, "other")) == out["step"]
    assert clock.finish_step() is None  # no step in progress
    clock.start_step()  # a new step starts from zero
    t.tick(1)
    assert clock.finish_step() == {**dict.fromkeys(PARTS, 0.0), "other": 1.0, "step": 1.0}


def test_clock_refuses_unknown_and_crossed_parts():
    clock = StepClock(FakeClock())
    with pytest.raises(ValueError, match="part: expected one of"):
        clock.begin("sampling")
    clock.begin("update")
    clock.begin("generation")
    with pytest.raises(RuntimeError, match="'update' is not the innermost"):
        clock.end("update")


def test_mean_and_description_of_records():
    records = [{"step": 1, "step_time": 10.0, "generation_seconds": 6.0, "update_seconds": 3.0,
                "other_seconds": 1.0},
               {"step": 2, "step_time": 20.0, "generation_seconds": 12.0,
                "update_seconds": 7.0, "other_seconds": 1.0},
               {"step": 3}]
    assert mean_step_seconds(records) == {"step": 15.0, "generation": 9.0, "update": 5.0,
                                          "other": 1.0}
    assert mean_step_seconds([{"step": 1}]) is None
    assert describe_step(records[0]) == "10.0s = gen 6.0 + upd 3.0 + other 1.0"
    assert describe_step({"step": 3}) is None


def test_mixed_group_fraction_matches_a_loop():
    g = torch.Generator().manual_seed(0)
    for G in (2, 3, 8):
        correct = torch.rand(12 * G, generator=g) < 0.3
        correct[:G] = True  # an all-right group
        correct[G:2 * G] = False  # an all-wrong group
        groups = [correct[i:i + G].tolist() for i in range(0, len(correct), G)]
        expected = sum(any(x) and not all(x) for x in groups) / len(groups)
        assert mixed_group_fraction(correct, G) == pytest.approx(expected)


@pytest.mark.slow
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_training_logs_each_part_and_they_sum_to_the_step(tiny_model, tmp_path, beta):
    from ktae.train.session import train

    cfg = tiny_config(tiny_model, tmp_path / "run", beta=beta, max_steps=3)
    summary = train(cfg, reward_funcs=[contains_digit])
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        parts = {p: m[k] for p, k in PART_KEYS.items()}
        assert all(v >= 0 for v in parts.values()), m
        for part in ("generation", "scoring", "advantages", "update"):
            assert parts[part] > 0, (part, m)
        # the reference pass (beta > 0) is the only log-prob pass of this setting
        assert (parts["logprobs"] > 0) == (beta > 0), m
        assert sum(parts.values()) == pytest.approx(m["step_time"], rel=1e-6)
        assert parts["other"] < 0.3 * m["step_time"], m  # almost all of it is measured
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["step_seconds"] == summary["step_seconds"]
    assert set(saved["step_seconds"]) == {"step", *PART_KEYS}
    assert saved["step_seconds"]["step"] == pytest.approx(
        sum(m["step_time"] for m in metrics) / 3)
    assert saved["no_signal"] is None  # 3 steps < the default window


def test_no_gradient_checkpointing_unless_asked(tiny_model, tmp_path):
    """TRL 1.16 turns it on by default, recomputing the forward pass in the backward one."""
    from ktae.train.session import grpo_config

    cfg = tiny_config(tiny_model, tmp_path / "run")
    assert grpo_config(cfg, 1).gradient_checkpointing is False
    assert grpo_config(cfg, 1, {"gradient_checkpointing": True}).gradient_checkpointing is True
