"""Entry point of the ``verl.plugins`` group: verl imports it on every ``import verl``.

That happens in the driver and in every Ray worker (verl 0.9.0 and 0.9.1 ``verl/__init__.py``;
``VERL_USE_EXTERNAL_PLUGINS=none`` disables it). verl logs a failing plugin only at
DEBUG level, so this module never raises: any failure is logged here as a WARNING with
its cause, and verl then refuses ``adv_estimator=ktae`` as an unknown name.

On a verl outside :data:`ktae.integrations.verl.SUPPORTED_VERL` nothing is patched; the
plugin's names are registered as functions that raise the one-line error naming the
range, and ``validate_config`` (run by ``main_ppo`` before Ray starts) raises it for a
config that selects one of them.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("ktae.integrations.verl")


def _register(registry: dict, register, name: str, fn, kind: str) -> bool:
    from ktae.integrations.verl.estimators import PLUGIN_MARK

    existing = registry.get(name)
    if existing is not None:
        if getattr(existing, PLUGIN_MARK, False):
            return False  # this plugin, loaded before (possibly under another module name)
        raise RuntimeError(f"verl already has a {kind} named {name!r} ({existing!r}); "
                           "the ktae plugin will not replace it")
    register(name)(fn)
    return True


def _refusing(message: str):
    def refuse(*args, **kwargs):
        raise RuntimeError(message)

    from ktae.integrations.verl.estimators import PLUGIN_MARK

    setattr(refuse, PLUGIN_MARK, True)
    return refuse


def _install_refusal(version) -> None:
    """Unknown verl: register refusing stand-ins and refuse such configs at start-up."""
    from ktae.core.calibration import CALIBRATIONS
    from ktae.integrations.verl import unsupported_verl_message
    from ktae.integrations.verl.estimators import PLUGIN_MARK
    from ktae.integrations.verl.hooks import when_imported
    from ktae.integrations.verl.options import _get, plugin_estimators

    _load_user_rules()
    names = plugin_estimators()
    message = unsupported_verl_message(version)
    logger.warning(message)
    from verl.trainer.ppo import core_algos

    for name in names:
        if name not in core_algos.ADV_ESTIMATOR_REGISTRY:
            core_algos.register_adv_est(name)(_refusing(message))
    for name in CALIBRATIONS.names():
        if name not in core_algos.POLICY_LOSS_REGISTRY:
            core_algos.register_policy_loss(name)(_refusing(message))

    def refuse_at_startup(module) -> None:
        upstream = getattr(module, "validate_config", None)
        if upstream is None or getattr(upstream, PLUGIN_MARK, False):
            return

        def validate_config(config, *args, **kwargs):
            algorithm = _get(config, "algorithm")
            policy_loss = _get(_get(_get(config, "actor_rollout_ref"), "actor"), "policy_loss")
            if _get(algorithm, "adv_estimator") in names or \
                    _get(policy_loss, "loss_mode") in CALIBRATIONS:
                raise RuntimeError(message)
            return upstream(config, *args, **kwargs)

        setattr(validate_config, PLUGIN_MARK, True)
        module.validate_config = validate_config

    when_imported("verl.utils.config", refuse_at_startup)


def _load_user_rules() -> None:
    """Users' rules first (entry points, ``KTAE_PLUGINS``), so that they register in verl;
    a failing one is a warning, and the plugin's own names still register."""
    from ktae.integrations.verl.options import load_user_rules

    try:
        load_user_rules()
    except Exception as error:  # noqa: BLE001 - user code, reported on one line
        logger.warning("ktae's verl plugin could not load a user credit rule, so its name is "
                       "unavailable in verl: %s", error)


def install() -> None:
    """Register the plugin's names in verl and arrange the wrappers (idempotent)."""
    import verl

    from ktae.core.calibration import CALIBRATIONS
    from ktae.integrations.verl import verl_supported

    version = getattr(verl, "__version__", None)
    if not verl_supported(version):
        _install_refusal(version)
        return

    _load_user_rules()
    from verl.trainer.ppo import core_algos

    from ktae.integrations.verl.estimators import make_estimator
    from ktae.integrations.verl.hooks import when_imported
    from ktae.integrations.verl.losses import make_policy_loss
    from ktae.integrations.verl.options import plugin_estimators
    from ktae.integrations.verl.patches import PATCHES

    for name in plugin_estimators():
        _register(core_algos.ADV_ESTIMATOR_REGISTRY, core_algos.register_adv_est, name,
                  make_estimator(name), "advantage estimator")
    for name in CALIBRATIONS.names():
        _register(core_algos.POLICY_LOSS_REGISTRY, core_algos.register_policy_loss, name,
                  make_policy_loss(name), "policy loss")
    for module_name, patch in PATCHES.items():
        when_imported(module_name, patch)


try:
    install()
except Exception as error:  # verl hides plugin errors at DEBUG level: say it here
    logger.warning("ktae's verl plugin did not load, so adv_estimator=ktae and the ktae "
                   "policy losses are unavailable: %s: %s", type(error).__name__, error,
                   exc_info=True)
