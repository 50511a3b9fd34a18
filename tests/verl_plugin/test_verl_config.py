"""Start-up checks on a config composed from verl's real ``ppo_trainer.yaml`` (Hydra)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install -e '.[verl,test]')")

from omegaconf import OmegaConf  # noqa: E402

#: What verl's own validation needs on top of ppo_trainer.yaml (a small GRPO-style run).
BASE = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
]

KTAE_TACO = [
    "algorithm.adv_estimator=ktae",
    "+algorithm.ktae.h1=1.0",
    "+algorithm.ktae.h2=2.0",
    "+algorithm.ktae.ignore_token_ids=[151643]",
    "+algorithm.ktae.correct_key=acc",
    "actor_rollout_ref.actor.policy_loss.loss_mode=taco",
    "+actor_rollout_ref.actor.policy_loss.ktae.alpha=0.01",
    "+actor_rollout_ref.actor.policy_loss.ktae.lam=0.9",
    "actor_rollout_ref.actor.calculate_entropy=true",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean",
]

DAPO = [
    "algorithm.filter_groups.enable=true",
    "algorithm.filter_groups.metric=acc",
    "reward.reward_manager.name=dapo",
    "+reward.reward_kwargs.max_resp_len=3072",
    "+reward.reward_kwargs.overlong_buffer_cfg.enable=true",
    "+reward.reward_kwargs.overlong_buffer_cfg.len=512",
    "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward.reward_kwargs.overlong_buffer_cfg.log=false",
]


def compose(*overrides):
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose("ppo_trainer", overrides=[*BASE, *overrides])


def verl_validate(config):
    """verl's start-up validation as ``main_ppo.main`` runs it (the plugin wraps it)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config, use_reference_policy=need_reference_policy(config),
                    use_critic=need_critic(config))


def test_validate_config_is_wrapped_by_the_plugin():
    from verl.utils import config as verl_config

    assert getattr(verl_config.validate_config, "_ktae_verl_plugin", False)


@pytest.mark.parametrize("extra", [[], DAPO], ids=["grpo-taco", "dapo-ktae-taco"])
def test_ktae_and_taco_overrides_validate(extra):
    from verl.utils.config import omega_conf_to_dataclass

    from ktae.integrations.verl.config import CalibratedPolicyLossConfig
    from ktae.integrations.verl.options import check_config

    config = compose(*KTAE_TACO, *extra)
    verl_validate(config)
    found = check_config(config)
    assert found.estimator.name == "ktae"
    assert found.estimator.options == {"h1": 1.0, "h2": 2.0, "ignore_token_ids": [151643],
                                       "base": "grpo"}
    assert found.calibration.name == "taco"
    assert found.calibration.options == {"alpha": 0.01, "lam": 0.9}
    # the plugin pointed the policy-loss block at its config class; verl builds it
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, CalibratedPolicyLossConfig)
    assert actor.policy_loss.ktae == {"alpha": 0.01, "lam": 0.9}
    assert actor.clip_ratio_high == 0.28


@pytest.mark.parametrize("name", ["taco", "taco-prob-only", "taco-entropy-only",
                                  "taco-entropy-high", "taco-random",
                                  "taco-hard", "adv-reweight", "forking-tokens", "stapo",
                                  "rsi-s"])
def test_every_calibration_is_reachable_from_the_command_line(name):
    import ktae

    assert name in ktae.CALIBRATIONS
    verl_validate(compose(f"actor_rollout_ref.actor.policy_loss.loss_mode={name}",
                          "actor_rollout_ref.actor.calculate_entropy=true"))


def test_all_registered_calibrations_are_covered():
    from verl.trainer.ppo import core_algos

    import ktae

    for name in ktae.CALIBRATIONS.names():
        assert getattr(core_algos.get_policy_loss_fn(name), "_ktae_verl_plugin", False)


@pytest.mark.parametrize("override, message", [
    ("+algorithm.ktae.h4=1.0", r"algorithm\.ktae\.h4: unknown option; expected one of base"),
    ("+algorithm.ktae.mode=fast", r"algorithm\.ktae: mode: expected 'exact' or 'reference'"),
    ("++algorithm.ktae.h1=-1", r"algorithm\.ktae: h1"),
    ("+actor_rollout_ref.actor.policy_loss.ktae.alhpa=0.1",
     "alhpa: unknown option for calibration 'taco'; expected alpha, lam"),
    ("++actor_rollout_ref.actor.policy_loss.ktae.lam=1.5", "lam"),
])
def test_a_typo_or_bad_value_fails_at_startup_with_the_option_named(override, message):
    config = compose(*KTAE_TACO, override)
    with pytest.raises(ValueError, match=message):
        verl_validate(config)


