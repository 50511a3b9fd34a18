"""``ktae audit --prompt-set``: other held-out prompt sets, the default unchanged."""

from __future__ import annotations

import json

import pytest

from ktae.cli import build_parser, main
from ktae.credit_audit.cli import default_output_dir
from ktae.credit_audit.run import audit, prompt_set_problems
from ktae.tasks import generate
from ktae.train.data import EVAL_SEED


def test_the_default_set_is_the_one_of_earlier_audits():
    # what every audit sampled before prompt sets existed
    assert prompt_set_problems(200) == generate(200, split="test", seed=EVAL_SEED)
    assert prompt_set_problems(200, 0) == generate(200, split="test", seed=EVAL_SEED)


def test_prompt_sets_differ_and_are_disjoint():
    sets = [prompt_set_problems(200, k) for k in range(3)]
    questions = [{p.question for p in s} for s in sets]
    assert all(len(s) == 200 for s in sets) and all(len(q) == 200 for q in questions)
    for a in range(3):
        for b in range(a + 1, 3):
            assert not questions[a] & questions[b], (a, b)
    assert {p.level for p in sets[1]} == {1, 2, 3}
    assert prompt_set_problems(200, 1) == sets[1]  # deterministic


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_prompt_set(bad):
    with pytest.raises(ValueError, match="^prompt-set: expected an integer >= 0"):
        prompt_set_problems(10, bad)
    with pytest.raises(ValueError, match="^prompt-set: expected an integer >= 0"):
        audit(model="default", prompt_set=bad)


def test_cli_names_a_prompt_set_in_the_default_folder(capsys):
    args = build_parser(["audit"]).parse_args(["audit", "--model", "default", "--prompt-set", "2"])
    assert args.prompt_set == 2
    assert default_output_dir(args).name.startswith("model-default-200x8-seed0-set2")
    default = build_parser(["audit"]).parse_args(["audit", "--model", "default"])
    assert default.prompt_set == 0
    assert default_output_dir(default).name == "model-default-200x8-seed0"
    assert main(["audit", "--model", "default", "--prompt-set", "-3", "-o", "/nonexistent/x"]
                ) == 2
    assert "prompt-set" in capsys.readouterr().err


def test_the_chosen_set_is_what_gets_sampled(monkeypatch):
    from ktae.groups import sampling

    seen = []

    def capture(model, tokenizer, rows, **kwargs):
        seen.append([r["answer"] for r in rows])
        raise RuntimeError("stop after the prompts are chosen")

    monkeypatch.setattr(sampling, "sample_groups", capture)
    for k in (0, 1):
        with pytest.raises(RuntimeError, match="stop after"):
            audit(model="default", prompts=30, samples=2, prompt_set=k, credit="grpo")
    assert seen[0] == [p.answer for p in prompt_set_problems(30, 0)]
    assert seen[1] == [p.answer for p in prompt_set_problems(30, 1)]
    assert seen[0] != seen[1]


@pytest.mark.slow
def test_the_prompt_set_is_recorded(tmp_path):
    out = tmp_path / "audit"
    assert main(["audit", "--model", "default", "--prompts", "6", "--samples", "4",
                 "--prompt-set", "1", "--credit", "grpo,ktae", "--resamples", "20",
                 "-o", str(out)]) == 0
    result = json.loads((out / "audit.json").read_text())
    assert result["prompt_set"] == 1 and "(prompt set 1)" in result["input"]
    assert "mass_gap" in result["methods"]["ktae"]["all"]
