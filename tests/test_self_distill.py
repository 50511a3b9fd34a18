"""SDPO and SDPG (docs/method.md §17) against their authors' own functions
(``tests/self_distill_oracle.py``) on the same inputs, and hand-computed small cases."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import self_distill_oracle as authors
import torch
from oracle import single_thread  # noqa: F401  (one torch thread for this module)

import ktae
from ktae.core.methods import parse_method
from ktae.core.policy_loss import policy_loss
from ktae.core.self_distill import (
    full_vocab_kl,
    sdpg_beta,
    sdpg_distill_loss,
    sdpo_logit_loss,
    sdpo_token_loss,
)


def tokens(seed=0, B=4, T=5, V=11):
    g = torch.Generator().manual_seed(seed)
    student_logits = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    teacher_logits = student_logits + torch.randn(B, T, V, generator=g, dtype=torch.float64)
    ids = torch.randint(V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    mask[3, 1:] = False
    old = torch.log_softmax(student_logits + 0.4 * torch.randn(B, T, V, generator=g,
                                                               dtype=torch.float64), -1)
    old = old.gather(-1, ids[..., None]).squeeze(-1)
    return student_logits, teacher_logits, ids, mask, old


def sampled(logits, ids, temperature=1.0):
    return torch.log_softmax(logits / temperature, -1).gather(-1, ids[..., None]).squeeze(-1)


# ------------------------------------------------------------------ SDPO's advantage


def test_sdpo_advantage_by_hand():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]], dtype=torch.bool)
    student = torch.tensor([[-1.0, -2.0], [-0.5, 0.0], [-3.0, -1.0], [-1.0, -1.0]])
    teacher = torch.tensor([[-0.5, -2.5], [-1.5, 0.0], [-3.0, -1.0], [-1.0, -1.0]])
    adv = ktae.compute_advantages("sdpo", rewards=rewards, group=[0, 0, 1, 1], mask=mask,
                                  logprobs=student, teacher_logprobs=teacher)
    torch.testing.assert_close(adv, torch.tensor([[0.5, -0.5], [-1.0, 0.0], [0.0, 0.0],
                                                  [0.0, 0.0]], dtype=torch.float64))
    # lam mixes in GRPO's advantage: +-1/sqrt(2) (unbiased std of {1, 0}) in each group
    mixed = ktae.compute_advantages("sdpo", rewards=rewards, group=[0, 0, 1, 1], mask=mask,
                                    logprobs=student, teacher_logprobs=teacher, lam=0.25)
    a = 0.5 / (0.5 ** 0.5 + 1e-6)  # GRPO's eps
    expected = torch.tensor([[0.25 * a + 0.375, 0.25 * a - 0.375], [-0.25 * a - 0.75, 0.0],
                             [0.25 * a, 0.25 * a], [-0.25 * a, -0.25 * a]], dtype=torch.float64)
    torch.testing.assert_close(mixed, expected)
    drgrpo = ktae.compute_advantages("sdpo", rewards=rewards, group=[0, 0, 1, 1], mask=mask,
                                     logprobs=student, teacher_logprobs=teacher, lam=1.0,
                                     base="drgrpo")
    torch.testing.assert_close(drgrpo[:, 0], torch.tensor([0.5, -0.5, 0.5, -0.5],
                                                          dtype=torch.float64))


def test_sdpo_advantage_gradient_is_the_authors_token_loss():
    """On-policy (one update per batch, ratio 1), ktae's clipped loss of ``A = q - s`` has
    the gradient of the authors' token-level loss, every row having a teacher."""
    student_logits, teacher_logits, ids, mask, _ = tokens()
    teacher = sampled(teacher_logits, ids)
    z = student_logits.clone().requires_grad_(True)
    s = sampled(z, ids)
    adv = ktae.compute_advantages("sdpo", rewards=torch.zeros(4, dtype=torch.float64),
                                  group=[0, 0, 1, 1], mask=mask, logprobs=s.detach(),
                                  teacher_logprobs=teacher)
    ours, _ = policy_loss(s, s.detach(), adv, mask, aggregation="token-mean")
    (g_ours,) = torch.autograd.grad(ours, z)
    cfg = SimpleNamespace(full_logit_distillation=False, alpha=1.0, is_clip=2.0)
    z2 = student_logits.clone().requires_grad_(True)
    s2 = sampled(z2, ids)
    theirs = authors.compute_self_distillation_loss(s2, teacher, mask.double(), cfg,
                                                    old_log_probs=s2.detach(),
                                                    self_distillation_mask=torch.ones(4))
    (g_theirs,) = torch.autograd.grad(theirs, z2)
    torch.testing.assert_close(g_ours, g_theirs)


