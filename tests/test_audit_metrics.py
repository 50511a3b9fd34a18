"""The credit audit's figures on constructed groups, against the slow reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from oracle import audit_response_metrics

from ktae.core.credit_metrics import (
    OTHER,
    RIGHT,
    WRONG,
    mass_metrics,
    response_metrics,
    summarise,
    summarise_ratio,
)
from ktae.credit_audit.run import AuditGroup, audit_groups, parse_methods
from ktae.groups.input import GroupInput

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
    # 12 of the 15 tokens lose their credit: changed, and the update shrinks
    assert forking["tokens_changed"]["mean"] == pytest.approx(12 / 15)
    assert forking["scale"]["mean"] < 1.0
    assert result["methods"]["grpo"]["all"]["blame"]["mean"] == 0.5


# --------------------------------------------------------------------------- credit mass


def slow_mass(credit, reference, labels, mask, correct, group) -> list[dict]:
    """The mass figures' per-response terms, by plain loops from the definitions
    (docs/audit.md, "Credit mass"); None where a response does not count."""
    out = []
    for i in range(len(credit)):
        members = [j for j in range(len(credit)) if group[j] == group[i]]
        mixed = any(correct[j] for j in members) and not all(correct[j] for j in members)
        toks = [t for t in range(len(credit[i])) if mask[i][t]]
        wrong = [credit[i][t] for t in toks if labels[i][t] == W]
        right = [credit[i][t] for t in toks if labels[i][t] == R]
        row = dict.fromkeys(("gap", "gap_norm", "changed", "tokens", "abs", "abs_ref"))
        if mixed and not correct[i] and wrong and right:
            row["gap"] = sum(wrong) / len(wrong) - sum(right) / len(right)
            row["gap_norm"] = sum(abs(reference[i][t]) for t in toks) / len(toks)
        if mixed and toks:
            row["tokens"] = len(toks)
            row["changed"] = sum(abs(credit[i][t] - reference[i][t])
                                 > 1e-6 * (1 + abs(reference[i][t])) for t in toks)
            row["abs"] = sum(abs(credit[i][t]) for t in toks)
            row["abs_ref"] = sum(abs(reference[i][t]) for t in toks)
        out.append(row)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_mass_figures_match_the_slow_reference(seed):
    g = torch.Generator().manual_seed(100 + seed)
    B, T = 24, 9
    group = torch.arange(B) // 4
    reference = torch.randn(B, 1, generator=g).expand(B, T).double()  # one value per response
    credit = torch.randint(-3, 4, (B, T), generator=g).double() / 2
    same = torch.rand(B, T, generator=g) < 0.4
    credit = torch.where(same, reference, credit)  # unchanged tokens
    labels = torch.randint(-1, 2, (B, T), generator=g).to(torch.int8)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    correct = torch.rand(B, generator=g) < 0.5
    m = mass_metrics(credit, reference, labels, mask, correct, group)
    ref = slow_mass(credit.tolist(), reference.tolist(), labels.tolist(), mask.tolist(),
                    correct.tolist(), group.tolist())
    pairs = {"mass_gap": ("gap", "gap_norm"), "tokens_changed": ("changed", "tokens"),
             "scale": ("abs", "abs_ref")}
    for figure, (num_key, den_key) in pairs.items():
        num, den = m.ratio(figure)
        for a, b, r in zip(num.tolist(), den.tolist(), ref, strict=True):
            if r[num_key] is None:
                assert math.isnan(a) and math.isnan(b)
            else:
                assert a == pytest.approx(r[num_key], rel=1e-12, abs=1e-12)
                assert b == pytest.approx(r[den_key], rel=1e-12, abs=1e-12)
    assert any(r["gap"] is not None for r in ref)
    assert any(r["changed"] and r["changed"] < r["tokens"] for r in ref if r["tokens"])


def test_mass_of_grpo_is_none():
    reference = torch.tensor([[-0.7] * 6, [0.9] * 6, [-0.7] * 6, [0.9] * 6]).double()
    m = mass_metrics(reference, reference, torch.tensor(LABELS), torch.ones(4, 6, dtype=torch.bool),
                     torch.tensor(CORRECT), torch.tensor(GROUP))
    assert m.mass_gap[0].item() == 0 and m.mass_gap_norm[0].item() == pytest.approx(0.7)
    assert m.tokens_changed.tolist() == [0, 0, 0, 0] and torch.equal(m.scale, m.scale_norm)
    # wrong tokens at -2, right at -0.5: gap -1.5 in units of |A_GRPO| = 0.7
    credit = torch.where(torch.tensor(LABELS) == W, -2.0, -0.5).double()
    m = mass_metrics(credit, reference, torch.tensor(LABELS), torch.ones(4, 6, dtype=torch.bool),
                     torch.tensor(CORRECT), torch.tensor(GROUP))
    assert m.mass_gap[0].item() == pytest.approx(-1.5)
    assert m.tokens_changed[0].item() == 6 and m.tokens[0].item() == 6


def test_summarise_ratio_bootstrap_over_groups():
    num = np.array([1.0, 2.0, np.nan, 3.0, -1.0, 0.5])
    den = np.array([2.0, 2.0, 5.0, 1.0, 4.0, 1.0])
    group = np.array([0, 0, 1, 1, 2, 2])
    s = summarise_ratio(num, den, group, resamples=300, seed=2)
    assert s["mean"] == pytest.approx(5.5 / 10.0) and s["responses"] == 5 and s["groups"] == 3
    rng = np.random.default_rng(2)
    draws = rng.integers(0, 3, size=(300, 3))
    sums, dens = [3.0, 3.0, -0.5], [4.0, 1.0, 5.0]
    est = [sum(sums[k] for k in d) / sum(dens[k] for k in d) for d in draws]
    assert s["low"] == pytest.approx(np.percentile(est, 2.5))
    assert s["high"] == pytest.approx(np.percentile(est, 97.5))
    # a mean is the ratio with denominator 1
    values = np.array([0.2, 0.4, np.nan, 1.0, 0.0, 0.6])
    assert summarise(values, group, resamples=50) == summarise_ratio(
        values, np.where(np.isnan(values), np.nan, 1.0), group, resamples=50)
    assert summarise_ratio(np.array([1.0]), np.array([0.0]), np.array([0]))["mean"] is None


def test_audit_reports_the_mass_figures():
    groups = [
        _group([[1, 2, 3], [1, 2, 4], [1, 5, 3]], [1.0, 0.0, 0.0], ["rr.", "rw.", "wr."]),
        _group([[1, 2], [3, 2], [1, 1]], [0.0, 1.0, 1.0], ["rw", "rr", "wr"], level=2),
    ]
    result = audit_groups(groups, parse_methods("grpo,ktae"), resamples=50)
    grpo = result["methods"]["grpo"]["all"]
    assert grpo["mass_gap"]["mean"] == 0 and grpo["tokens_changed"]["mean"] == 0
    assert grpo["scale"]["mean"] == pytest.approx(1.0)
    assert grpo["tokens_changed"]["responses"] == 6  # every response of a mixed group
    ktae_all = result["methods"]["ktae"]["all"]
    assert ktae_all["tokens_changed"]["mean"] > 0 and ktae_all["scale"]["mean"] != 1.0
    assert set(result["methods"]["ktae"]["levels"]["2"]) >= {"mass_gap", "tokens_changed",
                                                              "scale"}
    from ktae.credit_audit.report import markdown

    text = markdown({**result, "input": "x"})
    assert "mass gap: wrong − right" in text and "| ktae |" in text


def test_counts_the_groups_and_responses_a_self_teacher_can_teach():
    from ktae.credit_audit.run import _counts
    from ktae.models.self_teacher import choose_teachers

    rewards = [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    groups = [_group([[1, 2]] * 3, r, ["r.", "w.", "r."]) for r in rewards]
    counts = _counts(groups)
    assert counts["groups_with_right_answer"] == 2 and counts["mixed_groups"] == 2
    # the provider's own choice: a response is taught when another right one is in its group
    correct = torch.tensor([r > 0 for rs in rewards for r in rs])
    group = torch.arange(3).repeat_interleave(3)
    teachers = choose_teachers(correct, group, torch.full((9,), 2))
    assert counts["responses_with_teacher"] == int((teachers >= 0).sum()) == 5
