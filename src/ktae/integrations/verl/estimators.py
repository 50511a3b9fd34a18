"""Advantage estimators in verl's calling convention (``core_algos.register_adv_est``).

verl 0.9.1 calls a registered estimator as
``fn(token_level_rewards=[B, T], response_mask=[B, T], config=algorithm config,
index=uids, [reward_baselines])`` and stores both returned tensors as ``advantages`` and
``returns``. KTAE also needs the response token ids and, preferably, the verifier's
accuracy; those come from :func:`ktae.integrations.verl.fields.current_responses`,
provided by the trainer wrappers of :mod:`ktae.integrations.verl.patches`.

Mapping to :func:`ktae.compute_advantages`:

* ``rewards``: ``token_level_rewards.sum(-1)`` (as verl's GRPO: with
  ``use_kl_in_reward`` it includes the KL penalty);
* ``group``: verl's ``uid`` per response;
* ``token_ids``, ``mask``: the response ids and ``response_mask``;
* correctness: ``acc`` (``correct_key``) from the reward function's extra info when the
  batch has it, so that shaping terms such as DAPO's overlong penalty do not turn a right
  answer into a "wrong" one; a response is correct when that value exceeds
  ``reward_threshold`` (booleans count as 1/0). Without the field, the sequence reward
  is compared with ``reward_threshold`` (KTAE's runtime rule, ``reward > 0``), and a
  warning says so once per process.

Multi-turn batches of the v1 trainer (several rows per trajectory) get one response per
trajectory, as verl's GRPO does: :mod:`ktae.integrations.verl.trajectories`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ktae.core import estimators as core_estimators  # read at call time: tests wrap it
from ktae.integrations.verl.fields import LEGACY_SOURCE, ResponseFields, current_responses
from ktae.integrations.verl.options import (
    BYPASS_MODE_PATH,
    EstimatorSettings,
    estimator_needs_entropies,
    estimator_settings,
    is_user_rule,
    missing_entropies_reason,
)
from ktae.integrations.verl.trajectories import join_inputs, turn_layout

logger = logging.getLogger(__name__)

#: Marks functions made by this plugin (to recognise them under any module name).
PLUGIN_MARK = "_ktae_verl_plugin"

_warned_fallback: set[str] = set()


def _responses_for(name: str) -> ResponseFields:
    fields = current_responses()
    if fields is None or fields.responses is None:
        raise RuntimeError(
            f"advantage estimator {name!r} needs the response token ids, which verl passes to "
            "no estimator; the ktae plugin provides them on verl 0.9.1's v1 trainer "
            "(trainer.use_v1=true, PPOTrainer._compute_advantage) and legacy trainer "
            "(ray_trainer.compute_advantage). This call came from another code path "
            f"({fields.source if fields else 'no ktae wrapper was active'}), which the plugin "
            "does not support: run verl.trainer.main_ppo with one of those trainers")
    return fields


def correctness(fields: ResponseFields, settings: EstimatorSettings,
                batch_size: int) -> torch.Tensor | None:
    """``[B]`` bool correctness from the reward extra info, or None to use the reward."""
    key = settings.correct_key
    if key is None:
        return None
    values = fields.extra_info.get(key)
    if values is None:
        if key not in _warned_fallback:
            _warned_fallback.add(key)
            logger.warning("ktae: the reward function reports no %r; a response counts as "
                           "correct when its total reward > %g (algorithm.%s.correct_key)",
                           key, settings.reward_threshold, settings.name)
        return None
    values = list(values)
    if len(values) != batch_size:
        raise ValueError(f"reward extra info {key!r}: expected {batch_size} values, "
                         f"got {len(values)}")
    missing = sum(v is None for v in values)
    if missing:
        raise ValueError(f"reward extra info {key!r} is missing for {missing} of {batch_size} "
                         f"responses; set algorithm.{settings.name}.correct_key=null to "
                         "use the reward instead")
    try:
        numbers = torch.tensor([float(v) for v in values], dtype=torch.float64)
    except (TypeError, ValueError):
        raise ValueError(f"reward extra info {key!r}: expected numbers or booleans, "
                         f"got e.g. {values[0]!r}") from None
    return numbers > settings.reward_threshold


def missing_entropies_message(name: str, fields: ResponseFields, algorithm) -> str:
    """Why this batch came without the rollout entropies, as far as verl's code tells."""
    head = f"estimator {name!r} needs the rollout policy's per-token entropies"
    reason = missing_entropies_reason(fields.source != LEGACY_SOURCE, algorithm)
    if reason:
        return f"{head}, but {reason}"
    return (f"{head}, and the batch has none ({fields.source or 'unknown code path'}). "
            "verl 0.9.1 stores them (TransferQueue field 'entropy') only in the v1 "
            "trainer's PPOTrainer._compute_old_log_prob, which the legacy trainer "
            f"(trainer.use_v1=false) and bypass mode ({BYPASS_MODE_PATH}=true) skip; a "
            "trainer subclass that overrides that method without writing 'entropy' has "
            "the same effect")


def estimator_inputs(name: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                     index, config) -> dict[str, Any]:
    """The keyword arguments of ``ktae.compute_advantages(name, ...)`` for a verl call."""
    settings = estimator_settings(name, config)
    fields = _responses_for(name)
    responses = fields.responses.to(token_level_rewards.device)
    if tuple(responses.shape) != tuple(response_mask.shape):
        raise ValueError(f"responses: shape {tuple(responses.shape)} does not match "
                         f"response_mask {tuple(response_mask.shape)} ({fields.source})")
    if index is None:
        raise ValueError(f"index: estimator {name!r} needs verl's uid of each response "
                         "(the prompt it answers)")
    kwargs: dict[str, Any] = dict(rewards=token_level_rewards.sum(dim=-1), group=index,
                                  token_ids=responses, mask=response_mask, **settings.options)
    correct = correctness(fields, settings, int(response_mask.shape[0]))
    if correct is None and is_user_rule(name):  # a rule reads batch.correct, never a threshold
        correct = kwargs["rewards"] > settings.reward_threshold
    if correct is not None:
        kwargs["correct"] = correct.to(token_level_rewards.device)
    elif settings.options.get("mode") != "reference" and \
            settings.options.get("split") != "graded":
        kwargs["reward_threshold"] = settings.reward_threshold
    if estimator_needs_entropies(name):
        if fields.entropies is None:
            raise ValueError(missing_entropies_message(name, fields, config))
        kwargs["entropies"] = fields.entropies.to(token_level_rewards.device)
    return kwargs


def make_estimator(name: str) -> Callable:
    """A verl-convention estimator computing ``ktae.compute_advantages(name, ...)``."""

    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                  index=None, config=None, **unused) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            kwargs = estimator_inputs(name, token_level_rewards, response_mask, index, config)
            fields = current_responses()
            layout = turn_layout(fields.keys, response_mask, fields.lengths)
            if layout is None:
                adv = core_estimators.compute_advantages(name, **kwargs)
            else:  # multi-turn: one response per trajectory, as verl's GRPO
                joined = core_estimators.compute_advantages(name, **join_inputs(layout, kwargs))
                adv = layout.split(joined, response_mask.shape[1])
        adv = adv.to(token_level_rewards.dtype)
        return adv, adv

    estimator.__name__ = f"compute_{name}_advantage"
    estimator.__qualname__ = estimator.__name__
    estimator.__doc__ = (f"verl estimator {name!r}: ``ktae.compute_advantages({name!r}, ...)`` "
                         "on verl's batch; returns (advantages, returns), both [B, T].")
    setattr(estimator, PLUGIN_MARK, True)
    return estimator
