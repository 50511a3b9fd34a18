"""Each need is one record (ktae.core.needs.Need) with its provider, and every consumer loops
over a method's needs: the trainer computes exactly those declared, ``ktae explain`` calls
exactly their group providers, and a need declared here flows through both without an
edit to either."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

import ktae
from ktae.core.methods import Method, estimator_credit
from ktae.core.needs import (
    NEEDS,
    ModelResponses,
    Need,
    group_calls,
    held,
    load,
    register_need,
)

TOY = "toy_weight"


@pytest.fixture
def restore():
    """Leaves the needs and both registries as they were."""
    saved = (dict(NEEDS), dict(ktae.ADVANTAGE_ESTIMATORS._items), dict(ktae.CALIBRATIONS._items))
    yield
    for target, items in zip((NEEDS, ktae.ADVANTAGE_ESTIMATORS._items, ktae.CALIBRATIONS._items),
                             saved, strict=True):
        target.clear()
        target.update(items)


def test_every_registered_method_declares_need_records():
    for registry in (ktae.ADVANTAGE_ESTIMATORS, ktae.CALIBRATIONS):
        for record in registry.records():
            for name, need in zip(record.needs, record.need_records, strict=True):
                assert isinstance(need, Need) and NEEDS[name] is need
                assert record.kind in need.readers, (record.name, name)
    assert [n.name for n in Method("oar-g").model_needs] == ["input_grad_importance"]
    assert [n.name for n in Method("gtpo").model_needs] == ["entropies"]
    assert Method("ktae").model_needs == ()


def test_an_undeclared_need_is_refused_at_registration(restore):
    with pytest.raises(ValueError, match="needs='nope' is not a declared need"):
        ktae.ADVANTAGE_ESTIMATORS.register("x", needs=("nope",))
    with pytest.raises(ValueError, match="needs='old_logprobs' is not read by a"):
        ktae.ADVANTAGE_ESTIMATORS.register("x", needs=("old_logprobs",))
    with pytest.raises(ValueError, match="needs='nope' is not an input"):
        ktae.register_estimator("x", needs=("nope",))


def _fake_trainer(method: Method, calls: list):
    """What ``KTAEGRPOTrainer._rollout_needs`` reads of its trainer."""
    def policy_pass(batch):
        calls.append("policy pass")
        T = batch["completion_ids"].shape[1]
        return torch.full((2, T), -0.5), torch.full((2, T), 0.25)

    clock = SimpleNamespace(part=lambda name: contextlib.nullcontext())
    return SimpleNamespace(
        _method=method, credit=SimpleNamespace(seed=0, estimator=method.estimator,
                                               correct_reward_index=0),
        state=SimpleNamespace(global_step=0),
        accelerator=SimpleNamespace(process_index=0, unwrap_model=lambda m: m),
        model=SimpleNamespace(training=True), _tokenizer=object(), step_clock=clock,
        _policy_pass=policy_pass, num_generations=2, temperature=1.0,
        _last_rewards_per_func=torch.tensor([[1.0], [0.0]]), _local_slice=lambda b: slice(0, b))


def _rollout_batch():
    return {"prompt_ids": torch.ones(2, 2, dtype=torch.long), "prompt_mask": torch.ones(2, 2),
            "completion_ids": torch.tensor([[3, 4, 5], [3, 6, 0]]),
            "completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}


def test_the_trainer_computes_exactly_the_declared_needs():
    pytest.importorskip("trl")
    from ktae.train.dynamic_sampling import need_key
    from ktae.train.trainer import KTAEGRPOTrainer

    calls: list = []
    out = KTAEGRPOTrainer._rollout_needs(_fake_trainer(Method("ktae"), calls),
                                         _rollout_batch(), [{}, {}])
    assert out == {} and calls == []  # no model pass for a method that declares none
    out = KTAEGRPOTrainer._rollout_needs(_fake_trainer(Method("gtpo"), calls),
                                         _rollout_batch(), [{}, {}])
    assert list(out) == [need_key("entropies")] and calls == ["policy pass"]
    assert (out[need_key("entropies")] == 0.25).all()


def test_explain_calls_exactly_the_group_providers_of_the_missing_needs():
    groups = [SimpleNamespace(old_entropies=None, entropies=[[0.1]], logprobs=None,
                              input_grad_importance=None)]
    assert group_calls(Method("ktae").model_needs) == {}
    assert held(groups, NEEDS["entropies"])  # the current policy's stand in
    assert group_calls(n for n in Method("gtpo").model_needs if not held(groups, n)) == {}
    # the importance's clean pass gives the log-probs and entropies: one call for all three
    assert group_calls([*Method("oar-g").model_needs, NEEDS["logprobs"], NEEDS["entropies"]]) \
        == {"ktae.groups.scoring:score_groups": {"importance": True}}


def toy_provider(responses: ModelResponses) -> torch.Tensor:
    """The toy need: each response token's position, from the batch alone."""
    T = responses.completion_ids.shape[1]
    return torch.arange(T, dtype=torch.float32).expand(responses.completion_ids.shape[0], T)


