"""``ktae train`` with GTPO and the TACO family on CPU: what reaches TRL's loss.

Each run records what the trainer computed (advantages, old-policy entropies, the
calibration's inputs, the loss inputs TRL read and the loss it returned) and the test
recomputes it with the core functions.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
from test_train_helpers import contains_digit, read_jsonl, tiny_config

import ktae
from ktae.runs.credit import credit_settings
from ktae.train.dynamic_sampling import need_key
from ktae.train.session import train
from ktae.train.trainer import KTAEGRPOTrainer

pytestmark = pytest.mark.slow


class Recorder(KTAEGRPOTrainer):
    """Keeps, per step, what the credit machinery saw and produced."""

    rec: dict

    def _rollout_needs(self, batch, inputs):
        out = super()._rollout_needs(batch, inputs)
        if need_key("entropies") in out:
            self.rec["old_entropies"].append(out[need_key("entropies")].clone())
        return out

    def _finish_batch(self, batch, rewards, correct, mode, **kwargs):
        entry = {"rewards": rewards.clone(), "correct": correct.clone(),
                 "mask": batch["ktae_token_mask"].clone(),
                 "ids": torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
                 "entropies": batch.get(need_key("entropies"))}
        out = super()._finish_batch(batch, rewards, correct, mode, **kwargs)
        entry["advantages"] = out["advantages"].clone()
        self.rec["batches"].append(entry)
        return out

    def _loss_inputs(self, inputs):
        copy = super()._loss_inputs(inputs)
        self.rec["loss"].append({"inputs": copy, "advantages": inputs["advantages"].clone(),
                                 "mask": inputs["completion_mask"].clone(),
                                 "ids": torch.cat([inputs["prompt_ids"],
                                                   inputs["completion_ids"]], dim=1),
                                 "num_items": inputs["num_items_in_batch"].clone()})
        return copy

    def _calibrate(self, inputs, logps, entropies):
        self.rec["loss"][-1].update(logps=logps.clone(), entropies=entropies.clone())
        super()._calibrate(inputs, logps, entropies)

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        if self.rec["loss"]:
            self.rec["loss"][-1]["value"] = loss.detach().clone()
        return loss


def _run(tiny_model, tmp_path, **overrides):
    log = {"old_entropies": [], "batches": [], "loss": []}
    cls = type("Rec", (Recorder,), {"rec": log})
    cfg = tiny_config(tiny_model, tmp_path / "run", **overrides)
    train(cfg, trainer_cls=cls, reward_funcs=[contains_digit])
    return cfg, log, read_jsonl(tmp_path / "run" / "metrics.jsonl")


def test_gtpo_with_taco(tiny_model, tmp_path):
    cfg, log, metrics = _run(tiny_model, tmp_path, algo="grpo", credit="gtpo+taco",
                             taco_alpha=0.9)
    assert [m["step"] for m in metrics] == [1, 2]
    assert len(log["old_entropies"]) == 2 and len(log["batches"]) == 2
    for entry in log["batches"]:
        B = entry["rewards"].numel()
        expected = ktae.compute_advantages(
            "gtpo", rewards=entry["rewards"], group=torch.arange(B) // cfg.num_generations,
            mask=entry["mask"].bool(), entropies=entry["entropies"], correct=entry["correct"])
        torch.testing.assert_close(entry["advantages"], expected.float())
        spread = [a[m.bool()].max() - a[m.bool()].min() for a, m in
                  zip(entry["advantages"], entry["mask"], strict=True) if m.sum() > 1]
        assert max(spread) > 1e-3  # token-level, not a broadcast
    # on-policy first step: the old-policy entropies are the loss pass's entropies (TRL
    # shuffles the rows between generation and loss: match them by prompt and completion)
    gen, first = log["batches"][0], log["loss"][0]
    rows = {tuple(ids.tolist()): i for i, ids in enumerate(gen["ids"])}
    order = torch.tensor([rows[tuple(ids.tolist())] for ids in first["ids"]])
    real = first["mask"].bool()
    torch.testing.assert_close(gen["entropies"][order][real], first["entropies"][real],
                               rtol=1e-4, atol=1e-5)
    for rec in log["loss"]:
        res = ktae.calibrate_advantages("taco", rec["advantages"], logprobs=rec["logps"],
                                        entropies=rec["entropies"], mask=rec["mask"].bool(),
                                        alpha=0.9, lam=0.9)
        torch.testing.assert_close(rec["inputs"]["advantages"], res.advantages)
        assert torch.equal(rec["inputs"]["completion_mask"], rec["mask"])  # reweight only
    for m in metrics:
        for key in ("mean_weight", "mean_tail_risk", "tail_fraction",
                    "positive_advantage_fraction", "loss_token_fraction"):
            assert math.isfinite(m[key]), key
        assert 0 < m["mean_weight"] <= 1 and m["loss_token_fraction"] == 1.0


def test_gtpo_with_dynamic_sampling(tiny_model, tmp_path):
    """DAPO's refill rounds each get their entropy pass; the merged batch keeps each row's."""
    cfg, log, metrics = _run(tiny_model, tmp_path, algo="dapo", credit="gtpo",
                             max_generation_rounds=3)
    assert [m["step"] for m in metrics] == [1, 2]
    assert len(log["old_entropies"]) == sum(m["generation_rounds"] for m in metrics)
    assert max(m["generation_rounds"] for m in metrics) > 1  # rows from several rounds
    for entry in log["batches"]:
        mask = entry["mask"].bool()
        assert entry["entropies"].shape == mask.shape
        assert (entry["entropies"][mask] >= 0).all()
        B = entry["rewards"].numel()
        expected = ktae.compute_advantages(
            "gtpo", rewards=entry["rewards"], group=torch.arange(B) // cfg.num_generations,
            mask=mask, entropies=entry["entropies"], correct=entry["correct"])
        torch.testing.assert_close(entry["advantages"], expected.float() * mask)
    # each kept row carries the entropies of its own generation round
    rounds = log["old_entropies"][:int(metrics[0]["generation_rounds"])]
    first = log["batches"][0]
    for ent, m in zip(first["entropies"], first["mask"].bool(), strict=True):
        n = int(m.sum())
        assert any(torch.equal(ent[:n], r[:n]) for rnd in rounds for r in rnd
                   if r.shape[0] >= n)


def test_ktae_plus_stapo_runs_without_an_entropy_pass(tiny_model, tmp_path):
    _, log, metrics = _run(tiny_model, tmp_path, algo="dapo", credit="ktae+stapo")
    assert [m["step"] for m in metrics] == [1, 2]
    assert log["old_entropies"] == []  # only estimators that read entropies pay for them
    for m in metrics:
        assert 0 <= m["loss_token_fraction"] <= 1 and math.isfinite(m["entropy_threshold"])
    for rec in log["loss"]:
        res = ktae.calibrate_advantages("stapo", rec["advantages"], logprobs=rec["logps"],
                                        entropies=rec["entropies"], mask=rec["mask"].bool())
        assert torch.equal(rec["inputs"]["completion_mask"].bool(), res.loss_mask)


@pytest.mark.parametrize("credit, algo, options", [
    ("stapo", "dapo", {"prob_threshold": 0.5, "entropy_quantile": 0.9}),
    ("forking-tokens", "grpo", {}),
    ("rsi-s", "dapo", {"rsi_min": 1.0, "rsi_max": 1.05}),
])
def test_removed_tokens_leave_trls_loss(tiny_model, tmp_path, credit, algo, options):
    _, log, metrics = _run(tiny_model, tmp_path, algo=algo, credit=credit, max_steps=1,
                           calibration_options=options)
    rec = log["loss"][0]
    mask = rec["mask"].bool()
    res = ktae.calibrate_advantages(credit, rec["advantages"], logprobs=rec["logps"],
                                    entropies=rec["entropies"], mask=mask, **options)
    keep = res.loss_mask
    assert 0 < keep.sum() < mask.sum()  # tokens were removed
    assert torch.equal(rec["inputs"]["completion_mask"].bool(), keep)
    assert metrics[0]["loss_token_fraction"] == pytest.approx(keep.sum().item() / mask.sum().item())
    adv = rec["inputs"]["advantages"]
    # on-policy (ratio 1) each surviving token's loss is -A
    if algo == "dapo":  # TRL's token-mean: normalised by the surviving tokens
        assert rec["inputs"]["num_items_in_batch"].item() == pytest.approx(keep.sum().item())
        expected, _ = ktae.policy_loss(rec["logps"], rec["logps"], adv, keep)
    else:  # TRL's grpo: mean over rows of each row's surviving-token mean
        rows = (-(adv * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1))
        expected = rows.mean()
    torch.testing.assert_close(rec["value"], expected.float(), rtol=1e-5, atol=1e-6)


def test_adv_reweight_reads_the_old_policy(tiny_model, tmp_path):
    _, log, metrics = _run(tiny_model, tmp_path, algo="grpo", credit="adv-reweight",
                           max_steps=1)
    rec = log["loss"][0]
    # num_iterations = 1: TRL keeps no old log-probs and the old policy is the current one
    assert "old_per_token_logps" not in rec["inputs"]
    mask = rec["mask"].bool()
    weight = 0.1 * rec["logps"].exp() + 0.9
    expected = weight * rec["advantages"] * mask
    torch.testing.assert_close(rec["inputs"]["advantages"], expected)
    # its flag rate is 1 by construction: the mean weight is logged instead
    assert "flagged_token_rate" not in metrics[0]
    means = [float((0.1 * r["logps"].exp() + 0.9)[r["mask"].bool()].mean()) for r in log["loss"]]
    assert metrics[0]["mean_weight"] == pytest.approx(sum(means) / len(means), rel=1e-4)


def test_every_registered_name_is_a_credit():
    from ktae.runs.config import TrainConfig

    for est in ktae.ADVANTAGE_ESTIMATORS.names():
        assert credit_settings(TrainConfig(credit=est).resolve()).estimator == est
        for cal in ktae.CALIBRATIONS.names():
            s = credit_settings(TrainConfig(credit=f"{est}+{cal}").resolve())
            assert (s.estimator, s.calibration) == (est, cal)
    for cal in ktae.CALIBRATIONS.names():
        assert credit_settings(TrainConfig(credit=cal).resolve()).calibration == cal


def test_tool_mask_folds_into_the_loss_mask_and_attention_is_restored(monkeypatch):
    """Multi-turn batches: TRL multiplies completion_mask by tool_mask before the policy
    pass, so the loss-input copy holds the product, and the policy pass still attends to
    tool tokens."""
    from trl import GRPOTrainer

    seen = {}

    def fake_pass(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
        seen["attention"] = attention_mask.clone()
        return torch.zeros(2, 3), torch.ones(2, 3), None

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", fake_pass)
    trainer = KTAEGRPOTrainer.__new__(KTAEGRPOTrainer)
    inputs = {"prompt_mask": torch.ones(2, 2, dtype=torch.long),
              "completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
              "tool_mask": torch.tensor([[1, 0, 1], [1, 1, 1]]),
              "advantages": torch.ones(2, 3)}
    copy = KTAEGRPOTrainer._loss_inputs(trainer, inputs)
    assert "tool_mask" in inputs and "tool_mask" not in copy
    assert copy["completion_mask"].tolist() == [[1, 0, 1], [1, 1, 0]]
    assert inputs["completion_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]  # untouched
    calls = []
    trainer._in_loss = True  # the policy's pass inside _compute_loss (not a timed old-policy pass)
    trainer._pending_calibration = copy
    trainer._calibrate = lambda pending, logps, entropies: calls.append(pending)
    wrong_attention = torch.cat([copy["prompt_mask"], copy["completion_mask"]], dim=1)
    trainer._get_per_token_logps_and_entropies(None, torch.zeros(2, 5), wrong_attention, 3,
                                               compute_entropy=True)
    assert seen["attention"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert calls == [copy] and trainer._pending_calibration is None


@pytest.mark.parametrize("credit, options, clip", [("kl-cov", {}, False),
                                                   ("kl-cov", {"clip": True}, True),
                                                   ("taco", {}, True)])
def test_a_result_without_the_ppo_clip_unclips_trls_loss(monkeypatch, credit, options, clip):
    """KL-Cov's result asks for no PPO clip (verl's kl_cov loss): TRL 1.16's loss, which
    reads epsilon_low/epsilon_high after the policy pass, sees an infinite clip range for
    that call only; KL-Cov's ``clip=true`` and other rules keep the configured range."""
    from types import SimpleNamespace

    from trl import GRPOTrainer

    from ktae.runs.config import TrainConfig

    g = torch.Generator().manual_seed(0)
    logps = -torch.rand(2, 3, generator=g)
    seen = {}

    def fake_pass(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
        return logps, torch.ones(2, 3), None

    def fake_loss(self, model, inputs):  # TRL's order: the policy pass, then the clip range
        self._get_per_token_logps_and_entropies(model, inputs["ids"], inputs["attention"], 3,
                                                compute_entropy=True)
        seen["clip_range"] = (self.epsilon_low, self.epsilon_high)
        return torch.zeros(())

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", fake_pass)
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", fake_loss)
    trainer = KTAEGRPOTrainer.__new__(KTAEGRPOTrainer)
    trainer.credit = credit_settings(TrainConfig(credit=credit,
                                                 calibration_options=options).resolve())
    trainer.epsilon_low, trainer.epsilon_high = 0.2, 0.28
    trainer.state = SimpleNamespace(global_step=0)
    trainer.accelerator = SimpleNamespace(process_index=0, num_processes=1)
    trainer.model = SimpleNamespace(training=True)
    trainer.rollouts, trainer._metrics = None, {"train": defaultdict(list)}
    inputs = {"ids": torch.zeros(2, 5, dtype=torch.long),
              "attention": torch.ones(2, 5, dtype=torch.long),
              "prompt_mask": torch.ones(2, 2, dtype=torch.long),
              "completion_mask": torch.ones(2, 3, dtype=torch.long),
              "advantages": torch.tensor([1.0, -1.0])}
    KTAEGRPOTrainer._compute_loss(trainer, None, inputs)
    assert seen["clip_range"] == ((0.2, 0.28) if clip else (math.inf, math.inf))
    assert (trainer.epsilon_low, trainer.epsilon_high) == (0.2, 0.28)  # restored
    # an infinite range is no clip in TRL's clamp: coef_2 = clamp(coef_1, 1 - eps, 1 + eps)
    coef = torch.tensor([0.1, 1.0, 7.0])
    assert torch.equal(torch.clamp(coef, 1 - math.inf, 1 + math.inf), coef)
