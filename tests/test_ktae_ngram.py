"""KTAE over n-grams (``ngram=N > 1``): vectorised vs the slow oracle, by hand, edge cases.

The oracle (tests/oracle.py ``response_spans``, ``exact_token_stats``, ``exact_ktae``)
walks every response column by column and builds the spans straight from their
definition: n consecutive columns, all real, none an ignored id.
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
    batch_specs,
    bm25_tf,
    dense_group_index,
    exact_ktae,
    exact_token_stats,
    examples,
    random_batch,
    single_thread,  # noqa: F401  (autouse fixture)
)

import ktae


@st.composite
def ngram_options(draw, token_ids: np.ndarray, mask: np.ndarray):
    opts = dict(ngram=draw(st.integers(2, 4)),
                ngram_reduce=draw(st.sampled_from(["maxabs", "mean"])))
    if draw(st.booleans()):
        opts.update(base=draw(st.sampled_from(["grpo", "drgrpo", "rloo"])),
                    h1=draw(st.sampled_from([0.0, 1.0, 2.0])), h2=1.0,
                    h3=draw(st.sampled_from([0.0, 0.5, 1.0])),
                    k1=draw(st.sampled_from([0.5, 2.0])), b=draw(st.sampled_from([0.0, 0.5, 1.0])),
                    top=draw(st.sampled_from([0.5, 1.0])),
                    variant=draw(st.sampled_from(["runtime", "paper"])))
    if draw(st.booleans()):
        opts["reward_threshold"] = draw(st.sampled_from([-0.2, 0.3]))
    present = sorted(set(token_ids[mask.astype(bool)].tolist()))
    if present and draw(st.booleans()):
        opts["ignore_token_ids"] = [present[draw(st.integers(0, len(present) - 1))]]
    chunk = draw(st.sampled_from([None, 1, 9, 10**9]))
    if chunk is not None:
        opts["chunk_tokens"] = chunk
    return opts


def oracle_options(opts: dict) -> dict:
    return {k: v for k, v in opts.items() if k != "chunk_tokens"}


def check_span_table(table, batch: dict, opts: dict) -> None:
    """Every row of ``key_token_table(ngram=N)`` against ``exact_token_stats(ngram=N)``."""
    n = opts["ngram"]
    expect = exact_token_stats(batch["rewards"], batch["group"], batch["token_ids"],
                               batch["mask"], **oracle_options(opts))
    dense = dense_group_index(batch["group"])
    expect = {(dense[g], span): row for (g, span), row in expect.items()}
    assert table.span is not None and table.span.shape == (len(table), n)
    rows = table.to_rows()
    got = {(r["group"], r["span"]): r for r in rows}
    assert len(got) == len(rows), "duplicate (group, span) rows"
    assert set(got) == set(expect), (f"missing {sorted(set(expect) - set(got))}, "
                                     f"extra {sorted(set(got) - set(expect))}")
    ids = {}
    for key, e in expect.items():
        g = got[key]
        assert ids.setdefault(key[1], g["token"]) == g["token"], "one span, two ids"
        for f in "abcd":
            assert g[f] == e[f], f"{key}: {f} expected {e[f]}, got {g[f]}"
        for f in FLOAT_FIELDS:
            assert math.isfinite(g[f]), f"{key}: {f} is {g[f]}"
            if f == "direction" and math.isnan(e[f]):
                continue  # one-class group
            assert abs(g[f] - e[f]) <= 1e-9 * max(1.0, abs(e[f])), (key, f, e[f], g[f])
    assert len(set(ids.values())) == len(ids), "two spans share an id"
    assert sorted(ids, key=ids.get) == sorted(ids), "span ids are not in lexicographic order"


@settings(**examples(150))
@given(spec=batch_specs(vocab=(2, 6)), data=st.data())
def test_ngram_matches_oracle(spec, data):
    batch = random_batch(**spec)
    opts = data.draw(ngram_options(batch["token_ids"], batch["mask"]))
    rewards = torch.from_numpy(batch["rewards"])
    inputs = dict(group=batch["group"], token_ids=batch["token_ids"], mask=batch["mask"])
    got = ktae.compute_advantages("ktae", rewards=rewards, **inputs, **opts).numpy()
    expect = exact_ktae(batch["rewards"], batch["group"], batch["token_ids"], batch["mask"],
                        **oracle_options(opts))
    assert np.isfinite(got).all() and (got[batch["mask"] == 0] == 0).all()
    diff = np.abs(got - expect)
    i, t = np.unravel_index(int(np.argmax(diff)), diff.shape)
    assert diff[i, t] <= 1e-6, (f"response {i} column {t}: expected {expect[i, t]!r}, got "
                                f"{got[i, t]!r}; options {opts}")
    check_span_table(ktae.key_token_table(rewards=rewards, **inputs, **opts), batch, opts)


@settings(**examples(30))
@given(spec=batch_specs(max_groups=3, vocab=(2, 5)), n=st.integers(2, 5), big=st.booleans())
def test_exact_span_ids_with_real_and_huge_vocabularies(spec, n, big):
    """Real vocabularies need ranking from 4-grams on, huge ids from bigrams on: results
    equal the small-id ones (the ids only name the spans; no two spans ever merge)."""
    batch = random_batch(**spec)
    ids = np.unique(batch["token_ids"])
    rng = np.random.default_rng(spec["seed"])
    new = (rng.choice(2**62, size=len(ids), replace=False) if big
           else rng.choice(151_936, size=len(ids), replace=False))
    small = np.searchsorted(ids, batch["token_ids"])  # dense ids 0..V-1
    moved = new[small]
    kw = dict(rewards=torch.from_numpy(batch["rewards"]), group=batch["group"],
              mask=batch["mask"], ngram=n)
    a = ktae.compute_advantages("ktae", token_ids=small, **kw)
    b = ktae.compute_advantages("ktae", token_ids=moved, **kw)
    assert torch.equal(a, b)
    np.testing.assert_allclose(b.numpy(), exact_ktae(batch["rewards"], batch["group"], moved,
                                                     batch["mask"], ngram=n), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------- by hand


def test_spans_separate_answers_that_single_tokens_cannot():
    """``=37`` against ``=73``: every token occurs in every response (unigram values 0),
    the bigrams ``37`` and ``73`` split the classes."""
    eq, three, seven = 10, 3, 7
    ids = torch.tensor([[eq, three, seven]] * 2 + [[eq, seven, three]] * 2)
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    uni = ktae.key_token_table(rewards=rewards, group=[0] * 4, token_ids=ids)
    assert torch.equal(uni.value, torch.zeros_like(uni.value))
    bi = ktae.key_token_table(rewards=rewards, group=[0] * 4, token_ids=ids, ngram=2)
    good, bad = bi.lookup(0, span=[three, seven]), bi.lookup(0, span=[seven, three])
    assert (good["a"], good["b"], bad["a"], bad["b"]) == (2, 0, 0, 2)
    assert good["value"] > 0.5 and bad["value"] == -good["value"]
    base = ktae.compute_advantages("grpo", rewards=rewards, group=[0] * 4)
    adv = ktae.compute_advantages("ktae", rewards=rewards, group=[0] * 4, token_ids=ids, ngram=2)
    assert (adv[:2] > base[:2, None]).all() and (adv[2:] < base[2:, None]).all()


def test_spans_never_cross_padding_holes_or_ignored_tokens():
    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 9, 4, 5, 6]])
    mask = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    t = ktae.key_token_table(rewards=[1.0, 0.0], group=[0, 0], token_ids=ids, mask=mask,
                             ngram=2, ignore_token_ids=[9])
    spans = {r["span"] for r in t.to_rows()}
    assert spans == {(1, 2), (4, 5), (5, 6)}  # not (2, 3) or (3, 4) (padding), nor 9's
    row = t.lookup(0, span=[4, 5])
    assert (row["a"], row["b"]) == (1, 1)
    # L_T = L_F = 3 spans: the TF of (1, 2) is one span in three, in each class
    assert row["tf_correct"] == pytest.approx(bm25_tf(1, 3, 3, 2.0, 0.5), rel=1e-12)


def test_lengths_count_spans_not_tokens():
    ids = torch.tensor([[1, 2, 1, 2, 1], [1, 2, 3, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    t = ktae.key_token_table(rewards=[1.0, 0.0], group=[0, 0], token_ids=ids, mask=mask, ngram=2)
    row = t.lookup(0, span=(1, 2))  # twice among the 4 correct spans, once among 2 incorrect
    assert row["tf_correct"] == pytest.approx(bm25_tf(2, 4, 2, 2.0, 0.5), rel=1e-12)
    assert row["tf_incorrect"] == pytest.approx(bm25_tf(1, 2, 4, 2.0, 0.5), rel=1e-12)


def test_uncovered_tokens_get_the_base_advantage_only():
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 5, 4], [7, 0, 0, 0], [1, 8, 4, 4]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]])
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    kw = dict(rewards=rewards, group=[0] * 4, token_ids=ids, mask=mask)
    base = ktae.compute_advantages("grpo", rewards=rewards, group=[0] * 4)
    adv = ktae.compute_advantages("ktae", **kw, ngram=3, ignore_token_ids=[8])
    assert adv[2, 0] == base[2]  # a response shorter than the span
    assert (adv[3, :] == base[3]).all()  # 8 splits row 3 into runs of 1 and 2 tokens
    assert (adv[0] != base[0]).all()
    # a span length beyond every response: GRPO everywhere
    torch.testing.assert_close(ktae.compute_advantages("ktae", **kw, ngram=5),
                               base[:, None] * mask, rtol=0, atol=0)
    assert len(ktae.key_token_table(**kw, ngram=5)) == 0


def test_reductions_by_hand():
    """Token 2 of row 0 is covered by spans (1, 2) and (2, 3)."""
    ids = torch.tensor([[1, 2, 3], [1, 2, 4], [5, 2, 3], [6, 6, 6]])
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    kw = dict(rewards=rewards, group=[0] * 4, token_ids=ids)
    t = ktae.key_token_table(**kw, ngram=2)
    v12, v23 = t.lookup(0, span=[1, 2])["value"], t.lookup(0, span=[2, 3])["value"]
    assert v12 > 0 and abs(v23) < abs(v12)
    base = ktae.compute_advantages("grpo", rewards=rewards, group=[0] * 4)
    maxabs = ktae.compute_advantages("ktae", **kw, ngram=2, ngram_reduce="maxabs") - base[:, None]
    mean = ktae.compute_advantages("ktae", **kw, ngram=2, ngram_reduce="mean") - base[:, None]
    assert maxabs[0, 1].item() == pytest.approx(v12, abs=1e-15)
    assert mean[0, 1].item() == pytest.approx((v12 + v23) / 2, abs=1e-15)
    assert maxabs[0, 0].item() == pytest.approx(v12, abs=1e-15)  # one span covers the first
    assert mean[0, 2].item() == pytest.approx(v23, abs=1e-15)


def test_maxabs_ties_go_to_the_earlier_span():
    """(1, 2) in 2 of 2 correct and 1 of 2 incorrect responses, (2, 3) the mirror image
    (equal counts and lengths too): values v and -v, a tie on token 2."""
    ids = torch.tensor([[1, 2, 3], [1, 2, 6], [1, 2, 3], [5, 2, 3]])
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    kw = dict(rewards=rewards, group=[0] * 4, token_ids=ids, ngram=2)
    t = ktae.key_token_table(**kw)
    v12, v23 = t.lookup(0, span=[1, 2])["value"], t.lookup(0, span=[2, 3])["value"]
    assert v12 > 0.1 and v23 == pytest.approx(-v12, rel=1e-12)
    base = ktae.compute_advantages("grpo", rewards=rewards, group=[0] * 4)
    value = ktae.compute_advantages("ktae", **kw, ngram_reduce="maxabs") - base[:, None]
    assert value[0, 1].item() == pytest.approx(v12, abs=1e-15)  # (1, 2) starts first
    assert value[2, 1].item() == pytest.approx(v12, abs=1e-15)
    mean = ktae.compute_advantages("ktae", **kw, ngram_reduce="mean") - base[:, None]
    assert abs(mean[0, 1].item()) < 1e-12


def test_span_table_columns_lookup_and_format():
    ids = torch.tensor([[3, 1, 4, 1, 5], [3, 1, 4, 1, 6], [2, 7, 1, 8, 2], [2, 7, 1, 8, 3]])
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    t = ktae.key_token_table(rewards=rewards, group=[0] * 4, token_ids=ids, ngram=3)
    assert t.ngram == 3 and t.span.shape == (len(t), 3) and t.span.dtype == torch.int64
    row = t.lookup(0, span=(3, 1, 4))
    assert row["span"] == (3, 1, 4) and (row["a"], row["b"]) == (2, 0)
    assert t.lookup(0, row["token"]) == row
    with pytest.raises(KeyError, match=r"span \(4, 1, 3\) does not occur in group 0"):
        t.lookup(0, span=[4, 1, 3])
    with pytest.raises(ValueError, match="span: expected 3 token ids"):
        t.lookup(0, span=[3, 1])
    with pytest.raises(ValueError, match="exactly one of token and span"):
        t.lookup(0)
    assert set(t.to_rows()[0]) == {"group", "token", "span", "a", "b", "c", "d", "p_value",
                                   "fisher", "info_gain", "tf_correct", "tf_incorrect",
                                   "direction", "value"}
    text = t.format(top=len(t), decode=str)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["group", "span", "text"] and len(lines) == len(t) + 1
    assert "3 1 4" in text and "'314'" in text
    uni = ktae.key_token_table(rewards=rewards, group=[0] * 4, token_ids=ids)
    assert uni.span is None and uni.ngram == 1 and "span" not in uni.to_rows()[0]
    assert uni.lookup(0, span=[5]) == uni.lookup(0, 5)


def test_chunking_does_not_change_span_results():
    batch = random_batch(5, sizes=[8] * 9, vocab=4, max_len=20)
    kw = dict(rewards=torch.from_numpy(batch["rewards"]), group=batch["group"],
              token_ids=batch["token_ids"], mask=batch["mask"], ngram=3)
    whole = ktae.compute_advantages("ktae", **kw, chunk_tokens=10**9)
    table = ktae.key_token_table(**kw, chunk_tokens=10**9)
    for chunk in (1, 17, 100):
        torch.testing.assert_close(ktae.compute_advantages("ktae", **kw, chunk_tokens=chunk),
                                   whole, rtol=0, atol=1e-12)
        other = ktae.key_token_table(**kw, chunk_tokens=chunk)
        for f in ("group", "token", "span", "a", "b", "c", "d"):
            assert torch.equal(getattr(other, f), getattr(table, f)), f
        torch.testing.assert_close(other.value, table.value, rtol=0, atol=1e-12)


def test_credit_pictures_show_spans():
    from ktae.viz import credit_html, group_credit

    ids = torch.tensor([[10, 3, 7], [10, 3, 7], [10, 7, 3], [10, 7, 3]])
    d = group_credit(rewards=[1.0, 1.0, 0.0, 0.0], token_ids=ids, mask=torch.ones(4, 3),
                     decode=lambda t: "=" if t == 10 else str(t), ngram=2)
    top = d["table_rows"][0]
    assert len(top["span"]) == 2 and len(top["text"]) == 2
    assert {r["text"] for r in d["table_rows"]} >= {"37", "73"}
    page = credit_html(**d)
    assert "3 7" in page and "7 3" in page
