"""Loss-time calibration (SPEC section 5): TACO, its ablations and its baselines."""

from __future__ import annotations

import math

import pytest
import torch

import ktae
from ktae.core.calibration import CALIBRATIONS, CalibrationResult, calibrate_advantages

ALL_RULES = ["taco", "taco-prob-only", "taco-entropy-only", "taco-random", "taco-hard",
             "adv-reweight", "forking-tokens", "stapo"]


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


def test_registry_and_exports():
    assert sorted(ALL_RULES) == CALIBRATIONS.names()
    assert ktae.calibrate_advantages is calibrate_advantages
    assert ktae.CALIBRATIONS is CALIBRATIONS and ktae.CalibrationResult is CalibrationResult


def test_taco_flags_exactly_the_tail_and_scales_positive_advantages():
    adv, lp, H, mask = batch()
    r = calibrate_advantages("taco", adv, logprobs=lp, entropies=H, mask=mask)
    tail = lp.exp() < 0.01 * torch.exp(-H)  # p < alpha * exp(-H)
    pos = adv[:, None] > 0
    expected = tail & pos & mask
    assert torch.equal(r.flagged, expected)
    assert expected.sum() >= 5 and (tail & ~pos & mask).sum() >= 5  # both kinds occur
    full = adv[:, None].expand_as(lp) * mask
    torch.testing.assert_close(r.advantages, torch.where(expected, 0.1 * full, full))
    # tail tokens with non-positive advantage keep it exactly
    assert torch.equal(r.advantages[~pos.expand_as(mask)], full[~pos.expand_as(mask)])
    assert r.flag_rate == pytest.approx(expected.sum().item() / mask.sum().item())
    torch.testing.assert_close(r.weights, torch.where(expected, 0.1, mask.double()))
    assert r.advantages.shape == lp.shape and r.advantages.dtype == torch.float64


def test_taco_options():
    adv, lp, H, mask = batch(1)
    a = calibrate_advantages("taco", adv, logprobs=lp, entropies=H, mask=mask, lam=0.5)
    b = calibrate_advantages("taco", adv, logprobs=lp, entropies=H, mask=mask, lambda_=0.5)
    assert torch.equal(a.advantages, b.advantages)
    assert torch.equal(a.weights[a.flagged], torch.full_like(a.weights[a.flagged], 0.5))
    loose = calibrate_advantages("taco", adv, logprobs=lp, entropies=H, mask=mask, alpha=0.5)
    assert (loose.flagged | a.flagged).equal(loose.flagged)  # larger alpha flags more
    assert loose.flag_rate > a.flag_rate
    hard = calibrate_advantages("taco-hard", adv, logprobs=lp, entropies=H, mask=mask)
    assert torch.equal(hard.flagged, a.flagged)
    assert (hard.advantages[hard.flagged] == 0).all()
    same = calibrate_advantages("taco", adv, logprobs=lp, entropies=H, mask=mask, lam=1.0)
    assert torch.equal(same.advantages, hard.advantages)


def test_taco_by_hand_and_prob_only_differs():
    # p = 0.005 in a sharp context (H = 0.1): below 0.01 * e^-0.1 -> flagged by both.
    # p = 0.005 in a flat context (H = 3): above 0.01 * e^-3 -> probability-only only.
    # p = 0.3 with A > 0: flagged by neither. Same token with A < 0: never changed.
    lp = torch.log(torch.tensor([[0.005, 0.005, 0.3], [0.005, 0.005, 0.3]]))
    H = torch.tensor([[0.1, 3.0, 0.1], [0.1, 3.0, 0.1]])
    adv = torch.tensor([2.0, -2.0])
    mask = torch.ones(2, 3)
    taco = calibrate_advantages("taco", adv, logprobs=lp, entropies=H, mask=mask)
    prob = calibrate_advantages("taco-prob-only", adv, logprobs=lp, mask=mask)
    torch.testing.assert_close(taco.advantages,
                               torch.tensor([[0.2, 2.0, 2.0], [-2.0, -2.0, -2.0]]))
    torch.testing.assert_close(prob.advantages,
                               torch.tensor([[0.2, 0.2, 2.0], [-2.0, -2.0, -2.0]]))
    assert taco.flag_rate == pytest.approx(1 / 6) and prob.flag_rate == pytest.approx(2 / 6)


def test_entropy_only_matches_taco_count_and_takes_highest_entropy():
    adv, lp, H, mask = batch(2)
    taco = calibrate_advantages("taco", adv, logprobs=lp, entropies=H, mask=mask)
    r = calibrate_advantages("taco-entropy-only", adv, logprobs=lp, entropies=H, mask=mask)
    assert r.flagged.sum() == taco.flagged.sum() > 0
    pool = (adv[:, None] > 0) & mask
    assert not (r.flagged & ~pool).any()
    assert H[r.flagged].min() > H[pool & ~r.flagged].max()
    torch.testing.assert_close(r.weights[r.flagged], torch.full_like(r.weights[r.flagged], 0.1))


