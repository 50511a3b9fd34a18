"""The studies' driver: a recorded run is skipped, a run with a checkpoint resumes, a
finished run's files reach its record with the marker last, a refused command stops the
queue; the pilot's grid holds development seeds only and reads the eval split."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

STUDIES = Path(__file__).resolve().parents[1] / "studies"
sys.path.insert(0, str(STUDIES))

import driver  # noqa: E402

# a stand-in for `python -m ktae`: writes its arguments and a summary into -o, and fails
# with exit 2 when asked to
FAKE = '''
import json, pathlib, sys
argv = sys.argv[1:]
if "--refuse" in argv:
    sys.exit(2)
out = pathlib.Path(argv[argv.index("-o") + 1])
out.mkdir(parents=True, exist_ok=True)
(out / "summary.json").write_text(json.dumps({"argv": argv}))
(out / "calls").open("a").write("x")
'''


@pytest.fixture
def code(tmp_path) -> Path:
    tree = tmp_path / "code"
    (tree / "src" / "ktae").mkdir(parents=True)
    (tree / "src" / "ktae" / "__init__.py").write_text("")
    (tree / "src" / "ktae" / "__main__.py").write_text(FAKE)
    return tree


def test_drive_records_skips_and_resumes(tmp_path, code, capsys):
    root, records = tmp_path / "runs", tmp_path / "records"
    jobs = [driver.Job("a", ("train", "--seed", "1")), driver.Job("b", ("train", "--seed", "2"))]
    (root / "b" / "checkpoint-6").mkdir(parents=True)  # b was cut after a checkpoint
    (root / "b" / "summary.json").write_text("{}")
    assert driver.drive(jobs, n_jobs=2, root=root, records=records, code=code) == 0
    a = json.loads((records / "a" / "summary.json").read_text())["argv"]
    b = json.loads((records / "b" / "summary.json").read_text())["argv"]
    assert "--resume" not in a and b[-1] == "--resume"
    marker = json.loads((records / "a" / driver.MARKER).read_text())
    assert marker["command"] == "ktae train --seed 1 -o '{runs}/a'"
    # a second sitting skips both
    assert driver.drive(jobs, n_jobs=1, root=root, records=records, code=code) == 0
    assert (root / "a" / "calls").read_text() == "x"
    assert "2 of 2 recorded; 0 to do" in capsys.readouterr().out


def test_a_start_without_checkpoint_is_cleared_and_a_refusal_stops_the_queue(tmp_path, code,
                                                                              capsys):
    root, records = tmp_path / "runs", tmp_path / "records"
    (root / "a").mkdir(parents=True)
    (root / "a" / "stale").write_text("half a start")
    jobs = [driver.Job("a", ("train", "--refuse")), driver.Job("b", ("train",))]
    assert driver.drive(jobs, n_jobs=1, root=root, records=records, code=code) == 1
    assert not (root / "a" / "stale").exists() and not (records / "a").exists()
    assert not (root / "b").exists()  # never started
    assert "no further job starts" in capsys.readouterr().out


def _recorded(records: Path, name: str, seconds: float) -> None:
    (records / name).mkdir(parents=True)
    (records / name / driver.MARKER).write_text(json.dumps({"seconds": seconds}))


def test_a_deadline_starts_only_runs_that_would_end_by_it(tmp_path, code, capsys, monkeypatch):
    """With ``until``, a job starts only if the longest recorded run of its kind ends by
    then; a kind with no record starts; the rest wait, and the driver says so."""
    root, records = tmp_path / "runs", tmp_path / "records"
    _recorded(records, "grpo-s201", 9000.0)
    _recorded(records, "grpo-s202", 8000.0)
    _recorded(records, "short-s201", 1500.0)
    assert driver.kind("ktae-length-s202") == "ktae-length" and driver.kind("grpo") == "grpo"
    assert driver.longest_seconds(records) == {"grpo": 9000.0, "short": 1500.0}
    now = 1_000_000.0
    monkeypatch.setattr(driver.time, "time", lambda: now)
    jobs = [driver.Job(n, ("train",)) for n in ("grpo-s203", "short-s203", "new-s203")]
    # an hour left: GRPO's 2.5 hours do not fit; the short kind and the unknown one do
    assert driver.drive(jobs, n_jobs=1, root=root, records=records, code=code,
                        until=now + 3600) == 0
    assert sorted(p.name for p in records.iterdir() if "s203" in p.name) == ["new-s203",
                                                                              "short-s203"]
    assert "1 left: none would end by the deadline" in capsys.readouterr().out
    # without a deadline it runs
    assert driver.drive(jobs, n_jobs=1, root=root, records=records, code=code) == 0
    assert (records / "grpo-s203" / driver.MARKER).exists()


@pytest.mark.parametrize(("text", "expected"), [
    ("03:50", 3 * 3600 + 50 * 60), ("00:00", 86400), ("23:59", 23 * 3600 + 59 * 60),
    ("1:05", 3600 + 5 * 60)])
def test_until_is_the_next_such_time_of_day_in_utc(text, expected):
    day = 20_000 * 86400.0
    assert driver.deadline(text, now=day + 60) == day + expected


@pytest.mark.parametrize("text", ["24:00", "3:5", "soon", "12:60", "1:0x", "12"])
def test_a_bad_until_is_a_one_line_error(text, capsys):
    assert driver.deadline(text) is None
    assert driver.study_arguments("final", "d", ["run", "--until", text]) is None
    err = capsys.readouterr().err.strip()
    assert err == "final: --until: expected a UTC time as HH:MM"


def test_the_pilot_tunes_on_development_seeds_and_the_eval_split():
    import importlib.util

    spec = importlib.util.spec_from_file_location("pilot", STUDIES / "paired-verdict" /
                                                  "pilot.py")
    pilot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pilot)
    jobs = pilot.jobs()
    assert len(jobs) == len(pilot.GRID) * len(pilot.DEV_SEEDS)
    for job in jobs:
        argv = list(job.argv)
        assert argv[argv.index("--eval-split") + 1] == "eval"
        assert argv[argv.index("--credit") + 1] == "none"
        assert int(argv[argv.index("--seed") + 1]) in pilot.DEV_SEEDS
        rows = (int(argv[argv.index("--num-prompts") + 1])
                * int(argv[argv.index("--num-generations") + 1]))
        assert argv[argv.index("--trl") + 1] == f"gradient_accumulation_steps={rows // 8}"
    # point by point in the pilot's order: one recipe's seeds all run before the next's
    assert sorted(pilot.ORDER) == sorted(pilot.GRID)
    n = len(pilot.DEV_SEEDS)
    for i, point in enumerate(pilot.ORDER):
        assert [j.name for j in jobs[i * n:(i + 1) * n]] == [
            pilot.run_name(point, seed) for seed in pilot.DEV_SEEDS]


def test_the_pilots_tuning_table_reads_its_records(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("pilot_table", STUDIES / "paired-verdict" /
                                                  "pilot.py")
    pilot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pilot)
    monkeypatch.setattr(pilot, "RECORDS", tmp_path)
    point = next(iter(pilot.GRID))
    gains = [0.12, 0.15, 0.10, 0.14, 0.13]
    for seed, gain in zip(pilot.DEV_SEEDS, gains, strict=True):
        folder = tmp_path / pilot.run_name(point, seed)
        folder.mkdir()
        rows = [{"step": 0, "accuracy": 0.30, "truncated": 0.2},
                {"step": 6, "accuracy": 0.30 + gain / 2, "truncated": 0.1},
                {"step": 12, "accuracy": 0.30 + gain, "truncated": 0.05}]
        (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / driver.MARKER).write_text("{}")
    table = pilot.tuning_table()
    lines = [line for line in table.splitlines() if line.startswith(f"| `{point}`")]
    assert len(lines) == 2
    # step 12: mean gain +12.8 points, sd 1.9: the bar holds with 5 seeds
    assert "| 12 | 5 | 30.0 | 42.8 | +12.8 | 1.9 | 5.0% | yes |" in lines[1]
    assert lines[0].endswith("| no |")  # step 6: +6.4 points
