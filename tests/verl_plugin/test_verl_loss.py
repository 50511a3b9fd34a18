"""Calibrated losses through verl's real actor loss: ``partial(ppo_loss, config=actor
config)`` as ``verl.workers.engine_workers`` builds it, fed verl's no-padding layout."""

from __future__ import annotations

import math
from functools import partial

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install -e '.[verl,test]')")

import torch  # noqa: E402

import ktae  # noqa: E402

PROMPT_LENS = [3, 2, 4, 1, 2]
RESPONSE_LENS = [4, 6, 1, 5, 3]
ALPHA, LAM = 0.01, 0.9


def actor_config(loss_mode="taco", options=None, agg="token-mean", **extra):
    from verl.workers.config import FSDPActorConfig

    from ktae.integrations.verl.config import CalibratedPolicyLossConfig

    policy_loss = CalibratedPolicyLossConfig(loss_mode=loss_mode, ktae=dict(options or {}))
    return FSDPActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=2,
                           clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=agg,
                           policy_loss=policy_loss, calculate_entropy=True, **extra)


def worker_loss_fn(config):
    """The actor loss exactly as ``ActorRolloutRefWorker.init_model`` builds it."""
    from verl.workers import engine_workers

    return partial(engine_workers.ppo_loss, config=config)


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


class MicroBatch:
    """One micro-batch in verl's no-padding layout plus its padded [B, T] twins.

    Current log-probs and entropies sit on either side of TACO's threshold
    ``logp = -H + log(alpha)`` by a clear margin, so the flagged tokens are known.
    """

    def __init__(self, seed=0, is_weights=False):
        g = torch.Generator().manual_seed(seed)
        B, T = len(RESPONSE_LENS), max(RESPONSE_LENS)
        self.mask = torch.arange(T)[None, :] < torch.tensor(RESPONSE_LENS)[:, None]
        self.entropy = torch.rand(B, T, generator=g) * 2 + 0.1
        side = torch.where(torch.rand(B, T, generator=g) < 0.35, -1.0, 1.0)
        self.logp_values = (-self.entropy + math.log(ALPHA) + side * 0.7).clamp(max=-1e-3)
        self.old = self.logp_values + 0.05 * torch.randn(B, T, generator=g)
        self.adv = torch.randn(B, T, generator=g)
        self.adv[0] = self.adv[0].abs() + 0.1  # a response with positive credit throughout
        self.is_weights = torch.rand(B, T, generator=g) * 1.5 if is_weights else None
        zero = torch.zeros(B, T)
        self.adv, self.old, self.entropy = (torch.where(self.mask, x, zero)
                                            for x in (self.adv, self.old, self.entropy))
        self.logp_values = torch.where(self.mask, self.logp_values, zero)
        self.flagged = (self.logp_values < -self.entropy + math.log(ALPHA)) & (self.adv > 0) \
            & self.mask
        assert 0 < int(self.flagged.sum()) < int(((self.adv > 0) & self.mask).sum())

    def rows(self, x):
        return [x[i, :n] for i, n in enumerate(RESPONSE_LENS)]

    def verl_inputs(self, logp: torch.Tensor, *, dp_size=1, batch_num_tokens=None,
                    global_batch_size=None, with_entropy=True):
        """``(model_output, data)`` as the engine hands them to the loss function."""
        from verl.utils import tensordict_utils as tu

        def full_sequence(resp):  # response values shifted into the [prompt | response] rows
            parts = []
            for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
                parts += [resp.new_zeros(p - 1), resp[i, :r], resp.new_zeros(1)]
            return torch.cat(parts)

        model_output = {"log_probs": full_sequence(logp)}
        if with_entropy:
            model_output["entropy"] = full_sequence(self.entropy)
        fields = {
            "prompts": _nested([torch.full((p,), 7) for p in PROMPT_LENS]),
            "responses": _nested([torch.full((r,), 5) for r in RESPONSE_LENS]),
            "response_mask": _nested([torch.ones(r, dtype=torch.int64) for r in RESPONSE_LENS]),
            "old_log_probs": _nested(self.rows(self.old)),
            "advantages": _nested(self.rows(self.adv)),
        }
        if self.is_weights is not None:
            fields["rollout_is_weights"] = _nested(self.rows(self.is_weights))
        data = tu.get_tensordict(fields)
        tu.assign_non_tensor(data, dp_size=dp_size, batch_num_tokens=batch_num_tokens,
                             global_batch_size=global_batch_size)
        return model_output, data


