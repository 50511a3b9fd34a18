"""One batch of real SmolLM2-135M-Instruct rollouts (496 stored arithmetic responses, 62
groups of 8, right answers by the ``number`` reward) through the verl plugin gives the
token advantages ``ktae train`` computes: KTAE, KTAE over 3-grams, and KTAE calibrated by
TACO.

The plugin's side runs verl's own code: the legacy ``ray_trainer.compute_advantage`` with
the registered ``ktae`` estimator, and the actor loss of the engine workers
(``engine_workers.ppo_loss``) with the registered ``taco`` loss. The trainer's side is
what ``KTAEGRPOTrainer`` calls: ``estimator_credit`` with the method of
``credit_settings(TrainConfig(...).resolve())`` (as ``preflight``) and the tokenizer's
pad/EOS ids ignored (``_advantages``), then ``ktae.calibrate_advantages`` with the policy's log-probs and
entropies (``_calibrate``). Both sides must agree exactly (``rtol=atol=0``). The token ids
are SmolLM2's own (stored, no model loads); the log-probs and entropies TACO reads are
seeded numbers on either side of its threshold.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from functools import partial
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install -e '.[verl,test]')")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402

import ktae  # noqa: E402
from ktae.core.methods import estimator_credit  # noqa: E402
from ktae.rewards.answer_line import number_check  # noqa: E402
from ktae.runs.config import TrainConfig  # noqa: E402
from ktae.runs.credit import credit_settings  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "data" / "smollm2_arithmetic_samples.jsonl.gz"
IM_END = 2
"""SmolLM2-135M-Instruct's ``<|im_end|>``: its EOS and its pad token, which the trainer's
KTAE ignores (``KTAEGRPOTrainer.ignore_token_ids``)."""
BUDGET = 96
"""The stored responses' budget of new tokens: a shorter one stopped at ``<|im_end|>``."""
GROUP = 8
PROMPT_TOKENS = 5  # the actor's rows are [prompt | response]; only the response is read
ALPHA, LAM = 0.01, 0.9


@dataclasses.dataclass
class Rollouts:
    ids: torch.Tensor       # [B, T] right-padded with <|im_end|>
    mask: torch.Tensor      # [B, T] int64, 1 on the response (its <|im_end|> included)
    correct: torch.Tensor   # [B] bool, the number reward
    group: torch.Tensor     # [B] group ids, GROUP consecutive responses each

    @property
    def rewards(self) -> torch.Tensor:
        return self.correct.float()


