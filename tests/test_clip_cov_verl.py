"""Clip-Cov at its default options against verl's own loss (docs/method.md §16).

verl's ``compute_policy_loss_clip_cov`` is ported as written (``verl/trainer/ppo/
core_algos.py`` at commit b178a3c, the one ``ktae.core.clip_cov`` cites; ``agg_loss``'s
``token-mean`` on one micro-batch, no rollout-correction weights). Its random choice draws
``torch.randperm`` from torch's global generator; ktae's from the generator it is given:
seeded alike, the two draw the same permutation, so the chosen tokens are compared exactly.

The batches hold about 15,000 real tokens, so that the default ``clip_cov_ratio = 0.0002``
detaches ``floor(0.0002 * n) >= 2`` of them, and their covariance terms spread over
``(-10, 10)``, so that many fall inside the default bounds ``(1, 5)``.
"""

from __future__ import annotations

import pytest
import torch
from oracle import single_thread  # noqa: F401  (one torch thread for this module)

import ktae

SEEDS = (0, 1, 2, 3)
TOL = dict(rtol=1e-9, atol=1e-12)  # float64: the same tokens, the same sums up to rounding


def verl_clip_cov_loss(old_log_prob, log_prob, advantages, response_mask, clip_cov_ratio=0.0002,
                       clip_cov_lb=1.0, clip_cov_ub=5.0, cliprange_low=0.2, cliprange_high=0.2):
    """verl's compute_policy_loss_clip_cov (loss_agg_mode="token-mean"); returns the loss and
    the chosen (row, column) pairs."""
    def masked_mean(x, mask):
        return (x * mask).sum() / mask.sum()

    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    corr = torch.ones_like(advantages)
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)

    cov_all = (advantages - masked_mean(advantages, response_mask)) * (
        log_prob - masked_mean(log_prob.detach(), response_mask))
    cov_all[response_mask == 0] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf

    clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    top_k_idx = (cov_all < clip_cov_ub) & (cov_all > clip_cov_lb) & (response_mask > 0)
    top_k_idx = torch.nonzero(top_k_idx)
    if len(top_k_idx) > 0:
        perm = torch.randperm(len(top_k_idx))
        top_k_idx = top_k_idx[perm[: min(clip_num, len(top_k_idx))]]
    else:
        top_k_idx = torch.empty((0, 2), device=cov_all.device, dtype=torch.long)
    corr[top_k_idx[:, 0], top_k_idx[:, 1]] = 0

    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    loss = (pg_losses * response_mask).sum() / response_mask.sum()  # agg_loss, token-mean
    return loss, {tuple(ij) for ij in top_k_idx.tolist()}


def wide_batch(seed: int, B: int = 10, T: int = 1600):
    """Advantages of spread 2 and log-probs over (-6, 0): covariance terms over about
    (-10, 10); rollout log-probs 0.1 apart, so that the clip takes a few tokens."""
    g = torch.Generator().manual_seed(seed)
    adv = (2 * torch.randn(B, 1, generator=g, dtype=torch.float64)
           + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64))
    lp = -6 * torch.rand(B, T, generator=g, dtype=torch.float64)
    old = lp + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(T - 200, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return adv, lp, old, mask


@pytest.mark.parametrize("seed", SEEDS)
def test_clip_cov_at_its_defaults_equals_verls_loss(seed):
    adv, lp, old, mask = wide_batch(seed)
    n = int(mask.sum())
    res = ktae.calibrate_advantages("clip-cov", adv, logprobs=lp, old_logprobs=old, mask=mask,
                                    generator=torch.Generator().manual_seed(100 + seed))
    x = lp.clone().requires_grad_()
    loss, _ = ktae.policy_loss(x, old, res.advantages, res.loss_mask)
    (grad,) = torch.autograd.grad(loss, x)

    torch.manual_seed(100 + seed)  # verl draws from the global generator
    y = lp.clone().requires_grad_()
    ref, chosen = verl_clip_cov_loss(old, y, adv, mask.to(adv.dtype))
    (ref_grad,) = torch.autograd.grad(ref, y)

    # the defaults select tokens here: floor(0.0002 * n) of many candidates
    candidates = res.metrics["candidate_fraction"] * n
    assert n * 0.0002 >= 2 and candidates > 100
    assert len(chosen) == int(0.0002 * n) and int(res.flagged.sum()) == len(chosen)
    assert {(i, t) for i, t in res.flagged.nonzero().tolist()} == chosen
    assert res.loss_mask.equal(mask)
    torch.testing.assert_close(loss, ref, **TOL)
    torch.testing.assert_close(grad, ref_grad, **TOL)
    # the chosen tokens have no gradient, and had one before
    for i, t in chosen:
        assert grad[i, t] == 0
    x = lp.clone().requires_grad_()
    plain = torch.autograd.grad(ktae.policy_loss(x, old, adv, mask)[0], x)[0]
    assert all(plain[i, t] != 0 for i, t in chosen)