def value(metric):
    return metric.aggregate() if hasattr(metric, "aggregate") else metric


def test_the_worker_loss_is_the_wrapped_ppo_loss():
    from verl.workers import engine_workers
    from verl.workers.utils import losses

    assert engine_workers.ppo_loss is losses.ppo_loss
    assert getattr(losses.ppo_loss, "_ktae_verl_plugin", False)
    assert losses.ppo_loss.__wrapped__.__module__ == "verl.workers.utils.losses"


def test_taco_loss_equals_ktae_on_calibrated_advantages_with_current_entropy(monkeypatch):
    mb = MicroBatch()
    seen = {}
    real = ktae.calibrate_advantages

    def spy(name, advantages, **kwargs):
        seen.update(kwargs, name=name)
        return real(name, advantages, **kwargs)

    monkeypatch.setattr("ktae.core.calibration.calibrate_advantages", spy)  # the loss reads it
    logp = mb.logp_values.clone().requires_grad_(True)
    model_output, data = mb.verl_inputs(logp)
    loss, metrics = worker_loss_fn(actor_config(options={"alpha": ALPHA, "lam": LAM}))(
        model_output=model_output, data=data)

    # the calibration saw the current forward pass's entropy and log-probs
    assert seen["name"] == "taco"
    torch.testing.assert_close(seen["entropies"], mb.entropy, rtol=0, atol=0)
    torch.testing.assert_close(seen["logprobs"], mb.logp_values, rtol=0, atol=0)
    assert not seen["logprobs"].requires_grad

    monkeypatch.setattr("ktae.core.calibration.calibrate_advantages", real)
    res = ktae.calibrate_advantages("taco", mb.adv, logprobs=mb.logp_values, entropies=mb.entropy,
                                    mask=mb.mask, alpha=ALPHA, lam=LAM)
    assert torch.equal(res.flagged, mb.flagged)
    assert value(metrics["actor/calibration/flag_rate"]) == pytest.approx(
        float(mb.flagged.sum()) / float(mb.mask.sum()))
    keep = getattr(res, "loss_mask", mb.mask)
    ref_logp = mb.logp_values.clone().requires_grad_(True)
    want, _ = ktae.policy_loss(ref_logp, mb.old, res.advantages, keep, clip_low=0.2,
                               clip_high=0.28, dual_clip=3.0, aggregation="token-mean")
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-7)

    # gradients flow into the current log-probs, as ktae's loss defines them
    loss.backward()
    want.backward()
    assert logp.grad is not None and logp.grad[mb.mask].abs().sum() > 0
    torch.testing.assert_close(logp.grad, ref_logp.grad, rtol=1e-6, atol=1e-7)
    # a flagged token's gradient is the uncalibrated one times its calibration weight < 1
    uncalibrated = mb.logp_values.clone().requires_grad_(True)
    ktae.policy_loss(uncalibrated, mb.old, mb.adv, mb.mask, clip_low=0.2, clip_high=0.28,
                     dual_clip=3.0)[0].backward()
    flagged = mb.flagged & (ref_logp.grad != 0)
    assert flagged.any() and (res.weights[flagged] < 1).all()
    torch.testing.assert_close(logp.grad[flagged],
                               res.weights[flagged] * uncalibrated.grad[flagged])


