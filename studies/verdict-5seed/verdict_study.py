"""The real-model verdict study: its plan, and a driver that runs it over several sittings.

The plan (studies/verdict-5seed/plan.md, committed before any of its runs) is five arms of the
SmolLM2 recipe (configs/smollm2-recipe.yaml, arith level 0) in two settings, over the
seeds :data:`SEEDS`:

* arms (:data:`ARMS`): GRPO; GRPO + KTAE; GRPO with DAPO's overlong shaping (the length
  control); GRPO + KTAE over 3-token spans; GRPO + OAR-G;
* settings (:data:`SETTINGS`): a 64-token budget, where truncation is common, and a
  longer one, where it is rare.

``run`` works through the runs in plan order, ``--jobs`` at a time (one thread each), never
two runs of :data:`HEAVY` (OAR-G's: half the machine's memory each) at once:

* a run whose record (``studies/verdict-5seed/records/NAME/``) is complete is skipped;
* a run whose folder holds a checkpoint resumes from it (``ktae train --resume``);
* a finished run's files are copied into its record, the marker last, so that the record
  outlives the machine; the run's ``final/`` model stays in the run folder for ``audit``;
* a run killed by a signal (the kernel's out-of-memory killer) goes again at the end of
  the queue, from its last checkpoint, at most :data:`RETRIES` times.

The training runs import the package from one fixed commit (:data:`CODE`, a detached
worktree beside the run folders), so that work landing on the branch while the study runs
for hours cannot change it half-way; each record names that commit.

The audits of the models the plan names (:data:`AUDIT_SEEDS`; and the starting model)
come after the training runs in ``run``'s queue, each once its model exists: they fill a
slot that no training run may take (the last runs are OAR-G's, one at a time). They import
the package from their own fixed commit (:data:`AUDIT_CODE`). ``audit`` runs only the
audits. ``status`` prints what is done. Every sitting can be stopped at any time and
started again with the same command.

A record keeps a run's files but not its final model, which stays in the run folder,
outside the work tree: a new machine starts without it. An audit whose recorded run has
no model on this machine gets the model made again first, by the run's own command and
code (a :attr:`Job.remake`, queued just before the audit): it is audited only if its 200
held-out responses, before and after training, are the record's word for word, so the
audit is of the recorded model and not of a second draw; ``remade.json`` in the record
says so.

    python studies/verdict-5seed/verdict_study.py status
    python studies/verdict-5seed/verdict_study.py run --jobs 2        # hours; resumable
    python studies/verdict-5seed/verdict_study.py audit --jobs 2      # the audits alone; resumable
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RECORDS = HERE / "records"
CONFIG = "configs/smollm2-recipe.yaml"
SEEDS = (11, 12, 13, 14, 15)
"""Seeds of the final table: none of them was used before the plan was committed."""
ARMS = {
    "grpo": "--credit none",
    "ktae": "--credit ktae",
    "length": "--credit none --overlong-buffer {buffer}",
    "ktae3": "--credit ktae --ktae-ngram 3",
    "oarg": "--credit oar-g",
}
"""Arm -> its ``ktae train`` flags. ``length`` is DAPO's overlong shaping with its default
cache (a fifth of the budget); ``oarg`` is OAR-G, the 2026 method with the best blame on
the development audit of the real model under the corrected claim labels (docs/audit.md,
studies/verdict-5seed/plan.md)."""
ARM_LABELS = {"grpo": "GRPO", "ktae": "GRPO + KTAE", "length": "GRPO + overlong shaping",
              "ktae3": "GRPO + KTAE over 3-grams", "oarg": "GRPO + OAR-G"}
SETTINGS = {"t64": 64, "t128": 128}
"""Setting -> the response budget (``--max-new-tokens``): truncation common, and rare."""
STUDY_FLAGS = "--eval-size 200 --rollout-every 1 --rollout-groups 4 --threads 1 --no-progress"
"""Every run: the 200 held-out problems (200 distinct computations), every step's groups
recorded for the credit-mass analysis, one thread."""
AUDIT_SEEDS = (11, 12)
"""Seeds whose trained models are audited, in each setting and arm."""
AUDIT_FLAGS = ("--task arith@difficulty=0 --prompts 200 --samples 4 --temperature 0.6 "
               "--credit grpo,ktae,ktae@ngram=3 --threads 1 --no-progress --overwrite")
HEAVY = {("t64", "oarg"), ("t128", "oarg")}
"""(setting, arm) whose runs hold about half of a 24 GB machine's memory at their peak:
OAR-G's input-gradient pass over the whole rollout batch in the study's pinned code
(``benchmarks/importance_memory.py``: 8.7 GiB at 64 tokens and 12.5 GiB at 128 on top of
the model; the kernel's out-of-memory killer stopped two such runs beside other jobs).
``run`` never starts one while another is running; the plan order is kept otherwise."""
KEEP = ("summary.json", "metrics.jsonl", "eval.jsonl", "rollouts.jsonl", "config.yaml")
"""Files of a finished run kept in its record."""
CODE = RECORDS / "code.json"
"""The commit the training runs import the package from: ``{"commit": SHA}``."""
AUDIT_CODE = RECORDS / "audit-code.json"
"""The commit the audits import the package from: ``{"commit": SHA}``."""
MARKER = "record.json"
"""Written last into a record: the command, the seconds, the time it finished."""
RETRIES = 2
"""Times :func:`drive` starts a training run again after a signal killed it (the kernel's
out-of-memory killer sends SIGKILL), each time from its last checkpoint, at the end of
the queue."""


@dataclass(frozen=True)
class Job:
    name: str
    argv: tuple[str, ...]
    folder: Path
    """Where the command writes."""
    keep: tuple[str, ...]
    code: Path | None = None
    """A checkout whose ``src`` the command imports, run from there; None: this one."""
    heavy: bool = False
    """Needs about half the machine's memory (:data:`HEAVY`): never beside another such job."""
    needs: Path | None = None
    """A path that must exist before the job may start (an audited run's final model)."""
    again: Callable[[], Job] | None = field(default=None, compare=False)
    """The job made anew (a training run: ``--resume`` from its last checkpoint), for
    :func:`drive` to start again once a signal killed it (:data:`RETRIES`)."""
    remake: bool = False
    """A recorded training run made again for its final model (:func:`remake_jobs`): its
    record is checked against, not written (:func:`check_remake`)."""

    def ready(self) -> bool:
        return self.needs is None or self.needs.exists()


def runs_dir() -> Path:
    """The run folders: ``$KTAE_VERDICT_RUNS``, else ``$KTAE_CACHE/verdict`` or
    ``~/.cache/ktae/verdict`` (outside the work tree, which a new checkout replaces)."""
    if os.environ.get("KTAE_VERDICT_RUNS"):
        return Path(os.environ["KTAE_VERDICT_RUNS"])
    cache = os.environ.get("KTAE_CACHE")
    return (Path(cache) if cache else Path.home() / ".cache" / "ktae") / "verdict"


def code_tree(root: Path, pin: Path | None = None) -> Path:
    """A worktree of the commit that ``pin`` (default :data:`CODE`) names, made once,
    beside the run folders."""
    commit = json.loads((pin or CODE).read_text())["commit"]
    tree = root / f"code-{commit[:12]}"
    if not (tree / "src" / "ktae").exists():
        subprocess.run(["git", "worktree", "add", "--detach", "--force", str(tree), commit],
                       cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return tree


def run_name(setting: str, arm: str, seed: int) -> str:
    return f"{setting}-{arm}-s{seed}"


def plan() -> list[tuple[str, str, int]]:
    """(setting, arm, seed) in the order the runs are made: seed by seed, so that a study
    stopped early holds the same seeds in every arm and setting."""
    return [(setting, arm, seed) for seed in SEEDS for setting in SETTINGS for arm in ARMS]


def train_job(setting: str, arm: str, seed: int, root: Path) -> Job:
    budget = SETTINGS[setting]
    name = run_name(setting, arm, seed)
    folder = root / name
    flags = ARMS[arm].format(buffer=budget // 5)
    argv = ["ktae", "train", "--config", CONFIG, *shlex.split(flags), "--seed", str(seed),
            "--max-new-tokens", str(budget), *shlex.split(STUDY_FLAGS)]
    if (folder / "checkpoints").exists() or any(folder.glob("checkpoint-*")):
        argv.append("--resume")
    elif folder.exists():
        shutil.rmtree(folder)  # started but no checkpoint yet: nothing to keep
    return Job(name, (*argv, "-o", str(folder)), folder, KEEP,
               heavy=(setting, arm) in HEAVY)


def audit_jobs(root: Path, code: Path | None = None) -> list[Job]:
    """The starting model per setting, then each audited run's final model (the job
    :meth:`Job.ready` once that model exists), importing the package from ``code``."""
    jobs = []
    for setting, budget in SETTINGS.items():
        name = f"audit-{setting}-start"
        argv = ["ktae", "audit", "--model", "smollm2-135m", "--max-new-tokens", str(budget),
                *shlex.split(AUDIT_FLAGS)]
        jobs.append(Job(name, (*argv, "-o", str(root / name)), root / name, ("audit.json",),
                        code=code))
    for seed in AUDIT_SEEDS:
        for setting, budget in SETTINGS.items():
            for arm in ARMS:
                run = run_name(setting, arm, seed)
                name = f"audit-{run}"
                argv = ["ktae", "audit", "--model", str(root / run / "final"),
                        "--max-new-tokens", str(budget), *shlex.split(AUDIT_FLAGS)]
                jobs.append(Job(name, (*argv, "-o", str(root / name)), root / name,
                                ("audit.json",), code=code, needs=root / run / "final"))
    return jobs


REMADE = "remade-as-recorded"
"""Written into a remade run's folder once its check passed (:func:`finish_remake`): what
its audit waits for, since ``final/`` appears before the run's last evaluation."""


def to_remake(audit: Job) -> bool:
    """Whether ``audit``'s run is recorded but its final model is not on this machine."""
    return (audit.needs is not None and not audit.needs.exists()
            and recorded(audit.name.removeprefix("audit-")))


def remake_jobs(root: Path, audits: list[Job], code: Path | None = None) -> list[Job]:
    """``audits`` with, just before each one whose recorded run has no final model here,
    that run made again (:attr:`Job.remake`; resumed from its checkpoint if it has one),
    the audit then waiting for the remade run's check (:data:`REMADE`)."""
    jobs = []
    for audit in audits:
        run = audit.name.removeprefix("audit-")
        if to_remake(audit):
            setting, arm, seed = run.split("-")
            seed_ = int(seed.removeprefix("s"))

            def made(s=setting, a=arm, k=seed_) -> Job:
                return dataclasses.replace(train_job(s, a, k, root), code=code, keep=(),
                                           remake=True, again=lambda: made(s, a, k))

            jobs.append(made())
            # the model is saved before the run's last evaluation: wait for the check
            audit = dataclasses.replace(audit, needs=root / run / REMADE)
        jobs.append(audit)
    return jobs


def heldout_responses(path: Path) -> list[list[str]]:
    """Each evaluation's held-out responses, in order, from an ``eval.jsonl``."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [[p["response"] for p in row["problems"]] for row in rows]


def check_remake(job: Job) -> tuple[bool, int]:
    """Whether the remade run's held-out responses are its record's, word for word, and
    how many of them differ (every evaluation counted; a missing one counts whole)."""
    ours, theirs = (heldout_responses(folder / "eval.jsonl")
                    for folder in (job.folder, RECORDS / job.name))
    differ = sum(a != b for x, y in zip_longest(ours, theirs, fillvalue=[])
                 for a, b in zip_longest(x, y))
    return differ == 0, differ


def recorded(name: str) -> bool:
    return (RECORDS / name / MARKER).exists()


def execute(job: Job, log_dir: Path) -> bool:
    """Runs ``job``; on success copies its files into its record, the marker last."""
    return run_job(job, log_dir) == 0


def run_job(job: Job, log_dir: Path) -> int:
    """:func:`execute`, returning the command's exit status (negative: killed by that
    signal)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    env, cwd, commit = dict(os.environ), REPO, None
    if job.code is not None:
        cwd = job.code
        env["PYTHONPATH"] = os.pathsep.join([str(job.code / "src"), env.get("PYTHONPATH", "")])
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=job.code, text=True,
                                capture_output=True).stdout.strip() or None
    print(f"[{time.strftime('%H:%M:%S')}] start {job.name}: {shlex.join(job.argv)}", flush=True)
    with open(log_dir / f"{job.name}.log", "a") as log:
        rc = subprocess.run(job.argv, cwd=cwd, env=env, stdout=log,
                            stderr=subprocess.STDOUT).returncode
    seconds = time.time() - start
    if rc != 0:
        print(f"[{time.strftime('%H:%M:%S')}] FAILED {job.name} (exit {rc}, {seconds:.0f} s; "
              f"log: {log_dir / job.name}.log)", flush=True)
        return rc
    if job.remake:
        return finish_remake(job, seconds, commit)
    record = RECORDS / job.name
    if record.exists():
        shutil.rmtree(record)
    record.mkdir(parents=True)
    for name in job.keep:
        if (job.folder / name).exists():
            shutil.copy2(job.folder / name, record / name)
    argv = [str(a).replace(str(runs_dir()), "{runs}") for a in job.argv]
    (record / MARKER).write_text(json.dumps(
        {"command": shlex.join(argv), "code": commit, "seconds": round(seconds, 1),
         "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1) + "\n")
    print(f"[{time.strftime('%H:%M:%S')}] done {job.name} in {seconds / 60:.1f} min", flush=True)
    return 0


def finish_remake(job: Job, seconds: float, commit: str | None) -> int:
    """Checks a remade run against its record and writes ``remade.json`` there; a model
    whose held-out responses differ is moved aside (``final-differs``), so that no audit
    takes it, and the job fails."""
    (job.folder / REMADE).unlink(missing_ok=True)
    same, differ = check_remake(job)
    argv = [str(a).replace(str(runs_dir()), "{runs}") for a in job.argv]
    (RECORDS / job.name / "remade.json").write_text(json.dumps(
        {"command": shlex.join(argv), "code": commit, "seconds": round(seconds, 1),
         "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
         "same_heldout_responses": same, "responses_differing": differ}, indent=1) + "\n")
    if not same:
        aside = job.folder / "final-differs"
        if aside.exists():
            shutil.rmtree(aside)
        (job.folder / "final").rename(aside)
        print(f"[{time.strftime('%H:%M:%S')}] FAILED {job.name} remade: {differ} held-out "
              "responses differ from its record; its audit will not run", flush=True)
        return 1
    (job.folder / REMADE).write_text(f"{differ}\n")
    print(f"[{time.strftime('%H:%M:%S')}] remade {job.name} in {seconds / 60:.1f} min, the "
          "record's held-out responses word for word", flush=True)
    return 0


def pending_train(root: Path, code: Path | None = None) -> list[Job]:
    def made(s: str, a: str, seed: int) -> Job:
        return dataclasses.replace(train_job(s, a, seed, root), code=code,
                                   again=lambda: made(s, a, seed))

    return [made(s, a, seed) for s, a, seed in plan() if not recorded(run_name(s, a, seed))]


def pending_audits(root: Path, code: Path | None = None) -> list[Job]:
    return [job for job in audit_jobs(root, code) if not recorded(job.name)]


def next_job(pending: list[Job], running: list[Job]) -> Job | None:
    """The first of ``pending`` that may start beside ``running``: one that is
    :meth:`Job.ready`, and a heavy job (:data:`HEAVY`) only while no other heavy job runs;
    None when none may."""
    heavy = any(job.heavy for job in running)
    return next((job for job in pending if job.ready() and not (job.heavy and heavy)), None)


def drive(jobs: list[Job], n_jobs: int, log_dir: Path) -> int:
    """Runs ``jobs``, ``n_jobs`` at a time, in order but for :func:`next_job`'s rule; a
    job a signal killed goes again at the end of the queue (:data:`RETRIES`)."""
    print(f"{len(jobs)} to do, {n_jobs} at a time; logs in {log_dir}", flush=True)
    pending, running, results, retried = list(jobs), {}, [], Counter()
    with ThreadPoolExecutor(max_workers=n_jobs) as pool:
        while pending or running:
            while len(running) < n_jobs and (job := next_job(pending, list(running.values()))):
                pending.remove(job)
                running[pool.submit(run_job, job, log_dir)] = job
            if not running:  # what is left waits for models that no job will make
                print(f"not started, their models missing: {', '.join(j.name for j in pending)}",
                      flush=True)
                return 1
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                job, rc = running.pop(future), future.result()
                if rc < 0 and job.again is not None and retried[job.name] < RETRIES:
                    retried[job.name] += 1
                    print(f"[{time.strftime('%H:%M:%S')}] {job.name} again later (killed by "
                          f"signal {-rc}; try {retried[job.name] + 1})", flush=True)
                    pending.append(job.again())
                    continue
                results.append(rc == 0)
    failed = results.count(False)
    print(f"{len(results) - failed} finished, {failed} failed", flush=True)
    return 1 if failed else 0


def status() -> int:
    done = [run_name(*p) for p in plan() if recorded(run_name(*p))]
    print(f"training runs recorded: {len(done)} of {len(plan())}")
    for setting in SETTINGS:
        for arm in ARMS:
            seeds = [s for s in SEEDS if recorded(run_name(setting, arm, s))]
            print(f"  {setting} {arm:7s} seeds {seeds}")
    audits = audit_jobs(runs_dir())
    print(f"audits recorded: {sum(recorded(j.name) for j in audits)} of {len(audits)}")
    # names only: making the jobs (train_job) clears a run folder without a checkpoint,
    # which may be a run that a driver is making right now
    remakes = [j.name.removeprefix("audit-") for j in audits
               if not recorded(j.name) and to_remake(j)]
    if remakes:
        print(f"runs to make again for their audits (model not on this machine): "
              f"{', '.join(remakes)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("status", "run", "audit"))
    p.add_argument("--jobs", type=int, default=2, help="runs side by side (one thread each)")
    p.add_argument("--limit", type=int, default=None, help="at most this many runs this time")
    args = p.parse_args(argv)
    if args.jobs < 1:
        print("verdict_study: --jobs: expected a positive integer", file=sys.stderr)
        return 2
    if args.action == "status":
        return status()
    root = runs_dir()
    root.mkdir(parents=True, exist_ok=True)
    audits = pending_audits(root, code_tree(root, AUDIT_CODE))
    if args.action == "run":
        code = code_tree(root)
        jobs = pending_train(root, code) + remake_jobs(root, audits, code)
    else:
        missing = [j.name for j in audits if not j.ready()]
        if missing:
            print(f"verdict_study: audit: no final model for {', '.join(missing)}; "
                  "`run` makes them (again)", file=sys.stderr)
        jobs = [j for j in audits if j.ready()]
    return drive(jobs[:args.limit], args.jobs, root / "logs")


if __name__ == "__main__":
    sys.exit(main())
