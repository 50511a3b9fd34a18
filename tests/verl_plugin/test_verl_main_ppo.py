"""End to end: verl's real ``python -m verl.trainer.main_ppo`` for 2 steps on the CPU.

Each run trains ktae's shipped tiny model on the embedded arithmetic task (4 prompts x 4
responses per step) through stock verl 0.9.1, with the test-only CPU harness of
``tests/verl_plugin/loop`` (a CPU platform, a transformers rollout; see its docstring)
loaded in every process. The assertions read verl's own console metrics and the harness's
record of every call the plugin made to ktae (which process, which verl code path, the
inputs and the result), and recompute ktae's results from the recorded inputs.

Three runs, one per path through verl: the v1 trainer with ``adv_estimator=gtpo`` (the
driver, on the rollout entropies verl stores) and ``loss_mode=taco`` (the actor, on two
data-parallel ranks, at an ``alpha`` at which tokens are flagged); the legacy trainer with
KTAE; and DAPO's composition on the v1 trainer (the ``dapo`` reward manager's overlong
buffer, ``filter_groups`` on ``acc``, dynamic batch size, clip-higher) with KTAE and the
token-removing STAPO under verl's default ``token-mean``. Each takes 1.5 to 2.5 minutes on
a 2-core machine. KTAE on the v1 trainer without group filtering, and TACO on one rank of
several micro-batches, take the same verl code paths and are tested in process
(``test_verl_advantages.py`` through ``PPOTrainer._compute_advantage`` with a real
TransferQueue, ``test_verl_loss.py`` through ``ppo_loss`` on one and two micro-batches).

The other loss modes take the actor's path of the TACO and STAPO runs, and are tested
there in process, against verl's own loss functions, on one and several micro-batches and
ranks: ``forking-tokens`` (``test_verl_loss.py``:
``test_token_removing_rules_mean_what_verls_mode_means_on_the_kept_tokens``,
``test_every_calibration_runs_through_ppo_loss``), ``entropy-adv``, ``clip-cov`` and
``spo-mask`` (``test_every_calibration_runs_through_ppo_loss``), ``kl-cov``
(``test_kl_cov_has_the_gradient_of_verls_own_kl_cov_loss``; ``tests/test_kl_cov_verl.py``
and ``tests/test_clip_cov_verl.py`` against verl's formulas in the main environment).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

verl = pytest.importorskip("verl", reason="verl is not installed (pip install -e '.[verl,test]')")

import torch  # noqa: E402

import ktae  # noqa: E402

LOOP = Path(__file__).resolve().parent / "loop"
HARNESS_VERL = "0.9.1"


def _harness_missing() -> str | None:
    """Why the CPU harness cannot work with this verl, or None."""
    if verl.__version__ != HARNESS_VERL:
        return (f"the CPU harness of verl's main_ppo is written against verl {HARNESS_VERL}'s "
                f"internals; this is verl {verl.__version__}")
    try:
        from verl.plugin.platform.platform_manager import PlatformRegistry  # noqa: F401
        from verl.utils.distributed import initialize_global_process_group_ray  # noqa: F401
        from verl.workers.rollout.base import _ROLLOUT_REGISTRY  # noqa: F401
        from verl.workers.rollout.replica import RolloutReplicaRegistry  # noqa: F401
    except ImportError as e:
        return f"verl lacks an extension point the CPU harness uses: {e}"
    return None


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(_harness_missing() is not None,
                                 reason=_harness_missing() or "")]

sys.path.insert(0, str(LOOP))
import loop_run  # noqa: E402

STEPS, PROMPTS, N, MICRO = 2, 4, 4, 4
ROWS = PROMPTS * N


@pytest.fixture(scope="module")
def loop_inputs(tmp_path_factory):
    return loop_run.prepare(tmp_path_factory.mktemp("verl-loop"))


def _run(inputs, name: str, *overrides: str, dp: int = 1) -> loop_run.LoopResult:
    result = loop_run.run_main_ppo(
        inputs, loop_run.base_overrides(inputs, steps=STEPS, prompts=PROMPTS, n=N, dp=dp)
        + list(overrides), name=name)
    assert result.returncode == 0, result.output[-6000:]
    assert [m["step"] for m in result.metrics] == [1.0, 2.0], result.output[-3000:]
    return result


def _calls(result, call: str) -> list[dict]:
    return [r for r in result.record if r["call"] == call]


def _check_ktae_calls(result, source: str, name: str = "ktae") -> list[dict]:
    """Every recorded estimator call, recomputed from its inputs, and against verl's metrics."""
    calls = _calls(result, "compute_advantages")
    assert len(calls) == STEPS
    driver = {c["pid"] for c in calls}
    assert len(driver) == 1
    for call, metrics in zip(calls, result.metrics, strict=True):
        assert call["name"] == name and call["source"] == source
        inputs = call["inputs"]
        rows = len(inputs["token_ids"])
        assert len(inputs["mask"]) == rows and len(inputs["group"]) == rows
        assert len({str(g) for g in inputs["group"]}) == rows // N  # one uid per prompt
        # correctness is the verifier's acc, whatever the reward (DAPO shaping included)
        assert inputs["correct"] == [a > 0 for a in call["acc"]]
        tensors = ("rewards", "token_ids", "mask", "correct", "entropies")
        kwargs = {k: (torch.tensor(v) if k in tensors else v) for k, v in inputs.items()}
        expected = ktae.compute_advantages(name, **kwargs)
        got = torch.tensor(call["advantages"])
        torch.testing.assert_close(got, expected.to(got.dtype), rtol=0, atol=1e-6)
        mask = torch.tensor(inputs["mask"]).bool()
        # verl's own logged advantage statistics are over the same tensor
        assert metrics["critic/advantages/mean"] == pytest.approx(
            float(got[mask].mean()), abs=1e-5)
        assert metrics["critic/advantages/max"] == pytest.approx(float(got[mask].max()),
                                                                 abs=1e-5)
    return calls