@pytest.mark.parametrize("agg", ["token-mean", "token-sum", "seq-mean-token-mean",
                                 "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("split", ["one micro-batch", "global mini-batch over 2 ranks"])
@pytest.mark.parametrize("is_weights", [False, True])
def test_reweight_only_loss_matches_verl_vanilla_normalisation(agg, split, is_weights):
    """With lam = 0 TACO changes nothing: the loss must be verl's own vanilla loss for every
    aggregation mode and global-batch normaliser (gradient accumulation across splits)."""
    mb = MicroBatch(seed=1, is_weights=is_weights)
    info = {} if split == "one micro-batch" else dict(
        dp_size=2, batch_num_tokens=3 * int(mb.mask.sum()), global_batch_size=12)
    model_output, data = mb.verl_inputs(mb.logp_values, **info)
    ours, _ = worker_loss_fn(actor_config(options={"lam": 0.0}, agg=agg))(
        model_output=model_output, data=data)
    model_output, data = mb.verl_inputs(mb.logp_values, **info)
    vanilla, _ = worker_loss_fn(actor_config("vanilla", agg=agg))(
        model_output=model_output, data=data)
    torch.testing.assert_close(ours, vanilla, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["taco-prob-only", "taco-hard", "taco-entropy-only",
                                  "taco-entropy-high", "taco-random", "adv-reweight",
                                  "forking-tokens", "stapo", "entropy-adv", "clip-cov",
                                  "spo-mask", "rsi-s"])
def test_every_calibration_runs_through_ppo_loss(name):
    """Each loss mode through the actor's loss (``ppo_loss``) equals ktae's policy loss on
    its calibrated advantages and loss mask (test_verl_main_ppo.py runs TACO and STAPO
    through verl's main_ppo; the rest take the same path)."""
    torch.manual_seed(0)
    mb = MicroBatch(seed=2)
    logp = mb.logp_values.clone().requires_grad_(True)
    model_output, data = mb.verl_inputs(logp)
    loss, metrics = worker_loss_fn(actor_config(name))(model_output=model_output, data=data)
    assert torch.isfinite(loss)
    loss.backward()
    assert logp.grad[mb.mask].abs().sum() > 0
    torch.manual_seed(0)
    extra = {"old_logprobs": mb.old} if "old_logprobs" in \
        __import__("inspect").signature(ktae.calibrate_advantages).parameters else {}
    res = ktae.calibrate_advantages(name, mb.adv, logprobs=mb.logp_values, entropies=mb.entropy,
                                    mask=mb.mask, **extra)
    want, _ = ktae.policy_loss(mb.logp_values, mb.old, res.advantages,
                               getattr(res, "loss_mask", mb.mask), clip_low=0.2, clip_high=0.28,
                               dual_clip=3.0)
    torch.testing.assert_close(loss.detach(), want, rtol=1e-6, atol=1e-7)
    if name != "adv-reweight":  # whose flag rate is 1 by construction (not logged)
        assert value(metrics["actor/calibration/flag_rate"]) == pytest.approx(res.flag_rate)


def test_kl_cov_has_the_gradient_of_verls_own_kl_cov_loss():
    """ktae's ``kl-cov`` against verl's ``kl_cov`` loss mode (compute_policy_loss_kl_cov) on
    an off-policy micro-batch that reaches the actor's clip range: the same gradient, since
    neither clips a token; ``clip=true`` keeps the clip and differs on the clipped ones."""
    from verl.workers.config import FSDPActorConfig

    from ktae.integrations.verl.config import CalibratedPolicyLossConfig

    mb = MicroBatch(seed=3)
    g = torch.Generator().manual_seed(4)
    mb.old = torch.where(mb.mask, mb.logp_values + 0.4 * torch.randn(mb.mask.shape, generator=g),
                         0)
    ratio = (mb.logp_values - mb.old).exp()
    assert bool((mb.mask & ((ratio > 1.28) | (ratio < 0.8))).any())

    def grad(loss_mode, ktae_options):
        policy_loss = CalibratedPolicyLossConfig(loss_mode=loss_mode, ktae=ktae_options,
                                                 kl_cov_ratio=0.3, ppo_kl_coef=1.0)
        config = FSDPActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=2,
                                 clip_ratio_low=0.2, clip_ratio_high=0.28,
                                 loss_agg_mode="token-mean", policy_loss=policy_loss,
                                 calculate_entropy=True)
        logp = mb.logp_values.clone().requires_grad_(True)
        model_output, data = mb.verl_inputs(logp)
        loss, _ = worker_loss_fn(config)(model_output=model_output, data=data)
        loss.backward()
        return logp.grad

    want = grad("kl_cov", {})
    torch.testing.assert_close(grad("kl-cov", {"kl_cov_ratio": 0.3}), want, rtol=1e-5,
                               atol=1e-7)
    clipped = grad("kl-cov", {"kl_cov_ratio": 0.3, "clip": True})
    assert not torch.allclose(clipped, want, rtol=1e-5, atol=1e-7)


def test_missing_entropy_names_the_setting():
    mb = MicroBatch()
    model_output, data = mb.verl_inputs(mb.logp_values, with_entropy=False)
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.calculate_entropy=true"):
        worker_loss_fn(actor_config())(model_output=model_output, data=data)


def test_loss_outside_ppo_loss_refuses():
    from verl.trainer.ppo import core_algos

    mb = MicroBatch()
    fn = core_algos.get_policy_loss_fn("taco")
    with pytest.raises(RuntimeError, match="needs the current policy's entropy"):
        fn(mb.old, mb.logp_values, mb.adv, mb.mask, "token-mean", actor_config(), None)


@pytest.mark.parametrize("options, message", [
    ({"alhpa": 0.1}, "alhpa: unknown option for calibration 'taco'; expected alpha, lam"),
    ({"alpha": -1.0}, "alpha"),
])
def test_bad_calibration_options_are_refused_when_verl_builds_the_config(options, message):
    with pytest.raises(ValueError, match=message):
        actor_config(options=options)


#: Token-removing rules with options that make them remove a clear share of the tokens.
REMOVING_RULES = {"forking-tokens": {"top_fraction": 0.3},
                  "stapo": {"prob_threshold": 0.004, "entropy_quantile": 0.6},
                  "rsi-s": {"rsi_min": 3.5, "rsi_max": 8.0}}
#: Mini-batch layouts: each rank's micro-batches (MicroBatch seeds), ``None`` = verl gives
#: no global batch info (one micro-batch on one rank).
SPLITS = {"one micro-batch": [[3]], "two micro-batches": [[3, 4]],
          "two ranks of two micro-batches": [[3, 4], [5, 6]]}


def _verl_on_kept_tokens(config, old, logp, adv, keep, agg, info):
    """verl's own vanilla loss (``core_algos.compute_policy_loss_vanilla`` and its
    ``agg_loss``) with ``keep`` as the loss mask and ``info`` as ``global_batch_info``."""
    from verl.trainer.ppo import core_algos

    config.global_batch_info.clear()
    config.global_batch_info.update(info)
    loss, _ = core_algos.compute_policy_loss_vanilla(old_log_prob=old, log_prob=logp,
                                                     advantages=adv, response_mask=keep,
                                                     loss_agg_mode=agg, config=config)
    return loss


@pytest.mark.parametrize("agg", ["token-mean", "token-sum", "seq-mean-token-mean",
                                 "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("rule", list(REMOVING_RULES))
def test_token_removing_rules_mean_what_verls_mode_means_on_the_kept_tokens(rule, split, agg):
    """Each micro-batch's loss (and gradient) is verl's own loss on the tokens the rule keeps,
    under the global batch info verl gives that micro-batch. ``token-sum`` and the
    ``seq-mean-*`` modes are verl's ``agg_loss`` on the kept mask as it is; ``token-mean``
    is the kept tokens' mean within the micro-batch (verl's ``agg_loss`` on the kept mask
    with the micro-batch's kept count), weighted by the micro-batch's share of verl's
    ``batch_num_tokens`` (see the module docstring of ktae.integrations.verl.losses)."""
    options = REMOVING_RULES[rule]
    ranks = [[MicroBatch(seed=s) for s in seeds] for seeds in SPLITS[split]]
    batches = [mb for rank in ranks for mb in rank]
    info = {}
    if split != "one micro-batch":
        info = dict(dp_size=len(ranks), batch_num_tokens=sum(int(mb.mask.sum()) for mb in batches),
                    global_batch_size=sum(mb.mask.shape[0] for mb in batches))
    removed_rows = 0
    for mb in batches:
        logp = mb.logp_values.clone().requires_grad_(True)
        model_output, data = mb.verl_inputs(logp, **info)
        config = actor_config(rule, options, agg=agg)
        ours, _ = worker_loss_fn(config)(model_output=model_output, data=data)
        ours.backward()

        res = ktae.calibrate_advantages(rule, mb.adv, logprobs=mb.logp_values,
                                        entropies=mb.entropy, mask=mb.mask, **options)
        keep = res.loss_mask
        assert 0 < int(keep.sum()) < int(mb.mask.sum())
        removed_rows += int((mb.mask.any(-1) & ~keep.any(-1)).sum())
        ref_logp = mb.logp_values.clone().requires_grad_(True)
        verl_info = dict(info, loss_scale_factor=None)
        if agg == "token-mean":
            # the kept tokens' mean in this micro-batch, times its share of the real tokens
            verl_info = dict(dp_size=1, batch_num_tokens=int(keep.sum()), global_batch_size=None,
                             loss_scale_factor=None)
            share = int(mb.mask.sum()) / info.get("batch_num_tokens", int(mb.mask.sum()))
            share *= info.get("dp_size", 1)
        else:
            share = 1.0
        want = _verl_on_kept_tokens(actor_config("vanilla", agg=agg), mb.old, ref_logp,
                                    res.advantages, keep, agg, verl_info) * share
        want.backward()
        torch.testing.assert_close(ours, want, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(logp.grad, ref_logp.grad, rtol=1e-6, atol=1e-7)
        assert logp.grad[keep].abs().sum() > 0 and not logp.grad[~keep].any()
    if rule == "forking-tokens":  # the case where a row without kept tokens matters
        assert removed_rows > 0


TACO_FAMILY = ["taco", "taco-prob-only", "taco-entropy-only", "taco-entropy-high",
               "taco-random", "taco-hard", "taco-step"]


@pytest.mark.parametrize("name", TACO_FAMILY)
def test_taco_family_logs_the_taco_authors_metrics(name):
    """``taco/weight_mean`` etc. under the TACO authors' names, their definitions written
    out here: means over every real token of the micro-batch."""
    mb = MicroBatch(seed=2)
    model_output, data = mb.verl_inputs(mb.logp_values)
    torch.manual_seed(0)
    _, metrics = worker_loss_fn(actor_config(name))(model_output=model_output, data=data)
    real = mb.mask
    H = None if name == "taco-prob-only" else mb.entropy
    r = -mb.logp_values + math.log(0.01) - (0 if H is None else H)
    torch.manual_seed(0)
    res = ktae.calibrate_advantages(name, mb.adv, logprobs=mb.logp_values, entropies=mb.entropy,
                                    mask=mb.mask)
    if name in ("taco", "taco-prob-only"):  # TACO's w(r) at every real token, any sign of A
        weight = 1 - 0.9 * (1 - torch.exp(-r.clamp(min=0)))
    elif name in ("taco-hard", "taco-step"):  # the factor at every r > 0 token
        weight = torch.where(r > 0, 0.0 if name == "taco-hard" else 0.1, 1.0)
    else:  # the weights the ablation hands out (TACO's own multiset), 1 elsewhere
        weight = res.weights
    want = {"taco/weight_mean": weight[real].mean(), "taco/tail_risk_mean": r[real].mean(),
            "taco/tail_token_frac": (r[real] > 0).double().mean(),
            "taco/positive_adv_token_frac": (mb.adv[real] > 0).double().mean()}
    for key, expected in want.items():
        assert value(metrics[key]) == pytest.approx(float(expected), rel=1e-5), key
    assert 0 < value(metrics["taco/tail_token_frac"]) < 1
    # ktae's own names stay; actor/calibration/weight_mean is the mean applied weight
    assert value(metrics["actor/calibration/weight_mean"]) == pytest.approx(
        float(res.weights[real].mean()), rel=1e-6)
    assert value(metrics["actor/calibration/flag_rate"]) == pytest.approx(res.flag_rate)


def test_adv_reweight_logs_its_mean_weight_not_its_constant_flag_rate():
    mb = MicroBatch(seed=2)
    model_output, data = mb.verl_inputs(mb.logp_values)
    _, metrics = worker_loss_fn(actor_config("adv-reweight"))(model_output=model_output,
                                                              data=data)
    weight = 0.1 * mb.old.exp() + 0.9
    assert value(metrics["actor/calibration/mean_weight"]) == pytest.approx(
        float(weight[mb.mask].mean()), rel=1e-5)
    assert "actor/calibration/flag_rate" not in metrics
    assert not any(key.startswith("taco/") for key in metrics)


@pytest.mark.parametrize("name", ["forking-tokens", "stapo"])
def test_baselines_log_no_taco_metrics(name):
    mb = MicroBatch(seed=2)
    model_output, data = mb.verl_inputs(mb.logp_values)
    _, metrics = worker_loss_fn(actor_config(name))(model_output=model_output, data=data)
    assert not any(key.startswith("taco/") for key in metrics)
    assert "actor/calibration/flag_rate" in metrics
