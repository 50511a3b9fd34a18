"""Settings that only show in a real ``ktae train`` step reach it (tiny model, CPU).

* the default reward functions of ``train()`` carry DAPO's overlong shaping with the
  configured buffer, and the accuracy term alone says what is correct;
* shaping never flips "correct": a right but overlong response is correct for KTAE's
  classes and for dynamic sampling;
* the KL coefficient and the upper clip reach TRL's trainer and loss (the clip: the loss
  of an off-policy update, recomputed);
* a non-default TACO alpha and lambda are what the loss-time calibration used,
  recomputed from a recorded batch.
"""

from __future__ import annotations

import pytest
import torch
from test_train_credit import Recorder as LossRecorder
from test_train_helpers import Recorder, contains_digit, read_jsonl, tiny_config

import ktae
from ktae.rewards import overlong_penalty
from ktae.train.reward_funcs import make_overlong_reward
from ktae.train.session import train
from ktae.train.trainer import KTAEGRPOTrainer

pytestmark = pytest.mark.slow


class Seen(Recorder):
    """:class:`test_train_helpers.Recorder` that also keeps each reward function's scores
    and the trainer's loss settings."""

    def _finish_batch(self, batch, rewards, correct, mode, *, per_func, **kwargs):
        out = super()._finish_batch(batch, rewards, correct, mode, per_func=per_func, **kwargs)
        self.seen[-1].update(per_func=per_func.clone(), beta=self.beta,
                             clip=(self.epsilon_low, self.epsilon_high),
                             reward_funcs=list(self.reward_funcs))
        return out


def _train(tiny_model, out, **overrides):
    seen: list = []
    reward_funcs = overrides.pop("reward_funcs", None)
    cfg = tiny_config(tiny_model, out, **overrides)
    train(cfg, trainer_cls=type("S", (Seen,), {"seen": seen}), reward_funcs=reward_funcs)
    return cfg, seen, read_jsonl(out / "metrics.jsonl")


def test_default_rewards_shape_overlong_responses_and_beta_and_clip_reach_trl(tiny_model,
                                                                               tmp_path):
    """``ktae train``'s own reward functions (no stand-in): accuracy, then DAPO's overlong
    penalty with the configured buffer and factor; beta and clip_high reach the loss."""
    cfg, seen, metrics = _train(tiny_model, tmp_path / "run", algo="dapo", credit="ktae",
                                dynamic_sampling=False, max_steps=2, max_new_tokens=8,
                                overlong_buffer=4, overlong_factor=0.5, beta=0.04,
                                clip_high=0.31, learning_rate=1e-2, seed=2)
    first = seen[0]
    assert first["adv"].abs().sum() > 0  # what step 2's KL needs of seed 2: step 1 learns
    names = [getattr(f, "__name__", "") for f in first["reward_funcs"]]
    assert names == ["accuracy", "overlong"]
    lengths = first["token_mask"].sum(dim=1)
    assert (lengths > cfg.max_new_tokens - cfg.overlong_buffer).any()  # some reach the buffer
    expected = overlong_penalty(lengths.tolist(), max_length=8, cache_length=4, factor=0.5)
    torch.testing.assert_close(first["per_func"][:, 1], expected.to(first["per_func"].dtype))
    assert (first["per_func"][:, 1] < 0).any()
    torch.testing.assert_close(first["rewards"], first["per_func"].sum(dim=1))
    # the overlong function itself: inside the buffer free, past it penalised
    overlong = first["reward_funcs"][1]
    assert overlong(completion_ids=[[5] * 4, [5] * 6, [5] * 8]) == [0.0, -0.25, -0.5]
    # correctness is the verifier's (the strict boxed reward), never the shaped sum
    accuracy = first["reward_funcs"][0]
    assert accuracy.stop_ids == set(first["ignore"])  # the trainer's EOS and pad ids
    stop = min(accuracy.stop_ids)
    assert accuracy(["so \\boxed{12}", "12"], answer=["12", "12"],
                    completion_ids=[[5, stop], [5, stop]]) == [1.0, 0.0]
    # a right box in a response cut at the budget (no stop id at its end) is wrong
    assert accuracy(["so \\boxed{12}"], answer=["12"], completion_ids=[[5, 6]]) == [0.0]
    assert torch.equal(first["correct"], first["per_func"][:, 0] > 0.5)
    # beta: TRL's trainer holds it, keeps a reference model and logs the KL of the loss
    assert first["beta"] == 0.04
    assert all("kl" in m for m in metrics)
    assert metrics[-1]["kl"] > 0  # step 2: the policy moved away from the reference
    assert first["clip"] == (0.2, 0.31)


