"""The paired verdict's final runs and their analysis.

The final runs start only once the plan is committed: ``plan.md`` beside this file names
the recipe the pilot chose (:data:`RECIPE`), the 2026 arm (:data:`ARM_2026`), the number
of paired seeds (:data:`N_SEEDS`) and the commit every run imports
(``records/final-code.json``), and ``run`` refuses while any of them is missing or while
``plan.md`` differs from the committed one.

Every arm trains with the same recipe from the same seed, so step 1's rollouts are the
same in every arm; the arms differ only in their credit (:data:`ARMS`). Each run is
evaluated on the arith task's ``test`` split at :data:`OUTCOME_STEPS`, a cut-off answer
wrong, and GRPO's runs also before training (step 0: the same untrained model in every
arm); checkpoints every :data:`SAVE_EVERY` steps. The primary outcome is each problem's
mean correctness over the evaluations at :data:`OUTCOME_STEPS`.

The analysis (:func:`analyse`) reads every comparison of :data:`COMPARISONS` as a
``[problems, seeds]`` difference matrix: its paired t interval over seeds and problems
(``studies/stats.py``), Holm's correction over the family, a label only where the
corrected test rejects, and each label with one seed left out.

    python studies/paired-verdict/final.py status
    python studies/paired-verdict/final.py run --jobs 2     # hours; resumable
    python studies/paired-verdict/final.py run --until 03:50  # only runs that end by then
    python studies/paired-verdict/final.py table            # the verdict's table
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import driver  # noqa: E402
import stats  # noqa: E402

STUDY = "paired-verdict"
RECORDS = HERE / "records" / "final"
CODE = HERE / "records" / "final-code.json"
PLAN = HERE / "plan.md"
CONFIG = "configs/smollm2-recipe.yaml"
MAX_STEPS = 30
SAVE_EVERY = 6
OUTCOME_STEPS = (24, 30)
"""The primary outcome averages the evaluations at these steps, the only ones a run makes
(:func:`eval_steps`)."""
FIRST_SEED = 201
"""Final seeds are ``FIRST_SEED, FIRST_SEED + 1, ...``: disjoint from the pilot's
development seeds (101-105) and from the 5-seed study's (11-15)."""
N_SEEDS: int | None = 14
"""Paired seeds per arm, from the pilot's variance (``power.py --pilot``); set by the plan."""
RECIPE: str | None = "lr2e-4-p4g8-t96"
"""The pilot's chosen grid point (a key of ``pilot.GRID``); set by the plan."""
BUFFER_SHARE = 5
"""The length control's overlong buffer is the budget over this (DAPO's default share)."""
ARMS = {
    "grpo": "--credit none",
    "ktae": "--credit ktae",
    "length": "--credit none --overlong-buffer {buffer}",
    "ktae-length": "--credit ktae --overlong-buffer {buffer}",
}
"""Arm -> its ``ktae train`` flags beside the recipe's; the 2026 arm is added by
:data:`ARM_2026`."""
KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
           "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
"""Every run's torch, oneDNN and MKL kernels, held to AVX2 on any x86 CPU: the first runs
were recorded on a CPU with AVX2 only, and a CPU with AVX-512 reproduces their steps
bit for bit only under these (report.md, "The final runs' machines")."""
CANDIDATES_2026 = {
    "oar-g": "--credit oar-g",
    "stapo": "--credit stapo",
    "rsi-s": "--credit rsi-s",
    "delta": "--credit delta",
    "sdpo": "--credit sdpo",
    "sdpo-loss": "--credit none --self-distill sdpo",
    "sdpg": "--credit none --self-distill sdpg",
}
"""The 2026 methods in the repository that the development audit
(``studies/self-teacher-audit``) chooses among, with their flags."""
ARM_2026: str | None = "delta"
"""The best 2026 method on the development audit (a key of :data:`CANDIDATES_2026`); set
by the plan."""
LABELS = {"grpo": "GRPO", "ktae": "GRPO + KTAE", "length": "the length control",
          "ktae-length": "KTAE + the length control", "2026": "the 2026 arm"}
COMPARISONS = (("ktae", "grpo"), ("length", "grpo"), ("ktae-length", "grpo"),
               ("2026", "grpo"), ("ktae", "length"), ("ktae-length", "length"))
