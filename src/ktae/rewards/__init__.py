"""Verifiable rewards for math: strict boxed extraction, equivalence with a hard deadline.

Public API:
    extract_boxed(text) -> str | None
    math_reward(completion, reference, *, timeout=5.0) -> RewardResult
    batch_math_reward(completions, references, *, timeout=5.0, num_workers=None)
    correctness_reward(completions, references, ...), format_reward(completions)
    overlong_penalty(lengths, *, max_length, cache_length=512, factor=1.0)  (docs/method.md §11)
    reward_stats(), reset_reward_stats(), shutdown_verifiers()
    REWARDS, get_reward(name): the named rewards of ``ktae train --reward`` (registry)
"""

from ktae.core.shaping import overlong_penalty
from ktae.rewards.batch import batch_math_reward, correctness_reward, format_reward
from ktae.rewards.extract import extract_boxed, normalize_answer
from ktae.rewards.pool import shutdown_verifiers
from ktae.rewards.registry import REWARDS, Reward, get_reward
from ktae.rewards.verify import (
    MAX_SYMBOLIC_CHARS,
    RewardResult,
    answers_equivalent,
    math_reward,
    reset_reward_stats,
    reward_stats,
)

__all__ = [
    "MAX_SYMBOLIC_CHARS",
    "REWARDS",
    "Reward",
    "RewardResult",
    "answers_equivalent",
    "batch_math_reward",
    "correctness_reward",
    "extract_boxed",
    "format_reward",
    "get_reward",
    "math_reward",
    "normalize_answer",
    "overlong_penalty",
    "reset_reward_stats",
    "reward_stats",
    "shutdown_verifiers",
]