def test_shaping_never_flips_a_correct_response(tiny_model, tmp_path):
    """A right answer that ran past the overlong buffer (accuracy 1, penalty up to -1, sum
    <= 0.5) is still correct for KTAE's classes and for dynamic sampling."""
    overlong = make_overlong_reward(max_length=8, cache_length=4)
    cfg, seen, metrics = _train(tiny_model, tmp_path / "run", algo="dapo", credit="ktae",
                                max_steps=1, max_new_tokens=8, max_generation_rounds=2,
                                reward_funcs=[contains_digit, overlong])
    rec = seen[0]
    accuracy = rec["per_func"][:, 0]
    assert torch.equal(rec["correct"], accuracy > 0.5)
    flipped = rec["correct"] & (rec["rewards"] <= 0.5)
    assert flipped.any(), "no right-but-overlong response: the check has no power"
    # dynamic sampling kept groups that mix right and wrong by the verifier
    G = cfg.num_generations
    by_group = rec["correct"].view(-1, G).float().mean(dim=1)
    assert ((by_group > 0) & (by_group < 1)).any()
    # KTAE's classes are the verifier's
    group = torch.arange(rec["rewards"].numel()) // G
    expected = ktae.compute_advantages("ktae", rewards=rec["rewards"], group=group,
                                       token_ids=rec["ids"], mask=rec["token_mask"].bool(),
                                       correct=accuracy > 0.5, ignore_token_ids=rec["ignore"])
    torch.testing.assert_close(rec["adv"], expected * rec["loss_mask"])


def test_taco_alpha_and_lambda_reach_the_calibration(tiny_model, tmp_path):
    """Non-default alpha and lambda recomputed from the recorded loss batch; the defaults
    would give other advantages (so the check would see either one dropped)."""
    log = {"old_entropies": [], "batches": [], "loss": []}
    cfg = tiny_config(tiny_model, tmp_path / "run", algo="grpo", credit="taco", max_steps=1,
                      taco_alpha=0.9, taco_lambda=0.5)
    train(cfg, trainer_cls=type("L", (LossRecorder,), {"rec": log}),
          reward_funcs=[contains_digit])
    assert log["loss"]
    def taco(rec, **options):
        return ktae.calibrate_advantages("taco", rec["advantages"], logprobs=rec["logps"],
                                         entropies=rec["entropies"], mask=rec["mask"].bool(),
                                         **options).advantages

    for rec in log["loss"]:
        got = rec["inputs"]["advantages"]
        torch.testing.assert_close(got, taco(rec, alpha=0.9, lam=0.5))
        assert not torch.allclose(got, taco(rec, alpha=0.9))  # lambda mattered
        assert not torch.allclose(got, taco(rec, lam=0.5))  # alpha mattered


class OffPolicy(KTAEGRPOTrainer):
    """Keeps each loss call's inputs, the policy's log-probs inside it, and its value."""

    rec: list
    _loss_inputs_now: dict | None = None

    def _compute_loss(self, model, inputs):
        self._loss_inputs_now = inputs
        loss = super()._compute_loss(model, inputs)
        self.rec[-1]["loss"] = loss.detach().clone()
        return loss

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, *args,
                                           **kwargs):
        out = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
                                                         *args, **kwargs)
        inputs, self._loss_inputs_now = self._loss_inputs_now, None
        if inputs is not None:
            self.rec.append({"logps": out[0].detach().clone(),
                             "old": inputs["old_per_token_logps"].detach().clone(),
                             "adv": inputs["advantages"].detach().clone(),
                             "mask": inputs["completion_mask"].clone(),
                             "num_items": inputs["num_items_in_batch"].clone(),
                             "clip": (self.epsilon_low, self.epsilon_high)})
        return out


def test_clip_high_bounds_an_off_policy_update(tiny_model, tmp_path):
    """Two updates per generation batch (``num_iterations=2``): the second one is off-policy,
    and its loss is DAPO's clipped token-mean with ``clip_high`` as the upper epsilon (and
    not what ``clip_low`` would give there)."""
    rec: list = []
    cfg = tiny_config(tiny_model, tmp_path / "run", algo="dapo", credit="none",
                      dynamic_sampling=False, max_steps=2, clip_high=0.31, learning_rate=0.05,
                      trl={"num_iterations": 2})
    train(cfg, trainer_cls=type("O", (OffPolicy,), {"rec": rec}),
          reward_funcs=[contains_digit])
    assert len(rec) == 2 and rec[1]["clip"] == (0.2, 0.31)
    first, second = rec
    torch.testing.assert_close(first["logps"], first["old"], rtol=1e-4, atol=1e-4)  # on-policy
    ratio = (second["logps"] - second["old"]).exp()[second["mask"].bool()]
    assert (ratio - 1).abs().max() > 0.2  # off-policy enough for the clip to matter

    def loss(clip_high):
        adv = second["adv"]
        adv = adv[:, None].expand_as(second["logps"]) if adv.dim() == 1 else adv
        value, _ = ktae.policy_loss(second["logps"], second["old"], adv,
                                    second["mask"].bool(), clip_low=0.2, clip_high=clip_high)
        return value * second["mask"].sum() / second["num_items"]

    torch.testing.assert_close(second["loss"], loss(0.31).float(), rtol=1e-4, atol=1e-6)
    assert not torch.allclose(second["loss"], loss(0.2).float(), rtol=1e-4, atol=1e-6)