def test_random_keeps_count_pool_and_is_reproducible():
    adv, lp, H, mask = batch(3)
    taco = calibrate_advantages("taco", adv, logprobs=lp, entropies=H, mask=mask)

    def draw(seed):
        return calibrate_advantages("taco-random", adv, logprobs=lp, entropies=H, mask=mask,
                                    generator=torch.Generator().manual_seed(seed))

    a, b, c = draw(7), draw(7), draw(8)
    assert a.flagged.sum() == taco.flagged.sum() > 0 and a.flag_rate == taco.flag_rate
    assert not (a.flagged & ~((adv[:, None] > 0) & mask)).any()
    assert torch.equal(a.flagged, b.flagged) and torch.equal(a.advantages, b.advantages)
    assert not torch.equal(a.flagged, c.flagged)
    torch.testing.assert_close(a.advantages[a.flagged], 0.1 * adv[:, None].expand_as(lp)[
        a.flagged])


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


def test_forking_tokens_keeps_top_fraction_by_entropy():
    H = torch.tensor([[0.1, 0.9, 0.5, 0.3, 9.0], [0.7, 0.2, 0.8, 0.4, 0.6]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])  # 9 real tokens; 9.0 is padding
    adv = torch.tensor([1.0, -2.0])
    lp = torch.full((2, 5), -1.0)
    r = calibrate_advantages("forking-tokens", adv, logprobs=lp, entropies=H, mask=mask)
    keep = torch.tensor([[0, 1, 0, 0, 0], [0, 0, 1, 0, 0]], dtype=torch.bool)  # ceil(1.8)
    assert torch.equal(r.advantages, torch.where(keep, adv[:, None].expand(2, 5), 0.0))
    assert torch.equal(r.flagged, mask.bool() & ~keep)
    assert r.flag_rate == pytest.approx(7 / 9)
    half = calibrate_advantages("forking-tokens", adv, logprobs=lp, entropies=H, mask=mask,
                                top_fraction=0.5)
    assert (half.weights > 0).sum() == 5  # ceil(4.5): 0.9, 0.8, 0.7, 0.6, 0.5
    assert H[half.weights > 0].min() == pytest.approx(0.5)


def test_forking_tokens_keeps_20_percent_of_a_large_batch():
    g = torch.Generator().manual_seed(4)
    H = torch.rand(8, 50, generator=g)
    mask = torch.ones(8, 50)
    r = calibrate_advantages("forking-tokens", torch.ones(8), logprobs=-H, entropies=H,
                             mask=mask)
    kept = r.weights > 0
    assert kept.sum() == 80 and H[kept].min() >= torch.quantile(H, 0.8)


