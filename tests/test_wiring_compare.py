"""``ktae compare``'s table is the mean ± sample std over seeds of each run's numbers,
checked against numpy on known per-seed values (no model is trained: the runs are written
with those numbers)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ktae.cli import main
from ktae.runs.rundir import prepare_output_dir
from ktae.train.cli_compare import markdown_table, summarize

SEEDS = 3
STEPS = 2

#: Per arm, per seed: the summary numbers the table averages (None: not measured).
VALUES = {
    "none": dict(heldout_before=[0.10, 0.20, 0.40], heldout_after=[0.30, 0.50, 0.55],
                 heldout_carry_after=[0.05, 0.25, 0.30], final_response_length=[12.0, 15.0, 21.0],
                 mean_step_seconds=[0.125, 0.5, 0.25], advantage_share=[0.01, 0.02, 0.06]),
    "ktae": dict(heldout_before=[0.15, 0.15, 0.45], heldout_after=[0.60, 0.20, 0.35],
                 heldout_carry_after=[None, None, None], final_response_length=[9.0, 8.0, 4.0],
                 mean_step_seconds=[1.0, 2.0, 4.5], advantage_share=[0.30, 0.10, 0.20]),
}

#: Table column -> (summary key, scale, digits), as ``ktae compare`` prints them.
COLUMNS = {
    "acc. before (%)": ("heldout_before", 100.0, 1),
    "acc. after (%)": ("heldout_after", 100.0, 1),
    "carry/borrow after (%)": ("heldout_carry_after", 100.0, 1),
    "response length": ("final_response_length", 1.0, 1),
    "step time (s)": ("mean_step_seconds", 1.0, 3),
    "advantage share (%)": ("advantage_share", 100.0, 2),
}


def _write_run(run: Path, arm: str, seed: int) -> None:
    """A finished-looking run directory holding the known numbers of ``arm``, ``seed``."""
    values = VALUES[arm]
    prepare_output_dir(run, resume=True, write=True)
    summary = {"is_main": True, "steps": STEPS, **{k: v[seed] for k, v in values.items()}}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "eval.jsonl").write_text("".join(
        json.dumps({"step": s, "accuracy": a}) + "\n"
        for s, a in ((0, values["heldout_before"][seed]),
                     (STEPS, values["heldout_after"][seed]))))
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "round1_accuracy": 0.1 * s + 0.01 * seed}) + "\n"
        for s in range(1, STEPS + 1)))


def _write_runs(root):
    for arm in VALUES:
        for seed in range(SEEDS):
            _write_run(root / f"{arm}-seed{seed}", arm, seed)


def _expected(values, scale, digits) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "n/a"
    mean, std = np.mean(present), np.std(present, ddof=1)
    return f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}"


def _cells(text: str) -> dict[str, dict[str, str]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def _check(rows):
    assert set(rows) == set(VALUES)
    for arm, values in VALUES.items():
        assert rows[arm]["seeds"] == str(SEEDS)
        for column, (key, scale, digits) in COLUMNS.items():
            assert rows[arm][column] == _expected(values[key], scale, digits), (arm, column)


def test_expected_values_spread():
    """The chosen values tell mean ± std from the first seed ± 0 in every measured column."""
    for values in VALUES.values():
        for key, scale, digits in COLUMNS.values():
            if values[key][0] is not None:
                first = f"{scale * values[key][0]:.{digits}f} ± {0:.{digits}f}"
                assert _expected(values[key], scale, digits) != first


def test_markdown_table_is_mean_and_sample_std(tmp_path):
    _write_runs(tmp_path)
    table = summarize(tmp_path, list(VALUES), list(range(SEEDS)))
    text = markdown_table(table, algo="dapo", steps=STEPS)
    _check(_cells(text))


def test_one_seed_has_std_zero(tmp_path):
    _write_runs(tmp_path)
    table = summarize(tmp_path, ["none"], [1])
    rows = _cells(markdown_table(table, algo="dapo", steps=STEPS))
    assert rows["none"]["acc. after (%)"] == "50.0 ± 0.0"


def test_compare_command_writes_the_table_of_its_runs(tmp_path, capsys, monkeypatch):
    """The whole command, with ``train`` replaced by one that writes each run's known
    numbers: every (credit, seed) runs once, in its own directory, and the table and
    ``comparison.json`` hold their mean ± std and per-seed values."""
    from ktae.train import session

    root = tmp_path / "cmp"
    trained = []

    def fake_train(cfg, **kwargs):
        out = Path(cfg.output_dir)
        arm, seed = out.name.rsplit("-seed", 1)
        assert (cfg.credit, cfg.seed) == (arm, int(seed))
        trained.append((arm, int(seed)))
        _write_run(out, arm, int(seed))
        return {"steps": STEPS}

    monkeypatch.setattr(session, "train", fake_train)
    argv = ["compare", "--credit", ",".join(VALUES), "--seeds", str(SEEDS), "--max-steps",
            str(STEPS), "--num-prompts", "2", "--num-generations", "4", "--max-new-tokens", "6",
            "--train-size", "32", "--eval-size", "4", "--output-dir", str(root),
            "--no-progress"]
    assert main(argv) == 0
    capsys.readouterr()
    assert sorted(trained) == sorted((a, s) for a in VALUES for s in range(SEEDS))
    text = (root / "comparison.md").read_text()
    _check(_cells(text))
    data = json.loads((root / "comparison.json").read_text())
    for arm, values in VALUES.items():
        for key, per_seed in values.items():
            assert [r[key] for r in data[arm]] == pytest.approx(per_seed)
    assert re.search(r"after 2 steps of\s+dapo", text)


def test_first_seed_moves_the_grid_to_seeds_kept_aside(tmp_path, capsys, fake_session):
    """``--first-seed K --seeds N`` trains and tables seeds K..K+N-1 only."""
    root = tmp_path / "cmp"
    assert main(_argv(root, "--credit", "none", "--first-seed", "1", "--seeds", "2")) == 0
    capsys.readouterr()
    assert [(c.credit, c.seed) for c in fake_session["train"]] == [("none", 1), ("none", 2)]
    data = json.loads((root / "comparison.json").read_text())
    assert [r["heldout_after"] for r in data["none"]] == pytest.approx([0.50, 0.55])
    assert _cells((root / "comparison.md").read_text())["none"]["seeds"] == "2"


def test_two_seeds_have_their_sample_std_and_the_runs_curves(tmp_path):
    _write_runs(tmp_path)
    table = summarize(tmp_path, ["none"], [0, 1])
    text = markdown_table(table, algo="grpo", steps=STEPS, task="jsonl:data/train.jsonl")
    assert _cells(text)["none"]["acc. after (%)"] == _expected([0.30, 0.50], 100.0, 1)
    assert "on the held-out part of jsonl:data/train.jsonl after 2 steps of grpo" in text
    assert "on the embedded test split" in markdown_table(table, algo="grpo", steps=STEPS)
    assert [e["step"] for e in table["none"][1]["evals"]] == [0, STEPS]
    assert [m["step"] for m in table["none"][1]["metrics"]] == list(range(1, STEPS + 1))


# ---- the whole command with a fake trainer that leaves real run directories ------------------

def _finished_run(cfg) -> None:
    """What ``ktae train`` leaves in a finished run directory, with ``VALUES``' numbers:
    the run marker, the saved settings, a complete last checkpoint, the finished mark."""
    import dataclasses

    from ktae.runs.rundir import claim_checkpoint, mark_checkpoint_complete, mark_run_finished

    out = Path(cfg.output_dir)
    _write_run(out, cfg.credit, cfg.seed)
    dataclasses.replace(cfg, resume=False).save(out / "config.yaml")
    ckpt = out / f"checkpoint-{cfg.max_steps}"
    claim_checkpoint(ckpt)
    (ckpt / "model.safetensors").write_text("weights")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": cfg.max_steps}))
    mark_checkpoint_complete(ckpt, cfg.max_steps)
    mark_run_finished(out, cfg.max_steps)


@pytest.fixture
def fake_session(monkeypatch):
    """``train`` and ``preflight`` replaced: records what each was given."""
    from ktae.train import session

    calls = {"train": [], "preflight": []}

    def fake_train(cfg, **kwargs):
        assert cfg.resume is True  # a grid run resumes an interrupted run of its settings
        calls["train"].append(cfg)
        _finished_run(cfg)
        return {"steps": cfg.max_steps}

    monkeypatch.setattr(session, "train", fake_train)
    monkeypatch.setattr(session, "preflight", lambda cfg: calls["preflight"].append(cfg))
    return calls


def _argv(root, *extra):
    return ["compare", "--seeds", "2", "--max-steps", str(STEPS), "--num-prompts", "2",
            "--num-generations", "4", "--max-new-tokens", "6", "--train-size", "32",
            "--eval-size", "4", "--output-dir", str(root), "--no-progress", *extra]


def test_compare_prints_progress_writes_json_and_reuses_finished_runs(tmp_path, capsys,
                                                                       fake_session):
    root = tmp_path / "cmp"
    assert main(_argv(root, "--credit", "none,ktae")) == 0
    captured = capsys.readouterr()
    runs = [("none", 0), ("none", 1), ("ktae", 0), ("ktae", 1)]
    assert [(c.credit, c.seed) for c in fake_session["train"]] == runs
    assert len(fake_session["preflight"]) == 1  # one data setting: read once
    progress = [line for line in captured.err.splitlines() if line.startswith("[")]
    assert progress == [f"[{i + 1}/4] {arm} seed {seed} -> {root / f'{arm}-seed{seed}'}"
                        for i, (arm, seed) in enumerate(runs)]
    assert captured.out.rstrip().endswith(
        f"ktae compare: wrote {root / 'comparison.md'} and {root / 'curves.png'}")
    assert captured.out.startswith((root / "comparison.md").read_text())
    data = json.loads((root / "comparison.json").read_text())
    assert (root / "comparison.json").read_text() == json.dumps(data, indent=2) + "\n"
    assert list(data) == ["none", "ktae"]
    row = data["none"][1]
    assert "evals" not in row and "metrics" not in row
    assert row["heldout_after"] == pytest.approx(VALUES["none"]["heldout_after"][1])
    assert (root / "curves.png").read_bytes()[:4] == b"\x89PNG"

    # the same command again: every run is finished with these settings, none retrains
    assert main(_argv(root, "--credit", "none,ktae")) == 0
    err = capsys.readouterr().err
    assert len(fake_session["train"]) == 4
    assert [line for line in err.splitlines() if line.startswith("[")] == [
        f"[{i + 1}/4] {root / f'{arm}-seed{seed}'} done, reused"
        for i, (arm, seed) in enumerate(runs)]


def test_compare_sets_how_to_continue_and_names_the_task(tmp_path, capsys, fake_session,
                                                          monkeypatch):
    """Ctrl-C during the grid says that finished runs are kept; a task other than the
    embedded one is named in the table's caption."""
    from ktae import cli_common

    hints = []
    monkeypatch.setattr(cli_common, "set_interrupt_hint", hints.append)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i} + 1 =", "answer": str(i + 1)}) + "\n"
                            for i in range(40)))
    root = tmp_path / "cmp"
    assert main(_argv(root, "--credit", "none", "--seeds", "1", "--task", f"jsonl:{data}")) == 0
    capsys.readouterr()
    assert hints == ["finished runs are kept; run the same command again to continue"]
    assert f"on the held-out part of jsonl:{data} after" in (root / "comparison.md").read_text()


