"""Loading: ``import verl`` registers the plugin in the driver and in Ray workers; double
loading is harmless; failures and unknown verl versions are reported clearly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ktae.integrations.verl import unsupported_verl_message

verl = pytest.importorskip("verl", reason="verl is not installed (pip install -e '.[verl,test]')")


def run_python(*parts: str, **env) -> subprocess.CompletedProcess:
    """A fresh interpreter of this environment (the plugin loads at its ``import verl``)
    running the dedented ``parts`` one after the other."""
    code = "\n".join(textwrap.dedent(part) for part in parts)
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})


REPORT = """
    from verl.trainer.ppo import core_algos
    import ktae
    from ktae.integrations.verl.estimators import PLUGIN_MARK
    est = core_algos.ADV_ESTIMATOR_REGISTRY.get("ktae")
    losses = [n for n in ktae.CALIBRATIONS.names()
              if getattr(core_algos.POLICY_LOSS_REGISTRY.get(n), PLUGIN_MARK, False)]
    print("estimator", getattr(est, PLUGIN_MARK, False), "losses", len(losses),
          "of", len(ktae.CALIBRATIONS.names()))
"""


def test_import_verl_registers_the_names_in_a_ray_worker(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=1)
    def names_in_worker():
        import os

        import verl
        from verl.trainer.ppo import core_algos

        import ktae
        return (os.getpid(), verl.__version__, "ktae" in core_algos.ADV_ESTIMATOR_REGISTRY,
                sorted(set(ktae.CALIBRATIONS.names()) & set(core_algos.POLICY_LOSS_REGISTRY)))

    pid, version, has_ktae, losses = ray.get(names_in_worker.remote(), timeout=240)
    import ktae
    from ktae.integrations.verl import verl_supported

    assert pid != os.getpid()
    assert version == verl.__version__ and verl_supported(version)
    assert has_ktae
    assert losses == ktae.CALIBRATIONS.names()


def test_import_verl_registers_the_names_and_a_second_copy_is_harmless():
    """A fresh driver: ``import verl`` alone registers everything; executing the plugin
    again under another module name changes nothing (no error, no double wrapping)."""
    code = """
        import importlib.util, sys
        from verl.trainer.ppo import core_algos
        import verl.utils.config as cfg
        import ktae.integrations.verl.plugin as first
        before = (core_algos.ADV_ESTIMATOR_REGISTRY["ktae"], cfg.validate_config,
                  dict(core_algos.POLICY_LOSS_REGISTRY))
        spec = importlib.util.spec_from_file_location("second_copy_of_plugin", first.__file__)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        after = (core_algos.ADV_ESTIMATOR_REGISTRY["ktae"], cfg.validate_config,
                 dict(core_algos.POLICY_LOSS_REGISTRY))
        finders = [f for f in sys.meta_path if getattr(f, "mark", "") ==
                   "ktae_verl_post_import_finder"]
        inner = getattr(cfg.validate_config.__wrapped__, "_ktae_verl_plugin", False)
        print("same", before == after, "inner wrapped", inner, "finders", len(finders))
    """
    out = run_python("import verl", REPORT, code)
    assert out.returncode == 0, out.stderr
    assert "did not load" not in out.stderr
    n = len(__import__("ktae").CALIBRATIONS.names())
    assert f"estimator True losses {n} of {n}" in out.stdout
    assert "same True inner wrapped False finders 1" in out.stdout


def test_a_failing_plugin_is_reported_as_a_warning():
    code = """
        import sys
        sys.modules["ktae.integrations.verl.losses"] = None   # make one import fail
        import verl
        from verl.trainer.ppo import core_algos
        print("registered", "ktae" in core_algos.ADV_ESTIMATOR_REGISTRY)
    """
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert "WARNING" in out.stderr
    assert "ktae's verl plugin did not load" in out.stderr
    assert "ktae.integrations.verl.losses" in out.stderr


def test_switched_off_and_an_unknown_verl_version_is_refused_at_startup():
    """``VERL_USE_EXTERNAL_PLUGINS=none`` loads nothing; loading the plugin on another
    verl version patches nothing and refuses the plugin's names with a clear message."""
    code = """
        import verl
        verl.__version__ = "0.10.0"
        import ktae.integrations.verl.plugin
        from omegaconf import OmegaConf
        from verl.trainer.ppo import core_algos
        from verl.utils.config import validate_config
        config = OmegaConf.create({"algorithm": {"adv_estimator": "ktae"},
                                   "actor_rollout_ref": {"actor": {"policy_loss": {}}}})
        for call in (lambda: validate_config(config, False, False),
                     lambda: core_algos.get_adv_estimator_fn("ktae")(None, None),
                     lambda: core_algos.get_policy_loss_fn("taco")(None, None, None, None)):
            try:
                call()
            except RuntimeError as e:
                print("refused:", e)
    """
    out = run_python("import verl", REPORT, code, VERL_USE_EXTERNAL_PLUGINS="none")
    assert out.returncode == 0, out.stderr
    assert "estimator False losses 0" in out.stdout
    message = unsupported_verl_message("0.10.0")
    assert out.stdout.count(f"refused: {message}\n") == 3
    assert message in out.stderr  # also logged as a warning at load


