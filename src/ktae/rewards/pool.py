"""A pool of persistent verifier processes with a hard deadline per check.

Symbolic equivalence (sympy through math-verify) can run for ever on adversarial input
(``9^{9^{9^{9}}}``) and its built-in timeout uses ``signal.alarm``, which only works in
the main thread. Here every check runs in a child process started with ``subprocess``
(so it also works inside daemonic ``multiprocessing`` workers, which may not fork
``multiprocessing`` children) and the caller waits on its pipe with ``select`` until
the deadline; a worker that misses it is killed and replaced on the next check. The
caller can therefore be any thread of any process, and is never blocked longer than
``timeout`` (plus a one-off start-up of the worker, bounded by ``STARTUP_TIMEOUT``).

A deadline is time the caller could wait, not time it was stopped: when a wait on the pipe
returns more than :data:`PAUSE_SLACK` seconds after it was due (the process was stopped,
as by ``SIGSTOP`` or Ctrl-Z, or suspended, or not scheduled), the check gets its whole
``timeout`` again from then. A run paused in the middle of a check therefore scores it as
an unpaused run does, while a check that runs past its deadline in a running process is
still killed at it.

A forked child never reuses its parent's workers: the pool is per process id.

Workers die with this process, even mid-check (see :mod:`ktae.rewards._worker`). On Linux
the parent-death signal fires when the *thread* that started a worker ends, so every
worker is started by one thread of the pool that lives as long as the process, never by
the short-lived threads that run checks (``batch_math_reward``'s thread pool).
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

STARTUP_TIMEOUT = 120.0  # seconds to import math-verify in a fresh worker (loaded machines)
MAX_IDLE = 32  # idle workers kept alive; more are stopped when released
PAUSE_SLACK = 1.0
"""Seconds a wait may return after it was due before the caller counts itself paused and
gives the check its whole time again."""
_WORKER_SCRIPT = str(Path(__file__).with_name("_worker.py"))


class WorkerError(RuntimeError):
    """The worker died, could not start, or answered garbage."""


class VerifierTimeout(TimeoutError):
    """The worker missed its deadline and was killed."""


class _Spawner:
    """Starts worker processes from one daemon thread that lives as long as the process."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="ktae-verifier-spawner",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            future, args = self._jobs.get()
            try:
                future.set_result(subprocess.Popen(
                    args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL, bufsize=0, start_new_session=True,
                    close_fds=True))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                future.set_exception(e)

    def popen(self, args: list[str]) -> subprocess.Popen:
        future: Future = Future()
        self._jobs.put((future, args))
        return future.result()


class _Worker:
    """One verifier process and its line-buffered pipes."""

    def __init__(self, spawner: _Spawner) -> None:
        try:
            self.proc = spawner.popen([sys.executable, _WORKER_SCRIPT, str(os.getpid())])
        except OSError as e:
            raise WorkerError(f"cannot start the verifier process: {e}") from e
        self._buf = b""
        try:
            ready = self._read_line(STARTUP_TIMEOUT)
        except VerifierTimeout as e:
            self.kill()
            raise WorkerError("the verifier process did not start in time") from e
        try:
            greeting = json.loads(ready)
        except ValueError:
            greeting = None
        if not isinstance(greeting, dict) or greeting.get("ready") is not True:
            self.kill()
            raise WorkerError(f"unexpected greeting from the verifier: {ready!r}")

    def _read_line(self, timeout: float) -> bytes:
        """The worker's next line, waited for at most ``timeout`` seconds of time this
        process could wait (a pause restarts the wait: see the module's docstring)."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                raise VerifierTimeout
            readable, _, _ = select.select([fd], [], [], left)
            woke = time.monotonic()
            if woke - now > left + PAUSE_SLACK:  # stopped or starved past the deadline
                deadline = woke + timeout
            if not readable:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise WorkerError(f"the verifier process exited (code {self.proc.poll()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def request(self, payload: dict, timeout: float) -> dict:
        """Send one check and wait at most ``timeout`` seconds for its answer."""
        data = (json.dumps(payload) + "\n").encode("ascii")  # ensure_ascii: no encoding errors
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerError(f"the verifier process is gone: {e}") from e
        line = self._read_line(timeout)
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise WorkerError(f"garbled answer from the verifier: {line[:100]!r}")
        return reply

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a zombie we cannot reap
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:  # pragma: no cover
                pass


class VerifierPool:
    """Idle workers ready for a check; grows to the number of concurrent callers."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._spawner = _Spawner()

    def run(self, payload: dict, timeout: float) -> dict:
        """One check on an idle (or new) worker. Raises VerifierTimeout or WorkerError."""
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None or not worker.alive():
            worker = _Worker(self._spawner)
        try:
            reply = worker.request(payload, timeout)
        except (VerifierTimeout, WorkerError):
            worker.kill()
            self._replace_in_background()
            raise
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(worker)
                return reply
        worker.kill()
        return reply

    def _replace_in_background(self) -> None:
        """Start a replacement worker off the caller's critical path."""

        def start() -> None:
            try:
                fresh = _Worker(self._spawner)
            except WorkerError:
                return  # the next check starts one itself (and reports the error)
            with self._lock:
                if len(self._idle) < MAX_IDLE and self.pid == os.getpid():
                    self._idle.append(fresh)
                    return
            fresh.kill()

        threading.Thread(target=start, name="ktae-verifier-restart", daemon=True).start()

    def warm_up(self, n: int) -> None:
        """Start workers until ``n`` are idle (start-up happens off the check's deadline)."""
        with self._lock:
            missing = max(0, min(n, MAX_IDLE) - len(self._idle))
        fresh = [_Worker(self._spawner) for _ in range(missing)]
        with self._lock:
            self._idle.extend(fresh)

    def size(self) -> int:
        with self._lock:
            return len(self._idle)

    def shutdown(self) -> None:
        with self._lock:
            workers, self._idle = self._idle, []
        for w in workers:
            w.kill()


_POOL: VerifierPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool() -> VerifierPool:
    """This process's pool (a forked child gets a fresh one, never its parent's workers)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            _POOL = VerifierPool()
        return _POOL


def shutdown_verifiers() -> None:
    """Stop this process's idle verifier workers (they restart on demand)."""
    with _POOL_LOCK:
        pool = _POOL
    if pool is not None and pool.pid == os.getpid():
        pool.shutdown()


atexit.register(shutdown_verifiers)
