"""KTAE through verl's real advantage code: the legacy ``compute_advantage`` and the v1
trainer's ``PPOTrainer._compute_advantage`` with a real TransferQueue."""

from __future__ import annotations

import types

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install -e '.[verl,test]')")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from conftest import VerlBatch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402

import ktae  # noqa: E402


def algorithm_config(**ktae_options):
    cfg = {"adv_estimator": "ktae", "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True,
           "use_kl_in_reward": False, "rollout_correction": None}
    if ktae_options:
        cfg["ktae"] = ktae_options
    return OmegaConf.create(cfg)


def expected(batch: VerlBatch, *, correct=None, **options) -> torch.Tensor:
    if correct is None:
        correct = torch.tensor(batch.acc)
    return ktae.compute_advantages("ktae", rewards=batch.rewards, group=batch.uids,
                                   token_ids=batch.responses, mask=batch.response_mask,
                                   correct=correct, **options)


def legacy_data(b: VerlBatch, with_acc: bool = True) -> DataProto:
    non_tensors = {"uid": np.array(b.uids, dtype=object)}
    if with_acc:
        non_tensors["acc"] = np.array(b.acc)
    return DataProto.from_dict(
        tensors={"responses": b.responses, "response_mask": b.response_mask,
                 "token_level_rewards": b.token_level_rewards},
        non_tensors=non_tensors)


def legacy_advantages(data: DataProto, algorithm) -> torch.Tensor:
    from verl.trainer.ppo import ray_trainer

    out = ray_trainer.compute_advantage(
        data, adv_estimator=algorithm.adv_estimator, gamma=1.0, lam=1.0, num_repeat=1,
        norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo, config=algorithm)
    assert torch.equal(out.batch["advantages"], out.batch["returns"])
    return out.batch["advantages"]


def test_legacy_path_equals_ktae_with_verl_accuracy(verl_batch):
    adv = legacy_advantages(legacy_data(verl_batch), algorithm_config())
    want = expected(verl_batch)
    torch.testing.assert_close(adv, want, rtol=0, atol=0)
    assert adv.shape == verl_batch.responses.shape
    assert (adv[verl_batch.response_mask == 0] == 0).all()
    # acc, not the shaped reward, decides: by reward row 2 would count as wrong.
    by_reward = expected(verl_batch, correct=verl_batch.rewards > 0)
    assert not torch.allclose(adv, by_reward)


def test_legacy_path_options_reach_ktae(verl_batch):
    options = dict(h1=0.5, h2=2.0, h3=0.0, k1=1.5, b=0.25, top=2.0, variant="paper",
                   ignore_token_ids=[3, 4], chunk_tokens=4)
    adv = legacy_advantages(legacy_data(verl_batch), algorithm_config(**options))
    torch.testing.assert_close(adv, expected(verl_batch, **options), rtol=0, atol=0)
    assert not torch.allclose(adv, expected(verl_batch))


def test_legacy_path_without_accuracy_uses_the_reward_threshold(verl_batch, caplog):
    data = legacy_data(verl_batch, with_acc=False)
    adv = legacy_advantages(data, algorithm_config(reward_threshold=-0.5))
    want = expected(verl_batch, correct=verl_batch.rewards > -0.5)
    torch.testing.assert_close(adv, want, rtol=0, atol=0)


def test_legacy_path_drgrpo_base_follows_verl_switch(verl_batch):
    algorithm = algorithm_config()
    algorithm.norm_adv_by_std_in_grpo = False
    adv = legacy_advantages(legacy_data(verl_batch), algorithm)
    torch.testing.assert_close(adv, expected(verl_batch, base="drgrpo"), rtol=0, atol=0)


def test_legacy_path_reference_mode_uses_the_runtime_rule(verl_batch):
    adv = legacy_advantages(legacy_data(verl_batch), algorithm_config(mode="reference"))
    want = ktae.compute_advantages("ktae", rewards=verl_batch.rewards, group=verl_batch.uids,
                                   token_ids=verl_batch.responses,
                                   mask=verl_batch.response_mask, mode="reference")
    torch.testing.assert_close(adv, want, rtol=0, atol=0)


def graded(batch: VerlBatch, **options) -> torch.Tensor:
    """Graded KTAE on verl's summed token-level rewards (no correctness)."""
    return ktae.compute_advantages("ktae", rewards=batch.rewards, group=batch.uids,
                                   token_ids=batch.responses, mask=batch.response_mask,
                                   split="graded", **options)