def _token_level(call) -> bool:
    """Whether some response got different values on different tokens (KTAE's point)."""
    adv = torch.tensor(call["advantages"])
    mask = torch.tensor(call["inputs"]["mask"]).bool()
    spread = [adv[i][mask[i]].max() - adv[i][mask[i]].min() for i in range(len(adv))
              if mask[i].sum() > 1]
    return bool(max(spread) > 0)


def _mixed_groups(call) -> int:
    by_group: dict[str, set] = {}
    for g, c in zip(call["inputs"]["group"], call["inputs"]["correct"], strict=True):
        by_group.setdefault(str(g), set()).add(c)
    return sum(len(v) == 2 for v in by_group.values())


def _check_loss_calls(result, name: str, *, driver_pid: int | None,
                      entropy: bool = True) -> list[list[dict]]:
    """The calibrated loss ran in the actor worker on every micro-batch, with the entropy
    of that forward pass where the rule reads it; returns the calls of each step."""
    calls = _calls(result, "calibrate_advantages")
    assert calls and all(c["name"] == name for c in calls)
    assert all(c["entropies_from_forward"] == entropy for c in calls)
    assert driver_pid is None or all(c["pid"] != driver_pid for c in calls)
    assert len(calls) % STEPS == 0
    per_step = len(calls) // STEPS
    return [calls[i * per_step:(i + 1) * per_step] for i in range(STEPS)]


# -- the v1 trainer: GTPO advantages, TACO loss, two data-parallel ranks -----------------

@pytest.fixture(scope="module")
def v1_gtpo_taco_dp2(loop_inputs):
    return _run(loop_inputs, "v1-gtpo-taco-dp2", "trainer.use_v1=true",
                "algorithm.adv_estimator=gtpo",
                "actor_rollout_ref.actor.policy_loss.loss_mode=taco",
                "+actor_rollout_ref.actor.policy_loss.ktae.alpha=2.0",
                "actor_rollout_ref.actor.calculate_entropy=true",
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}", dp=2)


def test_v1_trainer_runs_gtpo_in_the_driver_on_the_stored_rollout_entropies(v1_gtpo_taco_dp2):
    calls = _check_ktae_calls(
        v1_gtpo_taco_dp2, "verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_advantage",
        "gtpo")
    for call in calls:
        assert len(call["inputs"]["token_ids"]) == ROWS  # the whole batch, in one call
        entropies = torch.tensor(call["inputs"]["entropies"])
        mask = torch.tensor(call["inputs"]["mask"]).bool()
        assert entropies.shape == mask.shape and bool((entropies[mask] >= 0).all())
        assert float(entropies[mask].sum()) > 0


