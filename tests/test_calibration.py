"""Loss-time calibration (docs/method.md §8 and §9): TACO, its ablations and its baselines."""

from __future__ import annotations

import math

import pytest
import torch

import ktae
from ktae.core.calibration import (
    CALIBRATIONS,
    CalibrationResult,
    calibrate_advantages,
    calibration_options,
)

ALL_RULES = ["taco", "taco-prob-only", "taco-entropy-only", "taco-entropy-high", "taco-random",
             "taco-hard", "taco-step", "adv-reweight", "forking-tokens", "stapo",
             "entropy-adv", "clip-cov", "kl-cov", "spo-mask", "rsi-s"]
LOG_ALPHA = math.log(0.01)


def batch(seed: int = 0, B: int = 6, T: int = 20, alpha: float = 0.01):
    """Random batch whose tokens sit clearly on either side of TACO's threshold."""
    g = torch.Generator().manual_seed(seed)
    H = torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    side = torch.where(torch.rand(B, T, generator=g) < 0.3, -1.0, 1.0).double()
    gap = 0.5 + 2 * torch.rand(B, T, generator=g, dtype=torch.float64)
    lp = (-H + math.log(alpha) + side * gap).clamp(max=-1e-3)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[0], adv[1] = 1.5, -0.7  # at least one response of each sign
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[0] = True
    mask[2, :] = False  # an empty response
    return adv, lp, H, mask


def call(name, adv, lp, H, mask, **kw):
    return calibrate_advantages(name, adv, logprobs=lp, entropies=H, mask=mask,
                                old_logprobs=lp, **kw)


def soft_weight_oracle(logp: float, H: float, alpha=0.01, lam=0.9) -> float:
    """docs/method.md §8 read literally, one token at a time."""
    r = -logp - H + math.log(alpha)
    return 1.0 if r <= 0 else 1.0 - lam * (1.0 - math.exp(-r))


def test_registry_and_exports():
    assert sorted(ALL_RULES) == CALIBRATIONS.names()
    assert ktae.calibrate_advantages is calibrate_advantages
    assert ktae.CALIBRATIONS is CALIBRATIONS and ktae.CalibrationResult is CalibrationResult
    assert calibration_options("taco") == ["alpha", "lam"]
    assert calibration_options("taco-hard") == ["alpha"]
    assert calibration_options("stapo") == ["prob_threshold", "entropy_quantile"]


# -- TACO: a transcription of the authors' formula ---------------------------------------

def test_taco_transcription_on_hand_built_tensors():
    lam = 0.9
    # columns: r exactly 0 | r = 1 | very large r | r < 0 | padding
    lp = torch.tensor([[LOG_ALPHA, LOG_ALPHA - 1.5, -1000.0, -0.1, -1000.0]] * 3,
                      dtype=torch.float64)
    H = torch.tensor([[0.0, 0.5, 2.0, 0.3, 0.0]] * 3, dtype=torch.float64)
    adv = torch.tensor([2.0, 0.0, -3.0], dtype=torch.float64)  # positive, zero, negative
    mask = torch.tensor([[1, 1, 1, 1, 0]] * 3)
    r = calibrate_advantages("taco", adv, logprobs=lp, entropies=H, mask=mask)
    w1 = 1 - lam * (1 - math.exp(-1.0))
    expected = torch.tensor([[2.0, 2.0 * w1, 2.0 * (1 - lam), 2.0, 0.0],
                             [0.0, 0.0, 0.0, 0.0, 0.0],
                             [-3.0, -3.0, -3.0, -3.0, 0.0]], dtype=torch.float64)
    assert torch.equal(r.advantages[1:], expected[1:])  # zero/negative: untouched, bitwise
    torch.testing.assert_close(r.advantages, expected, rtol=1e-12, atol=0)
    assert r.advantages[0, 0] == 2.0  # r exactly 0: weight exactly 1
    assert r.advantages[0, 2] == 2.0 * (1 - lam)  # r ~ 995: weight 1 - lambda
    assert r.flagged.tolist() == [[False, True, True, False, False]] + [[False] * 5] * 2
    assert r.flag_rate == pytest.approx(2 / 12)
    assert torch.equal(r.loss_mask, mask.bool())
    torch.testing.assert_close(r.weights[0], torch.tensor([1.0, w1, 0.1, 1.0, 0.0],
                                                          dtype=torch.float64))
    # metrics: w and r at every real token, whatever the advantage's sign
    risks = [0.0, 1.0, 1000.0 - 2.0 + LOG_ALPHA, 0.1 - 0.3 + LOG_ALPHA]
    weights = [1.0, w1, 1 - lam, 1.0]
    assert r.metrics["mean_weight"] == pytest.approx(sum(weights) / 4)
    assert r.metrics["mean_tail_risk"] == pytest.approx(sum(risks) / 4)
    assert r.metrics["tail_fraction"] == pytest.approx(2 / 4)
    assert r.metrics["positive_advantage_fraction"] == pytest.approx(4 / 12)
    assert r.metrics["loss_token_fraction"] == 1.0


