"""Verifier workers die with the process that started them, even in the middle of a check,
and only then (not when the thread that happened to start them ends)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ktae.rewards import math_reward
from ktae.rewards import pool as pool_mod

SRC = str(Path(pool_mod.__file__).resolve().parents[2])
TOWER = "9^{9^{9^{9}}}"  # sympy computes this in C code holding the GIL, for minutes
SLOW_PYTHON = "\\prod_{k=1}^{3000} (x+k)"  # many seconds of sympy in Python code

# A parent that starts a verifier, says which, then checks something that runs for minutes.
_PARENT = """
import sys
from ktae.rewards import math_reward
from ktae.rewards.pool import get_pool
pool = get_pool()
pool.warm_up(1)
print(pool._idle[0].proc.pid, flush=True)
math_reward("\\\\boxed{" + sys.argv[1] + "}", "1", timeout=600.0)
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan may wait unreaped under some init processes)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _running(pid):
            return True
        time.sleep(0.05)
    return not _running(pid)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_worker_dies_when_its_parent_is_killed_mid_check():
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, TOWER], stdout=subprocess.PIPE,
                              text=True, env=env)
    worker = None
    try:
        worker = int(parent.stdout.readline())  # started and idle; the check comes next
        time.sleep(1.0)
        start = _cpu_seconds(worker)
        time.sleep(1.0)
        assert _cpu_seconds(worker) > start + 0.1, "the worker is not checking anything"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert _wait_gone(worker, 5.0), "the verifier outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if worker is not None and _running(worker):
            os.kill(worker, signal.SIGKILL)


def test_worker_stops_at_end_of_input_mid_check():
    """The portable fallback: the parent's end of the pipe closes, the check is abandoned."""
    proc = subprocess.Popen([sys.executable, pool_mod._WORKER_SCRIPT, str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert b'"ready": true' in proc.stdout.readline()
        proc.stdin.write((json.dumps({"gold": "1", "pred": SLOW_PYTHON}) + "\n").encode())
        proc.stdin.flush()
        time.sleep(1.5)
        assert proc.poll() is None, "the check ended too early to test anything"
        proc.stdin.close()
        proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_workers_started_by_short_lived_threads_outlive_them():
    """Linux sends the parent-death signal when the starting *thread* ends: the pool starts
    workers from its own long-lived thread, so a check thread's exit kills nothing."""
    pool = pool_mod.VerifierPool()
    try:
        thread = threading.Thread(target=pool.warm_up, args=(2,))
        thread.start()
        thread.join()
        time.sleep(0.5)
        with pool._lock:
            workers = list(pool._idle)
        assert len(workers) == 2 and all(w.alive() for w in workers)
        for w in workers:
            assert w.request({"gold": "1/2", "pred": "0.5"}, 30.0) == {"equal": True}
    finally:
        pool.shutdown()


def test_a_check_from_a_finished_thread_pool_still_works():
    results = []
    for _ in range(2):  # the second round reuses workers started by the first's threads
        t = threading.Thread(target=lambda: results.append(
            math_reward("\\boxed{\\frac{2}{4}}", "0.5", timeout=30.0).correct))
        t.start()
        t.join()
    assert results == [True, True]


def test_a_pause_in_the_middle_of_a_check_restarts_its_wait(monkeypatch):
    """The caller stopped for an hour while it waited (SIGSTOP, a suspended machine): the
    wait returns late with nothing read, and the check gets its whole time again and is
    answered, not timed out. The clock and the first wait are simulated; the worker and
    its answer are real."""
    pool = pool_mod.get_pool()
    pool.warm_up(1)
    clock = {"offset": 0.0}
    real_select, real_monotonic = pool_mod.select.select, time.monotonic
    waits = []

    def paused_once(r, w, x, timeout):
        waits.append(timeout)
        if len(waits) == 1:  # stopped for an hour: the wait returns late, having read nothing
            clock["offset"] += 3600.0
            return [], [], []
        return real_select(r, w, x, timeout)

    monkeypatch.setattr(pool_mod, "select", type("S", (), {"select": staticmethod(paused_once)}))
    monkeypatch.setattr(pool_mod, "time",
                        type("T", (), {"monotonic": staticmethod(
                            lambda: real_monotonic() + clock["offset"])}))
    payload = {"scorer": "number", "gold": "7", "pred": "so the answer is 7"}
    reply = pool.run(payload, timeout=5.0)
    assert reply["equal"] is True
    assert len(waits) >= 2 and 4.0 < waits[1] <= 5.0  # the whole time again after the pause


def test_a_late_wait_within_the_slack_keeps_the_deadline(monkeypatch):
    """A wait that returns later than due by less than PAUSE_SLACK is not a pause: the
    deadline stands, and a check still unanswered at it times out."""
    pool = pool_mod.get_pool()
    pool.warm_up(1)
    clock = {"offset": 0.0}
    real_monotonic = time.monotonic

    def never_ready(r, w, x, timeout):  # the worker never answers; each wait runs late
        clock["offset"] += timeout + 0.5 * pool_mod.PAUSE_SLACK
        return [], [], []

    monkeypatch.setattr(pool_mod, "select", type("S", (), {"select": staticmethod(never_ready)}))
    monkeypatch.setattr(pool_mod, "time",
                        type("T", (), {"monotonic": staticmethod(
                            lambda: real_monotonic() + clock["offset"])}))
    with pytest.raises(pool_mod.VerifierTimeout):
        pool.run({"scorer": "number", "gold": "7", "pred": "7"}, timeout=2.0)
