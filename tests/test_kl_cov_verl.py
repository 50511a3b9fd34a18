"""KL-Cov against verl's own loss (docs/method.md §16): verl's ``compute_policy_loss_kl_cov``
ported as written, then ktae's calibration and loss compared with it on random off-policy
batches, value and gradient, at the default clip range of the loss.

The port follows ``verl/trainer/ppo/core_algos.py: compute_policy_loss_kl_cov`` at commit
b178a3c (the one ``ktae.core.kl_cov`` cites), with ``agg_loss``'s ``token-mean`` on one
micro-batch and no rollout-correction weights. Its ratio is ``exp(logp - old_logp)`` with
no clamp and no PPO clip on any token.
"""

from __future__ import annotations

import math

import pytest
import torch
from oracle import single_thread  # noqa: F401  (one torch thread for this module)

import ktae
from ktae.core.methods import parse_method

SEEDS = (0, 1, 2, 3, 4)
# float64 throughout: the same tokens are selected and the gradients agree to rounding
GRAD_TOL = dict(rtol=1e-9, atol=1e-12)


def verl_kl_cov_loss(old_log_prob, log_prob, advantages, response_mask,
                     kl_cov_ratio=0.0002, ppo_kl_coef=1.0):
    """verl's compute_policy_loss_kl_cov (loss_agg_mode="token-mean"); returns the loss
    and the flat indices of the selected tokens."""
    negative_approx_kl = log_prob - old_log_prob
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl
    pg_losses = pg_losses1

    all_valid = response_mask > 0
    all_valid_idx = torch.nonzero(all_valid.reshape(-1), as_tuple=True)[0]
    all_valid_adv = advantages[all_valid].detach().reshape(-1).cpu()
    all_valid_logp = log_prob[all_valid].detach().reshape(-1).cpu()

    k = min(kl_cov_ratio, len(all_valid_adv))
    large_cov_idxs = torch.zeros(0, dtype=torch.long)
    if k != 0:
        cov_lst_all = (all_valid_adv - all_valid_adv.mean()) * (all_valid_logp - all_valid_logp.mean())
        k_percent_nums = max(1, int(len(cov_lst_all) * kl_cov_ratio))
        large_cov_idxs = torch.topk(cov_lst_all, k_percent_nums, largest=True).indices
        if len(large_cov_idxs) != 0:
            large_cov_idxs = all_valid_idx[large_cov_idxs]
            rows, cols = large_cov_idxs // advantages.shape[1], large_cov_idxs % advantages.shape[1]
            pg_losses[rows, cols] = pg_losses_kl[rows, cols]

    mask = response_mask.to(pg_losses.dtype)
    loss = (pg_losses * mask).sum() / response_mask.sum()  # agg_loss, token-mean
    return loss, set(large_cov_idxs.tolist())


def off_policy_batch(seed: int, B: int = 8, T: int = 600, sigma: float = 0.3):
    """Token advantages, current and rollout log-probs ``sigma`` apart, a ragged mask."""
    g = torch.Generator().manual_seed(seed)
    adv = (torch.randn(B, 1, generator=g, dtype=torch.float64)
           + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64))
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
    old = lp + sigma * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return adv, lp, old, mask


def ktae_kl_cov(adv, lp, old, mask, **options):
    """ktae's calibration, then its loss as the trainer and the verl plugin call it (default
    clip range 0.2 / 0.2 and verl's dual clip 3, which ``ppo_clip=False`` turns off)."""
    res = ktae.calibrate_advantages("kl-cov", adv, logprobs=lp, old_logprobs=old, mask=mask,
                                    **options)
    x = lp.clone().requires_grad_()
    loss, metrics = ktae.policy_loss(x, old, res.advantages, res.loss_mask, dual_clip=3.0,
                                     ppo_clip=res.ppo_clip)
    (grad,) = torch.autograd.grad(loss, x)
    return res, loss.detach(), grad, metrics


def verl_reference(adv, lp, old, mask, **options):
    x = lp.clone().requires_grad_()
    loss, chosen = verl_kl_cov_loss(old, x, adv, mask, options.get("kl_cov_ratio", 0.0002),
                                    options.get("ppo_kl_coef", 1.0))
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad, chosen


OPTIONS = [{}, {"kl_cov_ratio": 0.05}, {"kl_cov_ratio": 1.0, "ppo_kl_coef": 2.0}]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("options", OPTIONS)
def test_kl_cov_equals_verls_loss_in_gradient_and_value(seed, options):
    adv, lp, old, mask = off_policy_batch(seed)
    res, loss, grad, metrics = ktae_kl_cov(adv, lp, old, mask, **options)
    ref_loss, ref_grad, chosen = verl_reference(adv, lp, old, mask, **options)
    assert not res.ppo_clip
    assert set(res.flagged.flatten().nonzero().squeeze(1).tolist()) == chosen
    torch.testing.assert_close(grad, ref_grad, **GRAD_TOL)
    # the value differs by a constant on the selected tokens: coef * (|d| - sign(d)) / n
    coef = options.get("ppo_kl_coef", 1.0)
    d = (lp - old).flatten()
    gap = sum(coef * (abs(float(d[i])) - math.copysign(1.0, float(d[i]))) for i in chosen)
    assert float(ref_loss - loss) == pytest.approx(gap / int(mask.sum()), rel=1e-9, abs=1e-12)
    assert metrics["clip_frac_low"] == metrics["clip_frac_high"] == metrics["dual_clip_frac"] == 0
    # the batch reaches the clip: a clipped loss would differ on many tokens
    ratio = (lp - old).exp()
    outside = mask & (((ratio > 1.2) & (res.advantages > 0)) | ((ratio < 0.8) & (res.advantages < 0)))
    assert int(outside.sum()) > 10


def test_the_clip_option_keeps_the_loss_clip():
    """``kl-cov@clip=true``: the result asks for the clip, and the loss with it is the
    clipped surrogate of the same calibrated advantages, away from verl's on the clipped
    tokens only."""
    adv, lp, old, mask = off_policy_batch(0)
    options = {"kl_cov_ratio": 1.0}
    res, loss, grad, _ = ktae_kl_cov(adv, lp, old, mask, clip=True, **options)
    assert res.ppo_clip
    x = lp.clone().requires_grad_()
    clipped, _ = ktae.policy_loss(x, old, res.advantages, mask, dual_clip=3.0)
    torch.testing.assert_close(grad, torch.autograd.grad(clipped, x)[0], **GRAD_TOL)
    _, ref_grad, _ = verl_reference(adv, lp, old, mask, **options)
    differs = ~torch.isclose(grad, ref_grad, rtol=1e-9, atol=1e-12)
    ratio = (lp - old).exp()
    a = res.advantages
    clip_region = mask & (((ratio > 1.2) & (a > 0)) | ((ratio < 0.8) & (a < 0)))
    assert differs.sum() > 0 and torch.equal(differs, clip_region)
    assert parse_method("kl-cov@clip=true").calibration_options == {"clip": True}
    with pytest.raises(ValueError, match="clip: expected true or false"):
        ktae.calibrate_advantages("kl-cov", adv, logprobs=lp, old_logprobs=old, mask=mask,
                                  clip="yes")
    with pytest.raises(ValueError, match="ppo_clip: expected true or false"):
        ktae.policy_loss(lp, old, adv, mask, ppo_clip="no")
