"""Policy loss (docs/method.md §10): hand-computed cases, autograd vs analytic gradient."""

from __future__ import annotations

import math

import pytest
import torch

import ktae
from ktae.core.policy_loss import aggregate_loss, kl_penalty, policy_loss

ONE = torch.ones(1, 1)


def one_token(ratio: float, adv: float, **kw):
    """Loss, metrics and d loss / d logp for a single token with the given ratio."""
    old = torch.tensor([[math.log(0.4)]], dtype=torch.float64)
    lp = (old + math.log(ratio)).requires_grad_()
    loss, m = policy_loss(lp, old, torch.tensor([adv], dtype=torch.float64), ONE, **kw)
    loss.backward()
    return loss.item(), m, lp.grad.item()


def test_exports():
    assert ktae.policy_loss is policy_loss and ktae.kl_penalty is kl_penalty


def test_positive_advantage_clip_high():
    # ratio 0.5 / 0.4 = 1.25: inside 1 + 0.28, outside 1 + 0.2.
    loss, m, g = one_token(1.25, 1.0, clip_high=0.28)
    assert loss == pytest.approx(-1.25) and m["clip_frac_high"] == 0.0
    assert g == pytest.approx(-1.25)  # d(-r A)/d logp = -r A
    loss, m, g = one_token(1.25, 1.0, clip_high=0.2)
    assert loss == pytest.approx(-1.2) and m["clip_frac_high"] == 1.0 and g == 0.0
    assert m["clip_frac_low"] == 0.0 and m["ratio_mean"] == pytest.approx(1.25)


def test_negative_advantage_clip_low():
    # A < 0, ratio 0.7: -min(-0.7, -0.8) = 0.8, clipped at eps_low = 0.2.
    loss, m, g = one_token(0.7, -1.0, clip_low=0.2)
    assert loss == pytest.approx(0.8) and m["clip_frac_low"] == 1.0 and g == 0.0
    loss, m, g = one_token(0.7, -1.0, clip_low=0.35)
    assert loss == pytest.approx(0.7) and m["clip_frac_low"] == 0.0
    assert g == pytest.approx(0.7)


def test_unclipped_sides():
    # A > 0 with a small ratio and A < 0 with a large ratio are never clipped.
    loss, m, g = one_token(0.5, 2.0)
    assert loss == pytest.approx(-1.0) and g == pytest.approx(-1.0)
    assert m["clip_frac_low"] == m["clip_frac_high"] == 0.0
    loss, m, g = one_token(1.5, -1.0)
    assert loss == pytest.approx(1.5) and g == pytest.approx(1.5)