"""(arm, against): every arm against GRPO, KTAE against the length control, and whether
credit adds to stopping (KTAE + the length control against the length control). Holm's
correction runs over all of them."""


def seeds() -> tuple[int, ...]:
    return tuple(range(FIRST_SEED, FIRST_SEED + (N_SEEDS or 0)))


def arms() -> dict[str, str]:
    out = dict(ARMS)
    if ARM_2026 is not None:
        out["2026"] = CANDIDATES_2026[ARM_2026]
    return out


def run_name(arm: str, seed: int) -> str:
    return f"{arm}-s{seed}"


def eval_steps(arm: str) -> tuple[int, ...]:
    """The steps a run of ``arm`` is evaluated at: :data:`OUTCOME_STEPS`, and step 0 in
    GRPO's (the untrained model, the same in every arm: evaluated once per seed)."""
    return (0, *OUTCOME_STEPS) if arm == "grpo" else OUTCOME_STEPS


def jobs() -> list[driver.Job]:
    """Seed by seed over the arms, so that a study stopped early holds paired seeds."""
    import pilot

    flags = pilot.GRID[RECIPE]
    argv = flags.split()
    budget = int(argv[argv.index("--max-new-tokens") + 1])
    common = (f"--eval-split test --eval-size 200 --max-steps {MAX_STEPS} "
              f"--save-every {SAVE_EVERY} --rollout-every 0 --threads 1 --no-progress").split()
    return [driver.Job(run_name(arm, seed),
                       ("train", "--config", CONFIG, *common,
                        "--eval-steps", ",".join(map(str, eval_steps(arm))), *argv,
                        *arm_flags.format(buffer=budget // BUFFER_SHARE).split(),
                        "--trl", f"gradient_accumulation_steps={pilot.micro_batches(flags)}",
                        "--seed", str(seed)))
            for seed in seeds() for arm, arm_flags in arms().items()]


def plan_problems() -> list[str]:
    """What keeps the final runs from starting: each a line; empty when they may."""
    out = []
    if not PLAN.is_file():
        out.append(f"{PLAN.name} does not exist")
    else:
        rel = PLAN.relative_to(driver.REPO)
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", str(rel)],
                                 cwd=driver.REPO, capture_output=True).returncode == 0
        changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(rel)],
                                 cwd=driver.REPO).returncode != 0
        if not tracked or changed:
            out.append(f"{PLAN.name} is not committed as it stands")
    import pilot

    if RECIPE not in pilot.GRID:
        out.append(f"RECIPE: expected a pilot grid point, got {RECIPE!r}")
    if ARM_2026 not in CANDIDATES_2026:
        out.append(f"ARM_2026: expected one of {', '.join(CANDIDATES_2026)}, got {ARM_2026!r}")
    if not N_SEEDS or N_SEEDS < 2:
        out.append(f"N_SEEDS: expected at least 2 paired seeds, got {N_SEEDS!r}")
    if not CODE.is_file():
        out.append(f"records/{CODE.name} does not name the runs' commit")
    return out


