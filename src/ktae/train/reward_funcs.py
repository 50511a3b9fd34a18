"""TRL reward functions of ``ktae train``: the chosen reward's accuracy and DAPO overlong
shaping.

TRL calls each with ``prompts``, ``completions``, ``completion_ids`` and every dataset
column (here ``answer``, and ``data_source`` where the task has one) as keyword lists, and
sums their outputs (weights 1). The first function is the reward named by
``TrainConfig.reward`` (:mod:`ktae.rewards.registry`), which the trainer also uses as the
correctness signal of KTAE and dynamic sampling (score > 0.5; so shaping never flips
"correct"). A response cut at ``max_new_tokens`` without its stop token is wrong
(:mod:`ktae.rewards.ends`; ``cut_off="read"`` scores its text instead): the trainer
gives the accuracy reward its stop ids (:attr:`accuracy.stop_ids`), TRL each
response's ids up to its first stop.
"""

from __future__ import annotations

from ktae.rewards import overlong_penalty
from ktae.rewards.ends import DEFAULT_CUT_OFF, check_cut_off_rule, cut_at_budget
from ktae.rewards.registry import DEFAULT_REWARD, get_reward, score_responses

FORMATTED_METRIC = "ktae/formatted_fraction"
"""Logged key: share of a generation pass's responses with an answer in the reward's format."""


def make_accuracy_reward(*, reward: str = DEFAULT_REWARD, timeout: float = 5.0,
                         num_workers: int | None = 1, cut_off: str = DEFAULT_CUT_OFF,
                         stop_ids=None):
    """``accuracy(completions, answer, completion_ids[, data_source]) -> [score]``: the
    reward ``reward`` of :data:`ktae.rewards.registry.REWARDS` (default: the STRICT
    last-``\\boxed{}`` reward, :func:`ktae.rewards.math_reward`; an unclosed box or a bare
    number scores 0), a response cut at the budget scoring the reward's wrong score
    (``cut_off="wrong"``, :mod:`ktae.rewards.ends`).

    ``stop_ids``: the ids that end a response (EOS, pad); a response whose ids end with
    none of them was cut. :class:`ktae.train.trainer.KTAEGRPOTrainer` sets
    ``accuracy.stop_ids`` from its own when it is None; called without them under
    ``cut_off="wrong"``, the function raises.

    With TRL's ``log_metric`` it also logs :data:`FORMATTED_METRIC`, the share of the
    responses holding an answer in the reward's format (read by ``ktae train``'s no-signal
    check, :mod:`ktae.train.no_signal`)."""
    get_reward(reward)
    check_cut_off_rule(cut_off)

    def accuracy(completions, answer, completion_ids=None, data_source=None, log_metric=None,
                 **_):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        truncated = None
        if cut_off == "wrong":
            if accuracy.stop_ids is None or completion_ids is None:
                raise ValueError("stop_ids: the accuracy reward needs the tokenizer's stop ids "
                                 "and each response's ids to tell a response cut at the "
                                 "budget (or cut_off='read')")
            truncated = [cut_at_budget(ids, accuracy.stop_ids) for ids in completion_ids]
        results = score_responses(reward, texts, list(answer), truncated=truncated,
                                  cut_off=cut_off, timeout=timeout, num_workers=num_workers,
                                  data_sources=data_source)
        if log_metric is not None and results:
            log_metric(FORMATTED_METRIC, sum(r.formatted for r in results) / len(results))
        return [r.score for r in results]

    accuracy.stop_ids = None if stop_ids is None else frozenset(int(i) for i in stop_ids)
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
                      timeout: float = 5.0, reward: str = DEFAULT_REWARD,
                      cut_off: str = DEFAULT_CUT_OFF) -> list:
    """Accuracy first (the correctness signal), then overlong shaping when the buffer > 0."""
    funcs = [make_accuracy_reward(reward=reward, timeout=timeout, cut_off=cut_off)]
    if overlong_buffer > 0:
        funcs.append(make_overlong_reward(max_length=max_new_tokens, cache_length=overlong_buffer,
                                          factor=overlong_factor))
    return funcs