def test_stapo_silences_rare_low_entropy_positive_tokens():
    # 10 real tokens -> the 2 lowest entropies (0.01, 0.02) form the low-entropy set.
    p = torch.tensor([[0.001, 0.001, 0.001, 0.5, 0.001], [0.001, 0.003, 0.2, 0.2, 0.2]])
    H = torch.tensor([[0.01, 2.0, 1.0, 1.0, 1.0], [0.5, 0.02, 1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, 1.0])
    r = calibrate_advantages("stapo", adv, logprobs=p.log(), entropies=H, mask=torch.ones(2, 5))
    expected = torch.zeros(2, 5, dtype=torch.bool)
    expected[0, 0] = True  # p < 0.002 and lowest entropy; [1, 1] has p = 0.003
    assert torch.equal(r.flagged, expected) and r.advantages[0, 0] == 0
    assert r.advantages.sum() == 9
    neg = calibrate_advantages("stapo", -adv, logprobs=p.log(), entropies=H,
                               mask=torch.ones(2, 5))
    assert not neg.flagged.any() and neg.advantages.sum() == -10
    loose = calibrate_advantages("stapo", adv, logprobs=p.log(), entropies=H,
                                 mask=torch.ones(2, 5), prob_threshold=0.01)
    assert loose.flagged.sum() == 2


def test_adv_reweight_formula():
    p = torch.tensor([[0.9, 0.01, 0.5]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    for a in (2.0, -3.0):
        r = calibrate_advantages("adv-reweight", torch.tensor([a], dtype=torch.float64),
                                 logprobs=p.log(), mask=mask)
        expected = [(0.1 * 0.9 + 0.9) * a, (0.1 * 0.01 + 0.9) * a, 0.0]
        assert r.advantages[0].tolist() == pytest.approx(expected)
        assert r.flagged.tolist() == [[True, True, False]]
    r = calibrate_advantages("adv-reweight", torch.tensor([1.0]), logprobs=p.log(), mask=mask,
                             w=0.5)
    assert r.advantages[0, 1].item() == pytest.approx(0.5 * 0.01 + 0.5)


@pytest.mark.parametrize("name", ALL_RULES)
def test_no_gradient_flows_through_calibration(name):
    adv, lp, H, mask = batch(5)
    lp, H, adv = (t.clone().requires_grad_() for t in (lp, H, adv))
    r = calibrate_advantages(name, adv, logprobs=lp, entropies=H, mask=mask,
                             generator=torch.Generator().manual_seed(0))
    assert not r.advantages.requires_grad and not r.weights.requires_grad
    assert r.advantages.grad_fn is None and r.weights.grad_fn is None


@pytest.mark.parametrize("name", ALL_RULES)
def test_empty_mask_and_broadcast(name):
    adv, lp, H, mask = batch(6)
    empty = calibrate_advantages(name, adv, logprobs=lp, entropies=H,
                                 mask=torch.zeros_like(mask))
    assert empty.flag_rate == 0.0 and not empty.flagged.any()
    assert torch.equal(empty.advantages, torch.zeros_like(lp))
    g = torch.Generator
    seq = calibrate_advantages(name, adv, logprobs=lp, entropies=H, mask=mask,
                               generator=g().manual_seed(1))
    tok = calibrate_advantages(name, adv[:, None].expand_as(lp) * 5 - 4 * adv[:, None],
                               logprobs=lp, entropies=H, mask=mask,
                               generator=g().manual_seed(1))
    torch.testing.assert_close(seq.advantages, tok.advantages)
    assert not seq.advantages[~mask].any() and not seq.flagged[~mask].any()


def test_token_level_advantages_keep_their_sign_rule():
    # token-level input (e.g. KTAE): only the positive entries can be reduced
    adv, lp, H, mask = batch(7)
    tok = torch.randn(lp.shape, generator=torch.Generator().manual_seed(0),
                      dtype=torch.float64)
    r = calibrate_advantages("taco", tok, logprobs=lp, entropies=H, mask=mask)
    assert torch.equal(r.advantages[tok <= 0], (tok * mask)[tok <= 0])
    assert (r.flagged <= (tok > 0)).all() and r.flagged.any()


def test_calibrated_advantages_feed_the_policy_loss():
    adv, lp, H, mask = batch(8)
    r = calibrate_advantages("taco", adv, logprobs=lp, entropies=H, mask=mask)
    logp = lp.clone().requires_grad_()
    loss, _ = ktae.policy_loss(logp, lp, r.advantages, mask)
    loss.backward()
    # at ratio 1 the token-mean gradient is -A / n_tokens
    torch.testing.assert_close(logp.grad, -r.advantages / mask.sum())


@pytest.mark.parametrize("name, kwargs, match", [
    ("taco-v2", {}, "calibration"),
    ("taco", {"w": 0.1}, "w"),
    ("taco-hard", {"lam": 0.5}, "lam"),
    ("taco", {"lam": 0.5, "lambda_": 0.5}, "lam"),
    ("taco", {"alpha": 0.0}, "alpha"),
    ("taco", {"lam": 1.5}, "lam"),
    ("adv-reweight", {"w": -0.1}, "w"),
    ("forking-tokens", {"top_fraction": 2}, "top_fraction"),
    ("stapo", {"low_entropy_fraction": float("nan")}, "low_entropy_fraction"),
    ("stapo", {"prob_threshold": "x"}, "prob_threshold"),
    ("taco", {"entropies": None}, "entropies"),
    ("forking-tokens", {"entropies": None}, "entropies"),
    ("taco", {"entropies": torch.zeros(2, 2)}, "entropies"),
    ("taco", {"logprobs": torch.tensor([[0.0, float("nan"), 0.0]] * 2)}, "logprobs"),
    ("taco", {"advantages": torch.ones(3)}, "advantages"),
    ("taco", {"advantages": torch.tensor([1.0, float("inf")])}, "advantages"),
    ("taco", {"mask": torch.ones(2, 4)}, "mask"),
    ("taco-random", {"generator": 3}, "generator"),
])
def test_validation_names_the_argument(name, kwargs, match):
    args = {"advantages": torch.ones(2), "logprobs": torch.zeros(2, 3),
            "entropies": torch.zeros(2, 3), "mask": torch.ones(2, 3)}
    args.update(kwargs)
    advantages = args.pop("advantages")
    with pytest.raises(ValueError, match=match):
        calibrate_advantages(name, advantages, **args)
