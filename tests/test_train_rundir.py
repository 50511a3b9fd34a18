"""Run directory: checkpoint markers, resume truncation, metrics lines, plots."""

from __future__ import annotations

import json

from ktae.train.rundir import (
    COMPLETE_MARKER,
    RunDir,
    checkpoint_step,
    is_complete_checkpoint,
    latest_complete_checkpoint,
    mark_checkpoint_complete,
)


def _checkpoint(root, step, complete=True):
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "trainer_state.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"x")
    if complete:
        mark_checkpoint_complete(d, step)
    return d


def test_latest_complete_checkpoint_skips_partial_ones(tmp_path):
    assert latest_complete_checkpoint(tmp_path / "missing") is None
    assert latest_complete_checkpoint(tmp_path) is None
    _checkpoint(tmp_path, 2)
    ten = _checkpoint(tmp_path, 10)
    _checkpoint(tmp_path, 12, complete=False)  # killed while writing
    (tmp_path / "checkpoint-x").mkdir()
    assert latest_complete_checkpoint(tmp_path) == ten
    assert checkpoint_step(ten) == 10
    # a file listed by the marker that went missing makes the checkpoint incomplete
    (ten / "model.safetensors").unlink()
    assert not is_complete_checkpoint(ten)
    assert latest_complete_checkpoint(tmp_path).name == "checkpoint-2"
    (tmp_path / "checkpoint-2" / COMPLETE_MARKER).write_text("{not json")
    assert latest_complete_checkpoint(tmp_path) is None


def test_metrics_record_and_truncate(tmp_path):
    run = RunDir(tmp_path / "run")
    rec = run.metrics_record(3, {"reward": 0.5, "ktae/accuracy": 0.25, "step_time": 2.0,
                                 "ktae/advantage_seconds": 0.5, "other": 1.0, "kl": None})
    assert rec == {"step": 3, "reward": 0.5, "accuracy": 0.25, "step_time": 2.0,
                   "advantage_seconds": 0.5, "advantage_share": 0.25}
    for step in range(1, 6):
        run.append(run.metrics_path, {"step": step, "x": float("nan") if step == 2 else 1.0})
    run.append(run.eval_path, {"step": 0, "accuracy": 0.1})
    run.append(run.eval_path, {"step": 4, "accuracy": 0.2})
    assert RunDir.read_jsonl(run.metrics_path)[1]["x"] is None  # NaN -> null, valid JSON
    run.truncate(3)
    assert [m["step"] for m in RunDir.read_jsonl(run.metrics_path)] == [1, 2, 3]
    assert [e["step"] for e in RunDir.read_jsonl(run.eval_path)] == [0]


def test_plots_are_written(tmp_path):
    run = RunDir(tmp_path)
    for step in range(1, 4):
        run.append(run.metrics_path, {"step": step, "accuracy": step / 4,
                                      "response_length": 10.0 + step, "entropy": 1 / step})
    run.append(run.eval_path, {"step": 0, "accuracy": 0.3})
    paths = run.plot()
    assert sorted(p.name for p in paths) == ["accuracy.png", "entropy.png",
                                             "response_length.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
    run.write_json("summary.json", {"a": 1.0})
    assert json.loads((tmp_path / "summary.json").read_text()) == {"a": 1.0}
