"""Exact resume in every epoch: a run stopped right after a checkpoint and resumed writes the
same metrics, evaluations and rollouts, and ends with the same weights, as an uninterrupted
run, also when the checkpoint lies in the second epoch or later (8 training problems, 2 per
step: 4 steps an epoch)."""

from __future__ import annotations

import pytest
import torch
from test_train_helpers import contains_digit, read_jsonl, tiny_config
from transformers import TrainerCallback

from ktae.train.session import train
from ktae.train.step_timing import TIMING_RECORD_KEYS

pytestmark = pytest.mark.slow

TIMING_KEYS = TIMING_RECORD_KEYS


class _Stop(Exception):
    pass


class _StopAfterSave(TrainerCallback):
    """Ends the run (as a kill would) right after checkpoint ``step`` is complete."""

    def __init__(self, step: int):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise _Stop


def _settings(**overrides) -> dict:
    return dict(max_steps=7, save_every=2, eval_every=3, train_size=8, num_prompts=2,
                rollout_every=1, credit="ktae", **overrides)


def _weights(run) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "final" / "model.safetensors"))


def assert_same_run(a, b) -> None:
    """Every key of every metrics line (timing aside), evaluations, rollouts and final
    weights of runs ``a`` and ``b`` agree; a key missing from either run fails."""
    ma, mb = read_jsonl(a / "metrics.jsonl"), read_jsonl(b / "metrics.jsonl")
    assert [m["step"] for m in mb] == [m["step"] for m in ma]
    for x, y in zip(ma, mb, strict=True):
        kx = {k: v for k, v in x.items() if k not in TIMING_KEYS}
        ky = {k: v for k, v in y.items() if k not in TIMING_KEYS}
        assert kx == ky, x["step"]
    assert read_jsonl(a / "eval.jsonl") == read_jsonl(b / "eval.jsonl")
    assert (a / "rollouts.jsonl").read_text() == (b / "rollouts.jsonl").read_text()
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


@pytest.mark.parametrize(("algo", "stop_at", "extra"), [
    ("dapo", 4, {}),  # at the end of the first epoch
    ("grpo", 6, {}),  # in the middle of the second
    ("dapo", 6, {"trl": {"gradient_accumulation_steps": 2}}),  # two micro-batches a step
])
def test_resume_in_a_later_epoch_is_the_uninterrupted_run(tiny_model, tmp_path, algo, stop_at,
                                                          extra):
    full, stopped = tmp_path / "full", tmp_path / "stopped"
    settings = _settings(algo=algo, **extra)
    train(tiny_config(tiny_model, full, **settings), reward_funcs=[contains_digit])
    with pytest.raises(_Stop):
        train(tiny_config(tiny_model, stopped, **settings),
              reward_funcs=[contains_digit], extra_callbacks=[_StopAfterSave(stop_at)])
    assert [m["step"] for m in read_jsonl(stopped / "metrics.jsonl")][-1] == stop_at
    train(tiny_config(tiny_model, stopped, resume=True, **settings),
          reward_funcs=[contains_digit])
    assert_same_run(full, stopped)


def test_epoch_order_depends_on_the_epoch_only():
    from trl.trainer.utils import RepeatSampler

    from ktae.train.trainer import EpochRepeatSampler

    data = list(range(10))
    kw = dict(mini_repeat_count=2, batch_size=2, repeat_count=1, seed=3)
    trl = RepeatSampler(data, **kw)
    orders = [list(trl) for _ in range(3)]  # an uninterrupted TRL run's epochs 0, 1, 2
    ours = EpochRepeatSampler(data, **kw)
    assert [list(ours) for _ in range(3)] == orders  # passes count epochs
    fresh = EpochRepeatSampler(data, **kw)  # a run resumed in epoch 2
    fresh.set_epoch(2)
    assert list(fresh) == orders[2]
    fresh.set_epoch(0)
    assert list(fresh) == orders[0]
