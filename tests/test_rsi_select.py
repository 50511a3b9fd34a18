"""RSI-S (docs/method.md §18): the Relative Surprisal Index band against a plain loop
written from the equations, hand-computed cases, degenerate input, bad options, the loss
over the kept tokens, and the name in ``ktae train``, ``ktae compare`` and the simulator."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
from oracle import single_thread  # noqa: F401  (one torch thread for this module)

import ktae
from ktae.core.calibration import calibration_options
from ktae.core.methods import method_credit, parse_method
from ktae.core.rsi_select import relative_surprisal_index
from ktae.runs.credit import credit_settings
from ktae.train import cli_train
from ktae.train.cli_compare import parse_arm


def calibrate(adv, lp, ent, mask, **options):
    return ktae.calibrate_advantages("rsi-s", adv, logprobs=lp, entropies=ent, mask=mask,
                                     **options)


def slow_rsi_s(lp, ent, mask, rsi_min=0.1, rsi_max=3.0):
    """The equations one token at a time: ``RSI = max(-logp, 0) / max(H, 1e-8)``, kept
    when ``rsi_min <= RSI <= rsi_max``; returns (keep, low, high) as nested lists."""
    B, T = mask.shape
    keep = [[False] * T for _ in range(B)]
    low = [[False] * T for _ in range(B)]
    high = [[False] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            if not mask[i, t]:
                continue
            rsi = max(-float(lp[i, t]), 0.0) / max(float(ent[i, t]), 1e-8)
            low[i][t] = rsi < rsi_min
            high[i][t] = rsi > rsi_max
            keep[i][t] = not (low[i][t] or high[i][t])
    return keep, low, high


def batch(seed: int, B: int = 5, T: int = 9, dtype=torch.float64):
    """Random log-probs and entropies spanning RSI from ~0 to well above 3, a ragged mask
    with garbage values on the padding, and mixed-sign advantages."""
    g = torch.Generator().manual_seed(seed)
    ent = (torch.rand(B, T, generator=g, dtype=torch.float64) * 3).to(dtype)
    lp = (-torch.rand(B, T, generator=g, dtype=torch.float64) ** 2 * 10).to(dtype)
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[0] = True
    mask[-1] = False  # an empty response
    lp = torch.where(mask, lp, torch.tensor(-50.0, dtype=dtype))
    ent = torch.where(mask, ent, torch.tensor(0.0, dtype=dtype))
    adv = torch.randn(B, T, generator=g, dtype=torch.float64).to(dtype)
    return adv, lp, ent, mask


def _far_from_bounds(lp, ent, mask, bounds):
    rsi = relative_surprisal_index(lp, ent)[mask]
    return all(bool((rsi - b).abs().min() > 1e-6) for b in bounds)


def test_registered_with_its_options_and_needs():
    assert "rsi-s" in ktae.CALIBRATIONS
    assert calibration_options("rsi-s") == ["rsi_min", "rsi_max"]
    assert ktae.CALIBRATIONS.record("rsi-s").needs == ("entropies",)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("options", [{}, {"rsi_min": 0.5, "rsi_max": 2.0},
                                     {"rsi_min": 0.0, "rsi_max": 1.2}])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vectorised_equals_the_loop(seed, options, dtype):
    adv, lp, ent, mask = batch(seed, dtype=dtype)
    bounds = (options.get("rsi_min", 0.1), options.get("rsi_max", 3.0))
    assert _far_from_bounds(lp, ent, mask, bounds)
    res = calibrate(adv, lp, ent, mask, **options)
    keep, low, high = slow_rsi_s(lp, ent, mask, *bounds)
    keep = torch.tensor(keep)
    assert torch.equal(res.loss_mask, keep)
    assert torch.equal(res.flagged, mask & ~keep)
    assert torch.equal(res.weights, keep.to(res.weights.dtype))
    torch.testing.assert_close(res.advantages, torch.where(keep, adv, 0).to(res.advantages.dtype))
    n = int(mask.sum())
    assert res.flag_rate == pytest.approx(int((mask & ~keep).sum()) / n)
    assert res.metrics["loss_token_fraction"] == pytest.approx(int(keep.sum()) / n)
    assert res.metrics["low_rsi_fraction"] == pytest.approx(sum(map(sum, low)) / n)
    assert res.metrics["high_rsi_fraction"] == pytest.approx(sum(map(sum, high)) / n)
    # the batch covers all three sides of the band
    assert 0 < int(keep.sum()) < n and sum(map(sum, low)) + sum(map(sum, high)) > 0


def test_by_hand():
    # RSI: 0.1/1 -> kept at the lower bound; ln 2 / 0.5 = 1.386 kept; 3 / 1 kept at the
    # upper bound; 3.3 / 1 dropped (tail); 0.05 / 1 dropped (redundant); 4 / 2 = 2 kept
    lp = torch.tensor([[-0.1, -math.log(2), -3.0], [-3.3, -0.05, -4.0]], dtype=torch.float64)
    ent = torch.tensor([[1.0, 0.5, 1.0], [1.0, 1.0, 2.0]], dtype=torch.float64)
    adv = torch.tensor([2.0, -1.0], dtype=torch.float64)
    res = calibrate(adv, lp, ent, torch.ones(2, 3))
    assert res.loss_mask.tolist() == [[True, True, True], [False, False, True]]
    assert res.advantages.tolist() == [[2.0, 2.0, 2.0], [0.0, 0.0, -1.0]]
    assert res.flag_rate == pytest.approx(2 / 6)
    assert res.metrics == pytest.approx({"low_rsi_fraction": 1 / 6, "high_rsi_fraction": 1 / 6,
                                         "loss_token_fraction": 4 / 6})
    torch.testing.assert_close(relative_surprisal_index(lp, ent),
                               torch.tensor([[0.1, 2 * math.log(2), 3.0], [3.3, 0.05, 2.0]],
                                            dtype=torch.float64))
    # the band is entropy-adaptive: the same surprisal 2.0 stays at H = 1 (RSI 2) and
    # leaves at H = 0.5 (RSI 4)
    same = calibrate(torch.tensor([1.0]), torch.tensor([[-2.0, -2.0]]),
                     torch.tensor([[1.0, 0.5]]), torch.ones(1, 2))
    assert same.loss_mask.tolist() == [[True, False]]
    # options change the band: rsi_max = 4 keeps both
    wide = calibrate(torch.tensor([1.0]), torch.tensor([[-2.0, -2.0]]),
                     torch.tensor([[1.0, 0.5]]), torch.ones(1, 2), rsi_max=4.0)
    assert wide.loss_mask.tolist() == [[True, True]]


def test_zero_entropy_and_rounding():
    # H = 0: the sampled token with p = 1 has RSI 0 (redundant), any other a huge RSI
    # (tail); a log-prob rounded above 0 counts as surprisal 0
    lp = torch.tensor([[0.0, -1e-3, 1e-7, -0.5]])
    ent = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    rsi = relative_surprisal_index(lp, ent)
    assert rsi[0, 0] == 0 and rsi[0, 2] == 0 and rsi[0, 1] == pytest.approx(1e5)
    res = calibrate(torch.tensor([1.0]), lp, ent, torch.ones(1, 4))
    assert res.loss_mask.tolist() == [[False, False, False, True]]
    assert res.metrics["low_rsi_fraction"] == 0.5 and res.metrics["high_rsi_fraction"] == 0.25
    # rsi_min = 0 keeps the certain tokens
    res0 = calibrate(torch.tensor([1.0]), lp, ent, torch.ones(1, 4), rsi_min=0.0)
    assert res0.loss_mask.tolist() == [[True, False, True, True]]


def test_empty_mask_and_padding():
    adv, lp, ent, mask = batch(7)
    none = calibrate(adv, lp, ent, torch.zeros_like(mask))
    assert not none.loss_mask.any() and not none.flagged.any()
    assert (none.advantages == 0).all() and none.flag_rate == 0.0
    assert none.metrics == {"low_rsi_fraction": 0.0, "high_rsi_fraction": 0.0,
                            "loss_token_fraction": 0.0}
    # padding never enters the loss, whatever its values
    res = calibrate(adv, lp, ent, mask)
    assert not (res.loss_mask & ~mask).any() and not (res.flagged & ~mask).any()
    assert (res.advantages[~mask] == 0).all()
    other = calibrate(adv, torch.where(mask, lp, -0.2), torch.where(mask, ent, 1.0), mask)
    assert torch.equal(other.loss_mask, res.loss_mask)


@pytest.mark.parametrize("options, message", [
    ({"rsi_min": -0.1}, r"^rsi_min: expected a finite number >= 0, got -0\.1$"),
    ({"rsi_min": "x"}, r"^rsi_min: expected a number, got 'x'$"),
    ({"rsi_max": 0.1}, r"^rsi_max: expected a finite number > 0\.1, got 0\.1$"),
    ({"rsi_min": 2.0, "rsi_max": 1.0}, r"^rsi_max: expected a finite number > 2\.0, got 1\.0$"),
    ({"rsi_max": float("inf")}, r"^rsi_max: expected a finite number > 0\.1, got inf$"),
    ({"rsi_mid": 1.0}, r"rsi_mid"),
])
def test_bad_options_are_one_line_errors(options, message):
    adv, lp, ent, mask = batch(0)
    with pytest.raises(ValueError, match=message) as err:
        calibrate(adv, lp, ent, mask, **options)
    assert "\n" not in str(err.value)


def test_needs_entropies():
    adv, lp, _, mask = batch(0)
    with pytest.raises(ValueError, match=r"^entropies: required by calibration 'rsi-s'"):
        ktae.calibrate_advantages("rsi-s", adv, logprobs=lp, mask=mask)


def test_loss_runs_over_the_kept_tokens_only():
    adv, lp, ent, mask = batch(3)
    res = calibrate(adv, lp, ent, mask)
    keep = res.loss_mask
    old = lp.detach()
    cur = (lp + 0.05).requires_grad_(True)
    loss, _ = ktae.policy_loss(cur, old, res.advantages, keep, aggregation="token-mean")
    loss.backward()
    # no token is clipped (ratio e^0.05 < 1.2): the loss is the plain surrogate's mean
    # over the kept tokens
    want = -torch.where(keep, res.advantages * (cur - old).exp(), 0).sum() / keep.sum()
    torch.testing.assert_close(loss.detach(), want.detach())
    assert (cur.grad[mask & ~keep] == 0).all() and (cur.grad[keep] != 0).all()


def test_every_command_reaches_it_with_its_options():
    parser = argparse.ArgumentParser()
    cli_train.add_arguments(parser)
    cfg = cli_train.config_from_args(parser.parse_args(["--credit", "rsi-s@rsi_max=2.5"]))
    settings = credit_settings(cfg)
    assert (settings.estimator, settings.calibration) == ("grpo", "rsi-s")
    assert settings.calibration_options == {"rsi_max": 2.5}
    cfg = cli_train.config_from_args(parser.parse_args(["--credit", "ktae+rsi-s"]))
    assert (credit_settings(cfg).estimator, credit_settings(cfg).calibration) == ("ktae", "rsi-s")
    arm = parse_arm("grpo+rsi-s@rsi_min=0.5")
    assert arm.overrides == {"calibration_options": {"rsi_min": 0.5}}
    with pytest.raises(ValueError, match="rsi_mid"):
        parse_arm("grpo+rsi-s@rsi_mid=0.5")
    # the method credit (audit, explain, simulate) applies the band with those options
    _, lp, ent, mask = batch(2)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0])
    group = torch.zeros(5, dtype=torch.long)
    for name, options in (("grpo+rsi-s", {}), ("grpo+rsi-s@rsi_min=0.5@rsi_max=1.5",
                                                {"rsi_min": 0.5, "rsi_max": 1.5})):
        got = method_credit(parse_method(name), rewards=rewards, group=group,
                            token_ids=torch.zeros(mask.shape, dtype=torch.long), mask=mask,
                            correct=rewards > 0, logprobs=lp, entropies=ent)
        want = calibrate(torch.where(mask, got.seq[:, None].double(), 0), lp, ent, mask,
                         **options)
        assert torch.equal(got.in_loss, want.loss_mask)
        torch.testing.assert_close(got.final, want.advantages)


@pytest.mark.slow
def test_audit_of_the_shipped_model_runs_rsi_s_with_its_options():
    result = ktae.audit(model="default", prompts=4, samples=4, resamples=20,
                        credit=["grpo", "rsi-s", "rsi-s@rsi_min=0.5@rsi_max=2"])
    grpo = result["methods"]["grpo"]["all"]
    default = result["methods"]["rsi-s"]["all"]
    narrow = result["methods"]["rsi-s@rsi_min=0.5@rsi_max=2"]["all"]
    assert grpo["tokens_changed"]["mean"] == 0
    # the band removes tokens (their credit becomes 0), and a narrower band removes more
    assert 0 < default["tokens_changed"]["mean"] < narrow["tokens_changed"]["mean"] <= 1
