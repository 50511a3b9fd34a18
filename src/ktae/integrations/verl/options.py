"""The plugin's configuration: parse, validate and check it against the rest of verl's.

Two blocks of verl's Hydra config belong to ktae:

* ``algorithm.ktae`` (with ``algorithm.adv_estimator=ktae``): KTAE's options, forwarded
  to :func:`ktae.compute_advantages`, plus how correctness is read (``correct_key``);
* ``actor_rollout_ref.actor.policy_loss.ktae`` (with ``policy_loss.loss_mode`` set to a
  calibration name such as ``taco``): the calibration's options, forwarded to
  :func:`ktae.calibrate_advantages`.

Every name is checked (a typo is a ``ValueError`` naming the key and listing the valid
ones) and every value is checked by running the real core function once on a two-response
batch, so a bad value fails at start-up, not after the first rollout. Nothing here
imports verl; configs may be OmegaConf nodes, verl config dataclasses or plain dicts.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ktae.core import calibration as core_calibration  # read at call time: tests wrap it
from ktae.core import estimators as core_estimators
from ktae.core.baselines import SEQUENCE_BASELINES
from ktae.core.calibration import CALIBRATIONS
from ktae.core.estimators import ADVANTAGE_ESTIMATORS
from ktae.core.self_distill import KINDS as _KINDS
from ktae.plugins import load_entry_points, load_from_env

SELF_DISTILL_KINDS = tuple(k for k in _KINDS if k != "none")
"""``ktae train --self-distill`` terms, refused as a verl ``loss_mode`` (docs/method.md §17)."""

#: Options of an estimator's block that say how correctness is read, for an estimator
#: that reads the verifier's ``correct``: ``reward_threshold`` and the reward extra-info
#: field ``correct_key`` (``correct_key`` stays here; the rest go to the estimator).
RULE_CORRECTNESS_OPTIONS = ("reward_threshold", "correct_key")


def _record(name: str):
    """The core's registry record of estimator ``name``, or None for a name ktae lacks."""
    return ADVANTAGE_ESTIMATORS.record(name) if name in ADVANTAGE_ESTIMATORS else None


def block_options(name: str) -> tuple[str, ...] | None:
    """The keys of ``algorithm.<name>``, read from the estimator's record (None: any, a
    rule taking ``**kwargs``): its options, then :data:`RULE_CORRECTNESS_OPTIONS` when it
    reads ``correct``. Inputs the caller fills (``correct``, ``word_starts``) are not keys:
    verl's batch carries no word starts, so ``prefix-value``'s ``unit: word`` fails the
    start-up check."""
    record = _record(name)
    if record is None or record.options is None:
        return None
    own = tuple(o for o in record.options if o not in RULE_CORRECTNESS_OPTIONS)
    return (*own, *RULE_CORRECTNESS_OPTIONS) if record.takes_correct else own


def plugin_estimators() -> dict[str, tuple[str, ...] | None]:
    """Estimators the plugin registers in verl, with the keys of their block
    (:func:`block_options`).

    Every estimator of ktae's registry (``ktae``, ``gtpo``, ``prefix-value``, and every
    user rule, ``ktae.register_estimator``, loaded in this process:
    :func:`load_user_rules`) except the sequence-level ones: verl's own ``grpo`` and
    ``rloo`` stay verl's; ``drgrpo`` is verl's ``grpo`` with
    ``algorithm.norm_adv_by_std_in_grpo=false``.
    """
    return {name: block_options(name) for name in ADVANTAGE_ESTIMATORS.names()
            if name not in SEQUENCE_BASELINES}


def is_user_rule(name: str) -> bool:
    """Whether estimator ``name`` was registered with ``ktae.register_estimator``."""
    record = _record(name)
    return record is not None and record.user_rule is not None


def load_user_rules() -> list[str]:
    """Import users' rules in this process: the ``ktae.plugins`` entry points and the
    modules or files of ``KTAE_PLUGINS`` (:mod:`ktae.plugins`). verl imports the plugin in
    the driver and in every Ray worker, so each process loads the same rules; returns the
    specs of ``KTAE_PLUGINS``."""
    load_entry_points()
    return load_from_env()