@pytest.mark.parametrize("options", [{}, {"ngram": 2, "h3": 0.0}])
def test_legacy_path_graded_split_uses_the_reward_values(verl_batch, options):
    """``+algorithm.ktae.split=graded``: the shaped rewards themselves, not ``acc``."""
    adv = legacy_advantages(legacy_data(verl_batch), algorithm_config(split="graded", **options))
    torch.testing.assert_close(adv, graded(verl_batch, **options), rtol=0, atol=0)
    assert not torch.allclose(adv, expected(verl_batch, **options))


@pytest.mark.parametrize("options, message", [
    ({"h4": 1.0}, r"algorithm\.ktae\.h4: unknown option; expected one of base, h1"),
    ({"base": "gae"}, "base"),
    ({"mode": "fast"}, "mode"),
    ({"correct_key": 3}, "correct_key"),
    ({"split": "soft"}, "split"),
    ({"split": "graded", "correct_key": "acc"}, r"algorithm\.ktae\.correct_key: split=graded"),
    ({"split": "graded", "reward_threshold": 0.5}, "reward_threshold: split=graded"),
    ({"ignore_token_ids": 151643}, "ignore_token_ids"),
])
def test_unknown_or_bad_options_give_a_clear_error(verl_batch, options, message):
    with pytest.raises(ValueError, match=message):
        legacy_advantages(legacy_data(verl_batch), algorithm_config(**options))


def test_estimator_refuses_to_run_without_response_ids(verl_batch):
    from verl.trainer.ppo import core_algos

    fn = core_algos.get_adv_estimator_fn("ktae")
    with pytest.raises(RuntimeError, match="needs the response token ids"):
        fn(token_level_rewards=verl_batch.token_level_rewards,
           response_mask=verl_batch.response_mask, index=np.array(verl_batch.uids),
           config=algorithm_config())


def test_other_estimators_pass_through_the_wrapper_unchanged(verl_batch):
    from verl.trainer.ppo import core_algos

    algorithm = algorithm_config()
    algorithm.adv_estimator = "grpo"
    adv = legacy_advantages(legacy_data(verl_batch), algorithm)
    want, _ = core_algos.compute_grpo_outcome_advantage(
        verl_batch.token_level_rewards, verl_batch.response_mask,
        np.array(verl_batch.uids, dtype=object))
    torch.testing.assert_close(adv, want, rtol=0, atol=0)


# -- v1 trainer (TransferQueue) -------------------------------------------------------

def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


@pytest.fixture(scope="module")
def transfer_queue(ray_session):
    tq = pytest.importorskip("transfer_queue")
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1,
                                                            "total_storage_size": 1000}}}))
    try:
        yield tq
    finally:
        tq.close()


def put_v1_batch(tq, b: VerlBatch, partition: str, with_acc: bool = True):
    """Store ``b`` as verl's v1 agent loop does: nested per-response fields by key."""
    from transfer_queue import KVBatchMeta
    from verl.utils import tensordict_utils as tu

    lengths = b.response_mask.sum(-1).tolist()
    keys = [f"{uid}x{partition}_{i}_0" for i, uid in enumerate(b.uids)]
    extra = [{"reward_extra_info": {"acc": a, "score": 1.0}} if with_acc
             else {"reward_extra_info": {}} for a in b.acc]
    fields = {
        "uid": [f"{uid}x{partition}" for uid in b.uids],
        "responses": _nested([r[:n] for r, n in zip(b.responses, lengths, strict=True)]),
        "response_mask": _nested([m[:n] for m, n in zip(b.response_mask, lengths, strict=True)]),
        "rm_scores": _nested([s[:n] for s, n in zip(b.token_level_rewards, lengths,
                                                    strict=True)]),
        "extra_fields": extra,
    }
    tq.kv_batch_put(keys=keys, partition_id=partition, fields=tu.get_tensordict(fields))
    return KVBatchMeta(partition_id=partition, keys=keys, tags=[{} for _ in keys])


def v1_advantages(tq, meta, algorithm) -> torch.Tensor:
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    trainer = types.SimpleNamespace(config=OmegaConf.create(
        {"algorithm": algorithm, "actor_rollout_ref": {"rollout": {"n": 4}}}))
    PPOTrainer._compute_advantage(trainer, meta, metrics={})
    out = tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id,
                          select_fields=["advantages", "returns"])
    adv = out["advantages"].to_padded_tensor(0.0)
    assert torch.equal(adv, out["returns"].to_padded_tensor(0.0))
    return adv


