"""Symbolic equivalence worker, run as a separate process by :mod:`ktae.rewards.pool`.

Protocol: one JSON object per line on stdin, ``{"gold": str, "pred": str}`` (symbolic
equivalence of two bare answers) or ``{"scorer": name, "gold": str, "pred": str}`` (a
whole response checked by a scorer of :mod:`ktae.rewards.answer_line` (e.g. ``"dapo"``)
or :mod:`ktae.rewards.authors_grader` (``"ktae-authors"``);
one JSON object per line on stdout, ``{"equal": bool}`` (scorers add ``"pred"``, the
answer they read, or null) or ``{"error": str}``. The first line
written is ``{"ready": true}``. The process exits on end of input, even in the middle of
a check.

The worker dies with the process that started it (its pid is ``argv[1]``), so a killed
trainer never leaves a check burning a core: on Linux through the parent-death signal
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``, which also stops a check stuck in C code holding
the GIL, e.g. ``9^{9^{9^{9}}}``); everywhere through a thread that exits as soon as stdin
reaches end of file, which happens when the parent dies (it then runs whenever the check
returns to Python code, as sympy does between steps).

This file is executed by path (not imported as ``ktae.rewards._worker``) so that the
worker starts with math-verify and the standard library only. math-verify's own
signal-based timeouts are disabled (``parsing_timeout=None``, ``timeout_seconds=None``):
the parent enforces the deadline by killing this process.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import sys
import threading
from functools import lru_cache

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WARM_UP = (("2\\sqrt{2}", "\\sqrt{8}"), ("x^2-1", "(x-1)(x+1)"))

MEMORY_LIMIT_BYTES = 4 * 1024**3  # address space; a runaway 9^9^9^9 fails fast instead


def _setup() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    logging.disable(logging.CRITICAL)  # math-verify warns on every disabled timeout
    sys.setrecursionlimit(10_000)


def _die_with_parent(parent_pid: int | None) -> None:
    """Ask Linux to SIGKILL this process when its parent dies; exit if it already has."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no usable libc: the end-of-input thread remains
            pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(0)  # the parent died before the signal was armed: we were re-parented


def _requests() -> queue.SimpleQueue:
    """Lines of stdin, read by a thread that ends the process at end of input."""
    lines: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        for line in sys.stdin.buffer:
            lines.put(line)
        os._exit(0)  # the parent closed our input or died: stop now, even mid-check

    threading.Thread(target=read, name="stdin", daemon=True).start()
    return lines


def _limit_memory() -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = MEMORY_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(hard,
                                                                              MEMORY_LIMIT_BYTES)
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (ImportError, ValueError, OSError):  # not on this platform: the deadline suffices
        pass


def _answer_line_checks() -> dict:
    """The scorers of ``answer_line.py`` and ``authors_grader.py`` (beside this file;
    loaded by path, so that this process never imports the ktae package)."""
    import importlib.util
    from pathlib import Path

    checks = {}
    for file in ("answer_line.py", "authors_grader.py"):
        path = Path(__file__).with_name(file)
        spec = importlib.util.spec_from_file_location(f"ktae_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        checks.update(module.CHECKS)
    return checks


def main() -> None:
    _die_with_parent(int(sys.argv[1]) if len(sys.argv) > 1 else None)
    _setup()
    requests = _requests()
    out = sys.stdout  # the protocol channel; stray prints of any library go to stderr
    sys.stdout = sys.stderr
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    def _parse(answer: str):
        return parse("\\boxed{" + answer + "}", extraction_config=config,
                     fallback_mode="no_fallback", parsing_timeout=None)

    parse_gold = lru_cache(maxsize=4096)(_parse)
    # sympy loads and initialises its machinery on first use (about 0.6 s for numbers and
    # 1.7 s more for expressions with a variable, measured): do it before saying ready, so
    # that it counts against the start-up time and not against the first check's deadline.
    for gold, pred in WARM_UP:
        try:
            verify(_parse(gold), _parse(pred), timeout_seconds=None)
        except Exception:  # noqa: BLE001 - a warm-up only: checks report their own errors
            pass
    scorers = _answer_line_checks()
    _limit_memory()
    out.write('{"ready": true}\n')
    out.flush()
    while True:
        line = requests.get()
        try:
            req = json.loads(line)
            if "scorer" in req:
                equal, read = scorers[req["scorer"]](req["pred"], req["gold"])
                reply = {"equal": bool(equal), "pred": read}
            else:
                gold, pred = parse_gold(req["gold"]), _parse(req["pred"])
                equal = bool(gold) and bool(pred) and bool(verify(gold, pred,
                                                                  timeout_seconds=None))
                reply = {"equal": equal}
        except BaseException as e:  # noqa: BLE001 - MemoryError, RecursionError, anything
            reply = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
