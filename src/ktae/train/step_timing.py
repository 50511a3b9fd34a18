"""Where an optimizer step's time goes: generation, scoring, log-probs, advantages, update.

The trainer opens a named part around each kind of work (:meth:`StepClock.part`); parts
nest, and a part's clock stops while a part inside it runs, so each second is counted
once, in the innermost part. The update part wraps TRL's ``training_step`` (which also
generates, inside ``_prepare_inputs``), so what stays in it is the loss forward and
backward pass; the optimizer step is added to it. ``other`` is what no part measured:
TRL's glue between them (padding, gathers, metric bookkeeping), gradient clipping and
rollout recording. See docs/step-time.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

PARTS = ("generation", "scoring", "logprobs", "advantages", "update")
"""The measured parts of a step, in the order they run."""

#: Part -> metrics.jsonl key (``advantage_seconds`` predates the other parts).
PART_KEYS = {
    "generation": "generation_seconds",
    "scoring": "scoring_seconds",
    "logprobs": "logprob_seconds",
    "advantages": "advantage_seconds",
    "update": "update_seconds",
    "other": "other_seconds",
}


TIMING_RECORD_KEYS = ("step_time", *PART_KEYS.values(), "advantage_share")
"""metrics.jsonl keys that are measured times (they differ between identical runs)."""


class StepClock:
    """Exclusive seconds per part of the step in progress.

    Args:
        clock: a monotonic clock in seconds (``time.perf_counter``; tests pass a fake).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.started: float | None = None
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self._open: list[list] = []  # [part, time its clock last (re)started]

    def start_step(self) -> None:
        """Start a step (its parts start at zero). Parts opened outside a step are not
        counted."""
        self.started = self.clock()
        self.seconds = dict.fromkeys(PARTS, 0.0)

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Count the time inside the block to ``name``, less the time of parts inside it."""
        self.begin(name)
        try:
            yield
        finally:
            self.end(name)

    def begin(self, name: str) -> None:
        """Open part ``name`` (pausing the enclosing part); :meth:`end` closes it."""
        if name not in PARTS:
            raise ValueError(f"part: expected one of {PARTS}, got {name!r}")
        now = self.clock()
        if self._open:
            outer = self._open[-1]
            self._add(outer[0], now - outer[1])
        self._open.append([name, now])

    def end(self, name: str) -> None:
        """Close part ``name``, the innermost open one (resuming the enclosing part)."""
        if not self._open or self._open[-1][0] != name:
            raise RuntimeError(f"part {name!r} is not the innermost open part")
        now = self.clock()
        _, since = self._open.pop()
        self._add(name, now - since)
        if self._open:
            self._open[-1][1] = now

    def _add(self, name: str, seconds: float) -> None:
        if self.started is not None:
            self.seconds[name] += seconds

    def finish_step(self) -> dict[str, float] | None:
        """The finished step's seconds: each part, ``other`` (the step's time that no part
        measured) and ``step``; None when no step was started."""
        if self.started is None:
            return None
        total = self.clock() - self.started
        out = dict(self.seconds)
        out["other"] = max(0.0, total - sum(out.values()))
        out["step"] = total
        self.started = None
        return out


def mean_step_seconds(records: list[dict]) -> dict[str, float] | None:
    """Mean seconds per part over metrics.jsonl ``records`` (those with a ``step_time``),
    keyed by part name and ``step``; None when no record has one."""
    timed = [r for r in records if r.get("step_time") is not None]
    if not timed:
        return None
    out = {"step": sum(r["step_time"] for r in timed) / len(timed)}
    for part, key in PART_KEYS.items():
        values = [r[key] for r in timed if r.get(key) is not None]
        if values:
            out[part] = sum(values) / len(values)
    return out


def describe_step(record: dict) -> str | None:
    """A short line of a metrics.jsonl record's step time, e.g. ``"21.3s = gen 12.1 +
    score 0.1 + lp 2.0 + adv 0.0 + upd 6.8 + other 0.3"``; None without timing."""
    if record.get("step_time") is None:
        return None
    short = {"generation": "gen", "scoring": "score", "logprobs": "lp", "advantages": "adv",
             "update": "upd", "other": "other"}
    parts = [f"{short[p]} {record[k]:.1f}" for p, k in PART_KEYS.items()
             if record.get(k) is not None]
    return f"{record['step_time']:.1f}s = " + " + ".join(parts)
