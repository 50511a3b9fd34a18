"""``ktae eval`` over several runs: mean and std over runs, kept apart from the spread
of the samples within a run."""

from __future__ import annotations

import json
import statistics

import pytest
from test_train_helpers import save_tiny_model

from ktae.cli import main

ARGS = ["--benchmarks", "embedded", "--limit", "6", "--k", "2", "--temperature", "1.0",
        "--template", "compact", "--max-new-tokens", "4", "--no-progress"]


def test_a_compare_directory_gives_mean_and_std_over_runs(tmp_path, capsys):
    from ktae.eval.multirun import expand_models, summary_markdown

    root = tmp_path / "compare"
    for i, name in enumerate(("ktae-seed0", "ktae-seed1", "none-seed0")):
        save_tiny_model(root / name / "final", seed=i)
    (root / "comparison.md").write_text("")
    assert expand_models([str(root)]) == [str(root / n / "final")
                                          for n in ("ktae-seed0", "ktae-seed1", "none-seed0")]
    out = tmp_path / "out"
    assert main(["eval", str(root), *ARGS, "-o", str(out)]) == 0
    runs = {n: json.loads((out / n / "results.json").read_text())
            for n in ("ktae-seed0", "ktae-seed1", "none-seed0")}
    summary = json.loads((out / "summary.json").read_text())
    ktae = summary["groups"]["ktae"]
    assert ktae["runs"] == ["ktae-seed0", "ktae-seed1"]
    accs = [runs[n]["results"]["embedded"] for n in ("ktae-seed0", "ktae-seed1")]
    assert ktae["embedded"]["mean"] == pytest.approx(statistics.fmean(accs))
    assert ktae["embedded"]["std"] == pytest.approx(statistics.stdev(accs))
    assert ktae["embedded"]["within_run_std"] == pytest.approx(statistics.fmean(
        runs[n]["benchmarks"]["embedded"]["accuracy_std"] for n in ("ktae-seed0", "ktae-seed1")))
    assert summary["groups"]["none"]["embedded"]["std"] == 0.0
    assert summary["groups"]["none"]["avg"]["mean"] == runs["none-seed0"]["avg"]
    md = (out / "summary.md").read_text()
    assert "| runs | n | embedded | avg |" in md
    assert md == summary_markdown(summary) and md in capsys.readouterr().out


def test_several_model_directories(tmp_path):
    a = save_tiny_model(tmp_path / "a", seed=0)
    b = save_tiny_model(tmp_path / "b", seed=1)
    out = tmp_path / "out"
    assert main(["eval", str(a), str(b), *ARGS, "-o", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["groups"]) == {"a", "b"}
    assert (out / "a" / "results.json").is_file() and (out / "b" / "results.json").is_file()


def test_aggregate_keeps_benchmarks_as_columns_and_avg_last():
    from ktae.eval.multirun import aggregate, group_of, summary_markdown

    def res(acc, std):
        return {"results": {"x": acc, "y": 1 - acc}, "avg": 0.5,
                "benchmarks": {"x": {"accuracy_std": std}, "y": {"accuracy_std": 0.0}}}

    summary = aggregate({"r-seed0": res(0.2, 0.1), "r-seed1": res(0.4, 0.3)})
    row = summary["groups"]["r"]
    assert row["x"]["mean"] == pytest.approx(0.3) and row["x"]["within_run_std"] == 0.2
    assert row["x"]["std"] == pytest.approx(statistics.stdev([0.2, 0.4]))
    md = summary_markdown(summary)
    assert "| r | 2 | 30.0 ± 14.1 | 70.0 ± 14.1 | 50.0 ± 0.0 |" in md
    assert group_of("ktae-ngram=3-seed12") == "ktae-ngram=3"
