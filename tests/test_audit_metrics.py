"""The credit audit's figures on constructed groups, against the slow reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from oracle import audit_response_metrics

from ktae.credit_audit.metrics import OTHER, RIGHT, WRONG, response_metrics, summarise
from ktae.credit_audit.run import AuditGroup, audit_groups, parse_methods
from ktae.viz.report import GroupInput

W, R, O = WRONG, RIGHT, OTHER


def _metrics(credit, labels, correct, group, mask=None):
    credit = torch.tensor(credit, dtype=torch.float64)
    labels = torch.tensor(labels, dtype=torch.int8)
    mask = torch.ones_like(labels, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return response_metrics(credit, labels, mask, torch.tensor(correct), torch.tensor(group))


LABELS = [[R, R, W, O, R, W], [R, R, R, O, R, R], [R, W, R, O, R, R], [R, R, R, O, W, R]]
CORRECT = [False, True, False, True]
GROUP = [0, 0, 0, 0]


def test_constant_credit_is_exactly_chance():
    # GRPO: one value per response
    m = _metrics([[-0.7] * 6, [0.9] * 6, [-0.7] * 6, [0.9] * 6], LABELS, CORRECT, GROUP)
    assert m.blame[0].item() == 0.5 and m.blame[2].item() == 0.5
    assert m.lowest[0].item() == pytest.approx(2 / 5) and m.lowest[2].item() == pytest.approx(1 / 5)
    assert torch.equal(m.lowest[[0, 2]], m.chance[[0, 2]])
    # a right answer: blame undefined; contamination = wrong tokens / all tokens
    assert math.isnan(m.blame[1].item()) and math.isnan(m.contamination[1].item())  # no slip
    assert m.contamination[3].item() == pytest.approx(1 / 6)


def test_lowest_value_on_the_wrong_tokens_gives_one():
    labels = torch.tensor(LABELS)
    credit = torch.where(labels == W, -2.0, torch.where(labels == R, -0.5, -1.0)).double()
    m = _metrics(credit.tolist(), LABELS, CORRECT, GROUP)
    assert m.blame[0].item() == 1.0 and m.blame[2].item() == 1.0
    assert m.lowest[0].item() == 1.0 and m.lowest[2].item() == 1.0
    # the reverse ranking gives 0
    m = _metrics((-credit).tolist(), LABELS, CORRECT, GROUP)
    assert m.blame[0].item() == 0.0 and m.lowest[0].item() == 0.0


def test_ties_count_half_and_are_shared():
    # wrong tokens 0 and 1, right tokens 1 and 2: pairs 1 + 1 + 1/2 + 1 over 4
    labels = [[W, W, R, R], [R, R, R, R]]
    m = _metrics([[0.0, 1.0, 1.0, 2.0], [1.0] * 4], labels, [False, True], [0, 0])
    assert m.blame[0].item() == pytest.approx(3.5 / 4)
    assert m.lowest[0].item() == 1.0
    # a tie at the minimum: one wrong and two right tokens share it
    m = _metrics([[0.0, 3.0, 0.0, 0.0], [1.0] * 4], labels, [False, True], [0, 0])
    assert m.lowest[0].item() == pytest.approx(1 / 3)
    assert m.blame[0].item() == pytest.approx((0.5 + 0.5 + 0 + 0) / 4)


def test_contamination_and_padding():
    labels = [[R, W, O, R, O], [R, R, R, R, O]]
    mask = [[True, True, True, True, False], [True] * 4 + [False]]
    # negative credit does not count; padding (credit 9) is ignored
    m = _metrics([[1.0, 3.0, -2.0, 0.0, 9.0], [-1.0] * 5], labels, [True, False], [0, 0], mask)
    assert m.contamination[0].item() == pytest.approx(3 / 4)
    m = _metrics([[-1.0, -3.0, -2.0, 0.0, 9.0], [-1.0] * 5], labels, [True, False], [0, 0], mask)
    assert math.isnan(m.contamination[0].item())  # no positive credit: undefined


def test_groups_that_are_not_mixed_count_nowhere():
    m = _metrics([[-1.0, 0.0], [-1.0, 0.0]], [[W, R], [W, R]], [False, False], [0, 1])
    assert bool(torch.isnan(m.blame).all()) and bool(torch.isnan(m.contamination).all())


@pytest.mark.parametrize("seed", range(6))
def test_matches_the_slow_reference(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 24, 9
    # few distinct values, so that ties are common
    credit = torch.randint(-3, 4, (B, T), generator=g).double() / 2
    labels = torch.randint(-1, 2, (B, T), generator=g).to(torch.int8)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    correct = torch.rand(B, generator=g) < 0.5
    group = torch.arange(B) // 4
    m = response_metrics(credit, labels, mask, correct, group)
    ref = audit_response_metrics(credit, labels, mask, correct, group)
    for key in ("blame", "lowest", "chance", "contamination"):
        got = getattr(m, key).tolist()
        want = [r[key] for r in ref]
        for a, b in zip(got, want, strict=True):
            if b is None:
                assert math.isnan(a)
            else:  # sums of halves and ratios of small integers: exact up to rounding
                assert a == pytest.approx(b, rel=1e-12, abs=1e-12)
    assert sum(r["blame"] is not None for r in ref) > 0


def test_summarise_bootstrap_over_groups():
    values = np.array([0.2, 0.4, np.nan, 1.0, 0.0, 0.6])
    group = np.array([0, 0, 1, 1, 2, 2])
    s = summarise(values, group, resamples=400, seed=1)
    assert s["mean"] == pytest.approx(2.2 / 5) and s["responses"] == 5 and s["groups"] == 3
    assert s["low"] <= s["mean"] <= s["high"] and s["low"] < s["high"]
    # the same draws by a plain loop
    rng = np.random.default_rng(1)
    draws = rng.integers(0, 3, size=(400, 3))
    sums, counts = [0.6, 1.0, 0.6], [2, 1, 2]
    est = [sum(sums[k] for k in d) / sum(counts[k] for k in d) for d in draws]
    assert s["low"] == pytest.approx(np.percentile(est, 2.5))
    assert s["high"] == pytest.approx(np.percentile(est, 97.5))
    one = summarise(np.array([0.5, 0.7]), np.array([4, 4]))
    assert one["low"] == one["high"] == one["mean"] == pytest.approx(0.6)
    assert summarise(np.array([np.nan]), np.array([0]))["mean"] is None


def _group(responses, rewards, labels, level=1):
    return AuditGroup(GroupInput(prompt="Q:5+3 A:", responses=responses, rewards=rewards),
                      labels=labels, level=level)


def test_audit_of_grpo_through_the_api_is_exactly_half():
    groups = [
        _group([[1, 2, 3], [1, 2, 4], [1, 5, 3]], [1.0, 0.0, 0.0], ["rr.", "rw.", "wr."]),
        _group([[1, 2], [3, 2], [1, 1]], [0.0, 1.0, 1.0], ["rw", "rr", "wr"], level=2),
    ]
    result = audit_groups(groups, parse_methods("grpo,ktae,rloo"), resamples=50)
    grpo = result["methods"]["grpo"]
    assert grpo["all"]["blame"]["mean"] == 0.5 and grpo["all"]["blame"]["responses"] == 3
    assert grpo["all"]["lowest"]["mean"] == pytest.approx(0.5)
    assert grpo["all"]["lowest"]["mean"] == pytest.approx(grpo["all"]["chance"]["mean"])
    assert result["methods"]["rloo"]["all"]["blame"]["mean"] == 0.5
    # contamination of the right answer holding a slip: GRPO spreads evenly, 1 of 2 tokens
    assert grpo["all"]["contamination"]["mean"] == pytest.approx(0.5)
    assert grpo["all"]["contamination_vs_grpo"]["mean"] == 0.0
    ktae_vs = result["methods"]["ktae"]["all"]["contamination_vs_grpo"]["mean"]
    assert ktae_vs == pytest.approx(result["methods"]["ktae"]["all"]["contamination"]["mean"]
                                    - grpo["all"]["contamination"]["mean"])
    assert set(grpo["levels"]) == {"1", "2"}
    assert grpo["levels"]["2"]["contamination"]["responses"] == 1


def test_bad_groups_and_methods():
    with pytest.raises(ValueError, match="^credit: .*'bogus'"):
        parse_methods("grpo,bogus")
    with pytest.raises(ValueError, match="^credit: .*twice"):
        parse_methods("ktae,ktae")
    with pytest.raises(ValueError, match="^credit: 'foo' in 'ktae@foo=1'"):
        parse_methods("ktae@foo=1")
    all_right = [_group([[1, 2], [1, 3]], [1.0, 1.0], ["rw", "rr"])]
    with pytest.raises(ValueError, match="^INPUT: no mixed group"):
        audit_groups(all_right, parse_methods("grpo"))
    no_slip = [_group([[1, 2], [1, 3]], [1.0, 0.0], ["rr", "rr"])]
    with pytest.raises(ValueError, match="^INPUT: no mixed group"):
        audit_groups(no_slip, parse_methods("grpo"))
    short = [_group([[1, 2], [1, 3]], [1.0, 0.0], ["r", "rw"])]
    with pytest.raises(ValueError, match="^labels: "):
        audit_groups(short, parse_methods("grpo"))


def test_tokens_a_loss_mask_removes_receive_no_credit():
    # forking-tokens keeps the ceil(0.2 * 15) = 3 highest-entropy tokens of the batch: the
    # wrong answer's slip (entropy 5) and two tokens of the right answer; every other
    # token leaves the loss and so gets 0, above the slip's negative credit
    responses = [[1, 2, 3, 4, 5], [1, 2, 6, 4, 5], [1, 2, 3, 4, 5]]
    entropies = [[0.1, 0.2, 4.0, 0.3, 3.0], [0.1, 0.2, 5.0, 0.3, 0.4], [0.1] * 5]
    g = GroupInput(prompt="p", responses=responses, rewards=[1.0, 0.0, 1.0],
                   logprobs=[[-1.0] * 5] * 3, entropies=entropies)
    groups = [AuditGroup(g, labels=["rrrrr", "rrwrr", "rrrrr"])]
    result = audit_groups(groups, parse_methods("grpo,forking-tokens"), resamples=0)
    forking = result["methods"]["forking-tokens"]["all"]
    assert forking["blame"]["mean"] == 1.0 and forking["lowest"]["mean"] == 1.0
    assert result["methods"]["grpo"]["all"]["blame"]["mean"] == 0.5
