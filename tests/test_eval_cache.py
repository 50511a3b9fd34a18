"""``ktae eval`` results are reused only when the weights, data and settings that
produced them are unchanged, and never land on another model's results."""

from __future__ import annotations

import json

import pytest
from test_train_helpers import save_tiny_model

from ktae.cli import main
from ktae.eval import runner as runner_mod
from ktae.runs.rundir import mark_checkpoint_complete

SHORT = ["--template", "compact", "--max-new-tokens", "4", "--no-progress"]


def _checkpoint(run, step, seed):
    path = run / f"checkpoint-{step}"
    path.mkdir(parents=True, exist_ok=True)
    save_tiny_model(path, seed=seed)
    (path / "trainer_state.json").write_text("{}")
    mark_checkpoint_complete(path, step)
    return path


def _data(path, answers=("2", "4", "6")):
    path.mkdir(exist_ok=True)
    (path / "math500.jsonl").write_text("".join(
        json.dumps({"problem": f"{a}+{a}", "answer": ans, "unique_id": f"t/{a}"}) + "\n"
        for a, ans in zip((1, 2, 3), answers, strict=True)))
    return path


@pytest.fixture()
def count_evaluations(monkeypatch):
    calls = []
    real = runner_mod.evaluate

    def counting(model, tokenizer, records, **kwargs):
        calls.append(kwargs["model_path"])
        return real(model, tokenizer, records, **kwargs)

    monkeypatch.setattr(runner_mod, "evaluate", counting)
    return calls


def test_checkpoint_cache_follows_weights_data_and_samples(tmp_path, capsys, count_evaluations):
    run = tmp_path / "run"
    ck2, ck4 = _checkpoint(run, 2, 0), _checkpoint(run, 4, 1)
    data = _data(tmp_path / "data")
    out = tmp_path / "eval"
    args = ["eval", str(run), "--checkpoints", "all", "--benchmarks", "math500",
            "--data-dir", str(data), *SHORT, "-o", str(out)]

    def cached():
        rows = json.loads((out / "checkpoints.json").read_text())["checkpoints"]
        return {r["label"]: r["cached"] for r in rows}

    assert main(args) == 0
    assert cached() == {"checkpoint-2": False, "checkpoint-4": False}
    assert main(args) == 0
    assert cached() == {"checkpoint-2": True, "checkpoint-4": True}
    assert len(count_evaluations) == 2

    # retrained (or overwritten) weights of checkpoint-2: evaluated again
    save_tiny_model(ck2, seed=5)
    mark_checkpoint_complete(ck2, 2)
    assert main(args) == 0
    assert cached() == {"checkpoint-2": False, "checkpoint-4": True}
    assert count_evaluations[-1] == str(ck2)

    # edited benchmark data: every checkpoint evaluated again
    _data(data, answers=("2", "4", "7"))
    assert main(args) == 0
    assert cached() == {"checkpoint-2": False, "checkpoint-4": False}

    # a deleted samples file is written again
    (out / "checkpoint-4" / "samples_math500.jsonl").unlink()
    assert main(args) == 0
    assert cached() == {"checkpoint-2": True, "checkpoint-4": False}
    assert (out / "checkpoint-4" / "samples_math500.jsonl").is_file()
    assert count_evaluations[-1] == str(ck4)
    results = json.loads((out / "checkpoint-4" / "results.json").read_text())
    assert results["config"]["cache_key"]["checkpoint"] == {"label": "checkpoint-4", "step": 4}
    assert "model.safetensors" in results["config"]["cache_key"]["weights"]


def test_incomplete_checkpoints_are_named(tmp_path, capsys):
    run = tmp_path / "run"
    _checkpoint(run, 2, 0)
    (run / "checkpoint-6").mkdir()  # no weights, no marker
    data = _data(tmp_path / "data")
    assert main(["eval", str(run), "--checkpoints", "all", "--benchmarks", "math500",
                 "--data-dir", str(data), *SHORT, "-o", str(tmp_path / "o")]) == 0
    assert "skipped checkpoint-6: incomplete" in capsys.readouterr().out


def test_same_last_component_never_shares_a_default_output(tmp_path, monkeypatch, capsys,
                                                          count_evaluations):
    from ktae.eval.cache import default_output_dir

    a = save_tiny_model(tmp_path / "runs" / "a" / "final", seed=0)
    b = save_tiny_model(tmp_path / "runs" / "b" / "final", seed=1)
    monkeypatch.chdir(tmp_path)
    base = ["--benchmarks", "embedded", "--limit", "2", *SHORT]
    assert main(["eval", str(a), *base]) == 0
    assert main(["eval", str(b), *base]) == 0
    out_a, out_b = default_output_dir(str(a)), default_output_dir(str(b))
    assert out_a != out_b and out_a.name.startswith("a-final-") \
        and out_b.name.startswith("b-final-")
    for model, out in ((a, out_a), (b, out_b)):
        results = json.loads((tmp_path / out / "results.json").read_text())
        assert results["config"]["model"] == str(model)
    assert default_output_dir("Qwen/Qwen2.5-Math-1.5B").name == "Qwen--Qwen2.5-Math-1.5B"

    # an explicit directory holding another model's results is not replaced...
    shared = tmp_path / "shared"
    assert main(["eval", str(a), *base, "-o", str(shared)]) == 0
    before = (shared / "results.json").read_text()
    assert main(["eval", str(b), *base, "-o", str(shared)]) == 2
    err = capsys.readouterr().err
    assert "holds the results of another model" in err and "--overwrite" in err
    assert (shared / "results.json").read_text() == before
    # ... unless asked
    assert main(["eval", str(b), *base, "-o", str(shared), "--overwrite"]) == 0
    assert json.loads((shared / "results.json").read_text())["config"]["model"] == str(b)
    # the identical evaluation is read back; another setting is evaluated again
    n = len(count_evaluations)
    assert main(["eval", str(b), *base, "-o", str(shared)]) == 0
    assert "cached:" in capsys.readouterr().out and len(count_evaluations) == n
    assert main(["eval", str(b), *base, "-o", str(shared), "--seed", "3"]) == 0
    assert len(count_evaluations) == n + 1