def test_taco_matches_the_per_token_formula_on_a_random_batch():
    adv, lp, H, mask = batch()
    for alpha, lam in ((0.01, 0.9), (0.2, 0.5), (0.01, 0.0), (0.01, 1.0)):
        r = calibrate_advantages("taco", adv, logprobs=lp, entropies=H, mask=mask,
                                 alpha=alpha, lambda_=lam)
        expected = torch.zeros_like(lp)
        for i in range(lp.shape[0]):
            for t in range(lp.shape[1]):
                if not mask[i, t]:
                    continue
                a = adv[i].item()
                w = soft_weight_oracle(lp[i, t].item(), H[i, t].item(), alpha, lam)
                expected[i, t] = a * w if a > 0 else a
        torch.testing.assert_close(r.advantages, expected, rtol=1e-12, atol=1e-15)
        tail = (-lp - H + math.log(alpha) > 0) & mask & (adv[:, None] > 0)
        assert torch.equal(r.flagged, tail) and tail.sum() >= 5


def test_taco_float32_and_token_level_advantages():
    adv, lp, H, mask = batch(7)
    tok = torch.randn(lp.shape, generator=torch.Generator().manual_seed(0))
    r = calibrate_advantages("taco", tok, logprobs=lp.float(), entropies=H.float(), mask=mask)
    assert r.advantages.dtype == torch.float32
    # token-level input (e.g. KTAE): only the positive entries can be reduced
    assert torch.equal(r.advantages[tok <= 0], (tok * mask)[tok <= 0])
    assert (r.flagged <= (tok > 0)).all() and r.flagged.any()
    assert (r.advantages[tok > 0] <= tok[tok > 0]).all()


def test_taco_options():
    adv, lp, H, mask = batch(1)
    a = call("taco", adv, lp, H, mask, lam=0.5)
    b = call("taco", adv, lp, H, mask, lambda_=0.5)
    assert torch.equal(a.advantages, b.advantages)
    assert (a.weights[a.flagged] >= 0.5).all() and (a.weights[a.flagged] < 1).all()
    loose = call("taco", adv, lp, H, mask, alpha=0.5)
    assert (loose.flagged | a.flagged).equal(loose.flagged)  # larger alpha flags more
    assert loose.flag_rate > a.flag_rate
    none = call("taco", adv, lp, H, mask, lam=0.0)
    assert torch.equal(none.advantages, adv[:, None].expand_as(lp) * mask)