def toy_group_provider(model, tokenizer, groups, *, temperature: float, scale: float = 1.0):
    for g in groups:
        g.toy_weight = [[scale * t for t in range(len(r))] for r in g.responses]


def test_a_new_need_flows_through_the_consumers_unedited(restore):
    pytest.importorskip("trl")
    from ktae.train.dynamic_sampling import merge_rows, need_key
    from ktae.train.trainer import KTAEGRPOTrainer

    register_need(Need(TOY, "each token's position", provider=f"{__name__}:toy_provider",
                       group_provider=f"{__name__}:toy_group_provider",
                       group_options={"scale": 2.0}))

    @ktae.register_estimator("by-position", needs=("mask", TOY))
    def by_position(batch):
        return batch.scores[TOY] * batch.rewards[:, None] * batch.mask

    method = Method("by-position")
    assert [n.name for n in method.model_needs] == [TOY] and method.needs_scores
    # the trainer: the provider runs, its value merges across rounds and reaches the rule
    calls: list = []
    batch = _rollout_batch()
    batch.update(KTAEGRPOTrainer._rollout_needs(_fake_trainer(method, calls), batch, [{}, {}]))
    assert calls == [] and torch.equal(batch[need_key(TOY)][1], torch.tensor([0.0, 1.0, 2.0]))
    merged = merge_rows([batch, batch], [torch.tensor([0]), torch.tensor([1])], {})
    assert torch.equal(merged[need_key(TOY)], batch[need_key(TOY)])
    mask = batch["completion_mask"].bool()
    adv = estimator_credit(method, rewards=torch.tensor([1.0, 0.0]), group=torch.tensor([0, 0]),
                           token_ids=batch["completion_ids"], mask=mask,
                           correct=torch.tensor([True, False]), **{TOY: batch[need_key(TOY)]})
    assert adv[0].tolist() == pytest.approx([0.0, 1.0, 2.0]) and not adv[1].any()
    with pytest.raises(ValueError, match=rf"reads each token's position \(needs={TOY}\)"):
        estimator_credit(method, rewards=torch.tensor([1.0, 0.0]), group=torch.tensor([0, 0]),
                         token_ids=batch["completion_ids"], mask=mask,
                         correct=torch.tensor([True, False]))
    with pytest.raises(ValueError, match=f"^{TOY}: required by advantage estimator"):
        ktae.compute_advantages("by-position", rewards=torch.tensor([1.0, 0.0]), group=[0, 0],
                                mask=mask)
    # ktae explain: the group provider fills what no group holds
    groups = [SimpleNamespace(responses=[[1, 2], [3]])]
    assert not held(groups, NEEDS[TOY])
    for provider, options in group_calls(method.model_needs).items():
        load(provider)(None, None, groups, temperature=1.0, **options)
    assert held(groups, NEEDS[TOY]) and groups[0].toy_weight == [[0.0, 2.0], [0.0]]