def test_compare_reads_each_data_setting_once(tmp_path, capsys, fake_session):
    assert main(_argv(tmp_path / "cmp", "--credit", "none,none@eval_size=6,none@train_size=40"
                      )) == 0
    capsys.readouterr()
    assert len(fake_session["train"]) == 6
    assert len(fake_session["preflight"]) == 1  # sizes are not in the data key
    assert main(_argv(tmp_path / "cmp2", "--credit", "none,none@reward=digits")) == 0
    capsys.readouterr()
    assert [c.reward for c in fake_session["preflight"][1:]] == ["boxed", "digits"]


def test_compare_refuses_a_run_directory_of_other_settings(tmp_path, capsys, fake_session):
    root = tmp_path / "cmp"
    assert main(_argv(root, "--credit", "none", "--seeds", "1")) == 0
    run = root / "none-seed0"
    config = (run / "config.yaml").read_text()
    capsys.readouterr()
    assert main(_argv(root, "--credit", "none", "--seeds", "1", "--lr", "0.01")) == 2
    assert capsys.readouterr().err == (f"ktae compare: {run}: settings differ from the run's: "
                                       "lr 3e-05 -> 0.01\n")
    assert (run / "config.yaml").read_text() == config and len(fake_session["train"]) == 1


def test_compare_refuses_a_directory_or_checkpoint_it_did_not_write(tmp_path, capsys,
                                                                     fake_session):
    root = tmp_path / "cmp"
    run = root / "none-seed0"
    run.mkdir(parents=True)
    (run / "notes.txt").write_text("someone else's")
    assert main(_argv(root, "--credit", "none", "--seeds", "1")) == 2
    assert capsys.readouterr().err == (
        f"ktae compare: {run} is not empty and is not a ktae run directory (it has no "
        "ktae_run.json; ktae writes only into its own runs): choose a new or empty "
        "--output-dir\n")
    (run / "notes.txt").unlink()
    prepare_output_dir(run, resume=True, write=True)  # a run of ours, interrupted early
    foreign = run / f"checkpoint-{STEPS}"
    foreign.mkdir()
    (foreign / "weights.bin").write_text("someone else's")
    assert main(_argv(root, "--credit", "none", "--seeds", "1")) == 2
    assert capsys.readouterr().err == (
        f"ktae compare: {foreign} was not written by ktae, and the run would write its "
        "checkpoint there; move it out of the run directory\n")  # names its run already
    assert fake_session["train"] == []