VERL_NEEDS = ("entropies",)
"""The needs from a model that verl 0.9.1 gives an estimator: the rollout policy's
per-token entropies (its ``entropys`` of the old log-prob pass; :func:`missing_entropies_reason`).
An estimator declaring another (log-probs, the input-gradient importance) is refused at
start-up."""


def estimator_needs_entropies(name: str) -> bool:
    """Whether the estimator reads the rollout policy's per-token entropies, as its record
    says (see :func:`missing_entropies_reason` for when verl 0.9.1 has them); False for a
    name ktae lacks."""
    record = _record(name)
    return record is not None and "entropies" in record.needs


BYPASS_MODE_PATH = "algorithm.rollout_correction.bypass_mode"


def bypass_mode(algorithm: Any) -> bool:
    """verl 0.9.1's own test of rollout-correction bypass mode (both trainers):
    ``rollout_correction and rollout_correction.get("bypass_mode", False)``."""
    rollout_correction = _get(algorithm, "rollout_correction")
    return bool(rollout_correction) and bool(_get(rollout_correction, "bypass_mode", False))


def missing_entropies_reason(use_v1: bool, algorithm: Any) -> str | None:
    """Why verl 0.9.1 would hand an estimator no rollout-policy entropies, or None.

    verl computes them only in the old-policy forward pass
    (``PPOTrainer._compute_old_log_prob``, ``calculate_entropy=True``), and only its v1
    trainer stores them (TransferQueue field ``entropy``); the legacy
    ``RayPPOTrainer.fit`` pops ``entropys`` before computing advantages. In bypass mode
    both trainers skip that pass and take the rollout engine's log-probs as the old ones,
    which come without entropies.
    """
    if not use_v1:
        return ("verl 0.9.1's legacy trainer drops them before computing advantages; "
                "set trainer.use_v1=true")
    if bypass_mode(algorithm):
        return (f"{BYPASS_MODE_PATH}=true skips the old-policy forward pass, the only place "
                "verl computes them (the rollout's log-probs come without entropies); set "
                f"{BYPASS_MODE_PATH}=false")
    return None

#: Where verl's accuracy sits in the reward function's extra info (``dapo`` manager).
DEFAULT_CORRECT_KEY = "acc"

POLICY_LOSS_KEY = "ktae"
POLICY_LOSS_PATH = "actor_rollout_ref.actor.policy_loss"
CALCULATE_ENTROPY_PATH = "actor_rollout_ref.actor.calculate_entropy"


