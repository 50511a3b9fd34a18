"""mutmut over the modules the wiring tests guard, each with only its fast tests.

Each module is mutated in a scratch copy of the working tree (``src``, ``tests``,
``pyproject.toml``; mutmut's ``setup.cfg`` is written there, the repository is not
touched), mutmut runs its tests against every mutant, and the surviving mutants are
listed per module with their diffs under ``OUT/survivors-<module>.txt`` (``OUT``:
``$KTAE_MUTMUT_OUT``, default ``<tmp>/ktae-mutmut-report``).

    python studies/mutation/mutmut_run.py                      # every module below
    python studies/mutation/mutmut_run.py src/ktae/eval/choice.py
    KTAE_MUTMUT_OUT=DIR KTAE_MUTMUT_CHILDREN=2 python studies/mutation/mutmut_run.py
    KTAE_MUTMUT_ONLY='ktae.train.session.x_grpo_config__mutmut_*' \
        python studies/mutation/mutmut_run.py src/ktae/train/session.py

``KTAE_MUTMUT_ONLY`` (space-separated mutant names or globs, as ``mutmut results`` prints
them) runs only those mutants: one function of a slow module, or the survivors of a
previous run; the others are reported "not checked".

Needs ``pip install mutmut`` (3.x). Slow: every mutant reruns the module's tests (the
choice module takes minutes, the trainer session much longer on a 2-core machine).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_DIFFS = 80
"""Surviving mutants whose diff is written out (all are counted per function)."""

#: Module -> pytest arguments selecting the fast tests that guard it.
MODULES = {
    "src/ktae/eval/choice.py": ["tests/test_eval_choice.py"],
    "src/ktae/train/cli_compare.py": [
        "tests/test_wiring_compare.py", "tests/test_mutation_kills.py",
        "tests/test_plugins.py::test_compare_arm_sets_the_rules_own_options",
        "tests/test_plugins.py::test_compare_arm_options_reach_the_config",
        "tests/test_plugins.py::test_compare_arm_option_adds_to_the_common_ones_of_the_same_rule",
        "-k", "not test_credit_ and not test_method_"],
    # not the layer test: a fresh interpreter per import, slow and blind to mutants
    "src/ktae/core/methods.py": ["tests/test_methods.py", "tests/test_train_credit.py",
                                 "tests/test_plugins.py", "tests/test_mutation_kills.py", "-k",
                                 "not sits_below"],
    "src/ktae/runs/credit.py": [
        "tests/test_wiring_config.py", "tests/test_train_config.py",
        "tests/test_mutation_kills.py", "-k",
        "credit or taco or ktae or estimator or calibration or advantage_base or algo or seed "
        "or dynamic_sampling or generation_rounds"],
    # the settings-to-TRL functions and the run plan; train()'s body is guarded by
    # tests/test_wiring_train.py and the hand mutations (every mutant of it would rerun
    # the training steps: hours on 2 cores), so run this module with KTAE_MUTMUT_ONLY
    # naming grpo_config, lora_config, plan_run and describe_changes
    # the trainer's pure helpers (its methods run inside TRL's loop: tests/test_wiring_train.py
    # and the hand mutations); run with KTAE_MUTMUT_ONLY naming derived_seed, is_disk_full,
    # check_group_layout, warn_settings_without_effect and EpochRepeatSampler
    "src/ktae/train/trainer.py": ["tests/test_trainer_helpers.py",
                                  "tests/test_train_resume_epochs.py",
                                  "tests/test_train_options.py", "-k",
                                  "helpers or epoch or without_effect or layout"],
    "src/ktae/train/session.py": ["tests/test_wiring_config.py", "tests/test_wiring_compare.py",
                                  "tests/test_train_config.py", "tests/test_plan_run.py"],
}


def _scratch_copy(dest: Path) -> None:
    for name in ("src", "tests", "docs"):  # some tests read docs/ (the plugin example)
        shutil.copytree(ROOT / name, dest / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")


def run_module(module: str, tests: list[str], out: Path, children: int) -> list[str]:
    """mutmut on ``module`` with ``tests``; returns the surviving mutants' names."""
    work = Path(tempfile.mkdtemp(prefix="ktae-mutmut-"))
    try:
        _scratch_copy(work)
        selection = "\n    ".join(tests)
        (work / "setup.cfg").write_text(
            "[mutmut]\n"
            "source_paths = src\n"
            f"only_mutate = {module}\n"
            "also_copy = docs\n"
            f"pytest_add_cli_args_test_selection =\n    {selection}\n"
            "pytest_add_cli_args = -p no:cacheprovider -q\n")
        env = {**os.environ, "PYTHONPATH": str(work / "src")}
        only = os.environ.get("KTAE_MUTMUT_ONLY", "").split()
        subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(children),
                        *only], cwd=work, env=env, check=False)
        results = subprocess.run([sys.executable, "-m", "mutmut", "results"], cwd=work,
                                 env=env, capture_output=True, text=True, check=False).stdout
        survivors = [m for m, status in re.findall(r"^\s*(\S+): (\w[\w ]*)$", results, re.M)
                     if status.strip() == "survived"]
        out.mkdir(parents=True, exist_ok=True)
        stem = module.replace("/", "_").removesuffix(".py")
        (out / f"results-{stem}.txt").write_text(results)
        by_function: dict[str, int] = {}
        for name in survivors:
            function = name.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[-1].removeprefix("x_")
            by_function[function] = by_function.get(function, 0) + 1
        lines = [f"{module}: {len(survivors)} surviving mutant(s)", "",
                 *(f"  {f}: {n}" for f, n in sorted(by_function.items())), ""]
        for name in survivors[:MAX_DIFFS]:  # `mutmut show` takes seconds per mutant
            diff = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=work,
                                  env=env, capture_output=True, text=True).stdout
            lines += [name, diff, ""]
        (out / f"survivors-{stem}.txt").write_text("\n".join(lines))
        return survivors
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    modules = argv or list(MODULES)
    out = Path(os.environ.get("KTAE_MUTMUT_OUT",
                              Path(tempfile.gettempdir()) / "ktae-mutmut-report"))
    children = int(os.environ.get("KTAE_MUTMUT_CHILDREN", "1"))
    summary = []
    for module in modules:
        survivors = run_module(module, MODULES[module], out, children)
        summary.append(f"{module}: {len(survivors)} survivor(s)")
    print("\n".join(summary))
    print(f"details: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
