"""``ktae audit`` end to end: the shipped model sampled on the spot, a ``ktae train`` run
directory, a JSONL of user-labelled groups, and bad input."""

from __future__ import annotations

import json

import pytest

import ktae
from ktae.cli import main

METHODS = "grpo,ktae,taco,ktae@ngram=2,forking-tokens"


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


GROUPS = [
    {"id": "carry", "prompt": "Q:37+45-18 A:", "level": "hard", "rewards": [1, 0, 0, 1],
     "responses": ["37+45=82. 82-18=64. \\boxed{64}", "37+45=72. 72-18=54. \\boxed{54}",
                   "37+45=82. 82-18=74. \\boxed{74}", "37+45=72. 72-18=64. \\boxed{64}"],
     "wrong": [[], [[6, 8]], [[16, 18]], [[6, 8], [16, 18]]]},
    {"prompt": "Q:5+3 A:", "level": "easy", "rewards": [1, 0, 0],
     "responses": ["5+3=8. \\boxed{8}", "5+3=9. \\boxed{9}", "5+3=8. \\boxed{7}"],
     "wrong": [[], [[4, 5]], [[14, 15]]], "checked": [[[0, 6]], [[0, 6]], [[0, 6]]]},
]


def _one_error_line(capsys, start: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert err.startswith(f"ktae audit: {start}"), err
    return err


@pytest.mark.slow
def test_audit_of_the_shipped_model(tmp_path, capsys):
    out = tmp_path / "audit"
    args = ["--prompts", "6", "--samples", "4", "--credit", METHODS, "--resamples", "50"]
    assert main(["audit", "--model", "default", *args, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "blame localisation best:" in printed and "wrote " in printed
    result = json.loads((out / "audit.json").read_text())
    assert list(result["methods"]) == METHODS.split(",")
    grpo = result["methods"]["grpo"]["all"]
    assert grpo["blame"]["mean"] == 0.5 and grpo["blame"]["responses"] > 0
    assert grpo["lowest"]["mean"] == pytest.approx(grpo["chance"]["mean"])
    assert result["counts"]["mixed_groups"] > 0 and result["levels"] == ["1", "2", "3"]
    for name in ("audit_blame.png", "audit_lowest.png", "audit_contamination.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "audit.md").read_text()
    assert "| ktae@ngram=2 |" in table and "per level" in table
    # the Python API computes the same figures
    again = ktae.audit(model="default", prompts=6, samples=4, credit=["grpo", "ktae"],
                       resamples=50)
    for name in ("grpo", "ktae"):
        assert again["methods"][name]["all"] == result["methods"][name]["all"]


def _train(run, *args) -> int:
    return main(["train", "--num-prompts", "8", "--num-generations", "4",
                 "--max-new-tokens", "40", "--eval-size", "4", "--eval-every", "0",
                 "--train-size", "64", "--save-every", "0", "--no-progress", "--algo", "grpo",
                 "--rollout-every", "1", "--rollout-groups", "8", "--output-dir", str(run),
                 *args])


@pytest.mark.slow
def test_train_then_audit_the_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(run, "--max-steps", "2", "--credit", "none") == 0
    capsys.readouterr()
    out = tmp_path / "audit"
    assert main(["audit", str(run), "--credit", "grpo,ktae,taco", "--resamples", "20",
                 "-o", str(out)]) == 0
    result = json.loads((out / "audit.json").read_text())
    assert result["kind"] == "run" and result["steps"] == [1, 2]
    assert set(result["methods"]["ktae"]["steps"]) == {"1", "2"}
    assert result["scored_with"] != "recorded"  # a GRPO run records no log-probs: scored
    assert "per recorded step" in (out / "audit.md").read_text()
    assert (out / "audit_blame.png").stat().st_size > 0
    # a run trained with a calibration recorded the log-probs and entropies it read
    cal_run = tmp_path / "taco-run"
    assert _train(cal_run, "--max-steps", "1", "--credit", "ktae+taco") == 0
    result = ktae.audit(cal_run, credit="taco,ktae+taco", resamples=0)
    assert result["scored_with"] == "recorded" and result["steps"] == [1]


def test_audit_of_user_labelled_groups(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "groups.jsonl", GROUPS)
    out = tmp_path / "audit"
    assert main(["audit", str(src), "--credit", "grpo,ktae@ngram=2", "--resamples", "20",
                 "-o", str(out)]) == 0
    result = json.loads((out / "audit.json").read_text())
    assert result["kind"] == "jsonl" and result["levels"] == ["easy", "hard"]
    grpo = result["methods"]["grpo"]
    # wrong answers holding a wrong token: 2 + 2; right answers holding one: 1
    assert grpo["all"]["blame"]["responses"] == 4 and grpo["all"]["blame"]["mean"] == 0.5
    assert grpo["all"]["contamination"]["responses"] == 1
    # GRPO spreads the right answer's credit evenly: 4 wrong characters out of 30
    assert grpo["all"]["contamination"]["mean"] == pytest.approx(4 / 30)
    # "checked" leaves all but the easy group's equations unjudged (10 characters of each
    # response), except a wrong span outside it (the box of the third response)
    assert result["counts"]["tokens"]["other"] == 10 + 10 + 9
    # a self-teacher: every response but the easy group's only right answer has another
    assert result["counts"]["groups_with_right_answer"] == 2
    assert result["counts"]["responses_with_teacher"] == 6
    assert "6 responses have another right answer" in (out / "audit.md").read_text()


@pytest.mark.slow
def test_user_labelled_groups_scored_by_the_shipped_model(tmp_path):
    src = _write_jsonl(tmp_path / "groups.jsonl", GROUPS)
    result = ktae.audit(src, credit="taco,gtpo", resamples=0)
    assert result["scored_with"].endswith("embedded-cc11645a8340")
    assert result["methods"]["taco"]["all"]["contamination"]["responses"] == 1


@pytest.mark.parametrize(("args", "start"), [
    (["--model", "default", "--credit", "grpo,bogus"], "credit: 'bogus'"),
    (["--model", "default", "--credit", "ktae@nope=1"], "credit: 'nope'"),
    (["--model", "default", "--samples", "1"], "samples: expected"),
    (["--model", "default", "--prompts", "0"], "prompts: expected"),
    (["--model", "default", "--threads", "0"], "threads: expected"),
    ([], "INPUT: give"),
    (["no/such/file.jsonl"], "INPUT: no such"),
])
def test_bad_arguments_are_one_line(args, start, capsys):
    assert main(["audit", *args]) == 2
    _one_error_line(capsys, start)


def test_bad_labels_are_one_line(tmp_path, capsys):
    bad = [dict(GROUPS[1], wrong=[[], [[4, 99]], []])]
    src = _write_jsonl(tmp_path / "outside.jsonl", bad)
    assert main(["audit", str(src), "--credit", "grpo"]) == 2
    assert "outside the response's 16 characters" in _one_error_line(capsys, "INPUT: ")
    unlabelled = [{k: v for k, v in GROUPS[1].items() if k != "wrong"}]
    _write_jsonl(src, unlabelled)
    assert main(["audit", str(src), "--credit", "grpo"]) == 2
    assert "expected 'wrong'" in _one_error_line(capsys, "INPUT: ")
    all_right = [dict(GROUPS[1], rewards=[1, 1, 1])]
    _write_jsonl(src, all_right)
    assert main(["audit", str(src), "--credit", "grpo"]) == 2
    _one_error_line(capsys, "INPUT: no mixed group")


@pytest.mark.slow
def test_sampling_options_and_a_tokenizer_directory(tmp_path):
    from ktae.runs.reader import default_tokenizer_path

    out = tmp_path / "audit"
    assert main(["audit", "--model", "default", "--prompts", "8", "--samples", "4", "--seed",
                 "1", "--max-new-tokens", "30", "--temperature", "0.8", "--credit",
                 "grpo,ktae", "--resamples", "10", "-o", str(out)]) == 0
    result = json.loads((out / "audit.json").read_text())
    assert "temperature 0.8, seed 1, at most 30 new tokens" in result["input"]
    src = _write_jsonl(tmp_path / "groups.jsonl", GROUPS)
    assert main(["audit", str(src), "--tokenizer", str(default_tokenizer_path()),
                 "--credit", "grpo", "-o", str(out), "--overwrite"]) == 0
    assert json.loads((out / "audit.json").read_text())["kind"] == "jsonl"


def test_a_runs_own_methods_keep_its_settings():
    """Auditing a run directory scores the run's estimator with the run's settings (here the
    graded split), as ktae explain does; other methods keep their defaults."""
    from ktae.credit_audit.run import parse_methods
    from ktae.runs.config import TrainConfig

    cfg = TrainConfig(credit="ktae", estimator_options={"split": "graded"})
    methods = parse_methods("grpo,ktae,ktae@ngram=3", train_config=cfg)
    assert methods["ktae"].estimator_options.get("split") == "graded"
    assert methods["ktae@ngram=3"].estimator_options.get("split") == "graded"
    assert "split" not in parse_methods("ktae")["ktae"].estimator_options