def test_options_for_an_unselected_estimator_are_refused():
    config = compose("+algorithm.ktae.h1=2.0")  # adv_estimator stays gae
    with pytest.raises(ValueError, match="algorithm.adv_estimator=ktae"):
        verl_validate(config)


def test_calibration_options_without_a_calibration_loss_are_refused():
    config = compose("+actor_rollout_ref.actor.policy_loss.ktae.alpha=0.01")
    with pytest.raises(ValueError, match="loss_mode=vanilla is not a ktae calibration"):
        verl_validate(config)


def test_entropy_based_calibration_needs_calculate_entropy():
    overrides = [o for o in KTAE_TACO if "calculate_entropy" not in o]
    with pytest.raises(ValueError, match=r"set actor_rollout_ref\.actor\.calculate_entropy=true"):
        verl_validate(compose(*overrides))
    # entropy-free calibrations, or an entropy bonus (which makes verl compute it), pass
    verl_validate(compose("actor_rollout_ref.actor.policy_loss.loss_mode=taco-prob-only"))
    verl_validate(compose(*overrides, "actor_rollout_ref.actor.entropy_coeff=0.001"))


def test_dapo_group_filtering_needs_the_v1_trainer():
    config = compose(*KTAE_TACO, *DAPO, "trainer.use_v1=false")
    with pytest.raises(ValueError, match=r"trainer\.use_v1=true"):
        verl_validate(config)
    verl_validate(compose(*KTAE_TACO, "trainer.use_v1=false"))  # legacy without filtering


def test_contradicting_drgrpo_switch_is_refused():
    config = compose(*KTAE_TACO, "+algorithm.ktae.base=grpo",
                     "algorithm.norm_adv_by_std_in_grpo=false")
    with pytest.raises(ValueError, match="norm_adv_by_std_in_grpo"):
        verl_validate(config)


def test_configs_without_the_plugin_pass_unchanged():
    config = compose("algorithm.adv_estimator=grpo")
    before = OmegaConf.to_container(config)
    verl_validate(config)
    assert OmegaConf.to_container(config) == before


def test_example_scripts_overrides_validate():
    """The shipped example commands compose and validate (their Hydra overrides only)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "examples" / "verl"
    scripts = sorted(root.glob("*.sh"))
    assert len(scripts) >= 2
    for script in scripts:
        text = script.read_text()
        overrides = _script_overrides(text)
        assert overrides, script
        # paths and model names are placeholders here; everything else is checked
        config = compose(*[o for o in overrides if not o.startswith(("data.train_files",
                                                                    "data.val_files"))])
        verl_validate(config)


def _script_overrides(text: str) -> list[str]:
    """``key=value`` words of the example's ``python -m verl.trainer.main_ppo`` command."""
    import shlex

    start = text.index("python3 -m verl.trainer.main_ppo")
    command = text[start:].split("\n\n")[0].replace("\\\n", " ")
    words = shlex.split(command, comments=True)[3:]
    env = {"MODEL_PATH": "Qwen/Qwen2.5-Math-7B", "TRAIN_FILE": "train.parquet",
           "VAL_FILE": "val.parquet", "N_GPUS": "8", "NNODES": "1"}
    out = []
    for w in words:
        for k, v in env.items():
            w = w.replace("${" + k + "}", v).replace("$" + k, v)
        if "=" in w and not w.startswith(("trainer.n_gpus_per_node", "trainer.nnodes",
                                          "actor_rollout_ref.model.path")):
            out.append(w)
    return out


def test_gtpo_needs_the_v1_trainer():
    import ktae

    if "gtpo" not in ktae.ADVANTAGE_ESTIMATORS:
        pytest.skip("the installed ktae has no gtpo estimator")
    verl_validate(compose("algorithm.adv_estimator=gtpo", "+algorithm.gtpo.a2=0.1"))
    with pytest.raises(ValueError, match=r"trainer\.use_v1=true"):
        verl_validate(compose("algorithm.adv_estimator=gtpo", "trainer.use_v1=false"))
    with pytest.raises(ValueError, match=r"algorithm\.gtpo\.a3: unknown option"):
        verl_validate(compose("algorithm.adv_estimator=gtpo", "+algorithm.gtpo.a3=0.1"))