USER_RULE = """
    import ktae

    @ktae.register_estimator("signed-length", needs=("mask",))
    def signed_length(batch, *, scale: float = 1.0):
        sign = 2.0 * batch.correct.double() - 1.0
        return scale * sign[:, None] * batch.mask.double()
"""


def test_a_users_rule_from_ktae_plugins_runs_through_verls_compute_advantage(tmp_path):
    """A fresh driver with ``KTAE_PLUGINS``: ``import verl`` registers the user's rule, and
    verl's own ``compute_advantage`` runs it with its ``algorithm.<name>`` options and the
    verifier's ``acc`` (prefix-value, built in, through the same call)."""
    rule = tmp_path / "signed_length.py"
    rule.write_text(textwrap.dedent(USER_RULE))
    code = """
        import numpy as np, torch
        from omegaconf import OmegaConf
        from verl import DataProto
        from verl.trainer.ppo import ray_trainer
        import ktae

        responses = torch.tensor([[3, 4, 5], [3, 6, 11], [7, 8, 11], [7, 11, 11]])
        mask = (responses != 11).long()
        rewards = torch.zeros(4, 3)
        rewards[torch.arange(4), mask.sum(1) - 1] = torch.tensor([1.0, -1.0, -0.25, -1.0])
        acc = np.array([True, False, True, False])  # row 2: right, shaped below 0
        for name, options in (("signed-length", {"scale": 2.0}),
                              ("prefix-value", {"total": "add", "apply": "all"})):
            data = DataProto.from_dict(
                tensors={"responses": responses, "response_mask": mask,
                         "token_level_rewards": rewards},
                non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object), "acc": acc})
            algorithm = OmegaConf.create({"adv_estimator": name, "gamma": 1.0, "lam": 1.0,
                                          "norm_adv_by_std_in_grpo": True,
                                          "use_kl_in_reward": False,
                                          "rollout_correction": None, name: options})
            out = ray_trainer.compute_advantage(
                data, adv_estimator=name, gamma=1.0, lam=1.0, num_repeat=1,
                norm_adv_by_std_in_grpo=True, config=algorithm)
            want = ktae.compute_advantages(name, rewards=rewards.sum(-1),
                                           group=["a", "a", "b", "b"], token_ids=responses,
                                           mask=mask, correct=torch.tensor(acc), **options)
            got = out.batch["advantages"]
            print(name, torch.allclose(got, want.to(got.dtype)), bool(got.abs().sum() > 0))
    """
    out = run_python("import verl", code, KTAE_PLUGINS=str(rule))
    assert out.returncode == 0, out.stderr
    assert "did not load" not in out.stderr and "could not load" not in out.stderr
    assert "signed-length True True" in out.stdout, out.stdout
    assert "prefix-value True True" in out.stdout, out.stdout