def test_prob_only_drops_the_entropy_term():
    # p = 0.005 in a sharp context (H = 0.1): in TACO's tail and in prob-only's.
    # p = 0.005 in a flat context (H = 3): in prob-only's tail only.
    # p = 0.3: in neither. Negative advantages: never changed.
    lp = torch.log(torch.tensor([[0.005, 0.005, 0.3], [0.005, 0.005, 0.3]],
                                dtype=torch.float64))
    H = torch.tensor([[0.1, 3.0, 0.1], [0.1, 3.0, 0.1]], dtype=torch.float64)
    adv = torch.tensor([2.0, -2.0], dtype=torch.float64)
    mask = torch.ones(2, 3)
    taco = calibrate_advantages("taco", adv, logprobs=lp, entropies=H, mask=mask)
    prob = calibrate_advantages("taco-prob-only", adv, logprobs=lp, mask=mask)
    w_taco = soft_weight_oracle(math.log(0.005), 0.1)
    w_prob = soft_weight_oracle(math.log(0.005), 0.0)  # r = -logp + log(alpha)
    torch.testing.assert_close(taco.advantages, torch.tensor(
        [[2 * w_taco, 2.0, 2.0], [-2.0, -2.0, -2.0]], dtype=torch.float64))
    torch.testing.assert_close(prob.advantages, torch.tensor(
        [[2 * w_prob, 2 * w_prob, 2.0], [-2.0, -2.0, -2.0]], dtype=torch.float64))
    assert taco.flag_rate == pytest.approx(1 / 6) and prob.flag_rate == pytest.approx(2 / 6)


def test_hard_and_step_act_on_tacos_tail_tokens():
    adv, lp, H, mask = batch(1)
    taco = call("taco", adv, lp, H, mask)
    hard = call("taco-hard", adv, lp, H, mask)
    step = call("taco-step", adv, lp, H, mask, lam=0.7)
    full = adv[:, None].expand_as(lp) * mask
    assert torch.equal(hard.flagged, taco.flagged) and torch.equal(step.flagged, taco.flagged)
    assert torch.equal(hard.advantages, torch.where(taco.flagged, 0.0, full))
    torch.testing.assert_close(step.advantages, torch.where(taco.flagged, 0.3 * full, full))


# -- ablations: TACO's rate and strength on other tokens -----------------------------------

@pytest.mark.parametrize("name", ["taco-entropy-only", "taco-entropy-high", "taco-random"])
@pytest.mark.parametrize("seed", [0, 2, 3])
def test_ablations_carry_tacos_count_and_weight_multiset(name, seed):
    adv, lp, H, mask = batch(seed)
    taco = call("taco", adv, lp, H, mask)
    r = call(name, adv, lp, H, mask, generator=torch.Generator().manual_seed(seed))
    pool = (adv[:, None] > 0) & mask
    assert r.flagged.sum() == taco.flagged.sum() > 0
    assert not (r.flagged & ~pool).any()
    assert torch.equal(r.weights[r.flagged].sort().values, taco.weights[taco.flagged].sort().values)
    assert (r.weights[mask & ~r.flagged] == 1).all()
    full = adv[:, None].expand_as(lp) * mask
    torch.testing.assert_close(r.advantages, r.weights * full)
    if name == "taco-entropy-only":  # TACO's entropy term: lower entropy, higher risk
        assert H[r.flagged].max() < H[pool & ~r.flagged].min()
    if name == "taco-entropy-high":
        assert H[r.flagged].min() > H[pool & ~r.flagged].max()


@pytest.mark.parametrize("name, lowest", [("taco-entropy-only", True),
                                          ("taco-entropy-high", False)])
@pytest.mark.parametrize("seed", [0, 1, 4])
@pytest.mark.parametrize("ties", [False, True])
def test_entropy_ablations_match_the_slow_reference(name, lowest, seed, ties):
    from oracle import budgeted_ablation_slow

    adv, lp, H, mask = batch(seed)
    adv = torch.randn(lp.shape, generator=torch.Generator().manual_seed(seed),
                      dtype=torch.float64)  # token-level signs
    if ties:  # entropies on a coarse grid: many ties, broken by position
        H = (H * 2).round() / 2
    r = call(name, adv, lp, H, mask, generator=torch.Generator().manual_seed(seed))
    chosen, weights = budgeted_ablation_slow(adv, lp, H, mask, lowest_entropy=lowest)
    assert 0 < len(chosen) < int(((adv > 0) & mask).sum())
    assert {tuple(x) for x in r.flagged.nonzero().tolist()} == chosen
    torch.testing.assert_close(r.weights[r.flagged].sort().values,
                               torch.tensor(weights, dtype=torch.float64))