@pytest.fixture(scope="module")
def rollouts() -> Rollouts:
    rows = [json.loads(line) for line in gzip.open(FIXTURE, "rt")]
    rows = rows[:len(rows) // GROUP * GROUP]
    responses = [r["response_ids"] + ([IM_END] if len(r["response_ids"]) < BUDGET else [])
                 for r in rows]
    B, T = len(rows), max(map(len, responses))
    ids = torch.full((B, T), IM_END, dtype=torch.int64)
    mask = torch.zeros(B, T, dtype=torch.int64)
    for i, r in enumerate(responses):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    correct = torch.tensor([number_check(r["response"], r["answer"])[0] for r in rows])
    group = torch.arange(B) // GROUP
    mixed = sum(0 < int(correct[group == g].sum()) < GROUP for g in range(B // GROUP))
    assert mixed >= 10, mixed  # groups with both right and wrong answers carry token credit
    return Rollouts(ids, mask, correct, group)


def trainer_advantages(b: Rollouts, cfg: TrainConfig) -> torch.Tensor:
    """``KTAEGRPOTrainer._advantages`` on one process: the global batch's token credit,
    float32, times the loss mask."""
    method = dataclasses.replace(credit_settings(cfg.resolve()).method,
                                 ignore_token_ids=(IM_END,))
    adv = estimator_credit(method, rewards=b.rewards, group=b.group, token_ids=b.ids,
                           mask=b.mask.bool(), correct=b.correct,
                           compute=ktae.compute_advantages)
    return adv.to(torch.float32) * b.mask.to(torch.float32)


def verl_advantages(b: Rollouts, ktae_options: dict, order: torch.Tensor) -> torch.Tensor:
    """verl 0.9.1's legacy ``compute_advantage`` with ``adv_estimator=ktae`` on the batch
    in ``order`` (verl's uid per group, the reward on the last response token, ``acc``
    from the reward function), returned in the original order."""
    from verl.trainer.ppo import ray_trainer

    lengths = b.mask.sum(-1)
    scores = torch.zeros(b.mask.shape)
    scores[torch.arange(len(lengths)), lengths - 1] = b.rewards
    data = DataProto.from_dict(
        tensors={"responses": b.ids[order], "response_mask": b.mask[order],
                 "token_level_rewards": scores[order]},
        non_tensors={"uid": np.array([f"prompt-{int(g)}" for g in b.group[order]],
                                     dtype=object),
                     "acc": b.correct[order].numpy()})
    algorithm = OmegaConf.create({"adv_estimator": "ktae", "gamma": 1.0, "lam": 1.0,
                                  "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False,
                                  "rollout_correction": None, "ktae": ktae_options})
    out = ray_trainer.compute_advantage(data, adv_estimator="ktae", gamma=1.0, lam=1.0,
                                        num_repeat=1, norm_adv_by_std_in_grpo=True,
                                        config=algorithm)
    adv = torch.empty_like(out.batch["advantages"])
    adv[order] = out.batch["advantages"]
    return adv


# verl's rows in their own order, and shuffled (uids, not positions, make the groups)
ORDERS = {"in order": None, "shuffled": 0}


def _order(b: Rollouts, seed: int | None) -> torch.Tensor:
    n = b.ids.shape[0]
    if seed is None:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("order", list(ORDERS), ids=list(ORDERS))
@pytest.mark.parametrize("train_options, ktae_options", [
    ({}, {}),
    ({"ktae_ngram": 3}, {"ngram": 3}),  # ktae train --credit ktae --ktae-ngram 3
], ids=["ktae", "ktae-ngram3"])
def test_verl_estimator_gives_the_trainers_token_advantages(rollouts, train_options,
                                                            ktae_options, order):
    want = trainer_advantages(rollouts, TrainConfig(credit="ktae", **train_options))
    got = verl_advantages(rollouts, {**ktae_options, "ignore_token_ids": [IM_END]},
                          _order(rollouts, ORDERS[order]))
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # real token credit: the tokens of one response differ; padding gets none
    real = rollouts.mask.bool()
    assert (got[~real] == 0).all()
    spread = [got[i][real[i]].unique().numel() for i in range(got.shape[0])]
    assert sum(s > 1 for s in spread) > got.shape[0] // 4


def test_ngram_option_changes_the_credit(rollouts):
    """The 3-gram comparison above is not the unigram one twice."""
    one = trainer_advantages(rollouts, TrainConfig(credit="ktae"))
    three = trainer_advantages(rollouts, TrainConfig(credit="ktae", ktae_ngram=3))
    assert not torch.equal(one, three)


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def policy_numbers(b: Rollouts, seed: int = 0):
    """Seeded ``(logprobs, old_logprobs, entropies)`` ``[B, T]``, zero off the response:
    log-probs on either side of TACO's threshold ``-H + log(alpha)`` by 0.7 nats."""
    g = torch.Generator().manual_seed(seed)
    real = b.mask.bool()
    entropy = torch.rand(b.mask.shape, generator=g) * 2 + 0.1
    side = torch.where(torch.rand(b.mask.shape, generator=g) < 0.35, -1.0, 1.0)
    logp = (-entropy + math.log(ALPHA) + side * 0.7).clamp(max=-1e-3)
    old = logp + 0.05 * torch.randn(b.mask.shape, generator=g)
    zero = torch.zeros(b.mask.shape)
    return tuple(torch.where(real, x, zero) for x in (logp, old, entropy))


def verl_taco_advantages(b: Rollouts, advantages: torch.Tensor, logp, old, entropy,
                         monkeypatch) -> torch.Tensor:
    """The advantages the plugin's ``taco`` loss calibrates inside verl's actor loss
    (``partial(engine_workers.ppo_loss, config=actor config)``, one micro-batch in verl's
    no-padding layout), padded ``[B, T]``."""
    from verl.utils import tensordict_utils as tu
    from verl.workers import engine_workers
    from verl.workers.config import FSDPActorConfig

    from ktae.integrations.verl.config import CalibratedPolicyLossConfig

    config = FSDPActorConfig(
        strategy="fsdp", rollout_n=GROUP, ppo_micro_batch_size_per_gpu=b.ids.shape[0],
        clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="token-mean",
        policy_loss=CalibratedPolicyLossConfig(loss_mode="taco",
                                               ktae={"alpha": ALPHA, "lam": LAM}),
        calculate_entropy=True)
    seen = []  # the calibrations the loss runs (the config above checked its options)
    real_calibrate = ktae.calibrate_advantages

    def keep_result(name, adv, **kwargs):
        result = real_calibrate(name, adv, **kwargs)
        seen.append(result)
        return result

    monkeypatch.setattr("ktae.core.calibration.calibrate_advantages", keep_result)
    lengths = b.mask.sum(-1).tolist()

    def rows(x):
        return [x[i, :n] for i, n in enumerate(lengths)]

    def full_sequence(x):  # response values at the positions that predict them
        parts = []
        for i, n in enumerate(lengths):
            parts += [x.new_zeros(PROMPT_TOKENS - 1), x[i, :n], x.new_zeros(1)]
        return torch.cat(parts)

    model_output = {"log_probs": full_sequence(logp), "entropy": full_sequence(entropy)}
    data = tu.get_tensordict({
        "prompts": _nested([torch.full((PROMPT_TOKENS,), 1) for _ in lengths]),
        "responses": _nested(rows(b.ids)),
        "response_mask": _nested(rows(b.mask)),
        "old_log_probs": _nested(rows(old)),
        "advantages": _nested(rows(advantages)),
    })
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    loss, _ = partial(engine_workers.ppo_loss, config=config)(model_output=model_output,
                                                               data=data)
    assert torch.isfinite(loss) and len(seen) == 1
    return seen[0].advantages


def test_verl_taco_loss_calibrates_as_the_trainer(rollouts, monkeypatch):
    cfg = TrainConfig(credit="ktae+taco", taco_alpha=ALPHA, taco_lambda=LAM)
    settings = credit_settings(cfg.resolve())
    adv = trainer_advantages(rollouts, cfg)
    # the plugin's estimator gives the advantages the loss then reads
    torch.testing.assert_close(
        verl_advantages(rollouts, {"ignore_token_ids": [IM_END]}, _order(rollouts, None)),
        adv, rtol=0, atol=0)
    logp, old, entropy = policy_numbers(rollouts)
    real = rollouts.mask.bool()
    # KTAEGRPOTrainer._calibrate: the policy pass's log-probs and entropies, the rollout's
    # log-probs as the old ones, the run's calibration options
    want = ktae.calibrate_advantages(
        settings.calibration, adv, logprobs=logp, entropies=entropy, mask=real,
        old_logprobs=old, generator=torch.Generator().manual_seed(0),
        **settings.calibration_options)
    got = verl_taco_advantages(rollouts, adv, logp, old, entropy, monkeypatch)
    assert got.shape == adv.shape
    torch.testing.assert_close(got, want.advantages, rtol=0, atol=0)
    changed = (got != adv) & real
    assert changed.any() and int(changed.sum()) == int((want.flagged & real).sum())
