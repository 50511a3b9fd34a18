"""Groups whose rewards are equal up to float rounding get zero advantages (baselines.py,
``equal_reward_groups``): GRPO, Dr.GRPO, RLOO and KTAE (threshold and graded splits)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from oracle import base_advantages, rewards_equal

import ktae
from ktae.core.baselines import EQUAL_REWARDS_RTOL, equal_reward_groups

ESTIMATORS = [("grpo", {}), ("drgrpo", {}), ("rloo", {}), ("ktae", {}),
              ("ktae", dict(split="graded")), ("ktae", dict(base="rloo", reward_threshold=0.35)),
              ("ktae", dict(base="drgrpo", split="graded", ngram=2))]


def float32_sums() -> torch.Tensor:
    """0.35 three ways in float32: 0.1 + 0.25, 0.05 + 0.3, 0.35 (they differ by an ulp)."""
    parts = torch.tensor([[0.1, 0.25], [0.05, 0.3], [0.35, 0.0]], dtype=torch.float32)
    r = parts.sum(1)
    assert len(set(r.tolist())) > 1  # not equal in float32
    return r


def test_float32_sums_are_not_equal_but_count_as_equal():
    r = float32_sums()
    assert 0 < float(r.max() - r.min()) <= EQUAL_REWARDS_RTOL * float(r.abs().max())
    assert equal_reward_groups(r, torch.zeros(3, dtype=torch.long), 1).tolist() == [True]


@pytest.mark.parametrize("name, opts", ESTIMATORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equal_rewards_get_zero_advantages(name, opts, dtype):
    """Group 0: three float32 sums of 0.35 (passed as float32, or float64 after the float32
    sums); group 1: real differences, for contrast."""
    r = torch.cat([float32_sums(), torch.tensor([1.0, 0.0, 0.5])]).to(dtype)
    ids = torch.tensor([[1, 2, 3], [1, 4, 5], [2, 3, 6]] * 2)
    adv = ktae.compute_advantages(name, rewards=r, group=[0, 0, 0, 1, 1, 1], token_ids=ids,
                                  **opts)
    assert torch.equal(adv[:3], torch.zeros_like(adv[:3]))
    assert adv[3:].abs().sum() > 0.5


def test_without_the_rule_grpo_would_amplify_rounding():
    """What the rule prevents: the rounding noise divided by its own tiny std."""
    r = float32_sums().double()
    z = (r - r.mean()) / r.std()
    assert z.abs().max() > 0.5  # an order-one advantage from an ulp


@pytest.mark.parametrize("rewards, equal", [
    ([0.0, 1e-30], False),          # tiny, but a real difference relative to its magnitude
    ([1e4, 1e4 + 1e-3], True),     # 1e-7 relative: below float32's resolution at 1e4
    ([1.0, 1.0 + 2e-6], False),     # 2e-6 relative: a real (if small) difference
    ([0.0, 0.0, 0.0], True),
    ([-3.0, -3.0 * (1 + 1e-7)], True),
    ([-1e-9, 1e-9], False),         # straddling 0 is never "equal" under a relative rule
    ([5.0], True),                  # a group of one (advantages keep verl's convention)
])
def test_the_rule_is_relative_to_the_rewards_magnitude(rewards, equal):
    r = torch.tensor(rewards, dtype=torch.float64)
    got = equal_reward_groups(r, torch.zeros(len(rewards), dtype=torch.long), 1)
    assert got.tolist() == [equal]
    assert rewards_equal(rewards) == equal  # the oracle's rule


def test_group_of_one_keeps_its_convention():
    adv = ktae.compute_advantages("grpo", rewards=[5.0], group=[0])
    assert float(adv[0]) == pytest.approx(5.0 / (1 + 1e-6))


@pytest.mark.parametrize("base", ["grpo", "drgrpo", "rloo"])
def test_baselines_match_the_oracle_near_equal(base):
    rng = np.random.default_rng(0)
    r = np.concatenate([np.full(4, 0.7) * (1 + rng.uniform(-1e-7, 1e-7, 4)),
                        rng.uniform(0, 1, 5)])
    group = [0] * 4 + [1] * 5
    got = ktae.compute_advantages(base, rewards=torch.tensor(r), group=group).numpy()
    want = base_advantages(r, {0: list(range(4)), 1: list(range(4, 9))}, base)
    assert np.abs(got - want).max() <= 1e-9
    assert np.all(got[:4] == 0)


def test_explicit_correct_keeps_its_split():
    """An explicit ``correct`` is the caller's split: equal rewards zero the base only."""
    ids = torch.tensor([[1, 2], [1, 3]])
    adv = ktae.compute_advantages("ktae", rewards=[0.5, 0.5], group=[0, 0], token_ids=ids,
                                  correct=[True, False])
    assert adv[0, 1] > 0 and adv[1, 1] < 0 and adv[0, 0] == adv[1, 0] == 0