def test_two_ranks_each_calibrate_their_half(v1_gtpo_taco_dp2):
    driver = _calls(v1_gtpo_taco_dp2, "compute_advantages")[0]["pid"]
    calls = _check_loss_calls(v1_gtpo_taco_dp2, "taco", driver_pid=driver)
    for step in calls:
        ranks: dict[int, int] = {}
        for c in step:
            assert c["shape"][0] == MICRO
            ranks[c["pid"]] = ranks.get(c["pid"], 0) + c["shape"][0]
        assert sorted(ranks.values()) == [ROWS // 2, ROWS // 2]  # one actor process per rank


def test_v1_trainer_runs_taco_per_micro_batch_and_logs_it(v1_gtpo_taco_dp2):
    driver = _calls(v1_gtpo_taco_dp2, "compute_advantages")[0]["pid"]
    steps = _check_loss_calls(v1_gtpo_taco_dp2, "taco", driver_pid=driver)
    trained_positive = 0
    for calls, metrics in zip(steps, v1_gtpo_taco_dp2.metrics, strict=True):
        assert len(calls) == ROWS // MICRO and all(c["shape"][0] == MICRO for c in calls)
        tokens = sum(c["tokens"] for c in calls)
        # alpha = 2 makes every token with p < 2 exp(-H) a tail token: TACO flags the
        # positive-advantage ones, and verl's logged metrics show it
        positive = sum(c["positive"] for c in calls)
        trained_positive += positive
        assert (sum(c["weights_below_one"] for c in calls) > 0) == (positive > 0)
        # verl: mean over the micro-batches of each rank, then over the ranks (equal counts)
        flag_rate = sum(c["flag_rate"] for c in calls) / len(calls)
        assert metrics["actor/calibration/flag_rate"] == pytest.approx(flag_rate, abs=1e-6)
        assert metrics["actor/taco/tail_token_frac"] > 0.5
        assert metrics["actor/taco/weight_mean"] < 1
        # first (on-policy) update: ratio 1, so verl's pg_loss is minus the token mean of
        # the calibrated advantages over the mini-batch of both ranks
        expected = -sum(c["calibrated_sum"] for c in calls) / tokens
        assert metrics["actor/pg_loss"] == pytest.approx(expected, abs=1e-4)
        if positive:
            uncalibrated = -sum(c["advantage_sum"] for c in calls) / tokens
            assert metrics["actor/pg_loss"] > uncalibrated + 1e-6  # less positive credit
    assert trained_positive > 0, "no positive advantage reached TACO: its weights went untested"


# -- the legacy trainer ---------------------------------------------------------------

@pytest.fixture(scope="module")
def legacy_ktae(loop_inputs):
    return _run(loop_inputs, "legacy-ktae", "trainer.use_v1=false",
                "algorithm.adv_estimator=ktae")


def test_legacy_trainer_runs_ktae_and_vanilla_loss(legacy_ktae):
    calls = _check_ktae_calls(legacy_ktae, "verl.trainer.ppo.ray_trainer.compute_advantage")
    assert not _calls(legacy_ktae, "calibrate_advantages")  # verl's vanilla loss
    for call, metrics in zip(calls, legacy_ktae.metrics, strict=True):
        adv = torch.tensor(call["advantages"])
        mask = torch.tensor(call["inputs"]["mask"]).bool()
        # on-policy first update with nothing calibrated: pg_loss = -mean(A) over tokens
        assert metrics["actor/pg_loss"] == pytest.approx(-float(adv[mask].mean()), abs=1e-4)


# -- DAPO: overlong buffer, dynamic sampling, dynamic batch size; KTAE + STAPO ------------

OVERLONG = 16


@pytest.fixture(scope="module")
def dapo_ktae_stapo(loop_inputs):
    return _run(loop_inputs, "dapo-ktae-stapo", "trainer.use_v1=true",
                "algorithm.adv_estimator=ktae",
                "reward.reward_manager.name=dapo",
                "+reward.reward_kwargs.max_resp_len=40",
                "+reward.reward_kwargs.overlong_buffer_cfg.enable=true",
                f"+reward.reward_kwargs.overlong_buffer_cfg.len={OVERLONG}",
                "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
                "+reward.reward_kwargs.overlong_buffer_cfg.log=false",
                "algorithm.filter_groups.enable=true",
                "algorithm.filter_groups.metric=acc",
                "actor_rollout_ref.actor.use_dynamic_bsz=true",
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=256",
                "actor_rollout_ref.actor.clip_ratio_high=0.28",
                "actor_rollout_ref.actor.policy_loss.loss_mode=stapo",
                # looser than STAPO's p < 0.002 below the 0.2-quantile of entropy: most of
                # the confident tiny model's token entropies are 0 in its bf16 forward pass
                "+actor_rollout_ref.actor.policy_loss.ktae.prob_threshold=0.99",
                "+actor_rollout_ref.actor.policy_loss.ktae.entropy_quantile=1.0",
                "actor_rollout_ref.actor.calculate_entropy=true")


def test_dapo_trains_only_mixed_groups_and_reads_correctness_from_acc(dapo_ktae_stapo):
    calls = _check_ktae_calls(dapo_ktae_stapo,
                              "verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_advantage")
    shaped = 0
    for call in calls:
        # filter_groups on acc: every group that reaches KTAE has right and wrong answers
        assert _mixed_groups(call) == len({str(g) for g in call["inputs"]["group"]})
        assert _token_level(call)
        lengths = torch.tensor(call["inputs"]["mask"]).sum(-1)
        for reward, acc, length in zip(call["inputs"]["rewards"], call["acc"], lengths.tolist(),
                                       strict=True):
            penalty = min(0.0, (40 - OVERLONG - length) / OVERLONG)
            assert reward == pytest.approx((1.0 if acc else -1.0) + penalty, abs=1e-6)
            shaped += penalty < 0
    assert shaped > 0, "no response reached the overlong buffer: the shaping went untested"


def test_dapo_runs_stapo_in_the_actor(dapo_ktae_stapo):
    driver = _calls(dapo_ktae_stapo, "compute_advantages")[0]["pid"]
    calls = _calls(dapo_ktae_stapo, "calibrate_advantages")
    assert calls and all(c["name"] == "stapo" and c["entropies_from_forward"] for c in calls)
    assert all(c["pid"] != driver for c in calls)
    assert all(c["kept"] <= c["tokens"] for c in calls)
    removed = sum(c["tokens"] - c["kept"] for c in calls)
    assert 0 < removed <= sum(c["positive"] for c in calls)  # only positive tokens go
    fractions = [m["actor/calibration/loss_token_fraction"] for m in dapo_ktae_stapo.metrics]
    assert min(fractions) < 1
