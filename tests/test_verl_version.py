"""The verl range of the plugin: the ``verl`` extra requires it, and on a verl outside it
the plugin wraps nothing and refuses its names at start-up in one line naming the range.

Runs without verl: a stand-in ``verl`` package reports the version and holds verl's two
registries and ``validate_config``, and the plugin module is loaded as ``import verl``
loads it (tests/verl_plugin run the same checks on the real verl releases).
"""

from __future__ import annotations

import importlib
import logging
import sys
import types
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from ktae.core.calibration import CALIBRATIONS
from ktae.integrations.verl import SUPPORTED_VERL, unsupported_verl_message, verl_supported
from ktae.integrations.verl.estimators import PLUGIN_MARK

ROOT = Path(__file__).resolve().parents[1]
RANGE = "verl>=0.9.0,<=0.9.1"
PLUGIN = "ktae.integrations.verl.plugin"
FINDER_MARK = "ktae_verl_post_import_finder"


def test_verl_extra_requires_the_supported_range():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    (spec,) = [Requirement(r) for r in extras["verl"] if Requirement(r).name == "verl"]
    assert str(spec.specifier) == str(Requirement(f"verl{SUPPORTED_VERL}").specifier)
    assert f"verl{SUPPORTED_VERL}" == RANGE


@pytest.mark.parametrize("version", ["0.9.0", "0.9.1"])
def test_supported_releases(version):
    assert verl_supported(version)


@pytest.mark.parametrize("version", ["0.8.5", "0.9.2", "0.10.0", "1.0.0", "0.9.1rc1",
                                     "0.9.2.dev0", "not-a-version", None])
def test_other_releases_are_refused(version):
    assert not verl_supported(version)
    assert unsupported_verl_message(version) == (
        f"ktae's verl plugin supports {RANGE}, whose internals it wraps; "
        f"this is verl {version}: pip install '{RANGE}'")


@pytest.fixture
def fake_verl(monkeypatch):
    """Install a stand-in verl of a given version; returns a loader of the plugin that
    gives back (core_algos, config module, the validate_config verl defined)."""

    def load(version: str):
        verl = types.ModuleType("verl")
        verl.__version__ = version
        verl.__path__ = []
        core_algos = types.ModuleType("verl.trainer.ppo.core_algos")
        core_algos.ADV_ESTIMATOR_REGISTRY = {}
        core_algos.POLICY_LOSS_REGISTRY = {}

        def registering(registry):
            def register(name):
                def add(fn):
                    registry[name] = fn
                    return fn
                return add
            return register

        core_algos.register_adv_est = registering(core_algos.ADV_ESTIMATOR_REGISTRY)
        core_algos.register_policy_loss = registering(core_algos.POLICY_LOSS_REGISTRY)
        config_module = types.ModuleType("verl.utils.config")

        def validate_config(config, use_reference_policy, use_critic):
            return "verl's validate_config ran"

        config_module.validate_config = validate_config
        modules = {"verl": verl, "verl.trainer": types.ModuleType("verl.trainer"),
                   "verl.trainer.ppo": types.ModuleType("verl.trainer.ppo"),
                   "verl.trainer.ppo.core_algos": core_algos,
                   "verl.utils": types.ModuleType("verl.utils"),
                   "verl.utils.config": config_module}
        for name, module in modules.items():
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            monkeypatch.setitem(sys.modules, name, module)
        modules["verl.trainer.ppo"].core_algos = core_algos
        monkeypatch.delitem(sys.modules, PLUGIN, raising=False)
        importlib.import_module(PLUGIN)
        return core_algos, config_module, validate_config

    meta_path = list(sys.meta_path)
    try:
        yield load
    finally:
        sys.meta_path[:] = meta_path  # the plugin's post-import finder goes
        sys.modules.pop(PLUGIN, None)


def _config(adv_estimator="grpo", loss_mode="vanilla"):
    return {"algorithm": {"adv_estimator": adv_estimator},
            "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": loss_mode}}}}


@pytest.mark.parametrize("version", ["0.8.5", "0.9.2", "0.10.0"])
def test_outside_the_range_the_plugin_refuses_its_names_at_startup(fake_verl, caplog, version):
    with caplog.at_level(logging.WARNING, logger="ktae.integrations.verl"):
        core_algos, config_module, upstream = fake_verl(version)
    message = unsupported_verl_message(version)
    assert RANGE in message and "\n" not in message
    refusals = [m for m in caplog.messages if "verl plugin supports" in m]
    assert refusals == [message]  # said once, at `import verl`
    # start-up (main_ppo's validate_config, before Ray): a config naming a plugin name fails
    for config in (_config(adv_estimator="ktae"), _config(loss_mode="taco")):
        with pytest.raises(RuntimeError) as err:
            config_module.validate_config(config, False, False)
        assert str(err.value) == message
    # any other config is verl's business
    assert config_module.validate_config(_config(), False, False) == upstream(None, 0, 0)
    # the names are taken by functions that raise the same line
    assert set(core_algos.ADV_ESTIMATOR_REGISTRY) >= {"ktae", "gtpo"}
    assert set(core_algos.POLICY_LOSS_REGISTRY) == set(CALIBRATIONS.names())
    with pytest.raises(RuntimeError, match="supports verl>=0.9.0,<=0.9.1"):
        core_algos.ADV_ESTIMATOR_REGISTRY["ktae"](None, None)
    with pytest.raises(RuntimeError, match="supports verl>=0.9.0,<=0.9.1"):
        core_algos.POLICY_LOSS_REGISTRY["taco"](None, None, None, None)


@pytest.mark.parametrize("version", ["0.9.0", "0.9.1"])
def test_inside_the_range_the_plugin_registers_and_wraps(fake_verl, caplog, version):
    with caplog.at_level(logging.WARNING, logger="ktae.integrations.verl"):
        core_algos, config_module, upstream = fake_verl(version)
    assert not [m for m in caplog.messages if "verl plugin supports" in m]
    estimator = core_algos.ADV_ESTIMATOR_REGISTRY["ktae"]
    assert getattr(estimator, PLUGIN_MARK, False)
    assert estimator.__name__ != "refuse"
    assert set(core_algos.POLICY_LOSS_REGISTRY) == set(CALIBRATIONS.names())
    # validate_config is the plugin's start-up check around verl's (which reads OmegaConf,
    # absent here: tests/verl_plugin/test_verl_config.py runs it)
    assert config_module.validate_config.__wrapped__ is upstream
    assert getattr(config_module.validate_config, PLUGIN_MARK, False)
    # the other three wrappers wait for verl to import their modules
    finders = [f for f in sys.meta_path if getattr(f, "mark", None) == FINDER_MARK]
    assert len(finders) == 1
    assert set(finders[0].hooks) == {"verl.workers.utils.losses",
                                     "verl.trainer.ppo.ray_trainer",
                                     "verl.trainer.ppo.v1.trainer_base"}
