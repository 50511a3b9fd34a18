"""KTAE through verl's real advantage code: the legacy ``compute_advantage`` and the v1
trainer's ``PPOTrainer._compute_advantage`` with a real TransferQueue."""

from __future__ import annotations

import types
from dataclasses import dataclass

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install -e '.[verl,test]')")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from conftest import PAD_ID, VerlBatch  # noqa: E402
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
@pytest.mark.parametrize("options", [
    {"a2": 0.2},
    {"a1": 0.5, "a2": 0.3, "eps": 1e-6, "normalize": "batch"},
    {"correct_key": None, "reward_threshold": -0.1},  # row 2 (-0.25) counts as wrong
], ids=["a2", "a1-eps-batch", "by-reward"])
def test_v1_path_gtpo_reads_the_rollout_entropies(transfer_queue, verl_batch, options):
    """GTPO through the v1 trainer: the old policy's entropies stored in TransferQueue
    (verl's ``_compute_old_log_prob`` writes ``entropy``) and every option reach the
    estimator."""
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(3)
    entropies = torch.where(verl_batch.response_mask.bool(),
                            torch.rand(verl_batch.responses.shape, generator=g) + 0.1, 0.0)
    partition = "gtpo" + "".join(sorted(options))
    meta = put_v1_batch(transfer_queue, verl_batch, partition)
    lengths = verl_batch.response_mask.sum(-1).tolist()
    transfer_queue.kv_batch_put(keys=meta.keys, partition_id=partition,
                                fields=tu.get_tensordict({"entropy": _nested(
                                    [e[:n] for e, n in zip(entropies, lengths, strict=True)])}))
    algorithm = algorithm_config()
    algorithm.adv_estimator = "gtpo"
    algorithm.gtpo = options
    adv = v1_advantages(transfer_queue, meta, algorithm)
    core = {k: v for k, v in options.items() if k != "correct_key"}
    correct = None if "correct_key" in options else torch.tensor(verl_batch.acc)
    want = ktae.compute_advantages("gtpo", rewards=verl_batch.rewards, group=verl_batch.uids,
                                   token_ids=verl_batch.responses, mask=verl_batch.response_mask,
                                   entropies=entropies, correct=correct, **core)
    torch.testing.assert_close(adv, want, rtol=0, atol=0)
    default = ktae.compute_advantages("gtpo", rewards=verl_batch.rewards, group=verl_batch.uids,
                                      token_ids=verl_batch.responses,
                                      mask=verl_batch.response_mask, entropies=entropies,
                                      correct=torch.tensor(verl_batch.acc))
    assert not torch.allclose(adv, default)


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


# -- multi-turn (v1 agent loops returning one output per model call) --------------------

#: (uid, session, number of turns): uid "p" has 3 trajectories of 2, 1 and 3 turns.
SESSIONS = [("p", 0, 2), ("p", 1, 1), ("p", 2, 3), ("q", 0, 1), ("q", 1, 2), ("q", 2, 2)]
ACC = {("p", 0): True, ("p", 1): False, ("p", 2): False, ("q", 0): True, ("q", 1): True,
       ("q", 2): False}


@dataclass
class TurnRows:
    """Turn rows as verl's v1 agent loop stores them (``{uid}_{session}_{turn}`` keys,
    every row with the final reward on its last token), in a shuffled order as
    ``_balance_batch`` leaves them."""

    keys: list[str]
    uids: list[str]
    sessions: list[tuple[str, int]]
    turns: list[int]
    lengths: list[int]
    batch: VerlBatch
    entropies: torch.Tensor


def make_turn_rows(partition: str, seed: int = 5) -> TurnRows:
    g = torch.Generator().manual_seed(seed)
    rows = [(u, s, t) for u, s, n in SESSIONS for t in range(n)]
    rows = [rows[i] for i in torch.randperm(len(rows), generator=g).tolist()]
    B, T = len(rows), 6
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    responses = torch.randint(0, 6, (B, T), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    mask[torch.rand(B, T, generator=g) < 0.15] = 0  # tool tokens inside a turn
    mask[:, 0] = 1
    responses = torch.where(torch.arange(T)[None, :] < lengths[:, None], responses, PAD_ID)
    score = torch.tensor([1.0 if ACC[(u, s)] else -1.0 for u, s, _ in rows])
    score[[i for i, r in enumerate(rows) if r[:2] == ("q", 1)]] -= 1.25  # shaped: acc decides
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), lengths - 1] = score
    entropies = torch.where(mask.bool(), torch.rand(B, T, generator=g) + 0.1, 0.0)
    batch = VerlBatch([f"{u}{partition}" for u, _, _ in rows], responses, mask, rewards,
                      [ACC[(u, s)] for u, s, _ in rows])
    return TurnRows([f"{u}{partition}_{s}_{t}" for u, s, t in rows], batch.uids,
                    [(u, s) for u, s, _ in rows], [t for _, _, t in rows], lengths.tolist(),
                    batch, entropies)


def put_turn_rows(tq, rows: TurnRows, partition: str):
    from transfer_queue import KVBatchMeta
    from verl.utils import tensordict_utils as tu

    b, n = rows.batch, rows.lengths

    def nested(x):
        return _nested([r[:k] for r, k in zip(x, n, strict=True)])

    fields = {"uid": rows.uids, "responses": nested(b.responses),
              "response_mask": nested(b.response_mask), "rm_scores": nested(b.token_level_rewards),
              "entropy": nested(rows.entropies),
              "extra_fields": [{"reward_extra_info": {"acc": a}} for a in b.acc]}
    tq.kv_batch_put(keys=rows.keys, partition_id=partition, fields=tu.get_tensordict(fields))
    return KVBatchMeta(partition_id=partition, keys=rows.keys, tags=[{} for _ in rows.keys])