def test_v1_path_equals_ktae_with_verl_accuracy(transfer_queue, verl_batch):
    meta = put_v1_batch(transfer_queue, verl_batch, "train")
    adv = v1_advantages(transfer_queue, meta, algorithm_config(h2=2.0))
    want = expected(verl_batch, h2=2.0)
    torch.testing.assert_close(adv, want, rtol=0, atol=0)
    assert not torch.allclose(adv, expected(verl_batch, correct=verl_batch.rewards > 0, h2=2.0))


def test_v1_path_graded_split_uses_the_reward_values(transfer_queue, verl_batch):
    meta = put_v1_batch(transfer_queue, verl_batch, "graded")
    adv = v1_advantages(transfer_queue, meta, algorithm_config(split="graded", ngram=2))
    torch.testing.assert_close(adv, graded(verl_batch, ngram=2), rtol=0, atol=0)


def test_v1_path_without_accuracy_uses_the_reward(transfer_queue, verl_batch):
    meta = put_v1_batch(transfer_queue, verl_batch, "noacc", with_acc=False)
    adv = v1_advantages(transfer_queue, meta, algorithm_config())
    torch.testing.assert_close(adv, expected(verl_batch, correct=verl_batch.rewards > 0),
                               rtol=0, atol=0)


# -- GTPO (an entropy-based estimator: v1 trainer only) ---------------------------------

needs_gtpo = pytest.mark.skipif("gtpo" not in ktae.ADVANTAGE_ESTIMATORS,
                                reason="the installed ktae has no gtpo estimator")


@needs_gtpo
def test_v1_path_gtpo_reads_the_rollout_entropies(transfer_queue, verl_batch):
    """GTPO through the v1 trainer: the old policy's entropies stored in TransferQueue
    (verl's ``_compute_old_log_prob`` writes ``entropy``) reach the estimator."""
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(3)
    entropies = torch.where(verl_batch.response_mask.bool(),
                            torch.rand(verl_batch.responses.shape, generator=g) + 0.1, 0.0)
    meta = put_v1_batch(transfer_queue, verl_batch, "gtpo")
    lengths = verl_batch.response_mask.sum(-1).tolist()
    transfer_queue.kv_batch_put(keys=meta.keys, partition_id="gtpo", fields=tu.get_tensordict(
        {"entropy": _nested([e[:n] for e, n in zip(entropies, lengths, strict=True)])}))
    algorithm = algorithm_config()
    algorithm.adv_estimator = "gtpo"
    algorithm.gtpo = {"a2": 0.2}
    adv = v1_advantages(transfer_queue, meta, algorithm)
    want = ktae.compute_advantages("gtpo", rewards=verl_batch.rewards, group=verl_batch.uids,
                                   token_ids=verl_batch.responses, mask=verl_batch.response_mask,
                                   entropies=entropies, correct=torch.tensor(verl_batch.acc),
                                   a2=0.2)
    torch.testing.assert_close(adv, want, rtol=0, atol=0)


@needs_gtpo
def test_legacy_path_gtpo_is_refused_with_the_setting_to_change(verl_batch):
    algorithm = algorithm_config()
    algorithm.adv_estimator = "gtpo"
    with pytest.raises(ValueError, match=r"trainer\.use_v1=true"):
        legacy_advantages(legacy_data(verl_batch), algorithm)


@needs_gtpo
def test_v1_path_gtpo_without_stored_entropies_names_the_real_cause(transfer_queue, verl_batch):
    """No ``entropy`` in TransferQueue (verl skipped the old-policy pass): the error says
    why, on the v1 trainer that is already in use."""
    meta = put_v1_batch(transfer_queue, verl_batch, "noentropy")
    algorithm = algorithm_config()
    algorithm.adv_estimator = "gtpo"
    algorithm.rollout_correction = {"bypass_mode": True}
    with pytest.raises(ValueError, match=r"but algorithm\.rollout_correction\.bypass_mode=true "
                       r"skips the old-policy forward pass.*bypass_mode=false"):
        v1_advantages(transfer_queue, meta, algorithm)
    algorithm.rollout_correction = {"bypass_mode": False}
    with pytest.raises(ValueError, match=r"the batch has none \(verl\.trainer\.ppo\.v1\..*"
                       r"PPOTrainer\._compute_old_log_prob, which the legacy trainer.*"
                       r"bypass mode") as error:
        v1_advantages(transfer_queue, meta, algorithm)
    assert "use the v1 trainer" not in str(error.value)