def test_sdpo_estimator_errors_are_one_line():
    mask = torch.ones(2, 2, dtype=torch.bool)
    lp = torch.full((2, 2), -1.0)
    for kw, match in [({"lam": 2}, "lam: expected a finite number >= 0 and <= 1"),
                      ({"base": "x"}, "base: expected one of"),
                      ({"teacher_choice": "x"}, "teacher_choice: expected one of"),
                      ({"teacher_logprobs": torch.zeros(2, 3)}, r"teacher_logprobs: expected shape"),
                      ({"logprobs": torch.tensor([[float("nan"), 0], [0, 0]])}, "logprobs: expected finite")]:
        args = {"logprobs": lp, "teacher_logprobs": lp, **kw}
        with pytest.raises(ValueError, match=match) as err:
            ktae.compute_advantages("sdpo", rewards=[1.0, 0.0], group=[0, 0], mask=mask, **args)
        assert "\n" not in str(err.value)


def test_method_strings_parse_the_teacher_options():
    m = parse_method("sdpo@lam=0.3@teacher_choice=shortest@teacher_seed=4")
    assert dict(m.estimator_options) == {"lam": 0.3, "teacher_choice": "shortest",
                                         "teacher_seed": 4}
    assert [n.name for n in m.model_needs] == ["teacher_logprobs", "logprobs"]


# ------------------------------------------------------------------ SDPO's losses


