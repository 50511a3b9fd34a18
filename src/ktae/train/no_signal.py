"""A run that learns nothing says so: the no-signal check of ``ktae train``.

A group whose responses are all right or all wrong ("unmixed") has equal rewards, so its
sequence-level advantages are zero; when every group of a step is unmixed the policy
gradient is zero (up to the KL term) and the step teaches nothing. When that holds for
``steps`` consecutive logged steps, or most responses hit the length limit for as long,
:func:`find_no_signal` names the likely cause, in this order:

* ``format``: no response held an answer in the reward's format (the accuracy reward
  logs the share that did, ``formatted_fraction``);
* ``truncation``: most responses were cut at ``max_new_tokens``;
* ``too_easy`` / ``too_hard``: every response was right / wrong;
* ``unmixed``: each prompt was always or never solved (more generations per prompt or a
  higher temperature mix them).

The trainer's callback warns once (:class:`NoSignalWarning`) and ``summary.json`` records
the finding. It reads metrics.jsonl records (pure: no model, no trainer). See
docs/step-time.md.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

from ktae.rewards.registry import REWARDS

TRUNCATION_SHARE = 0.5
"""A step is "truncated" when more than this share of its responses hit the length limit."""

DEFAULT_STEPS = 5
"""Consecutive logged steps without signal before the warning (``no_signal_steps``)."""


class NoSignalWarning(UserWarning):
    """``ktae train`` is learning nothing (see :mod:`ktae.train.no_signal`)."""


@dataclass(frozen=True)
class NoSignal:
    """Steps ``first``..``last`` (``steps`` logged steps) had no learning signal."""

    first: int
    last: int
    steps: int
    unmixed: bool
    """Every group of every step was all right or all wrong."""
    truncated_fraction: float
    """Mean share of responses cut at the length limit over those steps."""
    causes: tuple[str, ...]
    """Likely causes, most likely first: format, truncation, too_easy, too_hard, unmixed."""
    message: str

    def to_dict(self) -> dict:
        out = asdict(self)
        out["causes"] = list(self.causes)
        return out


def _unmixed(record: dict) -> bool:
    return record.get("mixed_group_fraction") == 0


def _truncated(record: dict) -> bool:
    return (record.get("truncated_fraction") or 0.0) > TRUNCATION_SHARE


def find_no_signal(records: list[dict], *, steps: int = DEFAULT_STEPS,
                   max_new_tokens: int | None = None,
                   reward: str | None = None) -> NoSignal | None:
    """The first window of ``steps`` consecutive records with no learning signal, or None.

    Args:
        records: metrics.jsonl records in step order (``step``, ``mixed_group_fraction``,
            ``truncated_fraction``, ``accuracy`` and, when the reward reports it,
            ``formatted_fraction``).
        steps: window length K (0 = never report).
        max_new_tokens: the length limit, named in the message.
        reward: the ``--reward`` name, whose answer format the message names.
    """
    if steps < 0:
        raise ValueError(f"steps: expected a non-negative integer, got {steps!r}")
    if steps == 0:
        return None
    run_unmixed = run_truncated = 0
    for i, record in enumerate(records):
        run_unmixed = run_unmixed + 1 if _unmixed(record) else 0
        run_truncated = run_truncated + 1 if _truncated(record) else 0
        if run_unmixed >= steps or run_truncated >= steps:
            window = records[i - steps + 1:i + 1]
            return _diagnose(window, unmixed=run_unmixed >= steps,
                             max_new_tokens=max_new_tokens, reward=reward)
    return None


def _diagnose(window: list[dict], *, unmixed: bool, max_new_tokens: int | None,
              reward: str | None) -> NoSignal:
    truncated = sum(r.get("truncated_fraction") or 0.0 for r in window) / len(window)
    formatted = [r.get("formatted_fraction") for r in window]
    accuracy = [r.get("accuracy") for r in window]
    causes, reasons = [], []
    if all(f is not None for f in formatted) and max(formatted) == 0:
        causes.append("format")
        reasons.append(f"reward format never met: no response was formatted for "
                       f"{_reward_text(reward)}; use a template that asks for that format "
                       "or a reward that reads how the model answers")
    if truncated > TRUNCATION_SHARE:
        causes.append("truncation")
        limit = f"max_new_tokens={max_new_tokens}" if max_new_tokens else "max_new_tokens"
        reasons.append(f"truncation: {100 * truncated:.0f}% of responses hit {limit}; raise "
                       "--max-new-tokens or ask for shorter answers")
    if unmixed and all(a == 1 for a in accuracy):
        causes.append("too_easy")
        reasons.append("task too easy: every response was right; use harder problems")
    elif unmixed and all(a == 0 for a in accuracy) and "format" not in causes:
        causes.append("too_hard")
        reasons.append("task too hard: every response was wrong; use easier problems or a "
                       "graded reward")
    elif unmixed and not causes:
        causes.append("unmixed")
        reasons.append("each prompt was always or never solved; raise --num-generations or "
                       "--temperature, or use problems of graded difficulty")
    first, last = window[0]["step"], window[-1]["step"]
    what = ("every group's responses were all right or all wrong, so the advantages and the "
            "policy gradient were zero" if unmixed else
            f"most responses ({100 * truncated:.0f}%) hit the length limit")
    message = (f"no learning signal in steps {first}-{last}: {what}. Likely cause: "
               + "; ".join(reasons) + ".")
    return NoSignal(first=first, last=last, steps=len(window), unmixed=unmixed,
                    truncated_fraction=truncated, causes=tuple(causes), message=message)


def _reward_text(reward: str | None) -> str:
    if reward is None:
        return "the reward"

    found = REWARDS.get(reward)
    return f"--reward {reward} ({found.summary})" if found else f"--reward {reward}"


def warn_no_signal(finding: NoSignal) -> None:
    """Warn about ``finding`` (once per call; the callback calls it once per run)."""
    warnings.warn(f"ktae train: {finding.message}", NoSignalWarning, stacklevel=2)
