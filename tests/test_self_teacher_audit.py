"""studies/self-teacher-audit: the audit commands it runs, how it records and resumes them,
and the analysis that names the study's 2026 arm."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location(
        "self_teacher_audit", REPO / "studies" / "self-teacher-audit" / "self_teacher_audit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _figure(mean, low=None, high=None, responses=10, groups=5):
    return {"mean": mean, "low": mean if low is None else low,
            "high": mean if high is None else high, "responses": responses, "groups": groups}


def _audit(study, name, blames: dict) -> dict:
    prompt_set, seed = study.SETS[name]
    methods = {m: {"all": {"blame": _figure(*b), "lowest": _figure(0.4, 0.3, 0.5),
                           "chance": _figure(0.35, 0.3, 0.4), "mass_gap": _figure(-0.2, -0.5, 0.1)}}
               for m, b in blames.items()}
    return {
        "input": f"{study.PROMPTS} arith problems (difficulty 0, eval split, prompt set "
                 f"{prompt_set}) x 8 responses sampled from M (chat template, temperature "
                 f"{study.TEMPERATURE}, seed {seed}, at most 64 new tokens)",
        "prompt_set": prompt_set, "resamples": 1000, "seconds": {"sampling": 1.0},
        "credit": {m: m for m in study.CREDIT},
        "counts": {"groups": 48, "mixed_groups": 20, "groups_with_right_answer": 24,
                   "responses": 384, "responses_with_teacher": 150, "wrong_answers": 300,
                   "responses_with_wrong_tokens": 80},
        "methods": methods,
        "sanity_rules": {"oracle": methods["grpo"], "random": methods["grpo"]},
    }


BLAMES = {"grpo": (0.5,), "ktae": (0.6, 0.5, 0.7), "ktae@ngram=3": (0.7, 0.6, 0.8),
          "oar-g": (0.62, 0.55, 0.69), "stapo": (0.5,), "sdpo": (0.66, 0.6, 0.72),
          "sdpo@lam=0.5": (0.64, 0.58, 0.7), "rsi-s": (0.52, 0.45, 0.59),
          "delta": (0.55, 0.5, 0.59)}


def test_the_audit_commands_of_the_two_sets(study, tmp_path):
    dev, held = (study.command(n, tmp_path / n) for n in ("dev", "heldout"))
    for argv, prompt_set, seed in ((dev, "0", "0"), (held, "1", "1")):
        assert argv[:3] == ["audit", "--model", "smollm2-135m"]
        assert argv[argv.index("--prompt-set") + 1] == prompt_set
        assert argv[argv.index("--seed") + 1] == seed
        assert argv[argv.index("--task") + 1] == "arith@difficulty=0"
        assert argv[argv.index("--credit") + 1].split(",") == list(study.CREDIT)
    with pytest.raises(ValueError, match="^set: expected one of dev, heldout"):
        study.command("test", tmp_path)


def test_a_finished_audit_is_recorded_without_sampling_again(study, tmp_path, monkeypatch):
    root, records = tmp_path / "runs", tmp_path / "records"
    for name in study.SETS:
        (root / name).mkdir(parents=True)
        (root / name / "audit.json").write_text(json.dumps(_audit(study, name, BLAMES)))
        (root / name / "audit.md").write_text("# Credit audit\n")
    calls = []
    real = study.subprocess.run
    monkeypatch.setattr(study.subprocess, "run",
                        lambda argv, **kw: calls.append(argv) or real(argv, **kw))
    assert study.run(root=root, records=records) == 0
    assert all(argv[0] == "git" for argv in calls), calls  # no audit ran
    for name in study.SETS:
        marker = json.loads((records / name / study.MARKER).read_text())
        assert "--prompt-set" in marker["command"] and "{runs}" in marker["command"]
        assert (records / name / "audit.json").is_file()
    # another set's settings are not this study's: it would be audited again
    assert not study.finished("heldout", root / "dev")


def test_the_analysis_names_the_best_2026_method(study, tmp_path):
    records = tmp_path / "records"
    for name in study.SETS:
        (records / name).mkdir(parents=True)
        (records / name / "audit.json").write_text(json.dumps(_audit(study, name, BLAMES)))
        (records / name / study.MARKER).write_text("{}")
    out = study.report(records, tmp_path / "results")
    choice = out["choice"]
    # ktae@ngram=3 is higher but not a 2026 method; sdpo's interval overlaps two others'
    assert choice["method"] == "sdpo"
    assert choice["not_separable_from"] == ["oar-g", "sdpo@lam=0.5"]
    assert "`sdpo`: blame 0.660 [0.600, 0.720]" in choice["sentence"]
    assert "not separable from `oar-g`, `sdpo@lam=0.5`" in choice["sentence"]
    saved = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert saved["sets"]["dev"]["teacher_share"] == {"groups": 0.5, "responses": 150 / 384}
    table = study.table(out["sets"])
    assert "| sdpo | 0.660 [0.600, 0.720] | 0.400 [0.300, 0.500] (0.350) | -0.200 [-0.500, +0.100] |" \
        in table
    assert "| (oracle) |" in table
    counts = study.counts_table(out["sets"])
    assert "| development (prompt set 0) | 48 | 24 (50%) | 150 of 384 (39%) | 20 | 10 (5) |" in counts


def test_a_separable_best_says_so(study):
    dev = {"figures": {m: {"blame": _figure(*b)} for m, b in
                       {"oar-g": (0.5, 0.45, 0.55), "stapo": (0.5,), "sdpo": (0.8, 0.7, 0.9),
                        "sdpo@lam=0.5": (0.6, 0.55, 0.65), "rsi-s": (0.5,),
                        "delta": (0.55, 0.5, 0.6)}.items()}}
    choice = study.choose(dev)
    assert choice["method"] == "sdpo" and choice["not_separable_from"] == []
    assert study.sentence(choice).endswith("its interval lies above every other 2026 method's.")


def test_held_out_problems_are_no_development_problem_reworded_or_reordered(study):
    from ktae.credit_audit.arith_input import prompt_set_problems
    from ktae.tasks import arith

    difficulty = int(study.TASK.split("=")[1])
    keys = {}
    for name, (prompt_set, _) in study.SETS.items():
        problems = prompt_set_problems(study.PROMPTS, prompt_set, difficulty)
        keys[name] = {(p.kind, arith.canonical(p.kind, p.operands)) for p in problems}
        assert len(keys[name]) == study.PROMPTS  # each problem once: a group is a problem
        assert {arith.split_of(p.kind, p.operands) for p in problems} == {"eval"}
    assert not keys["dev"] & keys["heldout"]