def test_ablation_weight_order_is_random_and_reproducible():
    adv, lp, H, mask = batch(2)

    def draw(name, seed):
        return call(name, adv, lp, H, mask, generator=torch.Generator().manual_seed(seed))

    for name in ("taco-entropy-only", "taco-entropy-high", "taco-random"):
        a, b, c = draw(name, 7), draw(name, 7), draw(name, 8)
        assert torch.equal(a.advantages, b.advantages) and torch.equal(a.flagged, b.flagged)
        assert not torch.equal(a.weights, c.weights)
    e7, e8 = draw("taco-entropy-only", 7), draw("taco-entropy-only", 8)
    assert torch.equal(e7.flagged, e8.flagged)  # same tokens, other order of weights


def test_random_is_uniform_over_the_positive_pool():
    # 2 of the 8 positive tokens are in TACO's tail: each of the 8 is drawn w.p. 1/4.
    lp = torch.log(torch.tensor([[1e-4, 1e-4] + [0.5] * 6, [1e-4] * 8]))
    H = torch.ones(2, 8)
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 8)
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(2, 8)
    for _ in range(400):
        counts += calibrate_advantages("taco-random", adv, logprobs=lp, entropies=H,
                                       mask=mask, generator=g).flagged
    assert counts.sum() == 800 and counts[1].sum() == 0
    assert ((counts[0] / 400 - 0.25).abs() < 0.08).all()


# -- baselines -----------------------------------------------------------------------------

def test_forking_tokens_keeps_top_fraction_by_entropy_in_the_loss_mask():
    H = torch.tensor([[0.1, 0.9, 0.5, 0.3, 9.0], [0.7, 0.2, 0.8, 0.4, 0.6]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])  # 9 real tokens; 9.0 is padding
    adv = torch.tensor([1.0, -2.0])
    lp = torch.full((2, 5), -1.0)
    r = calibrate_advantages("forking-tokens", adv, logprobs=lp, entropies=H, mask=mask)
    keep = torch.tensor([[0, 1, 0, 0, 0], [0, 0, 1, 0, 0]], dtype=torch.bool)  # ceil(1.8)
    assert torch.equal(r.loss_mask, keep)
    assert torch.equal(r.advantages, torch.where(keep, adv[:, None].expand(2, 5), 0.0))
    assert torch.equal(r.flagged, mask.bool() & ~keep)
    assert r.flag_rate == pytest.approx(7 / 9)
    assert r.metrics["loss_token_fraction"] == pytest.approx(2 / 9)
    assert r.metrics["entropy_threshold"] == pytest.approx(0.8)
    half = calibrate_advantages("forking-tokens", adv, logprobs=lp, entropies=H, mask=mask,
                                top_fraction=0.5)
    assert half.loss_mask.sum() == 5  # ceil(4.5): 0.9, 0.8, 0.7, 0.6, 0.5
    assert H[half.loss_mask].min() == pytest.approx(0.5)
    one = calibrate_advantages("forking-tokens", adv, logprobs=lp, entropies=H, mask=mask,
                               top_fraction=1e-6)
    assert one.loss_mask.sum() == 1  # at least one token, as the authors' max(1, ...)


def test_forking_tokens_keeps_20_percent_of_a_large_batch():
    g = torch.Generator().manual_seed(4)
    H = torch.rand(8, 50, generator=g)
    r = calibrate_advantages("forking-tokens", torch.ones(8), logprobs=-H, entropies=H,
                             mask=torch.ones(8, 50))
    assert r.loss_mask.sum() == 80 and H[r.loss_mask].min() >= torch.quantile(H, 0.8)


