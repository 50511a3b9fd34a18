"""The four wrappers the plugin puts around verl 0.9.0 and 0.9.1 functions, and why.

Each wrapper calls the upstream function unchanged; it only adds what the plugin's
registered functions need, and only when the config selects one of them. Each is applied
by :func:`ktae.integrations.verl.hooks.when_imported` as soon as verl imports the module
that defines the function, so every later ``from ... import name`` binds the wrapper.
A wrapper carries ``_ktae_verl_plugin`` and ``__wrapped__``, and is never applied twice.

=====================================================  ====================================
upstream function (verl 0.9.0, 0.9.1)                  why
=====================================================  ====================================
``trainer/ppo/ray_trainer.py: compute_advantage``      legacy trainer: hands the batch's
                                                       ``responses`` and reward extra info
                                                       (``acc``) to the estimator
``trainer/ppo/v1/trainer_base.py:``                    v1 trainer: its TransferQueue fetch
``PPOTrainer._compute_advantage``                      lists fixed fields without
                                                       ``responses``; fetches ``responses``
                                                       and ``extra_fields`` (and ``entropy``
                                                       for entropy-based estimators) for
                                                       the same keys
``workers/utils/losses.py: ppo_loss``                  hands ``model_output["entropy"]`` of
                                                       the current forward pass to the
                                                       calibrated loss, which verl calls
                                                       with log-probs only
``utils/config.py: validate_config``                   start-up check of the plugin's
                                                       options (:func:`.options.check_config`)
                                                       and the policy-loss config class
=====================================================  ====================================

docs/verl.md ("How the plugin hooks in") says, for each, why no public extension point of
verl replaces it and which upstream change would retire it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType

import torch

from ktae.core.calibration import CALIBRATIONS
from ktae.integrations.verl.estimators import PLUGIN_MARK
from ktae.integrations.verl.fields import (
    LEGACY_SOURCE,
    V1_SOURCE,
    PolicyStep,
    ResponseFields,
    extra_info_from_rows,
    providing_responses,
    providing_step,
)
from ktae.integrations.verl.options import (
    POLICY_LOSS_KEY,
    check_config,
    estimator_needs_entropies,
    plain,
    plugin_estimators,
)

#: verl's policy-loss config class, and ours (it adds the ``ktae`` options block).
VERL_POLICY_LOSS_TARGET = "verl.workers.config.PolicyLossConfig"
PLUGIN_POLICY_LOSS_TARGET = "ktae.integrations.verl.config.CalibratedPolicyLossConfig"


def _wrap(owner, attribute: str, make: Callable[[Callable], Callable]) -> bool:
    """Replace ``owner.attribute`` by ``make(upstream)`` unless already wrapped."""
    upstream = getattr(owner, attribute)
    if getattr(upstream, PLUGIN_MARK, False):
        return False
    wrapper = functools.wraps(upstream)(make(upstream))
    setattr(wrapper, PLUGIN_MARK, True)
    setattr(owner, attribute, wrapper)
    return True


def _estimator_name(adv_estimator) -> str:
    return str(getattr(adv_estimator, "value", adv_estimator))


# -- legacy trainer ---------------------------------------------------------------------

def patch_legacy_trainer(module: ModuleType) -> None:
    """Wrap verl 0.9.0 and 0.9.1 ``trainer/ppo/ray_trainer.py: compute_advantage``.

    The legacy ``RayPPOTrainer.fit`` calls this module-level function with the whole
    ``DataProto`` (``responses``, ``response_mask``, reward extra info in
    ``non_tensor_batch``), then dispatches to the registered estimator with four fields
    only. For the plugin's estimators the wrapper provides ``responses`` and the extra
    info to that call. Batches without ``responses`` (the v1 trainer's, whose own
    wrapper provides them) pass through untouched.
    """

    def make(upstream):
        def compute_advantage(data, adv_estimator, *args, **kwargs):
            if _estimator_name(adv_estimator) not in plugin_estimators() \
                    or "responses" not in data.batch.keys():
                return upstream(data, adv_estimator, *args, **kwargs)
            fields = ResponseFields(
                responses=data.batch["responses"],
                extra_info=data.non_tensor_batch,
                entropies=data.batch.get("entropys", None),
                source=LEGACY_SOURCE)
            with providing_responses(fields):
                return upstream(data, adv_estimator, *args, **kwargs)
        return compute_advantage

    _wrap(module, "compute_advantage", make)


# -- v1 trainer -------------------------------------------------------------------------

def _padded(x: torch.Tensor | None) -> torch.Tensor | None:
    if x is None:
        return None
    return x.to_padded_tensor(0) if x.is_nested else x


def _lengths(x: torch.Tensor | None) -> torch.Tensor | None:
    """Row lengths of a nested tensor (None for a padded one)."""
    if x is None or not x.is_nested:
        return None
    if x.layout == torch.jagged:
        return x.offsets().diff()
    return torch.tensor([row.shape[0] for row in x.unbind()], dtype=torch.int64)


def _row_extra_info(value) -> dict | None:
    value = getattr(value, "data", value)
    info = value.get("reward_extra_info") if isinstance(value, dict) else None
    return info if isinstance(info, dict) else None


def v1_response_fields(tq, batch, name: str) -> ResponseFields:
    """``responses``, reward extra info (and entropies) of a v1 batch from TransferQueue."""
    select = ["responses", "extra_fields"]
    if estimator_needs_entropies(name):
        select.append("entropy")
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                           select_fields=select)
    present = set(data.keys())  # TransferQueue leaves out fields it does not hold
    rows = [_row_extra_info(v) for v in list(data["extra_fields"])] \
        if "extra_fields" in present else []
    responses = data["responses"] if "responses" in present else None
    return ResponseFields(
        responses=_padded(responses),
        extra_info=extra_info_from_rows(rows),
        entropies=_padded(data["entropy"]) if "entropy" in present else None,
        source=V1_SOURCE, keys=list(batch.keys), lengths=_lengths(responses))


def patch_v1_trainer(module: ModuleType) -> None:
    """Wrap verl 0.9.0 and 0.9.1 ``trainer/ppo/v1/trainer_base.py: PPOTrainer._compute_advantage``.

    Upstream fetches a fixed field list from TransferQueue (``uid``, ``response_mask``,
    ``rm_scores``, log-probs, values), which lacks ``responses`` although TransferQueue
    stores them. For the plugin's estimators the wrapper fetches ``responses`` and
    ``extra_fields`` (the reward extra info) for the same keys, in the same order, and
    provides them, with the keys (which name each row's trajectory and turn: see
    :mod:`ktae.integrations.verl.trajectories`), to the upstream method's estimator call.
    """

    def make(upstream):
        def _compute_advantage(self, batch, metrics):
            name = _estimator_name(self.config.algorithm.adv_estimator)
            if name not in plugin_estimators():
                return upstream(self, batch, metrics)
            with providing_responses(v1_response_fields(module.tq, batch, name)):
                return upstream(self, batch, metrics)
        return _compute_advantage

    _wrap(module.PPOTrainer, "_compute_advantage", make)


# -- actor loss -------------------------------------------------------------------------

def patch_ppo_loss(module: ModuleType) -> None:
    """Wrap verl 0.9.0 and 0.9.1 ``workers/utils/losses.py: ppo_loss``.

    ``ppo_loss`` (bound by the engine workers as the actor's loss function) has the
    current forward pass's ``model_output["entropy"]`` but calls the registered policy
    loss with log-probs only. When ``policy_loss.loss_mode`` is a ktae calibration, the
    wrapper pads that entropy exactly as upstream pads the log-probs
    (``no_padding_2_padding``) and provides it to the loss; everything else (entropy
    bonus, KL loss, metrics) stays upstream's.
    """

    def make(upstream):
        def ppo_loss(config, model_output, data, dp_group=None):
            if config.policy_loss.get("loss_mode", "vanilla") not in CALIBRATIONS:
                return upstream(config, model_output, data, dp_group)
            entropy = model_output.get("entropy", None)
            if entropy is not None:
                entropy = module.no_padding_2_padding(entropy, data).detach()
            with providing_step(PolicyStep(entropies=entropy)):
                return upstream(config, model_output, data, dp_group)
        return ppo_loss

    _wrap(module, "ppo_loss", make)


# -- start-up check ---------------------------------------------------------------------

def use_plugin_policy_loss_config(config) -> bool:
    """Point ``policy_loss._target_`` at the plugin's config class when it has a ``ktae`` block.

    verl builds the actor config with Hydra, which rejects keys its ``PolicyLossConfig``
    lacks; :class:`ktae.integrations.verl.config.CalibratedPolicyLossConfig` is that class
    plus the ``ktae`` options. Returns whether the config was changed.
    """
    from omegaconf import open_dict

    policy_loss = config.actor_rollout_ref.actor.get("policy_loss")
    if policy_loss is None or policy_loss.get(POLICY_LOSS_KEY) is None:
        return False
    if plain(policy_loss.get("_target_")) != VERL_POLICY_LOSS_TARGET:
        return False
    with open_dict(policy_loss):
        policy_loss["_target_"] = PLUGIN_POLICY_LOSS_TARGET
    return True


def patch_validate_config(module: ModuleType) -> None:
    """Wrap verl 0.9.0 and 0.9.1 ``utils/config.py: validate_config``.

    ``verl.trainer.main_ppo.main`` calls it in the driver before starting Ray; the
    wrapper first checks the plugin's options (a typo or a setting verl cannot honour
    fails here, with the setting to change) and selects the plugin's policy-loss config
    class, then runs upstream's validation.
    """

    def make(upstream):
        def validate_config(config, use_reference_policy, use_critic):
            use_plugin_policy_loss_config(config)
            check_config(config)
            return upstream(config, use_reference_policy, use_critic)
        return validate_config

    _wrap(module, "validate_config", make)


#: module -> wrapper, in the order verl imports them.
PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "verl.utils.config": patch_validate_config,
    "verl.workers.utils.losses": patch_ppo_loss,
    "verl.trainer.ppo.ray_trainer": patch_legacy_trainer,
    "verl.trainer.ppo.v1.trainer_base": patch_v1_trainer,
}
