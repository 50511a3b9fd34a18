"""End to end: verl's real ``python -m verl.trainer.main_ppo`` for 2 steps on the CPU.

Each run trains ktae's shipped tiny model on the embedded arithmetic task (4 prompts x 4
responses per step) through stock verl 0.9.1, with the test-only CPU harness of
``tests/verl_plugin/loop`` (a CPU platform, a transformers rollout; see its docstring)
loaded in every process. The assertions read verl's own console metrics and the harness's
record of every call the plugin made to ktae (which process, which verl code path, the
inputs and the result), and recompute ktae's results from the recorded inputs.

Runs: the v1 trainer with ``adv_estimator=ktae`` and ``loss_mode=taco`` (an ``alpha`` at
which tokens are flagged); GTPO (the rollout entropies verl stores) with TACO on two
data-parallel ranks; the legacy trainer with KTAE; verl's GRPO with the
token-removing ``forking-tokens`` under ``token-mean``; and DAPO's composition (the
``dapo`` reward manager's overlong buffer, ``filter_groups`` on ``acc``, dynamic batch
size, clip-higher) with KTAE and STAPO. Each takes 1.5 to 2.5 minutes on a 2-core
machine.
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


# -- the v1 trainer: KTAE advantages, TACO loss ------------------------------------------

@pytest.fixture(scope="module")
def v1_ktae_taco(loop_inputs):
    return _run(loop_inputs, "v1-ktae-taco",
                "trainer.use_v1=true",
                "algorithm.adv_estimator=ktae",
                "actor_rollout_ref.actor.policy_loss.loss_mode=taco",
                "+actor_rollout_ref.actor.policy_loss.ktae.alpha=2.0",
                "actor_rollout_ref.actor.calculate_entropy=true",
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}")


def test_v1_trainer_runs_ktae_in_the_driver_on_the_whole_batch(v1_ktae_taco):
    calls = _check_ktae_calls(v1_ktae_taco,
                              "verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_advantage")
    for call in calls:
        assert len(call["inputs"]["token_ids"]) == ROWS
        if _mixed_groups(call):
            assert _token_level(call)


def test_v1_trainer_runs_taco_per_micro_batch_and_logs_it(v1_ktae_taco):
    driver = _calls(v1_ktae_taco, "compute_advantages")[0]["pid"]
    steps = _check_loss_calls(v1_ktae_taco, "taco", driver_pid=driver)
    trained_positive = 0
    for calls, metrics in zip(steps, v1_ktae_taco.metrics, strict=True):
        assert len(calls) == ROWS // MICRO and all(c["shape"][0] == MICRO for c in calls)
        tokens = sum(c["tokens"] for c in calls)
        # alpha = 2 makes every token with p < 2 exp(-H) a tail token: TACO flags the
        # positive-advantage ones, and verl's logged metrics show it
        positive = sum(c["positive"] for c in calls)
        trained_positive += positive
        assert (sum(c["weights_below_one"] for c in calls) > 0) == (positive > 0)
        flag_rate = sum(c["flag_rate"] for c in calls) / len(calls)  # verl: mean over micro-batches
        assert metrics["actor/calibration/flag_rate"] == pytest.approx(flag_rate, abs=1e-6)
        assert metrics["actor/taco/tail_token_frac"] > 0.5
        assert metrics["actor/taco/weight_mean"] < 1
        # first (on-policy) update: ratio 1, so verl's pg_loss is minus the token mean of
        # the calibrated advantages over the mini-batch (verl sums the micro-batch shares)
        expected = -sum(c["calibrated_sum"] for c in calls) / tokens
        assert metrics["actor/pg_loss"] == pytest.approx(expected, abs=1e-4)
        if positive:
            uncalibrated = -sum(c["advantage_sum"] for c in calls) / tokens
            assert metrics["actor/pg_loss"] > uncalibrated + 1e-6  # less positive credit
    assert trained_positive > 0, "no group had a right and a wrong answer: TACO went untested"


# -- GTPO on two data-parallel ranks ----------------------------------------------------

@pytest.fixture(scope="module")
def v1_gtpo_dp2(loop_inputs):
    return _run(loop_inputs, "v1-gtpo-dp2", "trainer.use_v1=true",
                "algorithm.adv_estimator=gtpo",
                "actor_rollout_ref.actor.policy_loss.loss_mode=taco",
                "actor_rollout_ref.actor.calculate_entropy=true",
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}", dp=2)


def test_gtpo_reads_the_stored_rollout_entropies(v1_gtpo_dp2):
    calls = _check_ktae_calls(
        v1_gtpo_dp2, "verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_advantage", "gtpo")
    for call in calls:
        entropies = torch.tensor(call["inputs"]["entropies"])
        mask = torch.tensor(call["inputs"]["mask"]).bool()
        assert entropies.shape == mask.shape and bool((entropies[mask] >= 0).all())
        assert float(entropies[mask].sum()) > 0


def test_two_ranks_each_calibrate_their_half(v1_gtpo_dp2):
    driver = _calls(v1_gtpo_dp2, "compute_advantages")[0]["pid"]
    calls = _check_loss_calls(v1_gtpo_dp2, "taco", driver_pid=driver)
    for step in calls:
        ranks: dict[int, int] = {}
        for c in step:
            assert c["shape"][0] == MICRO
            ranks[c["pid"]] = ranks.get(c["pid"], 0) + c["shape"][0]
        assert sorted(ranks.values()) == [ROWS // 2, ROWS // 2]  # one actor process per rank


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


# -- a token-removing rule under token-mean ---------------------------------------------

@pytest.fixture(scope="module")
def grpo_forking(loop_inputs):
    return _run(loop_inputs, "grpo-forking", "trainer.use_v1=true",
                "algorithm.adv_estimator=grpo",
                "actor_rollout_ref.actor.policy_loss.loss_mode=forking-tokens",
                "actor_rollout_ref.actor.loss_agg_mode=token-mean",
                "actor_rollout_ref.actor.calculate_entropy=true",
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}")


def test_forking_tokens_keeps_a_fifth_and_normalises_per_micro_batch(grpo_forking):
    assert not _calls(grpo_forking, "compute_advantages")  # verl's own GRPO
    for calls, metrics in zip(_check_loss_calls(grpo_forking, "forking-tokens",
                                                driver_pid=None),
                              grpo_forking.metrics, strict=True):
        tokens = sum(c["tokens"] for c in calls)
        for c in calls:
            assert 0 < c["kept"] < c["tokens"]
            assert c["kept"] == pytest.approx(0.2 * c["tokens"], abs=1.0)
        kept_fraction = sum(c["kept"] / c["tokens"] for c in calls) / len(calls)
        assert metrics["actor/calibration/loss_token_fraction"] == pytest.approx(
            kept_fraction, abs=1e-6)
        # token-mean: each micro-batch's kept-token mean, weighted by its share of
        # verl's global token count; ratio 1 on the first update
        expected = -sum(c["calibrated_sum"] / c["kept"] * c["tokens"] / tokens for c in calls)
        assert metrics["actor/pg_loss"] == pytest.approx(expected, abs=1e-4)


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


# -- the 2026 loss-time rules: entropy advantage, Clip-Cov, KL-Cov, SPO's mask -----------

# Two mini-batches of 2 prompts per step: the second is updated after the first's optimizer
# step, so its log-probs differ from the rollout's (Clip-Cov's clip test and KL-Cov's
# penalty act off-policy only). Clip-Cov's and KL-Cov's ratios are raised from verl's
# 0.0002 so that a micro-batch of about 100 tokens selects a few.
RULE_RUNS = {
    "entropy-adv": ["actor_rollout_ref.actor.calculate_entropy=true"],
    # clip_cov_lb below every covariance: every real token the ratio does not clip is a
    # candidate, so each step detaches some whatever the sampled rewards (with verl's
    # bound of 1, a step whose covariances all stay below 1, e.g. one whose groups are all
    # unmixed, detaches none)
    "clip-cov": ["actor_rollout_ref.actor.ppo_mini_batch_size=2",
                 "+actor_rollout_ref.actor.policy_loss.ktae.clip_cov_ratio=0.05",
                 "+actor_rollout_ref.actor.policy_loss.ktae.clip_cov_lb=-1000000.0"],
    "kl-cov": ["actor_rollout_ref.actor.ppo_mini_batch_size=2",
               "+actor_rollout_ref.actor.policy_loss.ktae.kl_cov_ratio=0.05"],
    "spo-mask": [],
}


@pytest.fixture(scope="module", params=sorted(RULE_RUNS))
def rule_run(request, loop_inputs):
    name = request.param
    return name, _run(loop_inputs, f"grpo-{name}", "trainer.use_v1=true",
                      "algorithm.adv_estimator=grpo",
                      f"actor_rollout_ref.actor.policy_loss.loss_mode={name}",
                      f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
                      *RULE_RUNS[name])


def _recompute(call) -> ktae.CalibrationResult:
    """The rule on the inputs the actor passed it, outside verl."""
    inputs = dict(call["inputs"])
    tensors = {k: torch.tensor(inputs.pop(k)) for k in
               ("advantages", "logprobs", "old_logprobs", "entropies", "mask")
               if inputs.get(k) is not None}
    inputs = {k: v for k, v in inputs.items() if v is not None}
    advantages = tensors.pop("advantages")
    return ktae.calibrate_advantages(call["name"], advantages, **tensors, **inputs)


def test_the_2026_rules_run_in_the_actor_on_every_micro_batch(rule_run):
    name, result = rule_run
    assert not _calls(result, "compute_advantages")  # verl's own GRPO advantages
    steps = _check_loss_calls(result, name, driver_pid=None, entropy=name == "entropy-adv")
    micro_batches = PROMPTS * N // MICRO
    for calls in steps:
        assert len(calls) == micro_batches
        for call in calls:
            assert call["inputs"]["old_logprobs"] is not None  # verl's old_log_prob
            expected = _recompute(call)
            got = call["result"]
            mask = torch.tensor(call["inputs"]["mask"]).bool()
            if name == "clip-cov":
                _check_clip_cov_choice(call, torch.tensor(got["weights"]),
                                       torch.tensor(got["advantages"]), mask)
            else:
                torch.testing.assert_close(torch.tensor(got["advantages"]),
                                           expected.advantages.float(), rtol=0, atol=1e-6)
                torch.testing.assert_close(torch.tensor(got["weights"]),
                                           expected.weights.float(), rtol=0, atol=1e-6)
            assert torch.equal(torch.tensor(got["loss_mask"]), expected.loss_mask & mask)


def _check_clip_cov_choice(call, weights, advantages, mask):
    """Clip-Cov's random choice draws from verl's global generator, whose state the test
    cannot replay: check its support and size instead. Exactly ``max(floor(ratio * real
    tokens), 1)`` of the candidates (all of them if fewer) get weight 0, no other token,
    and the calibrated advantages are the inputs times those weights."""
    from ktae.core.clip_cov import clipped_by_ratio, token_covariance

    inputs = call["inputs"]
    adv, logp, old = (torch.tensor(inputs[k]) for k in ("advantages", "logprobs",
                                                          "old_logprobs"))
    lb, ub = inputs.get("clip_cov_lb", 1.0), inputs.get("clip_cov_ub", 5.0)
    cov = token_covariance(adv, logp, mask)
    clipped = clipped_by_ratio(adv, logp, old, mask, inputs.get("clip_low", 0.2),
                               inputs.get("clip_high", 0.2))
    candidates = mask & ~clipped & (cov > lb) & (cov < ub)
    chosen = mask & (weights < 1)
    assert not (chosen & ~candidates).any()
    n = max(int(inputs["clip_cov_ratio"] * int(mask.sum())), 1)
    assert int(chosen.sum()) == min(n, int(candidates.sum()))
    assert torch.equal(weights[mask & ~chosen], torch.ones(int((mask & ~chosen).sum())))
    torch.testing.assert_close(advantages[mask], (adv * weights)[mask], rtol=0, atol=1e-6)


def _tensor(call, key):
    return torch.tensor(call["inputs"][key], dtype=torch.float64)


def test_each_2026_rule_does_what_it_says_in_verl(rule_run):
    name, result = rule_run
    steps = _check_loss_calls(result, name, driver_pid=None, entropy=name == "entropy-adv")
    calls = [c for step in steps for c in step]
    if name == "entropy-adv":
        # A' = A + min(alpha H, |A| / kappa) >= A, > A where the entropy and A are not 0
        assert sum(c["calibrated_sum"] for c in calls) > sum(c["advantage_sum"] for c in calls)
    elif name == "spo-mask":
        # only the tokens the rollout policy gave p < 0.9 stay in the loss
        for c in calls:
            mask = torch.tensor(c["inputs"]["mask"]).bool()
            low = _tensor(c, "old_logprobs").exp() < 0.9
            assert c["kept"] == int((low & mask).sum())
        assert 0 < sum(c["kept"] for c in calls) < sum(c["tokens"] for c in calls)
    elif name == "clip-cov":
        # some tokens are detached (weight 0) in every step: the first micro-batch of a
        # step is on-policy, so none of its tokens is clipped and all are candidates
        for step in steps:
            assert sum(c["weights_below_one"] for c in step) > 0
    else:  # kl-cov: the penalty shifts selected tokens once the policy has moved
        moved = [c for c in calls
                 if not torch.equal(_tensor(c, "logprobs"), _tensor(c, "old_logprobs"))]
        assert moved, "every micro-batch was exactly on-policy: KL-Cov's penalty went untested"
        shifted = sum(int((torch.tensor(c["result"]["advantages"], dtype=torch.float64)
                           != _tensor(c, "advantages")).sum()) for c in moved)
        assert shifted > 0