def plain(value: Any) -> Any:
    """OmegaConf containers and config dataclasses as plain dicts/lists (others as is)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - verl always brings omegaconf
        DictConfig = ListConfig = ()  # noqa: N806
    if DictConfig and isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _get(node: Any, key: str, default: Any = None) -> Any:
    if node is None:
        return default
    getter = getattr(node, "get", None)
    if getter is not None:
        return getter(key, default)
    return getattr(node, key, default)


def _section(node: Any, key: str, where: str) -> dict:
    value = plain(_get(node, key))
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a block of options (key=value), got {value!r}")
    return value


@dataclass(frozen=True)
class EstimatorSettings:
    """A plugin estimator's parsed ``algorithm.<name>`` block.

    Attributes:
        name: the estimator (``ktae``).
        options: keyword options for :func:`ktae.compute_advantages`.
        correct_key: the reward extra-info field read as correctness (None: use
            ``reward > reward_threshold`` on the sequence reward; always None with
            ``split=graded``, whose classes come from the reward values).
        reward_threshold: correctness threshold on ``correct_key``'s value, or on the
            reward when that field is absent.
    """

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    correct_key: str | None = DEFAULT_CORRECT_KEY
    reward_threshold: float = 0.0


def estimator_settings(name: str, algorithm: Any) -> EstimatorSettings:
    """Parse ``algorithm.<name>`` (names only; values are checked by :func:`check_config`).

    ``base`` defaults to ``drgrpo`` when verl's ``algorithm.norm_adv_by_std_in_grpo`` is
    false (verl's Dr.GRPO switch) and to ``grpo`` otherwise; an explicit ``base`` that
    contradicts that switch is an error.
    """
    estimators = plugin_estimators()
    if name not in estimators:
        raise ValueError(f"algorithm.adv_estimator: {name!r} is not an estimator of the ktae "
                         f"plugin; expected one of {sorted(estimators)}")
    where = f"algorithm.{name}"
    block = _section(algorithm, name, where)
    allowed = estimators[name]
    unknown = [] if allowed is None else sorted(set(block) - set(allowed))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown option; expected one of "
                         f"{', '.join(allowed)}")
    options = dict(block)
    record = _record(name)
    for need in record.need_records:
        if need.model and need.name not in VERL_NEEDS:
            kind = "rule" if is_user_rule(name) else "estimator"
            raise ValueError(f"algorithm.adv_estimator={name}: the {kind} reads "
                             f"{need.what} (needs={need.name}), which the ktae verl plugin "
                             "does not pass to estimators: verl computes advantages on the "
                             "driver, away from the actor's model; use ktae train")
    if is_user_rule(name):
        correct_key = options.pop("correct_key", DEFAULT_CORRECT_KEY)
        if correct_key is not None and not isinstance(correct_key, str):
            raise ValueError(f"{where}.correct_key: expected a field name or null, "
                             f"got {correct_key!r}")
        threshold = options.pop("reward_threshold", 0.0)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
                or not math.isfinite(threshold):
            raise ValueError(f"{where}.reward_threshold: expected a finite number, "
                             f"got {threshold!r}")
        return EstimatorSettings(name, options, correct_key, float(threshold))
    reference = options.get("mode") == "reference"
    graded = options.get("split") == "graded"
    if graded and options.get("correct_key") is not None:
        raise ValueError(f"{where}.correct_key: split=graded takes each response's "
                         "membership from its reward; remove correct_key or use "
                         "split=threshold")
    if graded and "reward_threshold" in options:
        raise ValueError(f"{where}.reward_threshold: split=graded uses the reward values "
                         "themselves; remove reward_threshold or use split=threshold")
    correct_key = options.pop("correct_key",
                              None if reference or graded else DEFAULT_CORRECT_KEY)
    if correct_key is not None and not isinstance(correct_key, str):
        raise ValueError(f"{where}.correct_key: expected a field name or null, got {correct_key!r}")
    if reference and correct_key is not None:
        raise ValueError(f"{where}.correct_key: mode=reference uses the released runtime's rule "
                         "(reward > 0); remove correct_key or use mode=exact")
    threshold = options.pop("reward_threshold", 0.0)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
            or not math.isfinite(threshold):
        raise ValueError(f"{where}.reward_threshold: expected a finite number, got {threshold!r}")
    if reference and threshold != 0:
        raise ValueError(f"{where}.reward_threshold: mode=reference uses the released "
                         "runtime's rule (reward > 0)")
    if "base" in (record.options or ()):
        norm_by_std = _get(algorithm, "norm_adv_by_std_in_grpo", True)
        implied = "grpo" if norm_by_std else "drgrpo"
        base = options.setdefault("base", implied)
        if not norm_by_std and base == "grpo":
            raise ValueError(f"{where}.base: 'grpo' divides by the group std, but "
                             "algorithm.norm_adv_by_std_in_grpo=false asks for Dr.GRPO; "
                             "set one of them consistently")
    if "ignore_token_ids" in options and options["ignore_token_ids"] is not None:
        ids = options["ignore_token_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                and i >= 0 for i in ids):
            raise ValueError(f"{where}.ignore_token_ids: expected a list of token ids, "
                             f"e.g. [151643], got {ids!r}")
    return EstimatorSettings(name, options, correct_key, float(threshold))


@dataclass(frozen=True)
class CalibrationSettings:
    """A calibration selected by ``policy_loss.loss_mode`` and its ``policy_loss.ktae`` options."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)


def calibration_settings(policy_loss: Any) -> CalibrationSettings:
    """Parse the policy-loss block (names only; values are checked by :func:`check_config`)."""
    name = _get(policy_loss, "loss_mode", "vanilla")
    block = _section(policy_loss, POLICY_LOSS_KEY, f"{POLICY_LOSS_PATH}.{POLICY_LOSS_KEY}")
    if name in SELF_DISTILL_KINDS:
        raise ValueError(f"{POLICY_LOSS_PATH}.loss_mode: {name!r} is ktae train's "
                         f"self-distillation term (--self-distill {name}), which the ktae verl "
                         "plugin cannot run: it needs the actor's logits over each response after "
                         "its privileged prompt, and verl 0.9.1's policy loss receives only "
                         "log-probs, advantages and the response mask; use ktae train")
    if name not in CALIBRATIONS:
        raise ValueError(f"{POLICY_LOSS_PATH}.loss_mode: {name!r} is not a ktae calibration; "
                         f"expected one of {', '.join(CALIBRATIONS.names())}")
    return CalibrationSettings(name, block)


def calibration_accepts(argument: str) -> bool:
    """Whether the installed :func:`ktae.calibrate_advantages` takes ``argument``."""
    return argument in inspect.signature(core_calibration.calibrate_advantages).parameters


# -- start-up checks --------------------------------------------------------------------

def _check_estimator_values(settings: EstimatorSettings) -> None:
    """Run the real estimator on two responses: bad option values raise here."""
    import torch

    extra = {need.name: torch.ones(2, 2) for need in _record(settings.name).need_records
             if need.model}
    try:
        core_estimators.compute_advantages(settings.name, rewards=torch.tensor([1.0, 0.0]),
                                           group=[0, 0], token_ids=torch.tensor([[1, 2], [1, 3]]),
                                           **settings.options, **extra)
    except (TypeError, ValueError) as e:
        raise ValueError(f"algorithm.{settings.name}: {e}") from None


def _dry_run_calibration(settings: CalibrationSettings, with_entropy: bool) -> None:
    import torch

    lp = torch.log(torch.tensor([[0.5, 0.001], [0.9, 0.2]]))
    extra = {"old_logprobs": lp} if calibration_accepts("old_logprobs") else {}
    core_calibration.calibrate_advantages(settings.name, torch.tensor([1.0, -1.0]), logprobs=lp,
                                          entropies=torch.ones(2, 2) if with_entropy else None,
                                          mask=torch.ones(2, 2), generator=torch.Generator(),
                                          **extra, **settings.options)


def calibration_needs_entropy(settings: CalibrationSettings) -> bool:
    """Whether the calibration reads the current policy's entropy (it raises without it)."""
    try:
        _dry_run_calibration(settings, with_entropy=False)
    except ValueError as e:
        if str(e).startswith("entropies:"):
            return True
        raise
    return False


def check_calibration_values(settings: CalibrationSettings) -> None:
    """Run the real calibration once on a 2 x 2 batch: bad option names or values raise."""
    try:
        _dry_run_calibration(settings, with_entropy=True)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{POLICY_LOSS_PATH}.{POLICY_LOSS_KEY} (loss_mode={settings.name}): "
                         f"{e}") from None