def outcomes(records: Path, name: str, steps=OUTCOME_STEPS) -> np.ndarray:
    """``[problems]``: each problem's mean correctness over the evaluations at ``steps``."""
    rows = {}
    for line in (records / name / "eval.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["step"]] = row
    missing = [s for s in steps if s not in rows]
    if missing:
        raise ValueError(f"steps: {name} has no evaluation at {missing}")
    return np.mean([[float(p["correct"]) for p in rows[s]["problems"]] for s in steps],
                   axis=0)


def analyse(records: Path, arm_names, seed_list, comparisons=COMPARISONS) -> dict:
    """Per comparison: the paired interval at 95% and at its Holm level, the corrected p,
    the label, and the labels with each seed left out; per arm: its mean outcome. Only the
    seeds every arm has recorded are read."""
    shared = [s for s in seed_list
              if all(driver.recorded(records, run_name(a, s)) for a in arm_names)]
    if len(shared) < 2:
        raise ValueError(f"records: expected at least 2 seeds recorded in every arm, got "
                         f"{len(shared)}")
    mats = {a: np.stack([outcomes(records, run_name(a, s)) for s in shared], axis=1)
            for a in arm_names}
    family = [(a, b) for a, b in comparisons if a in mats and b in mats]
    diffs = [mats[a] - mats[b] for a, b in family]
    plain = [stats.paired_interval(d) for d in diffs]
    corrected = stats.holm([r["p"] for r in plain])
    rows = []
    for i, ((a, b), d) in enumerate(zip(family, diffs, strict=True)):
        level = corrected["levels"][i]
        at = stats.paired_interval(d, level=level) if level is not None else plain[i]
        rows.append({"arm": a, "against": b, "diff": plain[i]["diff"],
                     "low": plain[i]["low"], "high": plain[i]["high"],
                     "low_holm": at["low"], "high_holm": at["high"],
                     "p": plain[i]["p"], "p_holm": corrected["adjusted"][i],
                     "label": stats.label(plain[i]["diff"], corrected["reject"][i]),
                     "drop_one": stats.drop_one_labels(diffs, i)})
    return {"seeds": shared, "problems": int(next(iter(mats.values())).shape[0]),
            "means": {a: float(m.mean()) for a, m in mats.items()}, "comparisons": rows}


def table(result: dict) -> str:
    lines = [f"{len(result['seeds'])} paired seeds x {result['problems']} held-out problems; "
             f"outcome: the mean of the evaluations at steps "
             f"{', '.join(map(str, OUTCOME_STEPS))}; points.", "",
             "| comparison | difference | paired 95% | at Holm's level | p | p (Holm) | "
             "label | with one seed left out |", "|---|---|---|---|---|---|---|---|"]

    def pts(x):
        return "-" if x is None else f"{100 * x:+.1f}"

    def pval(x):
        return "-" if x is None else f"{x:.3f}"

    for r in result["comparisons"]:
        flips = sorted(set(r["drop_one"]) - {r["label"]})
        lines.append(
            f"| {LABELS[r['arm']]} − {LABELS[r['against']]} | {pts(r['diff'])} | "
            f"{pts(r['low'])} to {pts(r['high'])} | {pts(r['low_holm'])} to "
            f"{pts(r['high_holm'])} | {pval(r['p'])} | {pval(r['p_holm'])} | {r['label']} | "
            f"{'same' if not flips else 'flips to ' + ', '.join(flips)} |")
    return "\n".join(lines)


def final_table(records: Path = RECORDS) -> str:
    """The verdict's table (:func:`table` without its caption) once every run of the plan
    is recorded (``scripts/tables.py run paired-verdict-final`` writes it into the report);
    a ValueError in one line before, so that no reader sees the comparisons of a study
    under way."""
    planned = jobs()
    done = sum(driver.recorded(records, j.name) for j in planned)
    if done < len(planned):
        raise ValueError(f"records: {done} of {len(planned)} final runs recorded; the "
                         "table reads all of them (final.py run)")
    text = table(analyse(records, list(arms()), seeds()))
    return text[text.index("| comparison"):]  # the table; its caption is the report's


def main(argv: list[str] | None = None) -> int:
    args = driver.study_arguments("final", __doc__.splitlines()[0], argv)
    if args is None:
        return 2
    problems = plan_problems()
    if args.action == "status":
        if problems:
            print("the final runs cannot start: " + "; ".join(problems))
            return 0
        print(driver.status_line(jobs(), RECORDS))
        return 0
    if args.action == "table":
        try:
            result = analyse(RECORDS, list(arms()), seeds())
        except ValueError as e:  # too few runs recorded yet
            print(f"final: {e} ({driver.status_line(jobs(), RECORDS)})", file=sys.stderr)
            return 1
        print(table(result))
        return 0
    if problems:
        print("final: the plan is not committed: " + "; ".join(problems), file=sys.stderr)
        return 2
    root = driver.runs_root(STUDY)
    code = driver.code_tree(root, json.loads(CODE.read_text())["commit"])
    os.environ.update(KERNELS)  # the runs inherit this process's environment
    return driver.drive(jobs(), n_jobs=args.jobs, root=root, records=RECORDS, code=code,
                        until=args.until)


if __name__ == "__main__":
    sys.exit(main())