def test_dual_clip_bounds_negative_advantages():
    loss, m, g = one_token(5.0, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(3.0) and m["dual_clip_frac"] == 1.0 and g == 0.0
    loss, m, _ = one_token(5.0, -1.0)
    assert loss == pytest.approx(5.0) and m["dual_clip_frac"] == 0.0
    loss, m, g = one_token(2.0, -1.0, dual_clip=3.0)  # below the bound: unchanged
    assert loss == pytest.approx(2.0) and m["dual_clip_frac"] == 0.0 and g == pytest.approx(2)
    loss, m, _ = one_token(5.0, 1.0, dual_clip=3.0)  # positive advantages: plain clip
    assert loss == pytest.approx(-1.2) and m["dual_clip_frac"] == 0.0


# Ratio 1 everywhere, so the per-token loss is -A: rows of 1, 3 and 0 real tokens.
AGG_ADV = torch.tensor([[1.0, 9.0, 9.0], [2.0, 3.0, 4.0], [7.0, 7.0, 7.0]])
AGG_MASK = torch.tensor([[1, 0, 0], [1, 1, 1], [0, 0, 0]])


@pytest.mark.parametrize("aggregation, kw, expected", [
    ("token-mean", {}, -(1 + 2 + 3 + 4) / 4),
    ("seq-mean-token-mean", {}, -(1 + 3) / 2),  # the empty row has no token mean
    ("seq-mean-token-sum-norm", {"max_response_length": 4}, -(1 / 4 + 9 / 4 + 0) / 3),
])
def test_aggregations_by_hand(aggregation, kw, expected):
    lp = torch.zeros(3, 3)
    loss, _ = policy_loss(lp, lp, AGG_ADV, AGG_MASK, aggregation=aggregation, **kw)
    assert loss.item() == pytest.approx(expected)
    assert aggregate_loss(-AGG_ADV, AGG_MASK, aggregation, **kw).item() == pytest.approx(
        expected)


def test_aggregate_ignores_nan_padding_and_needs_length():
    x = torch.where(AGG_MASK.bool(), -AGG_ADV, float("nan"))
    assert aggregate_loss(x, AGG_MASK, "token-mean").item() == pytest.approx(-2.5)
    with pytest.raises(ValueError, match="max_response_length"):
        aggregate_loss(x, AGG_MASK, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="max_response_length"):
        aggregate_loss(x, AGG_MASK, "seq-mean-token-sum-norm", max_response_length=0)
    with pytest.raises(ValueError, match="aggregation"):
        aggregate_loss(x, AGG_MASK, "sum")
    with pytest.raises(ValueError, match="mask"):
        aggregate_loss(x, AGG_MASK[:2], "token-mean")


def test_sequence_advantages_broadcast():
    g = torch.Generator().manual_seed(0)
    lp, old = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    adv = torch.tensor([1.0, -0.5, 2.0])
    mask = torch.rand(3, 5, generator=g) > 0.3
    a, ma = policy_loss(lp, old, adv, mask, clip_high=0.28)
    b, mb = policy_loss(lp, old, adv[:, None].expand(3, 5), mask, clip_high=0.28)
    assert torch.equal(a, b) and ma == mb


def analytic_grad(theta, theta_old, tokens, adv, mask, eps_low, eps_high, c, weight):
    """d loss / d theta of the clipped surrogate for a per-position softmax policy."""
    p = torch.softmax(theta, -1)
    lp = p.gather(-1, tokens[..., None]).squeeze(-1).log()
    old = torch.log_softmax(theta_old, -1).gather(-1, tokens[..., None]).squeeze(-1)
    r = (lp - old).exp()
    active = ~(((adv > 0) & (r > 1 + eps_high)) | ((adv < 0) & (r < 1 - eps_low)))
    if c is not None:
        clipped_loss = torch.maximum(-adv * r, -adv * r.clamp(1 - eps_low, 1 + eps_high))
        active &= ~((adv < 0) & (-c * adv < clipped_loss))
    coef = torch.where(active & mask, -adv * r * weight, 0)  # d loss / d logp
    onehot = torch.nn.functional.one_hot(tokens, theta.shape[-1]).to(theta.dtype)
    return coef[..., None] * (onehot - p)  # d logp / d theta = onehot - softmax


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean",
                                         "seq-mean-token-sum-norm"])
def test_gradient_matches_analytic_clipped_policy_gradient(aggregation):
    g = torch.Generator().manual_seed(3)
    B, T, V, L = 4, 6, 5, 8
    theta = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    theta_old = theta + 0.6 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    tokens = torch.randint(V, (B, T), generator=g)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 4:] = False
    mask[3, 1:] = False
    lengths = mask.sum(-1, keepdim=True).to(theta.dtype)
    weight = {"token-mean": 1 / mask.sum().double(),
              "seq-mean-token-mean": 1 / (lengths * B),
              "seq-mean-token-sum-norm": torch.tensor(1 / (L * B))}[aggregation]
    theta_var = theta.clone().requires_grad_()
    lp = torch.log_softmax(theta_var, -1).gather(-1, tokens[..., None]).squeeze(-1)
    old = torch.log_softmax(theta_old, -1).gather(-1, tokens[..., None]).squeeze(-1)
    loss, m = policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=2.0,
                          aggregation=aggregation, max_response_length=L)
    loss.backward()
    # the case must exercise both clip sides and the dual clip
    assert m["clip_frac_low"] > 0 and m["clip_frac_high"] > 0 and m["dual_clip_frac"] > 0
    expected = analytic_grad(theta, theta_old, tokens, adv, mask, 0.2, 0.28, 2.0, weight)
    torch.testing.assert_close(theta_var.grad, expected, rtol=1e-10, atol=1e-12)