#: Calibrations that read the loss's clip range as options of their own (Clip-Cov's test of
#: the tokens the clip already takes), and verl's defaults for it.
CLIP_RANGE_RULES = ("clip-cov",)
VERL_CLIP_RATIO = 0.2


def check_clip_range(settings: CalibrationSettings, actor: Any) -> None:
    """A rule that reads the clip range (``clip_low``/``clip_high``) must see verl's own
    ``clip_ratio_low``/``clip_ratio_high`` (each defaulting to ``clip_ratio``, 0.2)."""
    if settings.name not in CLIP_RANGE_RULES:
        return
    clip = _get(actor, "clip_ratio", VERL_CLIP_RATIO)
    defaults = inspect.signature(CALIBRATIONS.get(settings.name)).parameters
    for own, verl_key in (("clip_low", "clip_ratio_low"), ("clip_high", "clip_ratio_high")):
        verl_value = _get(actor, verl_key)
        verl_value = clip if verl_value is None else verl_value
        value = settings.options.get(own, defaults[own].default)
        if float(value) != float(verl_value):
            raise ValueError(f"{POLICY_LOSS_PATH}.{POLICY_LOSS_KEY}.{own}={value} but the "
                             f"actor's {verl_key} is {verl_value}: loss_mode={settings.name} "
                             f"must test the clip range the loss uses; set {own}={verl_value}")


