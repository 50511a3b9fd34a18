"""Run a study's ``ktae`` commands over several sittings: skip what is recorded, resume what
was cut, never lose a finished run.

A study is a list of :class:`Job`, each one ``ktae`` command writing one run folder. The
driver runs them ``jobs`` at a time (one thread each):

* a job whose record (``RECORDS/NAME/record.json``) exists is skipped;
* a job whose run folder holds a checkpoint resumes from it (``--resume``);
* a finished job's files are copied into its record, the marker last, so that the record
  outlives the machine (run folders live outside the work tree);
* a job killed by a signal (the out-of-memory killer) goes again at the end of the queue,
  from its last checkpoint, at most :data:`RETRIES` times;
* a refused command (exit 2: bad settings) stops the queue: the others would be refused;
* with a deadline (``until``, ``--until HH:MM``), a job starts only if the longest recorded
  run of its kind (its name without the seed, :func:`kind`) would end before it, so that a
  sitting with a known end does not start runs it would cut (a cut run resumes only where
  its run folder outlives the sitting); a job of a kind with no record starts.

Every job imports ``ktae`` from one pinned commit (a detached worktree beside the run
folders, made once), so that work landing on the branch while a study runs for hours
cannot change it half-way; each record names that commit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER = "record.json"
"""Written last into a record: the command, the commit, the seconds, when it finished."""
RETRIES = 2


@dataclass(frozen=True)
class Job:
    name: str
    """The run's name: its folder under the runs root and its record's."""
    argv: tuple[str, ...]
    """The ``ktae train`` command, without ``-o`` and ``--resume`` (added here)."""
    keep: tuple[str, ...] = ("summary.json", "metrics.jsonl", "eval.jsonl", "config.yaml")
    """Files of the finished run kept in its record."""


def runs_root(study: str) -> Path:
    """Where a study's run folders go: ``$KTAE_STUDY_RUNS/STUDY``, else
    ``$KTAE_CACHE/studies/STUDY`` or ``~/.cache/ktae/studies/STUDY`` (outside the work
    tree, which a new checkout replaces)."""
    if os.environ.get("KTAE_STUDY_RUNS"):
        return Path(os.environ["KTAE_STUDY_RUNS"]) / study
    cache = os.environ.get("KTAE_CACHE")
    return (Path(cache) if cache else Path.home() / ".cache" / "ktae") / "studies" / study


def code_tree(root: Path, commit: str) -> Path:
    """A detached worktree of ``commit`` beside the run folders, made once."""
    tree = root / f"code-{commit[:12]}"
    if not (tree / "src" / "ktae").exists():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", "--force", str(tree), commit],
                       cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return tree


def recorded(records: Path, name: str) -> bool:
    return (records / name / MARKER).is_file()


def command(job: Job, folder: Path) -> list[str]:
    """The job's command for its run folder: ``--resume`` when a checkpoint is there; a
    folder with no checkpoint is a start that kept nothing, and goes."""
    argv = [*job.argv, "-o", str(folder)]
    if any(folder.glob("checkpoint-*")) or (folder / "checkpoints").exists():
        argv.append("--resume")
    elif folder.exists():
        shutil.rmtree(folder)
    return argv


def run_job(job: Job, root: Path, records: Path, code: Path) -> int:
    """Runs ``job`` importing ``ktae`` from ``code``; on success copies its files into
    its record, the marker last. Returns the exit status (negative: killed by a signal)."""
    folder, logs = root / job.name, root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    argv = command(job, folder)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(code / "src"), env.get("PYTHONPATH", "")])
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=code, text=True,
                            capture_output=True).stdout.strip()
    start = time.time()
    print(f"[{time.strftime('%H:%M:%S')}] start {job.name}: {shlex.join(argv)}", flush=True)
    with open(logs / f"{job.name}.log", "a") as log:
        rc = subprocess.run([sys.executable, "-m", "ktae", *argv], cwd=code, env=env,
                            stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.time() - start
    if rc != 0:
        print(f"[{time.strftime('%H:%M:%S')}] FAILED {job.name} (exit {rc}, {seconds:.0f} s; "
              f"log {logs / job.name}.log)", flush=True)
        return rc
    record = records / job.name
    if record.exists():
        shutil.rmtree(record)
    record.mkdir(parents=True)
    for name in job.keep:
        if (folder / name).exists():
            shutil.copy2(folder / name, record / name)
    shown = [a.replace(str(root), "{runs}") for a in ["ktae", *job.argv, "-o", str(folder)]]
    (record / MARKER).write_text(json.dumps(
        {"command": shlex.join(shown), "code": commit, "seconds": round(seconds, 1),
         "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1) + "\n")
    print(f"[{time.strftime('%H:%M:%S')}] done {job.name} in {seconds / 60:.1f} min",
          flush=True)
    return 0


def kind(name: str) -> str:
    """A run's kind: its name without a trailing ``-s<seed>`` (``ktae-s202`` -> ``ktae``)."""
    stem, sep, seed = name.rpartition("-s")
    return stem if sep and seed.isdigit() else name