def test_kl_estimators_by_hand():
    lp = torch.log(torch.tensor([[0.5, 0.1]], dtype=torch.float64))
    ref = torch.log(torch.tensor([[0.25, 0.2]], dtype=torch.float64))
    d = (lp - ref)[0].tolist()
    expect = {"k1": d, "k2": [x * x / 2 for x in d],
              "k3": [math.exp(-x) - 1 + x for x in d]}
    for name, values in expect.items():
        assert kl_penalty(lp, ref, name)[0].tolist() == pytest.approx(values)
    assert torch.equal(kl_penalty(lp, ref, "low_var_kl"), kl_penalty(lp, ref, "k3"))
    assert kl_penalty(lp, ref, "k3")[0, 0].item() == pytest.approx(0.5 - 1 + math.log(2))
    # verl's clamps: the log-ratio to [-20, 20], then k3 to [-10, 10]
    far = kl_penalty(torch.tensor([[-30.0]]), torch.tensor([[0.0]]), "k3")
    assert far.item() == 10.0
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_penalty(lp, ref, "k4")
    with pytest.raises(ValueError, match="ref_logprobs"):
        kl_penalty(lp, ref[:, :1], "k1")


def test_k3_gradient_and_kl_term_in_loss():
    g = torch.Generator().manual_seed(1)
    lp = torch.randn(2, 4, generator=g, dtype=torch.float64).requires_grad_()
    ref = torch.randn(2, 4, generator=g, dtype=torch.float64)
    kl_penalty(lp, ref, "k3").sum().backward()
    torch.testing.assert_close(lp.grad, 1 - (ref - lp.detach()).exp())

    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    base, _ = policy_loss(lp, lp.detach(), adv, mask)
    for est in ("k1", "k2", "k3"):
        loss, m = policy_loss(lp, lp.detach(), adv, mask, ref_logprobs=ref, kl_coef=0.05,
                              kl_estimator=est)
        kl = kl_penalty(lp, ref, est)
        assert loss.item() == pytest.approx(base.item() + 0.05 * kl[mask.bool()].mean().item())
        assert m["ref_kl"] == pytest.approx(kl[mask.bool()].mean().item())
    # ref given with kl_coef 0: metric only
    loss, m = policy_loss(lp, lp.detach(), adv, mask, ref_logprobs=ref)
    assert loss.item() == pytest.approx(base.item()) and "ref_kl" in m


def test_entropy_bonus_and_metrics():
    lp = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    ent = torch.tensor([[1.0, 2.0, 9.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    loss, m = policy_loss(lp, lp.detach(), torch.tensor([1.0]), mask, entropies=ent,
                          entropy_coef=0.1)
    assert loss.item() == pytest.approx(-1.0 - 0.1 * 1.5)
    assert m["entropy_mean"] == pytest.approx(1.5)
    loss.backward()
    assert ent.grad[0].tolist() == pytest.approx([-0.05, -0.05, 0.0])
    assert m["approx_kl"] == 0.0 and m["pg_loss"] == pytest.approx(-1.0)


def test_approx_kl_is_k3_to_old_policy():
    lp, old = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.4)]])
    _, m = policy_loss(lp, old, torch.tensor([1.0]), ONE)
    assert m["approx_kl"] == pytest.approx(1.25 - 1 - math.log(1.25), rel=1e-5)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean",
                                         "seq-mean-token-sum-norm"])
def test_all_zero_mask_gives_zero_loss_finite_gradient(aggregation):
    lp = torch.randn(2, 3, requires_grad=True)
    ent = torch.rand(2, 3, requires_grad=True)
    loss, m = policy_loss(lp, lp.detach() + 1, torch.tensor([1.0, -1.0]), torch.zeros(2, 3),
                          aggregation=aggregation, max_response_length=3, dual_clip=3,
                          ref_logprobs=torch.zeros(2, 3), kl_coef=0.1, entropies=ent,
                          entropy_coef=0.01)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros(2, 3))
    assert torch.isfinite(ent.grad).all() and all(v == 0.0 for v in m.values())