@pytest.mark.parametrize("is_clip", [2.0, 1.1, None])
def test_sdpo_token_loss_equals_the_authors(is_clip):
    student_logits, teacher_logits, ids, mask, old = tokens(1)
    teacher = sampled(teacher_logits, ids)
    has = torch.tensor([1.0, 0.0, 1.0, 1.0])  # row 1 has no teacher
    cfg = SimpleNamespace(full_logit_distillation=False, alpha=1.0, is_clip=is_clip)
    z1, z2 = (student_logits.clone().requires_grad_(True) for _ in range(2))
    ours = sdpo_token_loss(sampled(z1, ids), teacher, mask & has.bool()[:, None],
                           old_logprobs=old, is_clip=is_clip)
    theirs = authors.compute_self_distillation_loss(sampled(z2, ids), teacher, mask.double(), cfg,
                                                    old_log_probs=old, self_distillation_mask=has)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(torch.autograd.grad(ours, z1)[0], torch.autograd.grad(theirs, z2)[0])


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 0.2])
@pytest.mark.parametrize("topk,add_tail", [(None, True), (4, True), (4, False), (100, True)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sdpo_logit_loss_equals_the_authors(alpha, topk, add_tail, temperature):
    student_logits, teacher_logits, ids, mask, old = tokens(2)
    has = torch.tensor([1.0, 1.0, 0.0, 1.0])
    cfg = SimpleNamespace(full_logit_distillation=True, distillation_topk=topk,
                          distillation_add_tail=add_tail, alpha=alpha, is_clip=2.0)
    z1, z2 = (student_logits.clone().requires_grad_(True) for _ in range(2))
    ours = sdpo_logit_loss(z1, teacher_logits, sampled(z1, ids, temperature),
                           mask & has.bool()[:, None], old_logprobs=old, alpha=alpha,
                           topk=topk, add_tail=add_tail, temperature=temperature)
    # the authors' actor: log-softmax at the temperature, the student's top-k indices,
    # the teacher gathered at them
    s_all = torch.log_softmax(z2 / temperature, -1)
    t_all = torch.log_softmax(teacher_logits / temperature, -1)
    kw = {"student_all_log_probs": s_all, "teacher_all_log_probs": t_all}
    if topk is not None:
        idx = torch.topk(z2.detach() / temperature, min(topk, z2.shape[-1]), dim=-1).indices
        kw = {"student_topk_log_probs": s_all.gather(-1, idx),
              "teacher_topk_log_probs": t_all.gather(-1, idx)}
    theirs = authors.compute_self_distillation_loss(
        sampled(z2, ids, temperature), sampled(teacher_logits, ids, temperature),
        mask.double(), cfg, old_log_probs=old, self_distillation_mask=has, **kw)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(torch.autograd.grad(ours, z1)[0], torch.autograd.grad(theirs, z2)[0])


def test_sdpo_logit_divergence_by_hand():
    """Two-token distributions s = (0.5, 0.5), t = (0.9, 0.1): the forward and reverse KLs
    and the Jensen-Shannon divergence at alpha = 0.5."""
    import math

    from ktae.core.self_distill import sdpo_logit_divergence

    s = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    t = torch.tensor([0.9, 0.1], dtype=torch.float64).log()
    rev = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    fwd = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    m = (0.7, 0.3)
    js = 0.5 * (0.5 * math.log(0.5 / m[0]) + 0.5 * math.log(0.5 / m[1])) \
        + 0.5 * (0.9 * math.log(0.9 / m[0]) + 0.1 * math.log(0.1 / m[1]))
    assert sdpo_logit_divergence(s, t, alpha=1.0).item() == pytest.approx(rev, rel=1e-12)
    assert sdpo_logit_divergence(s, t, alpha=0.0).item() == pytest.approx(fwd, rel=1e-12)
    assert sdpo_logit_divergence(s, t, alpha=0.5).item() == pytest.approx(js, rel=1e-12)
    with pytest.raises(ValueError, match="alpha: expected a finite number >= 0 and <= 1"):
        sdpo_logit_divergence(s, t, alpha=1.5)


def test_sdpo_loss_errors():
    z = torch.zeros(1, 2, 3)
    lp, mask = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="old_logprobs: required by the importance ratio"):
        sdpo_token_loss(lp, lp, mask)
    with pytest.raises(ValueError, match="topk: expected a positive integer or None"):
        sdpo_logit_loss(z, z, lp, mask, old_logprobs=lp, topk=0)
    with pytest.raises(ValueError, match="is_clip: expected a finite number > 0"):
        sdpo_token_loss(lp, lp, mask, old_logprobs=lp, is_clip=0)


# ------------------------------------------------------------------ SDPG


@pytest.mark.parametrize("beta,total,warmup,decay", [(1e-3, 0, 0, 0), (0.1, 20, 5, 0),
                                                     (0.1, 20, 0, 6), (0.2, 20, 5, 6),
                                                     (0.2, 0, 5, 6), (0.3, 8, 6, 6)])
def test_sdpg_schedule_equals_the_authors(beta, total, warmup, decay):
    for step in range(0, 25):
        assert sdpg_beta(step, total, beta=beta, warmup_steps=warmup, decay_steps=decay) == \
            authors._compute_effective_beta(beta, step, total, warmup, decay)


def test_sdpg_schedule_by_hand_and_errors():
    assert sdpg_beta(2, 10, beta=1.0, warmup_steps=4) == 0.5
    assert sdpg_beta(8, 10, beta=1.0, decay_steps=4) == 0.5
    assert sdpg_beta(1, 4, beta=1.0, warmup_steps=2, decay_steps=4) == 0.5 * 0.75
    with pytest.raises(ValueError, match="warmup_steps: expected a non-negative integer"):
        sdpg_beta(0, 10, warmup_steps=-1)
    with pytest.raises(ValueError, match="beta: expected a finite number >= 0"):
        sdpg_beta(0, 10, beta=-1)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sdpg_kl_equals_the_authors(temperature):
    student_logits, teacher_logits, *_ = tokens(3)
    student_logits[0, 0, 0] = 60.0  # a KL above the clamp of 20
    teacher_logits[0, 0, 0] = -60.0
    z1, z2 = (student_logits.clone().requires_grad_(True) for _ in range(2))
    ours = full_vocab_kl(z1, teacher_logits, temperature=temperature)
    theirs = authors.sdpg_kl_per_token(z2, teacher_logits, temperature)
    assert theirs[0, 0] == 20.0
    torch.testing.assert_close(ours, theirs)
    w = torch.rand(ours.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad((ours * w).sum(), z1)[0],
                               torch.autograd.grad((theirs * w).sum(), z2)[0])


def test_full_vocab_kl_by_hand():
    import math

    s = torch.tensor([math.log(0.5), math.log(0.5)], dtype=torch.float64)
    t = torch.tensor([math.log(0.9), math.log(0.1)], dtype=torch.float64)
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert full_vocab_kl(s, t).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("positive_only", [False, True])
@pytest.mark.parametrize("step", [3, 12])
def test_sdpg_loss_equals_the_authors(positive_only, step):
    """ktae's clipped loss (dual clip 10, clip 0.2 / 0.28) plus the distillation term equals
    the authors' ``compute_sdpg_loss`` with its own reference term off (``alpha = 0``; ktae's
    reference KL is its own ``beta`` term)."""
    student_logits, teacher_logits, ids, mask, old = tokens(4)
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2], dtype=torch.float64)[:, None].expand(4, 5)
    cfg = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28,
                          clip_ratio_c=10.0, policy_loss=SimpleNamespace(
                              alpha=0.0, kl_mode="urkl", beta=0.05, beta_warmup_steps=5,
                              beta_decay_steps=4, beta_distill_positive_advantage_only=positive_only))
    z1, z2 = (student_logits.clone().requires_grad_(True) for _ in range(2))
    beta = sdpg_beta(step, 15, beta=0.05, warmup_steps=5, decay_steps=4)
    kl = full_vocab_kl(z1, teacher_logits)
    pg, _ = policy_loss(sampled(z1, ids), old, adv, mask, clip_low=0.2, clip_high=0.28,
                        dual_clip=10.0, aggregation="token-mean")
    ours = pg + sdpg_distill_loss(kl, adv, mask, beta=beta, positive_only=positive_only)
    theirs = authors.compute_sdpg_loss(old, sampled(z2, ids),
                                       authors.sdpg_kl_per_token(z2, teacher_logits, 1.0), adv,
                                       mask.double(), config=cfg, current_step=step,
                                       total_steps=15)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(torch.autograd.grad(ours, z1)[0], torch.autograd.grad(theirs, z2)[0])


def test_sdpg_gating_takes_effect():
    kl = torch.ones(2, 2, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    assert sdpg_distill_loss(kl, adv, mask, beta=0.5).item() == 0.5
    assert sdpg_distill_loss(kl, adv, mask, beta=0.5, positive_only=True).item() == 0.25