def longest_seconds(records: Path) -> dict[str, float]:
    """Per kind of run, the longest time a recorded run of it took (its marker's seconds)."""
    out: dict[str, float] = {}
    for marker in sorted(records.glob(f"*/{MARKER}")) if records.is_dir() else []:
        seconds = json.loads(marker.read_text()).get("seconds")
        if isinstance(seconds, (int, float)):
            k = kind(marker.parent.name)
            out[k] = max(out.get(k, 0.0), float(seconds))
    return out


def _next_fitting(pending: list[Job], records: Path, until: float | None) -> Job | None:
    """The first pending job that would end before ``until`` (any, without a deadline)."""
    if until is None:
        return pending.pop(0) if pending else None
    longest, now = longest_seconds(records), time.time()
    for i, job in enumerate(pending):
        if now + longest.get(kind(job.name), 0.0) <= until:
            return pending.pop(i)
    return None


def drive(jobs: list[Job], *, n_jobs: int, root: Path, records: Path, code: Path,
          until: float | None = None) -> int:
    """Runs the jobs not yet recorded, ``n_jobs`` at a time, in order; one a signal killed
    goes again at the end of the queue (:data:`RETRIES`). With ``until`` (seconds since
    the epoch), a job starts only if the longest recorded run of its kind would end by
    then; the rest wait for a later sitting. Returns 1 if any failed."""
    pending = [j for j in jobs if not recorded(records, j.name)]
    print(f"{len(jobs) - len(pending)} of {len(jobs)} recorded; {len(pending)} to do, "
          f"{n_jobs} at a time; logs in {root / 'logs'}"
          + (f"; starting only runs that end by {time.strftime('%H:%M', time.gmtime(until))}"
             " UTC" if until is not None else ""), flush=True)
    running, failed, retried = {}, 0, Counter()
    with ThreadPoolExecutor(max_workers=n_jobs) as pool:
        while pending or running:
            while pending and len(running) < n_jobs:
                job = _next_fitting(pending, records, until)
                if job is None:
                    break
                running[pool.submit(run_job, job, root, records, code)] = job
            if not running:
                print(f"{len(pending)} left: none would end by the deadline", flush=True)
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                job, rc = running.pop(future), future.result()
                if rc < 0 and retried[job.name] < RETRIES:
                    retried[job.name] += 1
                    pending.append(dataclasses.replace(job))
                elif rc != 0:
                    failed += 1
                    if rc == 2:  # a refused command: every later job would be refused too
                        print("a command was refused (exit 2): no further job starts",
                              flush=True)
                        pending.clear()
    print(f"finished; {failed} failed", flush=True)
    return 1 if failed else 0


def study_arguments(prog: str, description: str, argv: list[str] | None):
    """A study script's ``status | run | table`` and ``--jobs``; None (after a one-line
    error) when ``--jobs`` is not a positive integer."""
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("action", choices=("status", "run", "table"))
    p.add_argument("--jobs", type=int, default=2, help="runs side by side (one thread each)")
    p.add_argument("--until", default=None, metavar="HH:MM",
                   help="start only runs that the longest recorded run of their kind says "
                        "would end by then (UTC; the next such time)")
    args = p.parse_args(argv)
    if args.jobs < 1:
        print(f"{prog}: --jobs: expected a positive integer", file=sys.stderr)
        return None
    if args.until is not None:
        args.until = deadline(args.until)
        if args.until is None:
            print(f"{prog}: --until: expected a UTC time as HH:MM", file=sys.stderr)
            return None
    return args


def deadline(text: str, now: float | None = None) -> float | None:
    """``HH:MM`` (UTC) as seconds since the epoch: the next such time after ``now``; None
    when ``text`` is not a time of day."""
    hours, sep, minutes = text.partition(":")
    if not (sep and hours.isdigit() and minutes.isdigit() and len(minutes) == 2
            and int(hours) < 24 and int(minutes) < 60):
        return None
    now = time.time() if now is None else now
    day = now - now % 86400
    at = day + int(hours) * 3600 + int(minutes) * 60
    return at if at > now else at + 86400


def status_line(jobs: list[Job], records: Path) -> str:
    """How many of ``jobs`` are recorded, and the next few to run."""
    todo = [j.name for j in jobs if not recorded(records, j.name)]
    return (f"recorded {len(jobs) - len(todo)} of {len(jobs)}; next: "
            f"{', '.join(todo[:4]) or 'none'}")