def test_empty_batch():
    lp = torch.zeros(0, 4, requires_grad=True)
    loss, m = policy_loss(lp, lp.detach(), torch.zeros(0), torch.zeros(0, 4),
                          aggregation="seq-mean-token-sum-norm", max_response_length=4)
    loss.backward()
    assert loss.item() == 0.0 and m["ratio_mean"] == 0.0


def test_padding_values_do_not_leak():
    lp = torch.tensor([[-1.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -1e4]])  # a huge log-ratio at the padded position
    mask = torch.tensor([[1, 0]])
    loss, m = policy_loss(lp, old, torch.tensor([[1.0, 1.0]]), mask, clip_high=0.28,
                          ref_logprobs=torch.tensor([[-1.0, 5e3]]), kl_coef=1.0)
    loss.backward()
    clean, _ = policy_loss(lp.detach()[:, :1], old[:, :1], torch.tensor([1.0]), ONE,
                           clip_high=0.28)
    assert loss.item() == pytest.approx(clean.item())
    assert torch.isfinite(lp.grad).all() and lp.grad[0, 1] == 0.0
    assert m["ratio_mean"] == pytest.approx(math.exp(0.2), rel=1e-5)


def test_dtypes():
    lp = torch.zeros(1, 2, dtype=torch.float64)
    loss, _ = policy_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2))
    assert loss.dtype == torch.float64
    lp16 = torch.zeros(1, 2, dtype=torch.bfloat16)
    loss, _ = policy_loss(lp16, lp16, torch.tensor([1.0]), torch.ones(1, 2))
    assert loss.dtype == torch.float32


@pytest.mark.parametrize("kwargs, name", [
    ({"old_logprobs": torch.zeros(2, 4)}, "old_logprobs"),
    ({"advantages": torch.zeros(3)}, "advantages"),
    ({"advantages": torch.zeros(2, 4)}, "advantages"),
    ({"mask": torch.ones(2, 4)}, "mask"),
    ({"mask": torch.full((2, 3), 2.0)}, "mask"),
    ({"logprobs": torch.tensor([[0.0, float("nan"), 0.0]] * 2)}, "logprobs"),
    ({"logprobs": torch.zeros(6)}, "logprobs"),
    ({"advantages": torch.tensor([1.0, float("inf")])}, "advantages"),
    ({"old_logprobs": torch.full((2, 3), float("-inf"))}, "old_logprobs"),
    ({"clip_low": 1.0}, "clip_low"),
    ({"clip_high": -0.1}, "clip_high"),
    ({"dual_clip": 1.0}, "dual_clip"),
    ({"kl_coef": 0.1}, "ref_logprobs"),
    ({"kl_coef": -0.1, "ref_logprobs": torch.zeros(2, 3)}, "kl_coef"),
    ({"ref_logprobs": torch.zeros(2, 2)}, "ref_logprobs"),
    ({"entropy_coef": 0.1}, "entropies"),
    ({"entropies": torch.full((2, 3), float("nan"))}, "entropies"),
    ({"aggregation": "seq-sum"}, "aggregation"),
    ({"aggregation": "seq-mean-token-sum-norm"}, "max_response_length"),
    ({"kl_estimator": "abs"}, "kl_estimator"),
])
def test_validation_names_the_argument(kwargs, name):
    args = {"logprobs": torch.zeros(2, 3), "old_logprobs": torch.zeros(2, 3),
            "advantages": torch.ones(2), "mask": torch.ones(2, 3)}
    args.update(kwargs)
    positional = [args.pop(k) for k in ("logprobs", "old_logprobs", "advantages", "mask")]
    with pytest.raises(ValueError, match=name):
        policy_loss(*positional, **args)


def test_advantages_and_old_logprobs_are_constants():
    lp = torch.zeros(1, 2, requires_grad=True)
    old = torch.zeros(1, 2, requires_grad=True)
    adv = torch.tensor([1.0], requires_grad=True)
    loss, _ = policy_loss(lp, old, adv, torch.ones(1, 2))
    loss.backward()
    assert adv.grad is None and old.grad is None
    assert lp.grad.tolist() == [[-0.5, -0.5]]
