"""``ktae train --resume`` and the settings of a run: settings that change the run are
refused, the rest are recorded as a new segment; a finished run is not trained further.
Also the options around a run's checkpoints and schedule: ``--save-total-limit``,
``--warmup-steps`` under the constant schedule, and the modes of the files written."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch
import yaml
from test_train_helpers import read_jsonl

from ktae.cli import main

pytestmark = pytest.mark.slow


def _train(model, out, *extra) -> int:
    torch.set_num_threads(1)
    return main(["train", "--model", str(model), "--output-dir", str(out), "--algo", "grpo",
                 "--num-prompts", "2", "--num-generations", "2", "--max-new-tokens", "4",
                 "--train-size", "8", "--eval-size", "2", "--eval-every", "0",
                 "--rollout-every", "0", "--no-progress", *extra])


def test_resume_refuses_settings_that_change_the_run(tiny_model, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(tiny_model, out, "--max-steps", "2") == 0
    config = (out / "config.yaml").read_text()
    metrics = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    for extra, message in [
        (["--lr", "0.01", "--seed", "1"], "seed 0 -> 1, lr 3e-05 -> 0.01"),
        (["--credit", "none"], "credit ktae -> none"),
        (["--lr-scheduler", "cosine"], "lr-scheduler constant -> cosine"),
    ]:
        assert _train(tiny_model, out, "--max-steps", "2", "--resume", *extra) == 2, extra
        assert capsys.readouterr().err == (
            f"ktae train: --resume: settings differ from the run's: {message}\n")
    assert (out / "config.yaml").read_text() == config
    assert (out / "metrics.jsonl").read_text() == metrics
    # a finished run is complete: not trained further
    assert _train(tiny_model, out, "--max-steps", "2", "--resume") == 0
    assert capsys.readouterr().err == (
        f"ktae train: --resume: {out} is complete (2 steps); nothing to do\n")
    assert (out / "metrics.jsonl").read_text() == metrics
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    # settings that cannot change past steps: allowed, and recorded as a segment
    assert _train(tiny_model, out, "--max-steps", "3", "--resume", "--threads", "2") == 0
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
    assert [e["step"] for e in read_jsonl(out / "eval.jsonl")] == [0, 2, 3]
    info = json.loads((out / "ktae_run.json").read_text())
    assert [(s["from_step"], s["changes"]) for s in info["segments"]] == [
        (0, {}), (2, {"max_steps": [2, 3], "torch_threads": [1, 2]})]
    assert info["finished"]["steps"] == 3
    assert yaml.safe_load((out / "config.yaml").read_text())["max_steps"] == 3


@pytest.mark.parametrize(("warmup", "steps"), [(["--warmup-steps", "10"], 10),
                                              (["--warmup-ratio", "0.5"], 2)])
def test_warmup_steps_warm_up_the_constant_schedule(tiny_model, tmp_path, warmup, steps):
    out = tmp_path / "run"
    assert _train(tiny_model, out, "--max-steps", "3", *warmup) == 0
    lrs = [m["learning_rate"] for m in read_jsonl(out / "metrics.jsonl")]
    assert lrs == pytest.approx([3e-5 * min(k / steps, 1) for k in range(3)])
    assert yaml.safe_load((out / "config.yaml").read_text())["lr_scheduler"] == \
        "constant_with_warmup"


@pytest.mark.parametrize(("limit", "kept"), [
    ([], ["checkpoint-2", "checkpoint-3"]),
    (["--save-total-limit", "0"], ["checkpoint-1", "checkpoint-2", "checkpoint-3"]),
    (["--save-total-limit", "1"], ["checkpoint-3"]),
])
def test_save_total_limit_and_file_modes(tiny_model, tmp_path, limit, kept):
    out = tmp_path / "run"
    old = os.umask(0o022)
    try:
        assert _train(tiny_model, out, "--max-steps", "3", "--save-every", "1", *limit) == 0
    finally:
        os.umask(old)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == kept
    for name in ("config.yaml", "summary.json", "ktae_run.json", "metrics.jsonl",
                 "final/model.safetensors", f"{kept[-1]}/model.safetensors",
                 f"{kept[-1]}/ktae_checkpoint.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644, name


def test_a_resumed_run_saves_at_its_own_save_every(tiny_model, tmp_path):
    """The checkpoint's trainer_state.json holds save_steps=2; the resumed run asks for 1."""
    out = tmp_path / "run"
    assert _train(tiny_model, out, "--max-steps", "2", "--save-every", "2") == 0
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["save_steps"] == 2
    assert _train(tiny_model, out, "--max-steps", "4", "--save-every", "1", "--resume") == 0
    saved = sorted(p.name for p in out.glob("checkpoint-*"))
    assert saved == ["checkpoint-3", "checkpoint-4"], saved  # step 3: saved at the new setting
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["save_steps"] == 1