def test_stapo_threshold_is_the_quantile_of_positive_tokens_entropies():
    g = torch.Generator().manual_seed(5)
    B, T = 8, 30
    H = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    p = torch.where(torch.rand(B, T, generator=g) < 0.5, 0.001, 0.3).double()
    adv = torch.linspace(-1, 1, B, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.9
    cand = (adv[:, None] > 0) & mask
    for q in (0.2, 0.1, 0.5):
        r = calibrate_advantages("stapo", adv, logprobs=p.log(), entropies=H, mask=mask,
                                 entropy_quantile=q)
        tau = torch.quantile(H[cand], q)
        assert r.metrics["entropy_threshold"] == pytest.approx(tau.item(), rel=1e-12)
        silenced = cand & (p < 0.002) & (H < tau)
        assert torch.equal(r.flagged, silenced) and silenced.sum() >= 3
        assert torch.equal(r.loss_mask, mask & ~silenced)
        assert torch.equal(r.advantages, torch.where(mask & ~silenced,
                                                     adv[:, None].expand(B, T), 0.0))


def test_stapo_by_hand():
    # positive tokens' entropies: 0.01, 2.0, 1.0, 1.0, 1.0 -> 0.2-quantile 0.8036
    p = torch.tensor([[0.001, 0.001, 0.001, 0.5, 0.001], [0.001, 0.003, 0.2, 0.2, 0.2]])
    H = torch.tensor([[0.01, 2.0, 1.0, 1.0, 1.0], [0.5, 0.02, 1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -1.0])
    r = calibrate_advantages("stapo", adv, logprobs=p.log(), entropies=H,
                             mask=torch.ones(2, 5))
    expected = torch.zeros(2, 5, dtype=torch.bool)
    expected[0, 0] = True  # row 1 is negative: never a candidate
    assert torch.equal(r.flagged, expected) and torch.equal(r.loss_mask, ~expected)
    assert r.metrics["entropy_threshold"] == pytest.approx(0.01 + 0.8 * 0.99)
    loose = calibrate_advantages("stapo", adv, logprobs=p.log(), entropies=H,
                                 mask=torch.ones(2, 5), entropy_quantile=1.0)
    assert loose.flagged.sum() == 3  # H < 2.0 and p < 0.002: entries 0, 2, 4 of row 0
    none = calibrate_advantages("stapo", -adv.abs(), logprobs=p.log(), entropies=H,
                                mask=torch.ones(2, 5))
    assert not none.flagged.any() and none.metrics["entropy_threshold"] == 0.0


def test_adv_reweight_uses_the_old_policy_probability():
    old = torch.tensor([[0.9, 0.01, 0.5]], dtype=torch.float64).log()
    cur = torch.tensor([[0.2, 0.7, 0.5]], dtype=torch.float64).log()
    mask = torch.tensor([[1, 1, 0]])
    for a in (2.0, -3.0):
        r = calibrate_advantages("adv-reweight", torch.tensor([a], dtype=torch.float64),
                                 logprobs=cur, old_logprobs=old, mask=mask)
        expected = [(0.1 * 0.9 + 0.9) * a, (0.1 * 0.01 + 0.9) * a, 0.0]
        assert r.advantages[0].tolist() == pytest.approx(expected)
        assert r.flagged.tolist() == [[True, True, False]]
        assert r.metrics["mean_weight"] == pytest.approx((0.99 + 0.901) / 2)
    r = calibrate_advantages("adv-reweight", torch.tensor([1.0]), logprobs=cur, mask=mask,
                             old_logprobs=old, w=0.5)
    assert r.advantages[0, 1].item() == pytest.approx(0.5 * 0.01 + 0.5)
    with pytest.raises(ValueError, match="old_logprobs"):
        calibrate_advantages("adv-reweight", torch.tensor([1.0]), logprobs=cur, mask=mask)


# -- generic properties --------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL_RULES)
def test_no_gradient_flows_through_calibration(name):
    adv, lp, H, mask = batch(5)
    lp, H, adv = (t.clone().requires_grad_() for t in (lp, H, adv))
    r = calibrate_advantages(name, adv, logprobs=lp, entropies=H, mask=mask, old_logprobs=lp,
                             generator=torch.Generator().manual_seed(0))
    assert not r.advantages.requires_grad and not r.weights.requires_grad
    assert r.advantages.grad_fn is None and r.weights.grad_fn is None


@pytest.mark.parametrize("name", ALL_RULES)
def test_empty_mask_and_broadcast(name):
    adv, lp, H, mask = batch(6)
    empty = call(name, adv, lp, H, torch.zeros_like(mask))
    assert empty.flag_rate == 0.0 and not empty.flagged.any() and not empty.loss_mask.any()
    assert torch.equal(empty.advantages, torch.zeros_like(lp))
    assert all(math.isfinite(v) for v in empty.metrics.values())
    g = torch.Generator
    seq = call(name, adv, lp, H, mask, generator=g().manual_seed(1))
    tok = call(name, adv[:, None].expand_as(lp) * 5 - 4 * adv[:, None], lp, H, mask,
               generator=g().manual_seed(1))
    torch.testing.assert_close(seq.advantages, tok.advantages)
    assert not seq.advantages[~mask].any() and not seq.flagged[~mask].any()
    assert not seq.loss_mask[~mask].any()
    assert all(isinstance(v, float) and math.isfinite(v) for v in seq.metrics.values())
    assert not seq.advantages[mask & ~seq.loss_mask].any()


# -- the loss mask reaches the policy loss ---------------------------------------------------

def _survivor_loss(logp, old, adv, keep, aggregation):
    """The same loss computed on the surviving tokens only, packed row by row."""
    rows = [r for r in range(keep.shape[0]) if keep[r].any()]
    width = int(keep.sum(dim=1).max())
    packed = [torch.zeros(len(rows), width, dtype=logp.dtype) for _ in range(3)]
    pm = torch.zeros(len(rows), width, dtype=torch.bool)
    for j, r in enumerate(rows):
        idx = keep[r].nonzero().flatten()
        for dst, src in zip(packed, (logp, old, adv), strict=True):
            dst[j, :len(idx)] = src[r, idx]
        pm[j, :len(idx)] = True
    lp_s = packed[0].clone().requires_grad_()
    loss, _ = ktae.policy_loss(lp_s, packed[1], packed[2], pm, aggregation=aggregation,
                               clip_low=0.2, clip_high=0.28)
    loss.backward()
    grad = torch.zeros_like(logp)
    for j, r in enumerate(rows):
        idx = keep[r].nonzero().flatten()
        grad[r, idx] = lp_s.grad[j, :len(idx)]
    return loss.detach(), grad


@pytest.mark.parametrize("name", ["forking-tokens", "stapo"])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_loss_mask_loss_and_gradient_equal_the_survivors_only_loss(name, aggregation):
    g = torch.Generator().manual_seed(11)
    B, T = 6, 40
    H = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    old = torch.where(torch.rand(B, T, generator=g) < 0.4, 0.001, 0.4).double().log()
    cur = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64) + 0.5
    mask = torch.rand(B, T, generator=g) < 0.85
    r = calibrate_advantages(name, adv, logprobs=cur, entropies=H, mask=mask)
    keep = r.loss_mask
    assert 0 < keep.sum() < mask.sum()
    logp = cur.clone().requires_grad_()
    loss, _ = ktae.policy_loss(logp, old, r.advantages, keep, aggregation=aggregation,
                               clip_low=0.2, clip_high=0.28)
    loss.backward()
    ref_loss, ref_grad = _survivor_loss(cur, old, r.advantages, keep, aggregation)
    torch.testing.assert_close(loss.detach(), ref_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(logp.grad, ref_grad, rtol=1e-12, atol=1e-14)
    assert (logp.grad[mask & ~keep] == 0).all()
    # the denominator counts survivors only: not the loss with the full mask
    full, _ = ktae.policy_loss(cur, old, r.advantages, mask, aggregation=aggregation)
    assert not torch.isclose(full, loss.detach())


def test_reweight_only_rules_keep_the_mask():
    adv, lp, H, mask = batch(9)
    for name in ALL_RULES:
        if name in ("forking-tokens", "stapo", "spo-mask", "rsi-s"):
            continue
        r = call(name, adv, lp, H, mask, generator=torch.Generator().manual_seed(0))
        assert torch.equal(r.loss_mask, mask) and r.metrics["loss_token_fraction"] == 1.0


# -- validation ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, kwargs, match", [
    ("taco-v2", {}, "calibration"),
    ("taco", {"w": 0.1}, "w"),
    ("taco-hard", {"lam": 0.5}, "lam"),
    ("taco", {"lam": 0.5, "lambda_": 0.5}, "lam"),
    ("taco", {"alpha": 0.0}, "alpha"),
    ("taco", {"lam": 1.5}, "lam"),
    ("adv-reweight", {"w": -0.1}, "w"),
    ("adv-reweight", {"old_logprobs": None}, "old_logprobs"),
    ("adv-reweight", {"old_logprobs": torch.zeros(2, 4)}, "old_logprobs"),
    ("forking-tokens", {"top_fraction": 2}, "top_fraction"),
    ("forking-tokens", {"top_fraction": 0}, "top_fraction"),
    ("stapo", {"entropy_quantile": float("nan")}, "entropy_quantile"),
    ("stapo", {"low_entropy_fraction": 0.2}, "low_entropy_fraction"),
    ("stapo", {"prob_threshold": "x"}, "prob_threshold"),
    ("taco", {"entropies": None}, "entropies"),
    ("taco-step", {"entropies": None}, "entropies"),
    ("forking-tokens", {"entropies": None}, "entropies"),
    ("stapo", {"entropies": None}, "entropies"),
    ("taco", {"entropies": torch.zeros(2, 2)}, "entropies"),
    ("taco", {"logprobs": torch.tensor([[0.0, float("nan"), 0.0]] * 2)}, "logprobs"),
    ("taco", {"advantages": torch.ones(3)}, "advantages"),
    ("taco", {"advantages": torch.tensor([1.0, float("inf")])}, "advantages"),
    ("taco", {"mask": torch.ones(2, 4)}, "mask"),
    ("taco-random", {"generator": 3}, "generator"),
])
def test_validation_names_the_argument(name, kwargs, match):
    args = {"advantages": torch.ones(2), "logprobs": torch.zeros(2, 3),
            "entropies": torch.zeros(2, 3), "mask": torch.ones(2, 3),
            "old_logprobs": torch.zeros(2, 3)}
    args.update(kwargs)
    advantages = args.pop("advantages")
    with pytest.raises(ValueError, match=match):
        calibrate_advantages(name, advantages, **args)


