"""Run directory: checkpoint markers, resume truncation, metrics lines, plots."""

from __future__ import annotations

import json

import pytest

from ktae.checkpoints import (
    COMPLETE_MARKER,
    checkpoint_step,
    is_complete_checkpoint,
    latest_complete_checkpoint,
)
from ktae.runs.rundir import RUN_MARKER, RunDir, mark_checkpoint_complete


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
    rec = run.metrics_record(3, {"reward": 0.5, "ktae/accuracy": 0.25, "ktae/step_seconds": 2.0,
                                 "step_time": 1.5,
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


def test_output_dir_that_is_not_a_run_is_refused_and_left_alone(tmp_path):
    from ktae.runs.rundir import prepare_output_dir

    user = tmp_path / "mine"
    (user / "checkpoint-0").mkdir(parents=True)
    (user / "checkpoint-0" / "weights.bin").write_bytes(b"precious")
    (user / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="not a ktae run directory"):
        prepare_output_dir(user, resume=False)
    with pytest.raises(ValueError, match="not a ktae run directory"):
        prepare_output_dir(user, resume=True)
    assert sorted(p.name for p in user.iterdir()) == ["checkpoint-0", "notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        prepare_output_dir(tmp_path / "file", resume=False)
    # new and empty directories are fine and become runs
    assert prepare_output_dir(tmp_path / "new", resume=False) is None
    assert (tmp_path / "new" / RUN_MARKER).is_file()
    (tmp_path / "empty").mkdir()
    assert prepare_output_dir(tmp_path / "empty", resume=True) is None


def test_resume_without_checkpoint_keeps_old_metrics(tmp_path, capsys):
    from ktae.runs.rundir import prepare_output_dir

    run = tmp_path / "run"
    prepare_output_dir(run, resume=False)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "eval.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(ValueError, match="already holds a run"):
        prepare_output_dir(run, resume=False)
    # a non-main process only checks: nothing moves
    assert prepare_output_dir(run, resume=True, write=False) is None
    assert (run / "metrics.jsonl").exists()
    assert prepare_output_dir(run, resume=True) is None
    kept = sorted(p.name for p in run.glob("*.before-*"))
    assert [k.split(".before-")[0] for k in kept] == ["eval.jsonl", "metrics.jsonl"]
    assert (run / kept[1]).read_text() == '{"step": 1}\n'
    assert not (run / "metrics.jsonl").exists()
    assert "kept as metrics.jsonl.before-" in capsys.readouterr().err


def test_resume_truncates_to_the_checkpoint(tmp_path):
    from ktae.runs.rundir import prepare_output_dir

    run = RunDir(tmp_path / "run")
    (run.path / RUN_MARKER).write_text("{}")
    for step in (1, 2, 3):
        run.append(run.metrics_path, {"step": step})
    _checkpoint(run.path, 2)
    assert prepare_output_dir(run.path, resume=True).name == "checkpoint-2"
    assert [m["step"] for m in RunDir.read_jsonl(run.metrics_path)] == [1, 2]


def test_atomic_write_uses_unique_temporaries(tmp_path):
    import threading

    from ktae.runs.rundir import atomic_write

    target = tmp_path / "config.yaml"
    errors = []

    def write(i):
        try:
            for _ in range(50):
                atomic_write(target, f"writer {i}\n" * 100)
        except Exception as err:  # pragma: no cover - the assertion reports it
            errors.append(err)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(target.read_text().splitlines())) == 1  # one writer's whole text
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def _foreign_run(path):
    """What another tool's run directory may hold: settings, metrics, two checkpoints."""
    for step in (100, 200):
        d = path / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text("{}")
        (d / "model.safetensors").write_bytes(b"theirs")
    (path / "config.yaml").write_text("lr: 1.0e-3\n")
    (path / "metrics.jsonl").write_text('{"step": 200}\n')
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_a_foreign_run_with_config_and_metrics_is_not_a_ktae_run(tmp_path):
    from ktae.runs.rundir import prepare_output_dir

    theirs = tmp_path / "theirs"
    files = _foreign_run(theirs)
    for resume in (False, True):
        for write in (False, True):
            with pytest.raises(ValueError, match="not a ktae run directory"):
                prepare_output_dir(theirs, resume=resume, write=write)
    assert sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*")) == files
    assert (theirs / "config.yaml").read_text() == "lr: 1.0e-3\n"


def test_train_refuses_a_foreign_run_with_or_without_resume(tmp_path, capsys):
    from ktae.cli import main

    theirs = tmp_path / "theirs"
    files = _foreign_run(theirs)
    for extra in ([], ["--resume"]):
        assert main(["train", "--output-dir", str(theirs), *extra]) == 2
        err = capsys.readouterr().err
        assert "not a ktae run directory" in err and "--resume" not in err, err
    assert sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*")) == files


def test_rotation_deletes_only_complete_ktae_checkpoints(tmp_path):
    from ktae.runs.rundir import rotate_checkpoints

    foreign = tmp_path / "checkpoint-7"  # no ktae marker: not ours, whatever its name
    foreign.mkdir()
    (foreign / "model.safetensors").write_bytes(b"theirs")
    (tmp_path / "checkpoint-3-backup").mkdir()
    partial = _checkpoint(tmp_path, 12, complete=False)  # being written
    for step in (2, 4, 6, 8, 10):
        _checkpoint(tmp_path, step)
    assert rotate_checkpoints(tmp_path, None) == [] and rotate_checkpoints(tmp_path, 0) == []
    assert [p.name for p in rotate_checkpoints(tmp_path, 2)] == [
        "checkpoint-2", "checkpoint-4", "checkpoint-6"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["checkpoint-10", "checkpoint-12", "checkpoint-3-backup", "checkpoint-7",
                    "checkpoint-8"]
    assert (foreign / "model.safetensors").read_bytes() == b"theirs"
    assert partial.is_dir()


def test_atomically_written_files_follow_the_umask(tmp_path):
    import os
    import stat

    from ktae.runs.rundir import atomic_write, follow_umask

    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "config.yaml", "a: 1\n")
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "model.safetensors").write_bytes(b"x")
        os.chmod(tmp_path / "m" / "model.safetensors", 0o600)  # as safetensors leaves it
        follow_umask(tmp_path / "m")
        os.umask(0o027)
        atomic_write(tmp_path / "summary.json", "{}\n")
    finally:
        os.umask(old)
    mode = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*") if p.is_file()}
    assert mode == {"config.yaml": 0o644, "model.safetensors": 0o644, "summary.json": 0o640}


def test_a_line_cut_short_by_a_kill_is_dropped(tmp_path):
    run = RunDir(tmp_path)
    run.append(run.eval_path, {"step": 0, "accuracy": 0.5})
    with open(run.eval_path, "a") as f:
        f.write('{"step": 6, "accur')
    assert RunDir.read_jsonl(run.eval_path) == [{"step": 0, "accuracy": 0.5}]
    run.truncate(6)
    assert run.eval_path.read_text() == '{"step": 0, "accuracy": 0.5}\n'
    run.eval_path.write_text('{"step": 0\n{"step": 1}\n')
    with pytest.raises(ValueError):  # only the last line may be cut short
        RunDir.read_jsonl(run.eval_path)


def test_run_marker_records_segments_and_the_finish(tmp_path):
    from ktae.runs.rundir import (
        finished_steps,
        mark_run_finished,
        prepare_output_dir,
        read_run_info,
        start_segment,
    )

    prepare_output_dir(tmp_path / "run", resume=False)
    run = tmp_path / "run"
    start_segment(run, from_step=0, changes={})
    mark_run_finished(run, 30)
    assert finished_steps(run) == 30
    start_segment(run, from_step=30, changes={"max_steps": [30, 40]})
    assert finished_steps(run) is None
    info = read_run_info(run)
    assert info["format"] == "ktae-run"
    assert [(s["from_step"], s["changes"]) for s in info["segments"]] == [
        (0, {}), (30, {"max_steps": [30, 40]})]


def test_a_checkpoint_directory_ktae_did_not_start_is_not_written_into(tmp_path):
    from ktae.runs.rundir import STARTED_MARKER, claim_checkpoint, foreign_checkpoints

    theirs = tmp_path / "checkpoint-4"
    theirs.mkdir()
    (theirs / "model.safetensors").write_bytes(b"theirs")
    ours_cut_short = tmp_path / "checkpoint-6"
    claim_checkpoint(ours_cut_short)
    (ours_cut_short / "model.safetensors").write_bytes(b"half")
    (tmp_path / "checkpoint-8").mkdir()  # empty: nothing to lose
    assert foreign_checkpoints(tmp_path) == {4: theirs}
    with pytest.raises(ValueError, match="not written by ktae"):
        claim_checkpoint(theirs)
    assert sorted(p.name for p in theirs.iterdir()) == ["model.safetensors"]
    claim_checkpoint(ours_cut_short)  # ours: written over on resume
    claim_checkpoint(tmp_path / "checkpoint-8")
    assert (tmp_path / "checkpoint-8" / STARTED_MARKER).is_file()


def test_train_refuses_to_save_over_a_foreign_checkpoint(tiny_model, tmp_path, capsys):
    from ktae.cli import main
    from ktae.runs.rundir import prepare_output_dir

    run = tmp_path / "run"
    prepare_output_dir(run, resume=False)
    theirs = run / "checkpoint-2"
    theirs.mkdir()
    (theirs / "model.safetensors").write_bytes(b"theirs")
    code = main(["train", "--model", str(tiny_model), "--output-dir", str(run),
                 "--max-steps", "2", "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{theirs} was not written by ktae" in err
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-2", "ktae_run.json"]
    assert (theirs / "model.safetensors").read_bytes() == b"theirs"
