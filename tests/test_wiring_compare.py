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
from ktae.train.cli_compare import markdown_table, summarize
from ktae.train.rundir import prepare_output_dir

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


def test_first_seed_moves_the_grid_to_seeds_kept_aside(tmp_path, capsys, monkeypatch):
    """``--first-seed K --seeds N`` trains and tables seeds K..K+N-1 only."""
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
    argv = ["compare", "--credit", "none", "--first-seed", "1", "--seeds", "2", "--max-steps",
            str(STEPS), "--num-prompts", "2", "--num-generations", "4", "--max-new-tokens", "6",
            "--train-size", "32", "--eval-size", "4", "--output-dir", str(root),
            "--no-progress"]
    assert main(argv) == 0
    capsys.readouterr()
    assert trained == [("none", 1), ("none", 2)]
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
