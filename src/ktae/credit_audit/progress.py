"""Progress lines of ``ktae audit`` after sampling, in the style of the sampling's lines
(:func:`ktae.credit_audit.arith_input.progress_printer`): what is done out of how many,
the time so far and an estimate of the rest, on stderr."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

EVERY_S = 5.0
"""Seconds between two lines of one phase (its first and last line always print)."""

Phase = Callable[[str, str, int], Callable[[int], None]]
"""``on_phase(verb, what, total)`` -> ``step(n)``, called with the number of items done
since the last call: the progress of one phase (``("scored", "groups (log-probs)",
200)``)."""


def phase_printer(stream=None, every: float = EVERY_S) -> Phase:
    """An ``on_phase`` that prints ``  VERB DONE/TOTAL WHAT in S s, about S s left``: at
    the first step of each phase, then at most once every ``every`` seconds, and at its
    last step."""

    def on_phase(verb: str, what: str, total: int) -> Callable[[int], None]:
        start, done, last = time.monotonic(), [0], [None]

        def step(n: int = 1) -> None:
            done[0] += n
            now = time.monotonic()
            if done[0] < total and last[0] is not None and now - last[0] < every:
                return
            last[0] = now
            elapsed = now - start
            left = elapsed / done[0] * (total - done[0]) if done[0] else 0.0
            print(f"  {verb} {done[0]}/{total} {what} in {elapsed:.0f} s"
                  + (f", about {left:.0f} s left" if done[0] < total else ""),
                  file=stream or sys.stderr, flush=True)

        return step

    return on_phase


def quiet_phase(verb: str, what: str, total: int) -> Callable[[int], None]:
    """An ``on_phase`` that prints nothing."""
    return lambda n=1: None
