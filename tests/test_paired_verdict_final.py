"""The paired verdict's final runs: they start only from a committed plan, pair every arm
on the same seeds (disjoint from the pilot's and the 5-seed study's), read the test split,
and the analysis labels only what survives Holm's correction."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

STUDIES = Path(__file__).resolve().parents[1] / "studies"
sys.path.insert(0, str(STUDIES))
sys.path.insert(0, str(STUDIES / "paired-verdict"))

import driver  # noqa: E402


def _final():
    spec = importlib.util.spec_from_file_location("paired_verdict_final",
                                                  STUDIES / "paired-verdict" / "final.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_final_runs_refuse_to_start_without_a_committed_plan(tmp_path, monkeypatch, capsys):
    final = _final()
    monkeypatch.setattr(final, "PLAN", tmp_path / "plan.md")
    monkeypatch.setattr(final, "CODE", tmp_path / "final-code.json")
    for name in ("N_SEEDS", "RECIPE", "ARM_2026"):
        monkeypatch.setattr(final, name, None)
    problems = final.plan_problems()
    assert any("plan.md does not exist" in p for p in problems)
    for name in ("N_SEEDS", "RECIPE", "ARM_2026"):
        assert any(p.startswith(name) for p in problems), name
    assert any("does not name the runs' commit" in p for p in problems)
    assert final.main(["run"]) == 2
    assert "the plan is not committed" in capsys.readouterr().err


def test_the_committed_plan_names_everything_the_final_runs_need():
    """plan.md is committed as it stands, and the constants it names are set: the final
    runs may start (this fails while plan.md is edited and not committed)."""
    final = _final()
    import pilot

    assert final.plan_problems() == []
    assert final.RECIPE in pilot.GRID and final.ARM_2026 in final.CANDIDATES_2026
    plan = final.PLAN.read_text()
    commit = json.loads(final.CODE.read_text())["commit"]
    assert commit[:12] in plan and f'RECIPE = "{final.RECIPE}"' in plan
    assert f"N_SEEDS = {final.N_SEEDS}" in plan and f'ARM_2026 = "{final.ARM_2026}"' in plan
    assert len(final.jobs()) == final.N_SEEDS * len(final.arms())


def test_the_final_runs_pair_every_arm_on_fresh_seeds_and_the_test_split(monkeypatch):
    final = _final()
    import pilot

    monkeypatch.setattr(final, "RECIPE", next(iter(pilot.GRID)))
    monkeypatch.setattr(final, "ARM_2026", "sdpo")
    monkeypatch.setattr(final, "N_SEEDS", 3)
    jobs = final.jobs()
    arms = list(final.arms())
    assert arms == ["grpo", "ktae", "length", "ktae-length", "2026"]
    assert len(jobs) == 3 * len(arms)
    # seed by seed: a study stopped early holds paired seeds
    assert [j.name for j in jobs[:len(arms)]] == [f"{a}-s{final.FIRST_SEED}" for a in arms]
    recipe = pilot.GRID[final.RECIPE].split()
    budget = int(recipe[recipe.index("--max-new-tokens") + 1])
    for job in jobs:
        argv = list(job.argv)
        seed = int(argv[argv.index("--seed") + 1])
        assert seed not in pilot.DEV_SEEDS and seed not in range(11, 16)
        assert argv[argv.index("--eval-split") + 1] == "test"
        assert " ".join(recipe) in " ".join(argv)
        arm = job.name.rsplit("-s", 1)[0]
        if arm in ("length", "ktae-length"):
            assert argv[argv.index("--overlong-buffer") + 1] == str(budget // 5)
        else:
            assert "--overlong-buffer" not in argv
        credit = argv[argv.index("--credit") + 1]
        assert credit == {"grpo": "none", "ktae": "ktae", "length": "none",
                          "ktae-length": "ktae", "2026": "sdpo"}[arm]
        # evaluated where the outcome reads, and GRPO's run before training too
        steps = argv[argv.index("--eval-steps") + 1]
        assert steps == ("0,24,30" if arm == "grpo" else "24,30")
        assert "--eval-every" not in argv


def _record(records: Path, name: str, evals: dict) -> None:
    folder = records / name
    folder.mkdir(parents=True)
    rows = [{"step": step, "problems": [{"correct": bool(c)} for c in correct]}
            for step, correct in evals.items()]
    (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / driver.MARKER).write_text("{}")


def test_the_analysis_labels_only_what_survives_the_correction(tmp_path):
    final = _final()
    rng = np.random.default_rng(11)
    problems, seed_list = 120, list(range(201, 209))
    ease = rng.uniform(0.2, 0.7, problems)
    for seed in seed_list:
        shift = rng.normal(0, 0.03)
        for arm, gain in (("grpo", 0.0), ("ktae", 0.25), ("length", 0.01)):
            p = np.clip(ease + shift + gain, 0, 1)
            _record(tmp_path, final.run_name(arm, seed),
                    {0: rng.random(problems) < ease,
                     24: rng.random(problems) < p, 30: rng.random(problems) < p})
    # one arm missing a seed: only the seeds every arm has are read
    _record(tmp_path, final.run_name("grpo", 299), {24: [True] * problems, 30: [True] * problems})
    comparisons = (("ktae", "grpo"), ("length", "grpo"), ("ktae", "length"))
    result = final.analyse(tmp_path, ["grpo", "ktae", "length"], seed_list + [299], comparisons)
    assert result["seeds"] == seed_list and result["problems"] == problems
    rows = {(r["arm"], r["against"]): r for r in result["comparisons"]}
    big = rows[("ktae", "grpo")]
    assert big["label"] == "helps" and big["low"] > 0
    # Holm's level is never below 95%: its interval holds the plain one
    assert big["low_holm"] <= big["low"] and big["high_holm"] >= big["high"]
    assert rows[("length", "grpo")]["label"] == "no evidence"
    assert all(r["p_holm"] >= r["p"] for r in rows.values())
    assert len(big["drop_one"]) == len(seed_list)
    # the outcome is the mean of the two evaluations, per problem
    out = final.outcomes(tmp_path, final.run_name("ktae", 201))
    assert set(np.unique(out)) <= {0.0, 0.5, 1.0}
    text = final.table(result)
    assert "| GRPO + KTAE − GRPO |" in text and "| helps |" in text
    with pytest.raises(ValueError, match="at least 2 seeds recorded in every arm"):
        final.analyse(tmp_path, ["grpo", "ktae", "2026"], seed_list, comparisons)
    with pytest.raises(ValueError, match=r"steps: .* has no evaluation at \[18\]"):
        final.outcomes(tmp_path, final.run_name("ktae", 201), (18, 24))


@pytest.mark.parametrize("candidate", ["oar-g", "stapo", "rsi-s", "delta", "sdpo", "sdpo-loss",
                                       "sdpg"])
def test_every_arm_of_every_candidate_plan_is_a_valid_train_command(candidate, monkeypatch):
    import argparse

    from ktae.train.cli_train import add_arguments, config_from_args

    final = _final()
    import pilot

    monkeypatch.setattr(final, "RECIPE", next(iter(pilot.GRID)))
    monkeypatch.setattr(final, "ARM_2026", candidate)
    monkeypatch.setattr(final, "N_SEEDS", 2)
    repo = STUDIES.parent
    monkeypatch.chdir(repo)
    for job in final.jobs()[:len(final.arms())]:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        argv = list(job.argv[1:]) + ["-o", "unused"]
        cfg = config_from_args(parser.parse_args(argv))
        assert cfg.eval_split == "test" and cfg.seed == final.FIRST_SEED


def test_the_table_before_two_seeds_are_recorded_is_one_line(tmp_path, monkeypatch, capsys):
    final = _final()
    monkeypatch.setattr(final, "RECORDS", tmp_path / "records")
    assert final.main(["table"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "expected at least 2 seeds recorded in every arm, got 0" in err
    assert "recorded 0 of" in err


def test_the_runs_inherit_the_kernels_of_the_first_machine(tmp_path, monkeypatch):
    """``run`` holds torch, oneDNN and MKL to AVX2 for every run it starts (the runs
    inherit its environment), so that a CPU with AVX-512 reproduces the first runs."""
    final = _final()
    for name in final.KERNELS:  # restored (or removed) when the test ends
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(final, "plan_problems", lambda: [])
    monkeypatch.setattr(driver, "runs_root", lambda study: tmp_path)
    monkeypatch.setattr(driver, "code_tree", lambda root, commit: tmp_path / "code")
    seen = {}

    def drive(jobs, **kw):
        seen.update({name: os.environ.get(name) for name in final.KERNELS})
        return 0

    monkeypatch.setattr(driver, "drive", drive)
    assert final.main(["run"]) == 0
    assert seen == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                    "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def test_the_final_table_waits_for_every_planned_run(tmp_path, monkeypatch):
    """``final_table`` refuses in one line while a planned run is missing, then reads them
    all; ``scripts/tables.py`` says the same and writes nothing."""
    final = _final()
    monkeypatch.setattr(final, "N_SEEDS", 2)
    rng = np.random.default_rng(5)
    names = [j.name for j in final.jobs()]
    for name in names[:-1]:
        evals = {24: rng.random(40) < 0.5, 30: rng.random(40) < 0.5}
        _record(tmp_path, name, {0: rng.random(40) < 0.3, **evals}
                if name.startswith("grpo-") else evals)
    with pytest.raises(ValueError, match=rf"^records: {len(names) - 1} of {len(names)} final "
                                         r"runs recorded; [^\n]*$"):
        final.final_table(tmp_path)
    _record(tmp_path, names[-1], {24: rng.random(40) < 0.5, 30: rng.random(40) < 0.5})
    text = final.final_table(tmp_path)
    assert text.startswith("| comparison | difference |") and "\n|---" in text
    assert text.count("\n| ") == len(final.COMPARISONS)  # a row each
    # scripts/tables.py on the committed records: the one-line refusal while the study runs,
    # the table once it is done
    spec = importlib.util.spec_from_file_location("tables_script",
                                                  STUDIES.parent / "scripts" / "tables.py")
    tables = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tables_script", tables)  # its dataclasses look it up
    spec.loader.exec_module(tables)
    planned = _final().jobs()
    done = sum(driver.recorded(final.RECORDS, j.name) for j in planned)
    if done < len(planned):
        with pytest.raises(SystemExit, match=rf"^tables: paired-verdict-final: records: "
                                             rf"{done} of {len(planned)} final runs"):
            tables.TABLES["paired-verdict-final"].render()
    else:
        assert tables.TABLES["paired-verdict-final"].render().startswith("| comparison")
