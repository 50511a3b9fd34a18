"""``ktae eval RUN --checkpoints all --select-on embedded`` on a run that kept every
checkpoint (``ktae train --save-total-limit 0``): each one is evaluated, the best named."""

from __future__ import annotations

import json

import pytest
import torch

from ktae.cli import main

pytestmark = pytest.mark.slow


def test_checkpoints_all_of_a_run_that_keeps_every_checkpoint(tiny_model, tmp_path, capsys):
    torch.set_num_threads(1)
    run = tmp_path / "run"
    assert main(["train", "--model", str(tiny_model), "--output-dir", str(run), "--algo",
                 "grpo", "--max-steps", "3", "--save-every", "1", "--save-total-limit", "0",
                 "--num-prompts", "2", "--num-generations", "2", "--max-new-tokens", "4",
                 "--train-size", "8", "--eval-size", "2", "--eval-every", "0",
                 "--rollout-every", "0", "--threads", "1", "--no-progress"]) == 0
    # the default limit (2) would have kept only the last two
    labels = ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert sorted(p.name for p in run.glob("checkpoint-*")) == labels
    capsys.readouterr()

    out = tmp_path / "eval"
    assert main(["eval", str(run), "--checkpoints", "all", "--select-on", "embedded",
                 "--benchmarks", "embedded", "--limit", "4", "--threads", "1",
                 "--no-progress", "-o", str(out)]) == 0
    stdout = capsys.readouterr().out
    summary = json.loads((out / "checkpoints.json").read_text())
    assert [r["label"] for r in summary["checkpoints"]] == labels
    assert [r["step"] for r in summary["checkpoints"]] == [1, 2, 3]
    for row in summary["checkpoints"]:
        results = json.loads((out / row["label"] / "results.json").read_text())
        assert results["config"]["checkpoint"] == row["label"]
        assert row["scores"]["embedded"] == results["results"]["embedded"]
    scores = [r["scores"]["embedded"] for r in summary["checkpoints"]]
    best = summary["checkpoints"][scores.index(max(scores))]  # the earliest on a tie
    assert summary["select_on"] == "embedded" and summary["best"] == best
    assert f"best checkpoint on embedded: {best['label']} (step {best['step']}," in stdout
