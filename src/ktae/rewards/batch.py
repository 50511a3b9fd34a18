"""Batch verification and the reward components the trainer composes.

``batch_math_reward`` checks many completions at once: the in-process stages run in a
thread pool and every symbolic check goes to its own verifier process
(:mod:`ktae.rewards.pool`), so up to ``num_workers`` sympy checks run in parallel.
Results come back in input order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ktae.rewards.extract import extract_boxed
from ktae.rewards.verify import (
    RewardResult,
    math_reward,
    reference_alternatives,
    scorer_reward,
)

DEFAULT_MAX_WORKERS = 8


def _check_lists(completions, references) -> None:
    if isinstance(completions, str) or not isinstance(completions, Sequence):
        raise ValueError("completions: expected a sequence of strings, "
                         f"got {type(completions).__name__}")
    if isinstance(references, str) or not isinstance(references, Sequence):
        raise ValueError("references: expected a sequence of answers, "
                         f"got {type(references).__name__}")
    if len(completions) != len(references):
        raise ValueError(f"references: expected {len(completions)} (one per completion), "
                         f"got {len(references)}")
    # Checked here, before any work, so that the error names the position.
    for i, (c, r) in enumerate(zip(completions, references, strict=True)):
        if not isinstance(c, str):
            raise ValueError(f"completions[{i}]: expected a string, got {type(c).__name__}")
        reference_alternatives(r, f"references[{i}]")


def _num_workers(num_workers: int | None, n: int) -> int:
    if num_workers is None:
        return max(1, min(DEFAULT_MAX_WORKERS, os.cpu_count() or 1, n))
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers: expected a positive integer or None, got {num_workers!r}")
    return num_workers


def batch_math_reward(completions: Sequence[str], references: Sequence, *,
                      timeout: float = 5.0, num_workers: int | None = None
                      ) -> list[RewardResult]:
    """:func:`ktae.rewards.math_reward` of each (completion, reference) pair, in order.

    Args:
        completions: B model outputs.
        references: B reference answers (strings or numbers; a list: any of them).
        timeout: hard limit in seconds per symbolic check.
        num_workers: parallel checks (threads, each with its own verifier process);
            default ``min(8, cpu_count, B)``.

    Returns:
        B RewardResults, ``result[i]`` for ``completions[i]``. An empty batch gives ``[]``.
    """
    _check_lists(completions, references)
    if not completions:
        return []
    workers = _num_workers(num_workers, len(completions))
    pairs = list(zip(completions, references, strict=True))
    if workers == 1:
        return [math_reward(c, r, timeout=timeout) for c, r in pairs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ktae-reward") as ex:
        return list(ex.map(lambda cr: math_reward(cr[0], cr[1], timeout=timeout), pairs))


def batch_scorer_reward(completions: Sequence[str], references: Sequence, *, scorer: str,
                        timeout: float = 5.0, num_workers: int | None = None
                        ) -> list[RewardResult]:
    """:func:`ktae.rewards.verify.scorer_reward` of each pair, in order (threads as in
    :func:`batch_math_reward`)."""
    _check_lists(completions, references)
    if not completions:
        return []
    workers = _num_workers(num_workers, len(completions))
    pairs = list(zip(completions, references, strict=True))

    def one(cr):
        return scorer_reward(cr[0], cr[1], scorer=scorer, timeout=timeout)

    if workers == 1:
        return [one(cr) for cr in pairs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ktae-reward") as ex:
        return list(ex.map(one, pairs))


def correctness_reward(completions: Sequence[str], references: Sequence, *,
                       timeout: float = 5.0, num_workers: int | None = None) -> list[float]:
    """1.0 for each completion whose boxed answer matches its reference, else 0.0."""
    return [r.score for r in batch_math_reward(completions, references, timeout=timeout,
                                               num_workers=num_workers)]


def format_reward(completions: Sequence[str]) -> list[float]:
    """1.0 for each completion that closes a non-empty ``\\boxed{}`` (or ``\\fbox{}``)."""
    if isinstance(completions, str) or not isinstance(completions, Sequence):
        raise ValueError("completions: expected a sequence of strings, "
                         f"got {type(completions).__name__}")
    out = []
    for i, c in enumerate(completions):
        if not isinstance(c, str):
            raise ValueError(f"completions[{i}]: expected a string, got {type(c).__name__}")
        box = extract_boxed(c)
        out.append(1.0 if box is not None and box.strip() else 0.0)
    return out
