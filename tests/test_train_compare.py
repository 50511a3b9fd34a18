"""``ktae compare``: grid runs, markdown table, curves; re-running reuses finished runs."""

from __future__ import annotations

import json

import pytest
import torch
from test_train_helpers import save_tiny_model

from ktae.cli import main

pytestmark = pytest.mark.slow


def test_compare_grid(tmp_path, capsys):
    torch.set_num_threads(1)
    model = save_tiny_model(tmp_path / "model")
    root = tmp_path / "cmp"
    argv = ["compare", "--model", str(model), "--credit", "none,ktae", "--seeds", "2",
            "--max-steps", "1", "--num-prompts", "2", "--num-generations", "4",
            "--max-new-tokens", "6", "--train-size", "32", "--eval-size", "4",
            "--output-dir", str(root), "--no-progress"]
    assert main(argv) == 0
    text = (root / "comparison.md").read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| none") or ln.startswith("| ktae")]
    assert len(rows) == 2 and all("| 2 |" in r for r in rows)
    assert "±" in rows[0]
    data = json.loads((root / "comparison.json").read_text())
    assert sorted(data) == ["ktae", "none"] and all(len(v) == 2 for v in data.values())
    assert {r["steps"] for v in data.values() for r in v} == {1}
    assert (root / "curves.png").read_bytes()[:4] == b"\x89PNG"
    for credit in ("none", "ktae"):
        for seed in (0, 1):
            assert (root / f"{credit}-seed{seed}" / "summary.json").exists()
    capsys.readouterr()
    assert main(argv) == 0  # second call reuses the finished runs
    assert capsys.readouterr().err.count("reused") == 4


def test_compare_rejects_bad_credit(tmp_path, capsys):
    assert main(["compare", "--credit", "none,magic", "--output-dir", str(tmp_path)]) == 2
    assert "magic" in capsys.readouterr().err


def test_short_runs_still_show_on_the_sampled_accuracy_panel(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from ktae.train.cli_compare import plot_curves

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    run = {"evals": [{"step": 0, "accuracy": 0.5}, {"step": 2, "accuracy": 0.6}],
           "metrics": [{"round1_accuracy": 0.5}, {"round1_accuracy": 0.3}]}
    plot_curves({"none": [run]}, tmp_path / "curves.png")
    right = figures[0].axes[1]
    (line,) = right.get_lines()
    assert line.get_marker() == "o" and list(line.get_ydata()) == pytest.approx([0.4])
    assert right.get_ylabel() == "sampled accuracy (2-step mean)"


def test_compare_reuses_a_finished_run_only_with_its_settings(tmp_path, capsys):
    torch.set_num_threads(1)
    model = save_tiny_model(tmp_path / "model")
    root = tmp_path / "cmp"
    argv = ["compare", "--model", str(model), "--credit", "none", "--seeds", "1",
            "--max-steps", "1", "--num-prompts", "2", "--num-generations", "2",
            "--max-new-tokens", "4", "--train-size", "8", "--eval-size", "2", "--algo", "grpo",
            "--output-dir", str(root), "--no-progress"]
    assert main(argv) == 0
    run = root / "none-seed0"
    config = (run / "config.yaml").read_text()
    capsys.readouterr()
    assert main([*argv, "--lr", "0.01"]) == 2
    err = capsys.readouterr().err
    assert err == (f"ktae compare: {run}: settings differ from the run's: "
                   "lr 3e-05 -> 0.01\n")
    assert (run / "config.yaml").read_text() == config
    assert main(argv) == 0
    assert "done, reused" in capsys.readouterr().err
