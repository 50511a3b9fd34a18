"""``mode="reference"``: one test per quirk of the released runtime (docs/method.md §4).

Each test builds a batch whose key-token table is known by construction and checks the
library's reference mode against numbers computed here, independently: exact rationals
(``fractions``) for hypergeometric probabilities, and a few lines of float32 torch for
the runtime's float32 Fisher sum.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from oracle import single_thread  # noqa: F401  (autouse fixture)

import ktae

KEY = 100  # the token whose table we control
COMMON = 7  # a token present in every response
EOS = 151643


def table_batch(a: int, b: int, c: int, d: int, *, common: bool = False) -> dict:
    """One group realising the 2x2 table ``[[a, b], [c, d]]`` for token ``KEY``.

    Correct responses (reward 1): ``a`` of them contain KEY; incorrect (reward 0): ``b``
    do. Each response also holds its own filler id (1000 + i), and with ``common`` the
    id ``COMMON`` (present everywhere, so the group's K is ``1 + n_correct``).
    """
    n_t, n_f = a + c, b + d
    rows, rewards = [], []
    for i in range(n_t + n_f):
        is_correct = i < n_t
        has_key = (i < a) if is_correct else (i - n_t < b)
        toks = [1000 + i] + ([KEY] if has_key else []) + ([COMMON] if common else [])
        rows.append(toks)
        rewards.append(1.0 if is_correct else 0.0)
    T = max(len(r) for r in rows)
    tok = np.zeros((len(rows), T), dtype=np.int64)
    mask = np.zeros((len(rows), T), dtype=np.int64)
    for i, r in enumerate(rows):
        tok[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return dict(rewards=torch.tensor(rewards), group=[0] * len(rows), token_ids=tok, mask=mask)


def row_of(batch: dict, token: int, **opts) -> dict:
    return ktae.key_token_table(**batch, **opts).lookup(0, token)


def hypergeom(a: int, b: int, c: int, d: int) -> dict[int, Fraction]:
    """Exact probabilities of every table with the margins of ``[[a, b], [c, d]]``."""
    n, r1, c1 = a + b + c + d, a + b, a + c
    lo, hi = max(0, r1 + c1 - n), min(r1, c1)
    return {k: Fraction(math.comb(c1, k) * math.comb(n - c1, r1 - k), math.comb(n, r1))
            for k in range(lo, hi + 1)}


def float32_fisher(a: int, b: int, c: int, d: int, width: int) -> float:
    """The runtime's p: float32 lgamma terms, kept where <= p_obs, summed over ``width``."""
    f = torch.float32
    n, r1, c1 = (torch.tensor(float(x), dtype=f) for x in (a + b + c + d, a + b, a + c))

    def lgc(nn, kk):
        return torch.lgamma(nn + 1) - torch.lgamma(kk + 1) - torch.lgamma(nn - kk + 1)

    lo, hi = max(0, a + b + a + c - (a + b + c + d)), min(a + b, a + c)
    terms = torch.zeros(1, width, dtype=f)
    p_obs = torch.exp(lgc(c1, torch.tensor(float(a))) + lgc(n - c1, r1 - a) - lgc(n, r1))
    for k in range(lo, hi + 1):
        kk = torch.tensor(float(k), dtype=f)
        pk = torch.exp(lgc(c1, kk) + lgc(n - c1, r1 - kk) - lgc(n, r1))
        if pk <= p_obs:
            terms[0, k] = pk
    return float(terms.sum(dim=-1)[0])


def small_tables(n_max: int):
    for n in range(2, n_max + 1):
        for n_t in range(1, n):
            for a in range(n_t + 1):
                for b in range(n - n_t + 1):
                    yield a, b, n_t - a, n - n_t - b


# ---------------------------------------------------------------------------- quirks


def test_statistics_are_float32():
    batch = table_batch(2, 1, 1, 2)
    batch["rewards"] = batch["rewards"].double()
    table = ktae.key_token_table(**batch, mode="reference")
    for f in ("p_value", "fisher", "info_gain", "tf_correct", "tf_incorrect", "direction",
              "value"):
        assert getattr(table, f).dtype == torch.float32, f
    exact = ktae.key_token_table(**batch)
    assert exact.p_value.dtype == torch.float64


def test_scores_are_float32():
    # 1e-50 > 0 in float64 but is 0 in float32: the runtime sees an all-wrong group
    rewards = torch.tensor([1e-50, 0.0, 0.0], dtype=torch.float64)
    tok = np.array([[5, 6], [6, 6], [7, 6]])
    ref = ktae.compute_advantages("ktae", rewards=rewards, group=[0, 0, 0], token_ids=tok,
                                  mode="reference")
    assert torch.equal(ref, torch.zeros(3, 2, dtype=ref.dtype))
    exact = ktae.compute_advantages("ktae", rewards=rewards, group=[0, 0, 0], token_ids=tok)
    assert exact[0, 0] > 0.5  # token 5 only in the (float64) correct response


def test_exact_p_of_one_still_gets_f_exp_minus_two():
    # [[1,1],[1,1]]: exact p = 1 (F = 0), but the float32 sum of 1/6 + 4/6 + 1/6 misses 1.0
    assert sum(hypergeom(1, 1, 1, 1).values()) == 1
    p32 = float32_fisher(1, 1, 1, 1, width=3)
    assert p32 != 1.0
    batch = table_batch(1, 1, 1, 1)
    ref = row_of(batch, KEY, mode="reference")
    assert ref["p_value"] == pytest.approx(p32, abs=1e-7) and ref["p_value"] != 1.0
    assert ref["fisher"] == pytest.approx(math.exp(-2 * p32), abs=1e-6)  # ~ 0.135
    assert row_of(batch, KEY)["fisher"] == 0.0  # exact mode


def test_f_is_zero_when_float32_sum_is_exactly_one():
    for t in small_tables(8):
        if (0 not in (t[0] + t[1], t[0] + t[2], t[1] + t[3]) and sum(hypergeom(*t).values()) == 1
                and float32_fisher(*t, width=min(t[0] + t[1], t[0] + t[2]) + 1) == 1.0):
            break
    else:
        pytest.fail("no table with a float32 p of exactly 1.0")
    ref = row_of(table_batch(*t), KEY, mode="reference")
    assert ref["p_value"] == 1.0 and ref["fisher"] == 0.0, t


def test_grid_width_is_set_by_the_groups_widest_token():
    # [[3,2],[4,1]] sums to exactly 1.0 on a 6-column grid but to 1 - 6e-8 on 8 columns;
    # a token present in all 10 responses (min(R1, C1) = 7) widens the group's grid to 8.
    t = (3, 2, 4, 1)
    assert float32_fisher(*t, width=6) == 1.0
    p8 = float32_fisher(*t, width=8)
    assert p8 != 1.0
    alone = row_of(table_batch(*t), KEY, mode="reference")
    widened = row_of(table_batch(*t, common=True), KEY, mode="reference")
    assert alone["fisher"] == 0.0
    assert widened["fisher"] == pytest.approx(math.exp(-2 * p8), abs=1e-6)


def find_dropped_tie(n_max: int = 14):
    """A table where a term equal to p_obs (exactly) is above it in float32."""
    for t in small_tables(n_max):
        probs = hypergeom(*t)
        obs = probs[t[0]]
        ties = [k for k, p in probs.items() if p == obs and k != t[0]]
        if not ties:
            continue
        exact_p = sum(p for p in probs.values() if p <= obs)
        p32 = float32_fisher(*t, width=min(t[0] + t[1], t[0] + t[2]) + 1)
        if abs(p32 - float(exact_p)) > 1e-4:
            return t, exact_p, exact_p - sum(probs[k] for k in ties)
    return None


def test_tied_term_dropped_without_tolerance():
    found = find_dropped_tie()
    assert found is not None, "no small table drops a tied term"
    t, exact_p, without_ties = found
    batch = table_batch(*t)
    ref = row_of(batch, KEY, mode="reference")
    assert ref["p_value"] == pytest.approx(float(without_ties), abs=1e-6), t
    assert ref["fisher"] == pytest.approx(math.exp(-2 * float(without_ties)), abs=1e-6)
    exact = row_of(batch, KEY)
    assert exact["p_value"] == pytest.approx(float(exact_p), rel=1e-9), t


def test_cohens_h_guard_in_one_class_group():
    # all wrong: a + c = 0, so a / (a + c + 1e-10) = 0 and D = -asin(sqrt(b / (b + d)))
    batch = table_batch(0, 2, 0, 3)
    ref = row_of(batch, KEY, mode="reference", h3=0.0)
    assert ref["direction"] == pytest.approx(-math.asin(math.sqrt(2 / 5)), abs=1e-6)
    assert ref["value"] == 0.0
    # two classes: the 1e-10 is below float32 resolution, h is the plain Cohen's h
    ref = row_of(table_batch(2, 1, 1, 3), KEY, mode="reference", h3=0.0)
    expect = (torch.asin(torch.tensor(2 / 3, dtype=torch.float32).sqrt())
              - torch.asin(torch.tensor(1 / 4, dtype=torch.float32).sqrt()))
    assert ref["direction"] == pytest.approx(float(expect), abs=1e-6)


def test_qwen_endoftext_forced_to_zero_in_reference_mode_only():
    batch = table_batch(3, 0, 0, 3)
    batch["token_ids"][batch["token_ids"] == KEY] = EOS
    seq = ktae.compute_advantages("grpo", rewards=batch["rewards"], group=batch["group"])
    ref = ktae.compute_advantages("ktae", **batch, mode="reference")
    exact = ktae.compute_advantages("ktae", **batch)
    at = torch.from_numpy(batch["token_ids"] == EOS)
    assert at.sum() == 3
    np.testing.assert_allclose(ref[at].numpy(), seq[:3].numpy(), atol=1e-6)
    assert (exact[at] - seq[:3]).min() > 0.5  # a strong key token in exact mode
    assert row_of(batch, EOS, mode="reference")["value"] == 0.0
    # other ids are not ignored in reference mode
    other = table_batch(3, 0, 0, 3)
    assert row_of(other, KEY, mode="reference")["value"] > 0.5


def test_singleton_group_in_reference_mode():
    rewards = torch.tensor([0.7, 1.0, 0.0])
    tok = np.array([[3, 4], [3, 5], [4, 4]])
    got = ktae.compute_advantages("ktae", rewards=rewards, group=["s", "p", "p"], token_ids=tok,
                                  mode="reference")
    expect = np.float32(0.7) / (np.float32(1.0) + np.float32(1e-6))
    np.testing.assert_allclose(got[0].numpy(), [expect, expect], rtol=1e-7)
    table = ktae.key_token_table(rewards=rewards, group=["s", "p", "p"], token_ids=tok,
                                 mode="reference")
    assert all(r["value"] == 0.0 for r in table.to_rows() if r["group"] == 0)


@pytest.mark.parametrize("rewards", [[0.5, 2.0, 1.0], [0.0, -1.0, 0.0]])
def test_one_class_group_in_reference_mode(rewards):
    r = torch.tensor(rewards)
    tok = np.array([[3, 4], [3, 5], [4, 4]])
    got = ktae.compute_advantages("ktae", rewards=r, group=[0, 0, 0], token_ids=tok,
                                  mode="reference")
    mean, std = r.mean(), r.std()
    base = (r - mean) / (std + 1e-6)
    np.testing.assert_allclose(got.numpy(), base[:, None].expand(3, 2).numpy(), atol=1e-6)
    table = ktae.key_token_table(rewards=r, group=[0, 0, 0], token_ids=tok, mode="reference")
    assert torch.equal(table.value, torch.zeros_like(table.value))


def test_explicit_correct_replaces_the_runtime_rule():
    """A verifier's accuracy (``correct``) decides the classes; the rewards, which may hold
    shaping terms (here a penalty that makes a correct response's reward negative), still
    set the base advantage."""
    ids = torch.tensor([[5, 6, 7], [5, 8, 9], [5, 6, 9], [5, 8, 8]])
    rewards = torch.tensor([-0.2, 0.0, 1.0, -1.0])  # response 0 is correct but penalised
    correct = torch.tensor([True, False, True, False])
    kw = dict(rewards=rewards, group=[0] * 4, token_ids=ids, mode="reference")
    by_rule = ktae.compute_advantages("ktae", **kw)
    by_correct = ktae.compute_advantages("ktae", correct=correct, **kw)
    as_if_rewards = ktae.compute_advantages(
        "ktae", **{**kw, "rewards": correct.float()})
    base = ktae.compute_advantages("grpo", rewards=rewards, group=[0] * 4)[:, None]
    base01 = ktae.compute_advantages("grpo", rewards=correct.float(), group=[0] * 4)[:, None]
    torch.testing.assert_close(by_correct - base, as_if_rewards - base01)
    assert not torch.allclose(by_correct, by_rule)
