"""Entropies stay finite when a model gives some vocabulary entries a logit of -inf (a
masked vocabulary): ``0 log 0 = 0`` in :func:`ktae.core.entropy.categorical_entropy`, the
trainer's full log-prob head, ``ktae explain``'s scoring, the input-gradient importance,
and every rule that reads the entropies."""

from __future__ import annotations

import math

import pytest
import torch

import ktae
from ktae.core.advantages import estimator_needs_entropies
from ktae.core.entropy import categorical_entropy
from ktae.core.methods import method_credit, parse_method

VOCAB = 41
BANNED = torch.tensor([0, 3, 7, 19, 40])  # the vocabulary entries whose logit is -inf


def subset_entropy(logits: torch.Tensor) -> torch.Tensor:
    """The entropy over the allowed entries only: no -inf anywhere."""
    allowed = torch.ones(logits.shape[-1], dtype=torch.bool)
    allowed[BANNED] = False
    logp = torch.log_softmax(logits[..., allowed], dim=-1)
    return -(logp.exp() * logp).sum(-1)


def banned_logits(shape, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, VOCAB, generator=g, dtype=torch.float64) * 2
    logits.requires_grad_(requires_grad)
    mask = torch.zeros(VOCAB, dtype=torch.bool)
    mask[BANNED] = True
    return logits, logits.masked_fill(mask, -math.inf)


def test_categorical_entropy_is_finite_and_right_with_neginf_logits():
    leaf, logits = banned_logits((3, 5), requires_grad=True)
    plain = torch.log_softmax(logits.detach(), -1)
    assert math.isnan(float(-(plain.exp() * plain).sum(-1)[0, 0]))  # 0 * -inf
    h = categorical_entropy(torch.log_softmax(logits, dim=-1))
    ref_leaf = leaf.detach().clone().requires_grad_()
    ref = subset_entropy(ref_leaf)
    torch.testing.assert_close(h, ref, rtol=1e-12, atol=1e-12)
    w = torch.randn(3, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (grad,) = torch.autograd.grad((h * w).sum(), leaf)
    (ref_grad,) = torch.autograd.grad((ref * w).sum(), ref_leaf)
    assert torch.isfinite(grad).all() and (grad[..., BANNED] == 0).all()
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # the in-place path gives the same values
        torch.testing.assert_close(categorical_entropy(torch.log_softmax(logits, -1)), ref,
                                   rtol=1e-12, atol=1e-12)
    # a certain next token: entropy exactly 0, not NaN
    sure = torch.full((VOCAB,), -math.inf, dtype=torch.float64)
    sure[5] = 0.0
    assert categorical_entropy(sure).item() == 0.0


def _masked_llama():
    """A tiny Llama whose LM head gives the banned entries a logit of -inf."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).float()
    banned = torch.zeros(VOCAB, dtype=torch.bool)
    banned[BANNED] = True
    model.lm_head.register_forward_hook(lambda _m, _i, out: out.masked_fill(banned, -math.inf))
    return model


def _ids(rows=3, length=11, seed=3):
    allowed = torch.tensor([v for v in range(1, VOCAB) if v not in BANNED.tolist()])
    g = torch.Generator().manual_seed(seed)
    ids = allowed[torch.randint(len(allowed), (rows, length), generator=g)]
    mask = torch.ones_like(ids)
    mask[0, 9:] = 0
    return ids, mask


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_the_full_head_gives_finite_entropies_and_gradients(entropy_grad):
    from ktae.train.logprob_head import full_logps

    model = _masked_llama()
    ids, mask = _ids()
    lp, ent = full_logps(model, ids, mask, 6, 0.7, compute_entropy=True,
                         entropy_grad=entropy_grad)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -7:-1].double() / 0.7
    want = subset_entropy(logits).float().masked_fill(mask[:, -6:] == 0, 0.0)
    assert torch.isfinite(ent).all() and torch.isfinite(lp).all()
    torch.testing.assert_close(ent, want, rtol=1e-5, atol=1e-5)
    (lp.sum() + ent.sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_explain_scoring_gives_finite_entropies():
    from ktae.groups.input import GroupInput
    from ktae.groups.scoring import score_groups

    class Tokenizer:
        pad_token_id = 1

        def __call__(self, text):
            return {"input_ids": [2, 4, 5, 6]}

    ids, _ = _ids(rows=2, length=5)
    group = GroupInput(prompt="p", responses=[ids[0].tolist(), ids[1, :3].tolist()],
                       rewards=[1.0, 0.0], correct=[True, False])
    score_groups(_masked_llama(), Tokenizer(), [group])
    flat = [h for row in group.entropies for h in row]
    assert len(flat) == 8 and all(math.isfinite(h) and h > 0 for h in flat)


@pytest.mark.parametrize("outcome", ["answer_mean", "last", "answer_joint"])
def test_input_grad_importance_is_finite_with_neginf_logits(outcome):
    from ktae.models.input_grad_importance import input_grad_importance

    ids, mask = _ids(rows=2, length=9)
    response = torch.zeros_like(ids, dtype=torch.bool)
    response[:, 2:6] = True
    answer = torch.zeros_like(ids, dtype=torch.bool)
    answer[:, 7:9] = True
    s = input_grad_importance(_masked_llama(), ids, torch.ones_like(ids), response, answer,
                              outcome=outcome, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(s).all() and (s[response] > 0).any()


def test_every_rule_reading_entropies_stays_finite():
    """The calibrations and the estimators that read entropies, on entropies and log-probs
    from a model with -inf logits."""
    from ktae.train.logprob_head import full_logps

    ids, mask = _ids(rows=4, length=11)
    with torch.no_grad():
        lp, ent = full_logps(_masked_llama(), ids, mask, 6, 1.0, compute_entropy=True,
                             entropy_grad=False)
    real = mask[:, -6:].bool()
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    group = torch.zeros(4, dtype=torch.long)
    names = [f"grpo+{c}" for c in ktae.CALIBRATIONS.names()]
    names += [e for e in ktae.ADVANTAGE_ESTIMATORS.names() if estimator_needs_entropies(e)]
    assert "gtpo" in names and "grpo+taco" in names
    for name in names:
        got = method_credit(parse_method(name), rewards=rewards, group=group,
                            token_ids=ids[:, -6:], mask=real, correct=rewards > 0,
                            logprobs=lp, entropies=ent)
        assert torch.isfinite(got.final).all(), name
