"""The verdict study's driver: its plan, what it skips and what it resumes."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "studies" / "verdict-5seed" / "verdict_study.py"


@pytest.fixture
def study(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("verdict_study_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "RECORDS", tmp_path / "records")
    monkeypatch.setenv("KTAE_VERDICT_RUNS", str(tmp_path / "runs"))
    yield module
    sys.modules.pop(spec.name, None)


def test_plan_is_every_arm_setting_and_seed_seed_by_seed(study):
    plan = study.plan()
    assert len(plan) == len(set(plan)) == len(study.ARMS) * len(study.SETTINGS) * len(study.SEEDS)
    assert len(study.SEEDS) >= 5 and len(study.SETTINGS) >= 2
    # a study stopped early holds whole seeds: every arm and setting of a seed come together
    block = len(study.ARMS) * len(study.SETTINGS)
    for k, seed in enumerate(study.SEEDS):
        assert {s for _, _, s in plan[k * block:(k + 1) * block]} == {seed}


def test_train_job_flags_and_resume(study, tmp_path):
    root = tmp_path / "runs"
    job = study.train_job("t64", "length", 11, root)
    argv = list(job.argv)
    assert argv[:4] == ["ktae", "train", "--config", study.CONFIG]
    assert argv[argv.index("--overlong-buffer") + 1] == str(64 // 5)
    assert argv[argv.index("--max-new-tokens") + 1] == "64"
    assert argv[argv.index("--seed") + 1] == "11" and "--resume" not in argv
    assert argv[-2:] == ["-o", str(root / "t64-length-s11")]
    # a folder with a checkpoint resumes; one without is started again
    (root / "t64-length-s11" / "checkpoint-4").mkdir(parents=True)
    assert "--resume" in study.train_job("t64", "length", 11, root).argv
    (root / "t64-grpo-s11").mkdir(parents=True)
    (root / "t64-grpo-s11" / "metrics.jsonl").write_text("{}\n")
    assert "--resume" not in study.train_job("t64", "grpo", 11, root).argv
    assert not (root / "t64-grpo-s11").exists()


def test_recorded_runs_are_skipped_and_records_written_last(study, tmp_path):
    root = tmp_path / "runs"
    name = study.run_name("t64", "grpo", 11)
    pending = study.pending_train(root)
    assert pending[0].name == name and len(pending) == len(study.plan())
    # a job that succeeds: its files are kept, the marker written
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text("{}")
    job = study.Job(name, (sys.executable, "-c", "pass"), folder, ("summary.json", "eval.jsonl"))
    assert study.execute(job, root / "logs")
    record = study.RECORDS / name
    assert (record / "summary.json").exists() and not (record / "eval.jsonl").exists()
    assert json.loads((record / study.MARKER).read_text())["seconds"] >= 0
    assert name not in {j.name for j in study.pending_train(root)}
    # a job that fails leaves no record
    other = study.run_name("t64", "ktae", 11)
    bad = study.Job(other, (sys.executable, "-c", "raise SystemExit(3)"), root / other, ())
    assert not study.execute(bad, root / "logs")
    assert not (study.RECORDS / other).exists()


def test_runs_import_the_frozen_code(study, tmp_path):
    code = tmp_path / "code"
    (code / "src").mkdir(parents=True)
    out = tmp_path / "seen.txt"
    script = ("import os, sys; open(sys.argv[1], 'w').write(os.environ['PYTHONPATH'] + '|' "
              "+ os.getcwd())")
    job = study.Job("t64-grpo-s12", (sys.executable, "-c", script, str(out)), tmp_path / "f",
                    (), code=code)
    assert study.execute(job, tmp_path / "logs")
    path, cwd = out.read_text().split("|")
    assert path.split(":")[0] == str(code / "src") and cwd == str(code)


def test_heavy_runs_never_run_side_by_side(study, tmp_path):
    """Two heavy jobs first in the queue: the second waits for the first, and a light job
    runs beside it meanwhile; every job runs once."""
    root, log = tmp_path / "runs", tmp_path / "order.log"
    assert study.train_job("t128", "oarg", 11, root).heavy
    assert study.train_job("t64", "oarg", 11, root).heavy
    assert not study.train_job("t128", "ktae", 11, root).heavy

    def job(name, heavy, seconds):
        script = ("import sys, time; log = open(sys.argv[1], 'a'); "
                  "log.write('start ' + sys.argv[2] + chr(10)); log.flush(); "
                  "time.sleep(float(sys.argv[3])); log.write('end ' + sys.argv[2] + chr(10))")
        return study.Job(name, (sys.executable, "-c", script, str(log), name, str(seconds)),
                         root / name, (), heavy=heavy)

    jobs = [job("h1", True, 1.0), job("h2", True, 0.2), job("l1", False, 0.2)]
    assert study.next_job(jobs[1:], [jobs[0]]) is jobs[2]
    assert study.next_job(jobs[1:2], [jobs[0]]) is None
    assert study.drive(jobs, 2, tmp_path / "logs") == 0
    events = log.read_text().split("\n")
    assert events.index("start l1") < events.index("end h1") < events.index("start h2")
    assert sorted(e for e in events if e.startswith("start")) == ["start h1", "start h2",
                                                                   "start l1"]


def test_audits_follow_the_runs_once_their_models_exist(study, tmp_path):
    """``run`` queues the audits after the training runs; an audit waits for its run's
    final model, imports its own pinned code, and a queue that can only wait stops."""
    root = tmp_path / "runs"
    code = tmp_path / "audit-code"
    jobs = study.pending_audits(root, code)
    names = [j.name for j in jobs]
    assert names[:2] == ["audit-t64-start", "audit-t128-start"]
    assert len(names) == len(set(names)) == len(study.SETTINGS) * (
        1 + len(study.AUDIT_SEEDS) * len(study.ARMS))
    assert all(j.code == code for j in jobs)
    start, trained = jobs[0], jobs[2]
    assert start.ready() and not trained.ready()
    assert study.next_job([trained, start], []) is start
    assert study.next_job([trained], []) is None
    run = trained.name.removeprefix("audit-")
    argv = list(trained.argv)
    assert argv[argv.index("--model") + 1] == str(root / run / "final")
    (root / run / "final").mkdir(parents=True)
    assert trained.ready() and study.next_job([trained], []) is trained
    # a queue whose jobs all wait on models nobody makes ends instead of hanging
    waiting = study.Job("audit-x", (sys.executable, "-c", "pass"), root / "audit-x", (),
                        needs=root / "never")
    assert study.drive([waiting], 2, tmp_path / "logs") == 1


def test_a_run_killed_by_a_signal_goes_again_from_its_checkpoint(study, tmp_path):
    """A job killed by SIGKILL (the out-of-memory killer) is made anew and run again, at
    most RETRIES times; one that exits with an error is not."""
    root, log = tmp_path / "runs", tmp_path / "tries.log"
    kill = ("import os, signal, sys; open(sys.argv[1], 'a').write(sys.argv[2] + chr(10)); "
            "os.kill(os.getpid(), signal.SIGKILL) if sys.argv[3] == 'kill' else "
            "sys.exit(int(sys.argv[3]))")
    made = []

    def job(name, action, tries_left):
        def again():
            made.append(name)
            return job(name, "0" if tries_left == 1 else action, tries_left - 1)

        return study.Job(name, (sys.executable, "-c", kill, str(log), name, action),
                         root / name, (), again=again)

    # killed once, then finishes: recorded, and drive reports success
    assert study.drive([job("k1", "kill", 1)], 2, tmp_path / "logs") == 0
    assert made == ["k1"] and (study.RECORDS / "k1" / study.MARKER).exists()
    # killed every time: RETRIES tries after the first, then a failure
    made.clear()
    assert study.drive([job("k2", "kill", 99)], 1, tmp_path / "logs") == 1
    assert made == ["k2"] * study.RETRIES
    # an error exit is not a kill: no second try
    made.clear()
    assert study.drive([job("e1", "3", 99)], 1, tmp_path / "logs") == 1
    assert made == []
    assert log.read_text().split().count("k2") == study.RETRIES + 1


def test_pending_runs_are_made_again_with_resume(study, tmp_path):
    root = tmp_path / "runs"
    first = study.pending_train(root)[0]
    assert "--resume" not in first.argv
    (first.folder / "checkpoint-4").mkdir(parents=True)
    again = first.again()
    assert again.name == first.name and "--resume" in again.argv and again.again is not None


def _eval_file(path, responses):
    path.write_text("".join(json.dumps({"step": step, "problems": [
        {"response": r} for r in rs]}) + "\n" for step, rs in enumerate(responses)))


def test_a_recorded_run_without_its_model_is_made_again_before_its_audit(study, tmp_path):
    """An audit whose run is recorded but whose final model is not on this machine gets
    the run made again just before it; the remade model is audited only if its held-out
    responses are the record's word for word, and the record's own files stay as they
    were."""
    root = tmp_path / "runs"
    audits = study.pending_audits(root)
    target = next(j for j in audits if j.needs is not None)
    run = target.name.removeprefix("audit-")
    record = study.RECORDS / run
    record.mkdir(parents=True)
    (record / study.MARKER).write_text("{}")
    _eval_file(record / "eval.jsonl", [["a", "b"], ["c", "d"]])
    jobs = study.remake_jobs(root, audits)
    names = [j.name for j in jobs]
    assert names.count(run) == 1 and names.index(run) == names.index(target.name) - 1
    remake, target = jobs[names.index(run)], jobs[names.index(target.name)]
    assert remake.remake and remake.keep == () and remake.folder == root / run
    # the model is saved before the run's last evaluation: the audit waits for the check
    (root / run / "final").mkdir(parents=True)
    assert not target.ready()
    (root / run / "final").rmdir()
    assert list(remake.argv[:2]) == ["ktae", "train"] and remake.again().remake
    # runs that are not recorded are the training queue's, not remade
    assert sum(j.remake for j in jobs) == 1

    def fake(responses):
        script = ("import json, os, sys; f = sys.argv[1]; os.makedirs(f + '/final', "
                  "exist_ok=True); open(f + '/eval.jsonl', 'w').write(sys.argv[2])")
        text = "".join(json.dumps({"problems": [{"response": r} for r in rs]}) + "\n"
                       for rs in responses)
        return study.dataclasses.replace(remake, argv=(sys.executable, "-c", script,
                                                       str(remake.folder), text))

    # the same responses: the model stays for the audit, the record gains remade.json only
    assert study.execute(fake([["a", "b"], ["c", "d"]]), tmp_path / "logs")
    note = json.loads((record / "remade.json").read_text())
    assert note["same_heldout_responses"] and note["responses_differing"] == 0
    assert target.ready() and (record / study.MARKER).read_text() == "{}"
    assert sorted(p.name for p in record.iterdir()) == ["eval.jsonl", "record.json",
                                                        "remade.json"]
    # one response differs, or the last evaluation is missing: set aside, no audit
    for responses, differ in (([["a", "b"], ["c", "x"]], 1), ([["a", "b"]], 2)):
        assert not study.execute(fake(responses), tmp_path / "logs")
        note = json.loads((record / "remade.json").read_text())
        assert not note["same_heldout_responses"] and note["responses_differing"] == differ
        assert not target.ready() and (remake.folder / "final-differs").exists()


def test_status_names_the_runs_to_make_again_and_touches_no_run_folder(study, tmp_path,
                                                                         capsys):
    root = tmp_path / "runs"
    target = next(j for j in study.pending_audits(root) if j.needs is not None)
    run = target.name.removeprefix("audit-")
    (study.RECORDS / run).mkdir(parents=True)
    (study.RECORDS / run / study.MARKER).write_text("{}")
    started = root / run / "metrics.jsonl"  # a remake a driver is making, no checkpoint yet
    started.parent.mkdir(parents=True)
    started.write_text("{}\n")
    assert study.status() == 0
    assert f"make again for their audits (model not on this machine): {run}" in (
        capsys.readouterr().out)
    assert started.exists()
