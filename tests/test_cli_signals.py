"""Ctrl-C (SIGINT) and SIGTERM stop a working ``ktae train`` or ``ktae eval`` at once: one
short message (train: how to resume), exit status 130 / 143, no traceback, and no
child process left behind (the verifier workers included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ktae.cli_common import descendants

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")

SHIPPED = next((Path(__file__).resolve().parents[1] / "src" / "ktae" / "models" / "shipped")
               .glob("embedded-*"))
# The program itself (argv from sys.argv, as the console script), with one verifier worker
# started first so that the test can see it is stopped too.
LAUNCH = ("import sys\n"
          "from ktae.rewards.pool import get_pool\n"
          "get_pool().warm_up(1)\n"
          "from ktae.cli import main\n"
          "sys.argv = ['ktae', *sys.argv[1:]]\n"
          "sys.exit(main())\n")
TIMEOUT = 300


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


class _Reader:
    """Collects a pipe's lines in a thread; ``wait_for`` blocks until one contains text."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self.lines.append(None)
            self._cond.notify_all()

    def wait_for(self, text: str, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: None in self.lines or any(text in ln for ln in self.lines if ln),
                timeout) and any(text in ln for ln in self.lines if ln)

    def text(self) -> str:
        return "".join(ln for ln in self.lines if ln)


def _interactive_signals() -> None:
    """In the child: SIGINT as in an interactive shell. A suite started in the background
    (``cmd &`` in a script, ``nohup``) runs with SIGINT ignored, the child would inherit
    that, and ktae keeps an inherited ignore (as a background job should)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str], cwd: Path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_interactive_signals)
    return proc, _Reader(proc.stdout), _Reader(proc.stderr)


def _wait_until(condition, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _stop_and_check(proc, err: _Reader, signum: int) -> str:
    children = descendants(proc.pid)
    assert children, "the command should hold a verifier worker at this point"
    before = len(err.lines)
    proc.send_signal(signum)
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    _wait_until(lambda: None in err.lines, 10, "stderr to close")
    stderr = err.text()
    assert rc == 128 + signum, (rc, stderr[-3000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    _wait_until(lambda: not any(_alive(p) for p in children), 10,
                f"the child processes {children} to end")
    after = [ln.strip() for ln in err.lines[before:] if ln and ln.strip()]
    assert len(after) == 1, after  # one line, whatever the command printed before
    return after[0]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_train_stops_with_a_resume_hint(tmp_path, signum):
    run = tmp_path / "run"
    proc, _out, err = _start(
        ["train", "--algo", "grpo", "--num-prompts", "2", "--num-generations", "4",
         "--max-new-tokens", "16", "--eval-size", "4", "--eval-every", "0",
         "--train-size", "32", "--save-every", "0", "--max-steps", "100000",
         "--no-progress", "-o", str(run)], tmp_path)
    try:
        metrics = run / "metrics.jsonl"
        _wait_until(lambda: metrics.is_file() and metrics.stat().st_size > 0
                    or proc.poll() is not None, TIMEOUT, "the first training step")
        assert proc.poll() is None, err.text()[-3000:]
        stderr = _stop_and_check(proc, err, signum)
    finally:
        if proc.poll() is None:
            proc.kill()
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    last = stderr
    assert last.startswith(f"ktae train: {word}; continue with: ktae train --algo grpo"), last
    assert last.endswith(f"--resume -o {run}"), last
    assert "--max-steps 100000" in last


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_eval_stops_at_once(tmp_path, signum):
    # 2,000 problems x 4 samples keep the tiny model generating long after the signal;
    # drawing 100,000 problems alone took over a minute before generation began
    proc, out, err = _start(
        ["eval", str(SHIPPED), "--benchmarks", "embedded", "--limit", "2000", "--k", "4",
         "--no-progress", "-o", str(tmp_path / "eval")], tmp_path)
    try:
        assert out.wait_for("generation:", TIMEOUT), err.text()[-3000:]  # evaluating now
        assert proc.poll() is None
        stderr = _stop_and_check(proc, err, signum)
    finally:
        if proc.poll() is None:
            proc.kill()
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    assert stderr == f"ktae eval: {word}"
