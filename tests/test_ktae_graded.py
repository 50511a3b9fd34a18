"""KTAE's graded split (ktae.core.ktae_graded, docs/graded.md).

- vectorised vs :func:`oracle.graded_token_stats` / :func:`oracle.exact_ktae` on random
  batches with continuous rewards (max abs difference <= 1e-6), unigrams and spans;
- 0/1 rewards: bit-for-bit the threshold split (advantages and table);
- invariance to ``r -> alpha r + beta`` and continuity in the rewards (property tests);
- h1, h2, h3 switch their parts off; bad options are refused.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import (
    FLOAT_FIELDS,
    SETTINGS,
    batch_specs,
    dense_group_index,
    exact_ktae,
    graded_token_stats,
    random_batch,
    single_thread,  # noqa: F401  (autouse fixture)
)

import ktae

TABLE_FIELDS = ("a", "b", "c", "d") + FLOAT_FIELDS


def continuous(batch: dict, seed: int, ties: bool = False) -> dict:
    """The batch with uniform rewards in [-2, 3) (no grid), a few ties if ``ties``."""
    rng = np.random.default_rng(seed)
    r = rng.uniform(-2.0, 3.0, size=len(batch["rewards"]))
    if ties and r.size > 2:
        r[1] = r[0]
    return {**batch, "rewards": r}


def inputs(batch: dict, rewards=None) -> dict:
    return dict(rewards=torch.tensor(batch["rewards"] if rewards is None else rewards),
                group=batch["group"], token_ids=torch.from_numpy(batch["token_ids"]),
                mask=torch.from_numpy(batch["mask"]).bool())


def advantages(batch: dict, rewards=None, **opts) -> np.ndarray:
    return ktae.compute_advantages("ktae", **inputs(batch, rewards), **opts).numpy()


def table_values(batch: dict, rewards=None, **opts) -> np.ndarray:
    return ktae.key_token_table(**inputs(batch, rewards), **opts).value.numpy()


GRADED_OPTS = st.fixed_dictionaries({
    "base": st.sampled_from(["grpo", "drgrpo", "rloo"]),
    "h1": st.sampled_from([0.0, 1.0, 2.0]), "h2": st.sampled_from([1.0, 2.0]),
    "h3": st.sampled_from([0.0, 1.0]), "k1": st.sampled_from([0.5, 2.0]),
    "b": st.sampled_from([0.0, 0.5, 1.0]), "variant": st.sampled_from(["runtime", "paper"]),
    "ngram": st.sampled_from([1, 1, 2, 3]), "ngram_reduce": st.sampled_from(["mean", "maxabs"]),
})


@settings(**SETTINGS, max_examples=60)
@given(spec=batch_specs(), opts=GRADED_OPTS, ties=st.booleans(), chunk=st.sampled_from([None, 5]))
def test_graded_matches_oracle(spec, opts, ties, chunk):
    batch = continuous(random_batch(**spec), spec["seed"], ties)
    got = advantages(batch, split="graded", chunk_tokens=chunk, **opts)
    want = exact_ktae(batch["rewards"], batch["group"], batch["token_ids"], batch["mask"],
                      split="graded", **opts)
    assert np.abs(got - want).max(initial=0.0) <= 1e-6


@pytest.mark.parametrize("ngram", [1, 2])
def test_large_groups_match_oracle(ngram):
    """A group of 70 (its response sets do not fit the 62-bit keys: soft counts are
    summed per pair instead) next to small ones."""
    batch = continuous(random_batch(5, sizes=[70, 3, 6], vocab=9, max_len=6), 5, ties=True)
    got = advantages(batch, split="graded", ngram=ngram)
    want = exact_ktae(batch["rewards"], batch["group"], batch["token_ids"], batch["mask"],
                      split="graded", ngram=ngram)
    assert np.abs(got - want).max() <= 1e-6


@settings(**SETTINGS, max_examples=40)
@given(spec=batch_specs(), opts=GRADED_OPTS)
def test_graded_table_matches_oracle(spec, opts):
    batch = continuous(random_batch(**spec), spec["seed"])
    opts = {k: v for k, v in opts.items() if k not in ("base", "ngram_reduce")}
    table = ktae.key_token_table(**inputs(batch), split="graded", **opts)
    want = graded_token_stats(batch["rewards"], batch["group"], batch["token_ids"],
                              batch["mask"], **opts)
    dense = dense_group_index(batch["group"])
    assert len(table) == len(want)
    for (label, v), expected in want.items():
        key = dict(span=v) if opts["ngram"] > 1 else dict(token=v)
        row = table.lookup(dense[label], **key)
        for name in TABLE_FIELDS:
            if name == "direction" and math.isnan(expected[name]):
                assert math.isfinite(row[name])  # a group without membership
                continue
            assert abs(row[name] - expected[name]) <= 1e-6 * max(1.0, abs(expected[name])), \
                (name, row, expected)


@pytest.mark.parametrize("ngram", [1, 2])
@pytest.mark.parametrize("opts", [{}, dict(h1=0.0), dict(h2=0.0), dict(h3=0.0),
                                  dict(variant="paper", base="rloo", k1=1.0, b=1.0)])
def test_binary_rewards_equal_threshold_split_bit_for_bit(ngram, opts):
    """Two distinct rewards per group: memberships are exactly 0 and 1 and every statistic
    is the thresholded one, computed by the same operations."""
    for seed in range(6):
        batch = random_batch(seed, sizes=[5, 8, 1, 3, 8, 2], vocab=7, max_len=12,
                             empty_class=seed % 2 == 0, left_pad=seed % 3 == 0)
        for chunk in (None, 9):
            kw = dict(ngram=ngram, chunk_tokens=chunk, **opts)
            threshold = advantages(batch, **kw)
            graded = advantages(batch, split="graded", **kw)
            assert np.array_equal(threshold, graded)
            t = ktae.key_token_table(**inputs(batch), **kw)
            g = ktae.key_token_table(**inputs(batch), split="graded", **kw)
            # rows of groups with both classes (one-class groups: w = 0 for all, a
            # different but equally valueless table)
            both = ((t.a + t.c > 0) & (t.b + t.d > 0)).numpy()
            for name in TABLE_FIELDS:
                x = getattr(t, name).double().numpy()
                y = getattr(g, name).double().numpy()
                assert np.array_equal(x[both], y[both]), name
            assert np.array_equal(t.value.numpy(), g.value.numpy())


def test_oracle_graded_equals_oracle_threshold_on_binary_rewards():
    """The slow references agree with each other where they must (groups with both
    classes), independently of the library."""
    from oracle import exact_token_stats

    batch = random_batch(2, sizes=[5, 7, 3], vocab=6, max_len=8)
    args = (batch["rewards"], batch["group"], batch["token_ids"], batch["mask"])
    hard, soft = exact_token_stats(*args), graded_token_stats(*args)
    assert hard.keys() == soft.keys()
    for key, h in hard.items():
        if h["a"] + h["c"] > 0 and h["b"] + h["d"] > 0:
            for name in TABLE_FIELDS:
                assert soft[key][name] == pytest.approx(h[name], abs=1e-12), name


def test_two_valued_groups_split_between_their_values():
    """Rewards 0.2/0.7 (any two values): graded = threshold at a value between them."""
    batch = random_batch(3, sizes=[6, 6], vocab=5, max_len=8)
    r = np.where(batch["rewards"] > 0, 0.7, 0.2)
    assert np.array_equal(advantages(batch, r, split="graded"),
                          advantages(batch, r, reward_threshold=0.5))


@settings(**SETTINGS, max_examples=40)
@given(spec=batch_specs(), alpha=st.sampled_from([1e-3, 0.37, 1.0, 8.0, 1e4]),
       beta=st.sampled_from([-50.0, -1.0, 0.0, 0.25, 7.0]), ngram=st.sampled_from([1, 2]))
def test_graded_values_invariant_to_shift_and_scale(spec, alpha, beta, ngram):
    batch = continuous(random_batch(**spec), spec["seed"], ties=True)
    r = batch["rewards"]
    before = table_values(batch, split="graded", ngram=ngram)
    after = table_values(batch, alpha * r + beta, split="graded", ngram=ngram)
    # memberships (r - lo) / (hi - lo) differ by rounding only (relative 1e-12 here)
    assert np.abs(before - after).max(initial=0.0) <= 1e-8
    # the advantage: its key-token part (the advantage minus Dr.GRPO's R - mean)
    m = batch["mask"].astype(bool)

    def key_part(rewards):
        base = ktae.compute_advantages("drgrpo", **inputs(batch, rewards)).numpy()
        adv = advantages(batch, rewards, split="graded", base="drgrpo", ngram=ngram)
        return (adv - base)[m]

    # rounding of R - mean is relative to the rewards' magnitude (|alpha r + beta| <= 1e5)
    assert np.abs(key_part(r) - key_part(alpha * r + beta)).max(initial=0.0) <= 1e-9


@settings(**SETTINGS, max_examples=40)
@given(spec=batch_specs(max_groups=2, max_size=8), which=st.integers(0, 63),
       ngram=st.sampled_from([1, 2]))
def test_graded_values_are_continuous_in_the_rewards(spec, which, ngram):
    """Move one reward from just below to just above each other reward of its group (where
    a rank-based statistic would jump, and the group's min and max change hands): the
    values move by no more than the rewards (1e-9 here, 2e-9 apart)."""
    batch = continuous(random_batch(**spec), spec["seed"])
    r = batch["rewards"].copy()
    j = which % len(r)
    for k in range(len(r)):
        if k == j:
            continue
        lo, hi = r.copy(), r.copy()
        lo[j], hi[j] = r[k] - 1e-9, r[k] + 1e-9
        a = table_values(batch, lo, split="graded", ngram=ngram)
        b = table_values(batch, hi, split="graded", ngram=ngram)
        assert np.abs(a - b).max(initial=0.0) <= 1e-5


def test_continuity_where_the_threshold_split_jumps():
    ids = torch.tensor([[1, 2, 3], [1, 4, 5], [1, 2, 5], [6, 4, 3]])
    group = [0, 0, 0, 0]

    def values(r2, **opts):
        return ktae.key_token_table(rewards=torch.tensor([1.0, 0.0, r2, 0.3], dtype=torch.float64),
                                    group=group,
                                    token_ids=ids, **opts).value

    lo, hi = values(0.5 - 1e-9, split="graded"), values(0.5 + 1e-9, split="graded")
    assert (lo - hi).abs().max() < 1e-7
    t_lo = values(0.5 - 1e-9, reward_threshold=0.5)
    t_hi = values(0.5 + 1e-9, reward_threshold=0.5)
    assert (t_lo - t_hi).abs().max() > 0.1  # what the graded split removes


def test_switches_turn_their_part_off():
    batch = continuous(random_batch(11, sizes=[6, 7], vocab=6, max_len=9), 11)
    kw = inputs(batch)
    t = ktae.key_token_table(**kw, split="graded")
    no_f = ktae.key_token_table(**kw, split="graded", h1=0.0)
    no_ig = ktae.key_token_table(**kw, split="graded", h2=0.0)
    no_tf = ktae.key_token_table(**kw, split="graded", h3=0.0)
    keep = t.value != 0
    assert keep.any()

    def scaled(k):
        return 2 * torch.sigmoid(k) - 1

    assert torch.allclose(no_f.value[keep], scaled(t.info_gain * t.direction)[keep], atol=1e-12)
    assert torch.allclose(no_ig.value[keep], scaled(t.fisher * t.direction)[keep], atol=1e-12)
    h = torch.asin((t.a / (t.a + t.c)).sqrt()) - torch.asin((t.b / (t.b + t.d)).sqrt())
    assert torch.allclose(no_tf.direction[keep], h[keep], atol=1e-12)
    assert not torch.allclose(t.direction[keep], h[keep])


def test_fisher_is_interpolated_between_integer_tables():
    """A soft table half way between two integer tables gets the mean of their F."""
    ids = torch.tensor([[7, 1], [7, 2], [3, 4]])
    t = ktae.key_token_table(rewards=[1.0, 0.5, 0.0], group=[0, 0, 0], token_ids=ids,
                             split="graded")
    row = t.lookup(0, 7)  # in the responses with w = 1 and w = 0.5
    assert (row["a"], row["b"], row["c"], row["d"]) == (1.5, 0.5, 0.0, 1.0)
    f1 = ktae.key_token_table(rewards=[1.0, 1.0, 0.0], group=[0, 0, 0], token_ids=ids
                              ).lookup(0, 7)["fisher"]
    f0 = ktae.key_token_table(rewards=[1.0, 0.0, 0.0], group=[0, 0, 0], token_ids=ids
                              ).lookup(0, 7)["fisher"]
    assert row["fisher"] == pytest.approx((f0 + f1) / 2, abs=1e-15)


def test_format_shows_soft_counts():
    ids = torch.tensor([[7, 1], [7, 2], [3, 4]])
    t = ktae.key_token_table(rewards=[1.0, 0.5, 0.0], group=[0, 0, 0], token_ids=ids,
                             split="graded")
    lines = t.format(decode=str).splitlines()
    row7 = next(line.split() for line in lines[1:] if line.split()[1] == "7")
    assert row7[3:7] == ["1.5", "0.5", "0", "1"]  # a, b, c, d after group, token, text


def test_groups_without_membership_get_base_advantage():
    ids = torch.tensor([[1, 2], [1, 3], [4, 5], [4, 6]])
    adv = ktae.compute_advantages("ktae", rewards=[0.35, 0.35, 1.0, 0.0], group=[0, 0, 1, 1],
                                  token_ids=ids, split="graded")
    assert torch.equal(adv[:2], torch.zeros(2, 2))
    assert (adv[2] > 0).all() and (adv[3] < 0).all()


@pytest.mark.parametrize("kwargs, message", [
    (dict(split="soft"), "split: expected 'threshold' or 'graded'"),
    (dict(split="graded", correct=[True, False]), "correct: split='graded'"),
    (dict(split="graded", reward_threshold=0.5), "reward_threshold: split='graded'"),
    (dict(split="graded", mode="reference"), "split: the reference mode"),
])
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ktae.compute_advantages("ktae", rewards=[1.0, 0.0], group=[0, 0],
                                token_ids=[[1, 2], [1, 3]], **kwargs)
    kwargs.pop("base", None)
    with pytest.raises(ValueError, match=message):
        ktae.key_token_table(rewards=[1.0, 0.0], group=[0, 0], token_ids=[[1, 2], [1, 3]],
                             **kwargs)