BYPASS = "algorithm.rollout_correction.bypass_mode=true"


def test_gtpo_in_rollout_correction_bypass_mode_is_refused_at_startup():
    """Bypass mode skips verl's old-policy forward pass, the only one that computes the
    rollout entropies GTPO reads: refused before Ray starts, naming that setting."""
    import ktae

    if "gtpo" not in ktae.ADVANTAGE_ESTIMATORS:
        pytest.skip("the installed ktae has no gtpo estimator")
    with pytest.raises(ValueError, match=r"needs the rollout policy's per-token entropies, "
                       r"but algorithm\.rollout_correction\.bypass_mode=true skips the "
                       r"old-policy forward pass.*set algorithm\.rollout_correction\."
                       r"bypass_mode=false"):
        verl_validate(compose("algorithm.adv_estimator=gtpo", BYPASS))
    # the legacy trainer is named first: it drops the entropies in either mode
    with pytest.raises(ValueError, match=r"legacy trainer drops them.*trainer\.use_v1=true"):
        verl_validate(compose("algorithm.adv_estimator=gtpo", BYPASS, "trainer.use_v1=false"))
    # estimators that read no entropies run in bypass mode; so does gtpo in decoupled mode
    verl_validate(compose(*KTAE_TACO, BYPASS))
    verl_validate(compose("algorithm.adv_estimator=gtpo",
                          "algorithm.rollout_correction.bypass_mode=false"))


#: The GTPO command line of docs/verl.md, and every option of its table.
GTPO_DOC = ["algorithm.adv_estimator=gtpo", "+algorithm.gtpo.a2=0.1",
            "+algorithm.gtpo.normalize=group", "trainer.use_v1=true"]


def test_gtpo_options_from_the_docs_validate():
    import ktae
    from ktae.integrations.verl.options import check_config

    if "gtpo" not in ktae.ADVANTAGE_ESTIMATORS:
        pytest.skip("the installed ktae has no gtpo estimator")
    config = compose(*GTPO_DOC)
    verl_validate(config)
    assert check_config(config).estimator.options == {"a2": 0.1, "normalize": "group"}
    config = compose(*GTPO_DOC, "+algorithm.gtpo.a1=0.5", "+algorithm.gtpo.eps=1e-6",
                     "+algorithm.gtpo.correct_key=null", "+algorithm.gtpo.reward_threshold=0.5")
    verl_validate(config)
    found = check_config(config).estimator
    assert found.options == {"a1": 0.5, "a2": 0.1, "eps": 1e-6, "normalize": "group"}
    assert found.correct_key is None and found.reward_threshold == 0.5


@pytest.mark.parametrize("override, message", [
    ("+algorithm.gtpo.eps=0", r"algorithm\.gtpo: eps"),
    ("++algorithm.gtpo.normalize=token",
     r"algorithm\.gtpo: normalize: expected one of group, batch"),
    ("+algorithm.gtpo.a1=nan", r"algorithm\.gtpo: a1"),
    ("+algorithm.gtpo.correct_key=3", r"algorithm\.gtpo\.correct_key"),
])
def test_gtpo_bad_values_fail_at_startup_with_the_option_named(override, message):
    import ktae

    if "gtpo" not in ktae.ADVANTAGE_ESTIMATORS:
        pytest.skip("the installed ktae has no gtpo estimator")
    with pytest.raises(ValueError, match=message):
        verl_validate(compose(*GTPO_DOC, override))


@pytest.mark.parametrize("override, message", [
    ("algorithm.adv_estimator=sdpo", r"adv_estimator=sdpo: .*needs=teacher_logprobs"),
    ("algorithm.adv_estimator=delta", r"adv_estimator=delta: .*needs=token_grad_proxy"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode=sdpg",
     r"loss_mode: 'sdpg' is ktae train's self-distillation term"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode=sdpo",
     r"loss_mode: 'sdpo' is ktae train's self-distillation term"),
])
def test_self_distillation_is_refused_at_startup_in_one_line(override, message):
    """SDPO's self-teacher pass and the self-distillation losses need the actor's model
    over a privileged prompt (docs/method.md §17): refused before Ray starts."""
    with pytest.raises(ValueError, match=message) as err:
        verl_validate(compose(override))
    assert "\n" not in str(err.value)