@dataclass(frozen=True)
class PluginConfig:
    """What :func:`check_config` found: the plugin parts a verl config uses (or None)."""

    estimator: EstimatorSettings | None
    calibration: CalibrationSettings | None


def check_config(config: Any) -> PluginConfig:
    """Check a full verl PPO config (``ppo_trainer.yaml`` + overrides) for the plugin's parts.

    Raises ``ValueError`` naming the setting to change: an unknown option or a bad value in
    ``algorithm.ktae`` / ``policy_loss.ktae``, a block whose estimator or loss is not
    selected, a calibration that needs the current entropy while verl does not compute
    it, an estimator that needs the rollout entropies where verl does not keep them
    (legacy trainer, rollout-correction bypass mode), or a combination verl 0.9.1's
    legacy trainer cannot run. Configs that use no part of the plugin pass unchanged.
    """
    algorithm = _get(config, "algorithm")
    actor = _get(_get(config, "actor_rollout_ref"), "actor")
    policy_loss = _get(actor, "policy_loss")
    trainer = _get(config, "trainer")
    use_v1 = bool(_get(trainer, "use_v1", True))

    name = _get(algorithm, "adv_estimator")
    estimator = None
    estimators = plugin_estimators()
    for other in estimators:
        if other != name and _get(algorithm, other) is not None:
            raise ValueError(f"algorithm.{other}: options for the {other!r} estimator are set "
                             f"but algorithm.adv_estimator={name}; set "
                             f"algorithm.adv_estimator={other} or remove the block")
    if name in estimators:
        estimator = estimator_settings(name, algorithm)
        _check_estimator_values(estimator)
        reason = missing_entropies_reason(use_v1, algorithm)
        if estimator_needs_entropies(name) and reason:
            raise ValueError(f"algorithm.adv_estimator={name} needs the rollout policy's "
                             f"per-token entropies, but {reason}")

    loss_mode = _get(policy_loss, "loss_mode", "vanilla")
    calibration = None
    if loss_mode in CALIBRATIONS or loss_mode in SELF_DISTILL_KINDS:  # the latter: refused
        calibration = calibration_settings(policy_loss)
        check_calibration_values(calibration)
        entropy_on = bool(_get(actor, "calculate_entropy", False)) or \
            float(_get(actor, "entropy_coeff", 0.0) or 0.0) != 0.0
        if not entropy_on and calibration_needs_entropy(calibration):
            raise ValueError(f"{POLICY_LOSS_PATH}.loss_mode={loss_mode} reads the current "
                             "policy's entropy at each update, which verl computes only when "
                             f"asked: set {CALCULATE_ENTROPY_PATH}=true")
        check_clip_range(calibration, actor)
    elif _get(policy_loss, POLICY_LOSS_KEY) is not None:
        raise ValueError(f"{POLICY_LOSS_PATH}.{POLICY_LOSS_KEY}: calibration options are set "
                         f"but loss_mode={loss_mode} is not a ktae calibration; set "
                         f"{POLICY_LOSS_PATH}.loss_mode to one of "
                         f"{', '.join(CALIBRATIONS.names())}")

    if (estimator or calibration) and not use_v1:
        groups = _get(algorithm, "filter_groups")
        if groups is not None and bool(_get(groups, "enable", False)):
            raise ValueError("algorithm.filter_groups.enable=true: verl 0.9.1 filters groups "
                             "(DAPO dynamic sampling) only in its v1 trainer and ignores the "
                             "setting in the legacy one; set trainer.use_v1=true")
    return PluginConfig(estimator, calibration)