def test_sum_norm_aggregation_with_a_loss_mask():
    adv, lp, H, mask = batch(10)
    r = calibrate_advantages("forking-tokens", adv, logprobs=lp, entropies=H, mask=mask)
    logp = lp.clone().requires_grad_()
    loss, _ = ktae.policy_loss(logp, lp, r.advantages, r.loss_mask,
                               aggregation="seq-mean-token-sum-norm", max_response_length=50)
    loss.backward()
    # at ratio 1 each surviving token contributes -A / (L * B); removed tokens nothing
    B = lp.shape[0]
    expected = -(r.advantages * r.loss_mask).sum() / (50 * B)
    torch.testing.assert_close(loss.detach(), expected)
    torch.testing.assert_close(logp.grad, -r.advantages * r.loss_mask / (50 * B))


def test_taco_family_reports_the_taco_authors_figures_and_logged_metrics():
    from ktae.core.calibration import CONSTANT_FLAG_RATE, logged_metrics
    from ktae.core.calibration_taco import TACO_FAMILY, TACO_METRIC_NAMES

    assert TACO_FAMILY == {n for n in ALL_RULES if n.startswith("taco")}
    adv, lp, H, mask = batch(0)
    for name in ALL_RULES:
        r = call(name, adv, lp, H, mask, generator=torch.Generator().manual_seed(0))
        figures = logged_metrics(name, r)
        assert set(TACO_METRIC_NAMES) <= set(figures) or name not in TACO_FAMILY
        assert figures["loss_token_fraction"] == r.metrics["loss_token_fraction"]
        if name in CONSTANT_FLAG_RATE:  # adv-reweight: every token has p_old < 1
            assert r.flag_rate == 1.0 and "flag_rate" not in figures
            assert figures["mean_weight"] == pytest.approx(float(r.weights[mask].mean()))
        else:
            assert figures["flag_rate"] == r.flag_rate
    assert CONSTANT_FLAG_RATE == {"adv-reweight"}
