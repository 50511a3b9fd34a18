"""``ktae eval RUN_DIR --checkpoints all``: a real 4-step run, checkpoints every 2 steps."""

from __future__ import annotations

import json

import pytest
from test_train_helpers import contains_digit, tiny_config

from ktae.cli import main
from ktae.eval import sweep as sweep_mod
from ktae.eval.sweep import best_checkpoint, run_checkpoints

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tiny_model, tmp_path_factory):
    from ktae.train.session import train

    out = tmp_path_factory.mktemp("sweep") / "run"
    cfg = tiny_config(tiny_model, out, max_steps=4, save_every=2, algo="grpo", credit="ktae")
    train(cfg, reward_funcs=[contains_digit])
    return out


def test_checkpoints_all_evaluates_each_once_and_names_the_best(run_dir, tmp_path, capsys,
                                                                 monkeypatch):
    assert [(c.label, c.step) for c in run_checkpoints(run_dir)] == \
        [("checkpoint-2", 2), ("checkpoint-4", 4)]
    out = tmp_path / "eval"
    data = tmp_path / "data"  # short problems: the tiny model's context is 128 tokens
    data.mkdir()
    (data / "math500.jsonl").write_text("".join(
        json.dumps({"problem": f"{a}+{a}", "answer": str(2 * a), "unique_id": f"t/{a}"}) + "\n"
        for a in (1, 2, 3)))
    args = ["eval", str(run_dir), "--checkpoints", "all", "--benchmarks", "embedded,math500",
            "--data-dir", str(data), "--limit", "3", "--k", "embedded=2,1", "--temperature", "1.0",
            "--select-on", "embedded", "--no-progress", "-o", str(out)]
    assert main(args) == 0
    stdout = capsys.readouterr().out
    summary = json.loads((out / "checkpoints.json").read_text())
    assert [r["label"] for r in summary["checkpoints"]] == ["checkpoint-2", "checkpoint-4"]
    assert [r["cached"] for r in summary["checkpoints"]] == [False, False]
    for row in summary["checkpoints"]:
        results = json.loads((out / row["label"] / "results.json").read_text())
        assert results["config"]["checkpoint"] == row["label"]
        assert results["config"]["step"] == row["step"]
        assert results["config"]["k"] == {"embedded": 2, "math500": 1}
        # each checkpoint is prompted as it was trained (its ktae_generation.json)
        assert results["config"]["template"] == "compact"
        assert results["config"]["max_new_tokens"] == 8
        assert row["scores"] == {"avg": results["avg"], **results["results"]}
    best = best_checkpoint(summary["checkpoints"], "embedded")
    assert summary["best"] == best and summary["select_on"] == "embedded"
    assert f"best checkpoint on embedded: {best['label']} (step {best['step']}," in stdout
    png = (out / "checkpoints.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000

    # a second run reads every checkpoint back instead of evaluating it again
    def refuse(*a, **k):
        raise AssertionError("a cached checkpoint was evaluated again")

    monkeypatch.setattr("ktae.eval.runner.evaluate", refuse)
    assert main(args) == 0
    assert "checkpoint-2: cached" in capsys.readouterr().out
    again = json.loads((out / "checkpoints.json").read_text())
    assert [r["cached"] for r in again["checkpoints"]] == [True, True]
    assert again["best"]["label"] == best["label"]
    monkeypatch.undo()

    # other settings (here the seed) are another evaluation; one step can be chosen
    assert main([*args[:-2], "--seed", "1", "--checkpoints", "4", "-o", str(out)]) == 0
    third = json.loads((out / "checkpoints.json").read_text())
    assert [(r["label"], r["cached"]) for r in third["checkpoints"]] == [("checkpoint-4", False)]


def test_checkpoint_errors_come_before_any_model_loads(run_dir, tmp_path, capsys):
    base = ["eval", str(run_dir), "--benchmarks", "embedded", "-o", str(tmp_path / "o")]
    cases = [
        (["--checkpoints", "3"], "--checkpoints: no complete checkpoint for step(s) 3; "
                                 "the run has 2, 4"),
        (["--checkpoints", "x"], "--checkpoints: expected 'all' or comma-separated steps"),
        (["--checkpoints", "all", "--select-on", "math500"],
         "--select-on: math500 is not among --benchmarks"),
        (["--select-on", "embedded"], "--select-on: only with --checkpoints"),
    ]
    for extra, message in cases:
        assert main([*base, *extra]) == 2
        assert message in capsys.readouterr().err
    # checkpoints saved with different budgets need one given explicitly
    import shutil

    mixed = tmp_path / "mixed-run"
    shutil.copytree(run_dir, mixed)
    gen = mixed / "checkpoint-2" / "ktae_generation.json"
    gen.write_text(json.dumps({**json.loads(gen.read_text()), "max_new_tokens": 6}))
    assert main(["eval", str(mixed), "--checkpoints", "all", "--benchmarks", "embedded",
                 "-o", str(tmp_path / "m")]) == 2
    assert "saved with different templates or budgets" in capsys.readouterr().err
    empty = tmp_path / "empty-run"
    empty.mkdir()
    assert main(["eval", str(empty), "--checkpoints", "all"]) == 2
    assert "holds no complete checkpoint-N directory" in capsys.readouterr().err


def test_best_checkpoint_ties_go_to_the_earliest_step():
    rows = [{"step": s, "scores": {"avg": v}} for s, v in ((2, 0.5), (4, 0.7), (6, 0.7))]
    assert best_checkpoint(rows, "avg")["step"] == 4
    assert sweep_mod.score({"avg": 0.3, "results": {"a": 0.1}}, "a") == 0.1
