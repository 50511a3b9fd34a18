"""TRL reward functions of ``ktae train``: the chosen reward's accuracy and DAPO overlong
shaping.

TRL calls each with ``prompts``, ``completions``, ``completion_ids`` and every dataset
column (here ``answer``, and ``data_source`` where the task has one) as keyword lists, and
sums their outputs (weights 1). The first function is the reward named by
``TrainConfig.reward`` (:mod:`ktae.rewards.registry`), which the trainer also uses as the
correctness signal of KTAE and dynamic sampling (score > 0.5; so shaping never flips
"correct").
"""

from __future__ import annotations

from ktae.rewards import overlong_penalty
from ktae.rewards.registry import DEFAULT_REWARD, get_reward

FORMATTED_METRIC = "ktae/formatted_fraction"
"""Logged key: share of a generation pass's responses with an answer in the reward's format."""


def make_accuracy_reward(*, reward: str = DEFAULT_REWARD, timeout: float = 5.0,
                         num_workers: int | None = 1):
    """``accuracy(completions, answer[, data_source]) -> [score]``: the reward ``reward``
    of :data:`ktae.rewards.registry.REWARDS` (default: the STRICT last-``\\boxed{}``
    reward, :func:`ktae.rewards.math_reward`; an unclosed box or a bare number scores 0).

    With TRL's ``log_metric`` it also logs :data:`FORMATTED_METRIC`, the share of the
    responses holding an answer in the reward's format (read by ``ktae train``'s no-signal
    check, :mod:`ktae.train.no_signal`)."""
    score = get_reward(reward).score

    def accuracy(completions, answer, data_source=None, log_metric=None, **_):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        results = score(texts, list(answer), timeout=timeout, num_workers=num_workers,
                        data_sources=data_source)
        if log_metric is not None and results:
            log_metric(FORMATTED_METRIC, sum(r.formatted for r in results) / len(results))
        return [r.score for r in results]

    return accuracy


def make_overlong_reward(*, max_length: int, cache_length: int, factor: float = 1.0):
    """``overlong(completion_ids) -> [penalty]``: DAPO's soft overlong punishment (docs/method.md §11)
    on the response length in tokens, ``L_max = max_length``, ``L_c = cache_length``."""
    overlong_penalty([1], max_length=max_length, cache_length=cache_length, factor=factor)

    def overlong(completion_ids, **_):
        lengths = [len(ids) for ids in completion_ids]
        return overlong_penalty(lengths, max_length=max_length, cache_length=cache_length,
                                factor=factor).tolist()

    return overlong


def make_reward_funcs(*, max_new_tokens: int, overlong_buffer: int, overlong_factor: float,
                      timeout: float = 5.0, reward: str = DEFAULT_REWARD) -> list:
    """Accuracy first (the correctness signal), then overlong shaping when the buffer > 0."""
    funcs = [make_accuracy_reward(reward=reward, timeout=timeout)]
    if overlong_buffer > 0:
        funcs.append(make_overlong_reward(max_length=max_new_tokens, cache_length=overlong_buffer,
                                          factor=overlong_factor))
    return funcs
