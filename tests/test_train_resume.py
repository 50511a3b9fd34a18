"""Kill/resume: a run killed with SIGKILL and resumed ends with the same metrics as an
uninterrupted run with the same seed; half-written checkpoints are never picked.

The run kills itself right after its checkpoint at step 4 is complete, so the test does
not race the run (see test_train_resume_kill.py for kills at other points)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_train_helpers import DETERMINISTIC_KEYS, read_jsonl, save_tiny_model

from ktae.checkpoints import COMPLETE_MARKER, latest_complete_checkpoint
from ktae.train.step_timing import TIMING_RECORD_KEYS

pytestmark = pytest.mark.slow

SCRIPT = """
import os, signal, sys, torch
sys.path.insert(0, {tests!r})
from transformers import TrainerCallback
from test_train_helpers import contains_digit, tiny_config
from ktae.train.session import train


class KillAfterSave(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        if state.global_step == {kill_at}:
            os.kill(os.getpid(), signal.SIGKILL)


torch.set_num_threads(1)
cfg = tiny_config({model!r}, {out!r}, max_steps=8, save_every=2, eval_every=4, algo="dapo",
                  credit="ktae", resume={resume})
train(cfg, reward_funcs=[contains_digit], extra_callbacks=[KillAfterSave()])
"""

# The fork server: imports what a training run imports, then runs each script it is sent
# (one JSON line: path, argv, environment, log) in a child forked for it, and answers with
# the child's exit status as ``subprocess`` gives it (-9 when it SIGKILLed itself).
FORK_SERVER = r"""
import atexit, json, os, runpy, sys, traceback
sys.path.insert(0, {tests!r})
import matplotlib.pyplot
import torch
import transformers
import trl

import ktae.cli
import ktae.train.session
import test_train_helpers

torch.set_num_threads(1)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.environ.update(job["env"])
            sys.argv = [job["path"], *job["argv"]]
            runpy.run_path(job["path"], run_name="__main__")
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (done.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class ForkedRuns:
    """Runs training scripts, each in a process of its own, forked from one server that
    imported torch, transformers, TRL and ktae's trainer once: every run skips those
    imports (about 10 s of CPU a process), and a run may still SIGKILL itself. The server
    starts with ``OMP_NUM_THREADS=1`` and ``PYTHONHASHSEED=0``, as the runs did."""

    def __init__(self, folder: Path):
        self.folder = folder
        server = folder / "fork_server.py"
        server.write_text(FORK_SERVER.format(tests=str(Path(__file__).parent)))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        self.log = open(folder / "fork_server.log", "w")  # noqa: SIM115 (closed in close)
        self.server = subprocess.Popen([sys.executable, str(server)], env=env, text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=self.log)
        self.runs = 0

    def run(self, script: Path, *argv: str, env: dict | None = None, timeout: float = 300
            ) -> subprocess.CompletedProcess:
        """Runs ``script`` with ``argv`` (and ``env`` added to the environment) in a forked
        process; its exit status, and its stdout and stderr together as ``stderr``."""
        self.runs += 1
        log = self.folder / f"run{self.runs}.log"
        self.server.stdin.write(json.dumps({"path": str(script), "argv": list(argv),
                                            "env": env or {}, "log": str(log)}) + "\n")
        self.server.stdin.flush()
        ready, _, _ = select.select([self.server.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"{script} ran longer than {timeout} s")
        answer = self.server.stdout.readline()
        if not answer:
            raise RuntimeError(f"the fork server ended: {(self.folder / 'fork_server.log')}")
        output = log.read_text() if log.exists() else ""
        return subprocess.CompletedProcess([str(script), *argv], int(answer), "", output)

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait(timeout=60)
        self.log.close()


@pytest.fixture
def forked_runs(tmp_path):
    """A :class:`ForkedRuns` server for the test, ended after it."""
    runs = ForkedRuns(tmp_path)
    yield runs
    runs.close()


KILL_AT = 4
TIMING_KEYS = TIMING_RECORD_KEYS


def _script(tmp_path: Path, model: Path, out: Path, resume: bool, kill: bool = False
            ) -> Path:
    path = tmp_path / f"run_{out.name}_{int(resume)}.py"
    path.write_text(SCRIPT.format(tests=str(Path(__file__).parent), model=str(model),
                                  out=str(out), resume=resume,
                                  kill_at=KILL_AT if kill else -1))
    return path


def test_kill_and_resume_matches_uninterrupted(tmp_path, forked_runs):
    model = save_tiny_model(tmp_path / "model")
    full, killed = tmp_path / "full", tmp_path / "killed"
    done = forked_runs.run(_script(tmp_path, model, full, False))
    assert done.returncode == 0, done.stderr[-3000:]

    proc = forked_runs.run(_script(tmp_path, model, killed, False, kill=True))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    done = latest_complete_checkpoint(killed)
    assert done is not None and done.name == f"checkpoint-{KILL_AT}"
    # a checkpoint cut short by a kill (no marker) must be ignored on resume
    partial = killed / "checkpoint-7"
    partial.mkdir(exist_ok=True)
    (partial / "model.safetensors").write_bytes(b"truncated")
    assert latest_complete_checkpoint(killed) == done

    resumed = forked_runs.run(_script(tmp_path, model, killed, True))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = read_jsonl(full / "metrics.jsonl"), read_jsonl(killed / "metrics.jsonl")
    assert [m["step"] for m in b] == list(range(1, 9))
    for ma, mb in zip(a, b, strict=True):
        # every key the uninterrupted run logs (timing aside) is in the resumed run, equal
        assert set(ma) - set(TIMING_KEYS) == set(mb) - set(TIMING_KEYS), ma["step"]
        # and these must be logged at all (flagged_token_rate: calibrations only)
        missing = [k for k in DETERMINISTIC_KEYS if k != "flagged_token_rate" and k not in ma]
        assert not missing, (ma["step"], missing)
        for key in set(ma) - set(TIMING_KEYS):
            assert mb[key] == ma[key], (ma["step"], key)
    ea, eb = read_jsonl(full / "eval.jsonl"), read_jsonl(killed / "eval.jsonl")
    assert [e["step"] for e in eb] == [e["step"] for e in ea] == [0, 4, 8]
    assert [e["accuracy"] for e in eb] == [e["accuracy"] for e in ea]
    assert (killed / "checkpoint-8" / COMPLETE_MARKER).exists()
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["resumed_from"] == str(done)