def per_trajectory_reference(name: str, rows: TurnRows, **options) -> torch.Tensor:
    """Plain loops: join each session's turns (a masked position between turns), run the
    estimator on the trajectories with the last turn's reward, split the result back."""
    b = rows.batch
    sessions = sorted(set(rows.sessions))
    ids, mask, ent, where, last = [], [], [], [], []
    for session in sessions:
        turns = sorted((t, i) for i, (s, t) in enumerate(zip(rows.sessions, rows.turns,
                                                             strict=True)) if s == session)
        cells = []  # (token id, mask, entropy, row position) of the trajectory, in order
        for _, i in turns:
            if cells:
                cells.append((0, 0, 0.0, None))
            cells += [(int(b.responses[i, j]), int(b.response_mask[i, j]),
                       float(rows.entropies[i, j]), (i, j)) for j in range(rows.lengths[i])]
        ids.append([c[0] for c in cells])
        mask.append([c[1] for c in cells])
        ent.append([c[2] for c in cells])
        where.append([c[3] for c in cells])
        last.append(turns[-1][1])
    width = max(len(x) for x in ids)

    def padded(lists):
        return torch.tensor([x + [0] * (width - len(x)) for x in lists])

    kwargs = dict(rewards=b.rewards[last], group=[b.uids[i] for i in last],
                  token_ids=padded(ids), mask=padded(mask),
                  correct=torch.tensor([b.acc[i] for i in last]), **options)
    if name == "gtpo":
        kwargs["entropies"] = padded(ent).float()
    adv = ktae.compute_advantages(name, **kwargs)
    out = torch.zeros(b.responses.shape)
    for k, positions in enumerate(where):
        for col, pos in enumerate(positions):
            if pos is not None:
                out[pos] = adv[k, col]
    return out


def test_v1_multi_turn_ktae_is_grpo_over_trajectories_as_verl_does(transfer_queue):
    """KTAE with zero key-token values (top=0) is its GRPO base: through the real v1
    trainer it equals verl's own GRPO on the same multi-turn batch
    (``compute_advantage_for_multi_trajectories``: final turn's reward, groups of
    trajectories, broadcast to every turn)."""
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    rows = make_turn_rows("mt")
    meta = put_turn_rows(transfer_queue, rows, "mt")
    adv = v1_advantages(transfer_queue, meta, algorithm_config(top=0.0))
    b = rows.batch
    data = DataProto.from_dict(
        tensors={"token_level_rewards": b.token_level_rewards, "response_mask": b.response_mask},
        non_tensors={"uid": np.array(b.uids, dtype=object)})
    grpo = compute_advantage_for_multi_trajectories(
        data, batch_keys=rows.keys, adv_estimator="grpo", num_repeat=3,
        config=OmegaConf.create({"adv_estimator": "grpo"})).batch["advantages"]
    # same formula, float32 on both sides; ktae's group statistics run in another order
    torch.testing.assert_close(adv, grpo, rtol=0, atol=1e-6)
    # a row-by-row GRPO (each turn its own response) differs on this batch
    by_rows = ktae.compute_advantages("ktae", rewards=b.rewards, group=b.uids,
                                      token_ids=b.responses, mask=b.response_mask, top=0.0,
                                      correct=torch.tensor(b.acc))
    assert not torch.allclose(adv, by_rows, atol=1e-3)


@pytest.mark.parametrize("options", [{"h2": 2.0}, {"ngram": 2}])
def test_v1_multi_turn_ktae_counts_tokens_per_trajectory(transfer_queue, options):
    rows = make_turn_rows("mtk")
    meta = put_turn_rows(transfer_queue, rows, f"mtk{len(options)}{sorted(options)[0]}")
    adv = v1_advantages(transfer_queue, meta, algorithm_config(**options))
    torch.testing.assert_close(adv, per_trajectory_reference("ktae", rows, **options),
                               rtol=0, atol=0)
    assert (adv[rows.batch.response_mask == 0] == 0).all()


@needs_gtpo
def test_v1_multi_turn_gtpo_runs_on_trajectories(transfer_queue):
    rows = make_turn_rows("mtg")
    meta = put_turn_rows(transfer_queue, rows, "mtg")
    algorithm = algorithm_config()
    algorithm.adv_estimator = "gtpo"
    adv = v1_advantages(transfer_queue, meta, algorithm)
    torch.testing.assert_close(adv, per_trajectory_reference("gtpo", rows), rtol=0, atol=0)


def test_turn_layout_round_trip_and_its_errors():
    from ktae.integrations.verl.trajectories import join_inputs, turn_layout

    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]])
    x = torch.arange(1, 13).view(3, 4) * mask
    # single-turn keys: row by row (no layout); no keys (legacy trainer): the same
    assert turn_layout(["a_0_0", "a_1_0", "b_0_0"], mask) is None
    assert turn_layout(None, mask) is None
    # without TransferQueue lengths a row ends at its last real token
    layout = turn_layout(["a_0_1", "b_0_0", "a_0_0"], mask)
    assert layout.final.tolist() == [0, 1] and layout.start.tolist() == [5, 0, 0]
    assert layout.join(x).tolist() == [[9, 10, 11, 12, 0, 1, 2], [5, 0, 7, 0, 0, 0, 0]]
    assert torch.equal(layout.split(layout.join(x), 4), x)
    with pytest.raises(ValueError, match=r"key 'a-0': expected verl's '\{uid\}_\{session_id\}_"):
        turn_layout(["a-0", "b_0_0", "a_0_0"], mask)
    with pytest.raises(ValueError, match=r"index: row 2 has uid 'q' but the last turn"):
        join_inputs(layout, {"rewards": torch.zeros(3), "group": ["p", "r", "q"]})
