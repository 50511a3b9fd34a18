"""Counting without a sort: KTAE's scatter counts (ktae.core.scatter_counts) against the
sort they replace (ktae.core.token_counts.count_units), and prefix-value's classes from
pair common prefixes (ktae.core.prefix_lcp) against one torch.unique and the slow
reference. Both algorithms stay selectable; the values must be the same bits."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from oracle import exact_ktae
from prefix_value_oracle import slow_prefix_values
from test_prefix_value import random_groups

import ktae
from ktae.core import (
    chunk_pool,
    jit_counts,
    prefix_lcp,
    prefix_value,
    scatter_counts,
    token_counts,
)
from ktae.core import ktae as ktae_module
from ktae.core.groups import group_index
from ktae.core.ngrams import find_spans
from ktae.core.token_counts import count_units, real_positions, row_lengths


def _keys(seed: int, n: int, high: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randint(0, high, (max(1, n // 3),), generator=gen)
    return pool[torch.randint(0, pool.numel(), (n,), generator=gen)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("high", [7, 5000, 1 << 62])
def test_dense_and_hashed_ids_are_unique_with_its_inverse(seed, high):
    key = _keys(seed, 3000, high)
    uniq, inv = torch.unique(key, return_inverse=True)
    if high < 1 << 20:
        d_uniq, d_inv = scatter_counts.dense_ids(key, high)
        assert d_inv.dtype == torch.int32  # a small lookup table
        assert torch.equal(d_uniq, uniq) and torch.equal(d_inv.long(), inv)
    h_uniq, h_inv = scatter_counts.hash_ids(key)
    assert torch.equal(h_uniq.sort().values, uniq)  # each key once, in slot order
    assert torch.equal(h_uniq[h_inv], key)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("high", [7, 5000, 1 << 62])
def test_representatives_name_each_distinct_key_by_one_of_its_copies(seed, high):
    key = _keys(seed, 3000, high)
    rep = scatter_counts.representatives(key)
    assert torch.equal(key[rep], key) and torch.equal(rep[rep], rep)
    assert rep.unique().numel() == key.unique().numel()  # one representative per key


def test_representatives_survive_colliding_slots(monkeypatch):
    # one slot per key and every key hashed alike in the first round: most keys lose it
    monkeypatch.setattr(scatter_counts, "_REP_FACTOR", 1)
    monkeypatch.setattr(scatter_counts, "_MULTIPLIERS", (0,) + scatter_counts._MULTIPLIERS)
    key = _keys(0, 500, 1 << 40)
    rep = scatter_counts.representatives(key)
    assert torch.equal(key[rep], key) and rep.unique().numel() == key.unique().numel()


@pytest.mark.parametrize("bound", [1, 2, 9, 300])
def test_dense_ids_of_keys_at_both_ends_of_the_range(bound):
    # the running count's first and last entries, and repeats of one key
    key = torch.tensor([bound - 1, 0, bound - 1, 0, bound // 2, bound - 1])
    uniq, inv = scatter_counts.dense_ids(key, bound)
    want_uniq, want_inv = torch.unique(key, return_inverse=True)
    assert torch.equal(uniq, want_uniq) and torch.equal(inv.long(), want_inv)
    present = scatter_counts.mark(key, bound)
    assert present.dtype == torch.bool and torch.equal(present.nonzero().squeeze(1), want_uniq)


def test_ids_of_no_keys():
    empty = torch.zeros(0, dtype=torch.int64)
    for uniq, inv in (scatter_counts.dense_ids(empty, 10), scatter_counts.hash_ids(empty)):
        assert uniq.numel() == 0 and inv.numel() == 0


def _batch(seed: int, vocab: int, max_group: int = 12):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, max_group + 1, (int(torch.randint(1, 6, (1,), generator=gen)),),
                          generator=gen)
    group = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
    group = group[torch.randperm(group.numel(), generator=gen)]  # groups not contiguous
    B, T = group.numel(), 9
    ids = torch.randint(0, 6, (B, T), generator=gen)
    ids = torch.where(torch.rand(B, T, generator=gen) < 0.3, ids * (vocab // 6) + 1, ids)
    mask = torch.rand(B, T, generator=gen) < 0.8
    mask[0] = False  # an empty response
    correct = torch.rand(B, generator=gen) < 0.5
    return group, ids, mask, correct


def _rows(cnt) -> list[tuple]:
    cols = (cnt.group, cnt.token, cnt.a, cnt.b, cnt.count_correct, cnt.count_incorrect,
            cnt.run_length)
    return sorted(zip(*(c.tolist() for c in cols), strict=True))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("vocab", [6, 152_000, 1 << 40])  # bitmaps; hashed (group, id) keys
def test_scatter_counts_equal_the_sorted_counts(seed, vocab):
    group, ids, mask, correct = _batch(seed, vocab)
    gid, P = group_index(group, group.numel(), torch.device("cpu"))
    flat, row, row_len = real_positions(mask)
    tok = ids.reshape(-1)[flat]
    new = scatter_counts.count_units_scatter(tok, int(tok.max()) + 1, row, row_len, gid, P,
                                             correct)
    old = count_units(tok.clone(), row, row_len, gid, P, correct)
    assert new.order is None and new.pair is not None
    assert _rows(new) == _rows(old)
    for name in ("group_n_correct", "group_n_incorrect", "group_len_correct",
                 "group_len_incorrect"):
        assert torch.equal(getattr(new, name), getattr(old, name))
    # each token gets its own pair's value (here: a code of the pair)
    code = lambda c: (c.group * 1000 + c.a * 100 + c.b * 10 + c.count_correct).double()  # noqa: E731
    assert torch.equal(new.spread(code(new)), old.spread(code(old)))
    positions = torch.arange(tok.numel()) * 2
    assert torch.equal(new.spread_at(code(new), positions, 2 * tok.numel()),
                       old.spread_at(code(old), positions, 2 * tok.numel()))


def _represented_rows(cnt) -> list[tuple]:
    """:func:`_rows` of the pairs counted by representatives (the slots pairs use)."""
    used = torch.unique(cnt.pair)
    cols = (cnt.group, cnt.token, cnt.a, cnt.b, cnt.count_correct, cnt.count_incorrect,
            cnt.run_length)
    return sorted(zip(*(c[used].tolist() for c in cols), strict=True))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("n", [2, 3])
def test_span_counts_by_representatives_equal_the_sorted_counts(seed, n):
    group, ids, mask, correct = _batch(seed, 152_000)
    gid, P = group_index(group, group.numel(), torch.device("cpu"))
    spans, key = find_spans(ids, mask, n)
    if not key.numel():
        return
    new = scatter_counts.count_spans_scatter(key, int(key.max()) + 1, spans.row,
                                             spans.row_len, gid, P, correct)
    old = count_units(key.clone(), spans.row, spans.row_len, gid, P, correct)
    assert _represented_rows(new) == _rows(old)
    unused = torch.ones(key.numel(), dtype=torch.bool).index_fill_(0, new.pair, False)
    assert not (new.a[unused].any() or new.b[unused].any() or new.run_length[unused].any())
    for name in ("group_n_correct", "group_n_incorrect", "group_len_correct",
                 "group_len_incorrect"):
        assert torch.equal(getattr(new, name), getattr(old, name))
    code = lambda c: (c.group * 1000 + c.a * 100 + c.b * 10 + c.count_correct).double()  # noqa: E731
    assert torch.equal(new.spread(code(new)), old.spread(code(old)))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("n", "vocab"), [(2, 152_000), (3, 152_000), (4, 152_000), (3, 1 << 40)])
def test_span_ids_of_raw_token_ids_are_equal_exactly_for_equal_spans(seed, n, vocab):
    _, ids, mask, _ = _batch(seed, vocab)
    spans, raw = find_spans(ids, mask, n, dense=False)
    _, dense = find_spans(ids, mask, n)
    words = spans.token_ids(torch.arange(spans.start.numel()))
    same_words = (words[:, None, :] == words[None, :, :]).all(2)
    assert torch.equal(raw[:, None] == raw[None, :], same_words)
    assert torch.equal(dense[:, None] == dense[None, :], same_words)
    if n == 3 and vocab < 1 << 20:  # raw codes: the lexicographic code of the ids
        v = int(spans.tokens.max()) + 1
        assert torch.equal(raw, (words[:, 0] * v + words[:, 1]) * v + words[:, 2])


def test_span_counts_take_the_sort_for_large_groups_and_keys(monkeypatch):
    group, ids, mask, correct = _batch(0, 100)
    gid, P = group_index(group, group.numel(), torch.device("cpu"))
    spans, key = find_spans(ids, mask, 2)
    args = (spans.row, spans.row_len, gid, P, correct)
    assert scatter_counts.count_spans_scatter(key, 1 << 62, *args) is None  # beyond 62 bits
    monkeypatch.setattr(scatter_counts, "MAX_GROUP", 1)
    assert scatter_counts.count_spans_scatter(key, int(key.max()) + 1, *args) is None


def test_the_sort_takes_groups_over_the_limit_and_keys_beyond_62_bits(monkeypatch):
    group, ids, mask, correct = _batch(0, 100, max_group=12)
    gid, P = group_index(group, group.numel(), torch.device("cpu"))
    flat, row, row_len = real_positions(mask)
    tok = ids.reshape(-1)[flat]
    monkeypatch.setattr(scatter_counts, "MAX_GROUP", 1)
    assert scatter_counts.count_units_scatter(tok, 100, row, row_len, gid, P, correct) is None
    monkeypatch.undo()
    assert scatter_counts.pair_ids(tok, 1 << 61, row, gid, 4) is None  # 4 groups x 2**61
    assert scatter_counts.pair_ids(tok, 1 << 61, row, gid, 1) is not None


KTAE_CASES = [
    {},
    {"mode": "reference"},
    {"ignore_token_ids": [3, 4]},
    {"apply": "wrong", "base": "rloo"},
    {"ngram": 2},
    {"ngram": 3, "ngram_reduce": "maxabs", "chunk_tokens": 16},
    {"ngram": 2, "ignore_token_ids": [1]},
    {"variant": "paper", "h3": 0.5, "chunk_tokens": 16},
]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("opts", KTAE_CASES + [{"ignore_token_ids": [0, 1, 5]},
                                               {"mode": "reference", "ignore_token_ids": [1]}])
def test_ktae_values_are_the_same_bits_with_either_counting(monkeypatch, seed, opts):
    group, ids, mask, correct = _batch(seed, 152_000)
    rewards = correct.double()
    out = {}
    for counting in ktae_module.COUNTINGS:
        monkeypatch.setattr(ktae_module, "COUNTING", counting)
        out[counting] = ktae.compute_advantages("ktae", rewards=rewards, group=group,
                                                token_ids=ids, mask=mask, **opts)
    assert all(torch.equal(v, out["sort"]) for v in out.values()), list(out)


def zipf_batch(seed: int, groups: int = 6, size: int = 8, max_len: int = 300,
               vocab: int = 151_936, shift: int = 0):
    """A heavy-tailed batch: ids from a Zipf law (exponent 1) over ``vocab`` ids, shuffled
    over the id range and then shifted by ``shift``, log-normal lengths, groups not
    contiguous, a mix of all-correct, all-wrong and mixed groups."""
    gen = torch.Generator().manual_seed(seed)
    B = groups * size
    ranks = torch.arange(1, vocab + 1, dtype=torch.float64)
    cdf = torch.cumsum(1 / ranks, 0)
    cdf /= cdf[-1].clone()
    draw = torch.searchsorted(cdf, torch.rand(B * max_len, generator=gen, dtype=torch.float64))
    ids = torch.randperm(vocab, generator=gen)[draw.clamp_max(vocab - 1)].view(B, max_len)
    lengths = (max_len / 3 * torch.exp(0.8 * torch.randn(B, generator=gen))).long()
    mask = torch.arange(max_len)[None, :] < lengths.clamp(0, max_len)[:, None]
    group = torch.randperm(B, generator=gen) % groups
    correct = torch.rand(B, generator=gen) < torch.tensor([0.0, 1.0, 0.5])[group % 3]
    return group, ids + shift, mask, correct


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shift", [0, 1 << 40])  # dense ids; ids too sparse for a bitmap
@pytest.mark.parametrize("opts", [{}, {"ngram": 3}, {"ignore_token_ids": [0, 1]},
                                  {"chunk_tokens": 300}])
def test_counting_of_heavy_tailed_batches_equals_the_oracle(monkeypatch, seed, shift, opts):
    group, ids, mask, correct = zipf_batch(seed, shift=shift)
    kw = dict(rewards=correct.double(), group=group, token_ids=ids, mask=mask)
    want = torch.as_tensor(exact_ktae(**{k: v.numpy() for k, v in kw.items()},
                                      **{k: v for k, v in opts.items() if k != "chunk_tokens"}))
    out = {}
    for counting in ktae_module.COUNTINGS:
        monkeypatch.setattr(ktae_module, "COUNTING", counting)
        out[counting] = ktae.compute_advantages("ktae", **kw, **opts)
    assert all(torch.equal(v, out["sort"]) for v in out.values()), list(out)
    assert torch.allclose(out["auto"].double(), want.to(torch.float64), rtol=0, atol=1e-6)


def _spy(monkeypatch, module, name: str, calls: list):
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(name) or real(*a, **k))


@pytest.mark.parametrize(("groups", "size", "max_len", "shift", "expected"), [
    (6, 8, 3000, 0, "scatter"),  # a 152k vocabulary, 40k tokens: bitmaps
    (6, 8, 300, 0, "sort"),  # the same vocabulary, 4k tokens: the bitmap is too sparse
    (6, 8, 3000, 1 << 40, "sort"),  # ids beyond the bitmap's reach
    (400, 2, 60, 0, "sort"),  # many groups of few tokens: (group, token) pairs too sparse
])
def test_auto_counting_takes_the_sort_where_ids_would_be_hashed(monkeypatch, groups, size,
                                                                 max_len, shift, expected):
    monkeypatch.setattr(jit_counts, "AVAILABLE", False)  # the choice without numba
    group, ids, mask, correct = zipf_batch(0, groups, size, max_len, shift=shift)
    seen: set = set()  # the first response of each group wrong, the others right
    correct = torch.tensor([g in seen or seen.add(g) is not None for g in group.tolist()])
    calls: list = []
    _spy(monkeypatch, ktae_module, "count_units", calls)
    _spy(monkeypatch, scatter_counts, "hash_ids", calls)
    _spy(monkeypatch, scatter_counts, "dense_ids", calls)
    kw = dict(rewards=correct.double(), group=group, token_ids=ids, mask=mask,
              chunk_tokens=1 << 20)  # one chunk
    auto = ktae.compute_advantages("ktae", **kw)
    assert "hash_ids" not in calls
    assert ("count_units" in calls) == (expected == "sort")
    calls.clear()
    monkeypatch.setattr(ktae_module, "COUNTING", "scatter")  # hashes where auto sorts
    assert torch.equal(ktae.compute_advantages("ktae", **kw), auto)
    assert ("hash_ids" in calls) == (expected == "sort") and "count_units" not in calls


@pytest.mark.parametrize("rows", [slice(None), slice(3, 11), slice(2, 9, 3)])
@pytest.mark.parametrize("T", [0, 5, 8, 24, 61])
@pytest.mark.parametrize("block", [1, 5, 1 << 17])  # words per block of rows
def test_row_lengths_equal_the_mask_sums(monkeypatch, rows, T, block):
    monkeypatch.setattr(token_counts, "_ROW_LENGTH_BLOCK", block)
    mask = torch.rand(12, T, generator=torch.Generator().manual_seed(T)) < 0.6
    for m in (mask[rows], mask[rows].T.contiguous().T, mask.T[:, rows].T):
        got = row_lengths(m)
        assert got.dtype == torch.int64 and torch.equal(got, m.sum(1))


def test_values_read_from_non_contiguous_ids_are_the_same_bits():
    group, ids, mask, correct = zipf_batch(1)
    kw = dict(rewards=correct.double(), group=group, mask=mask)
    out = ktae.compute_advantages("ktae", token_ids=ids, **kw)
    fortran = ids.T.contiguous().T  # the same ids, column-major
    assert not fortran.is_contiguous()
    assert torch.equal(ktae.compute_advantages("ktae", token_ids=fortran, **kw), out)


@pytest.mark.parametrize(("ngram", "counter"), [(1, "count_units_scatter"),
                                              (3, "count_spans_scatter")])
def test_the_counting_switch_picks_the_algorithm(monkeypatch, ngram, counter):
    monkeypatch.setattr(jit_counts, "AVAILABLE", False)  # the torch paths' switch
    group, ids, mask, correct = _batch(1, 50)
    kw = dict(rewards=correct.double(), group=group, token_ids=ids, mask=mask, ngram=ngram)
    calls = []
    real = getattr(ktae_module, counter)
    monkeypatch.setattr(ktae_module, counter, lambda *a, **k: calls.append(1) or real(*a, **k))
    ktae.compute_advantages("ktae", **kw)
    assert calls
    calls.clear()
    monkeypatch.setattr(ktae_module, "COUNTING", "sort")
    ktae.compute_advantages("ktae", **kw)
    assert not calls


def _exact_prefix_ids(ids, mask):
    """Per real token (row-major), an id shared exactly by the tokens whose responses have
    the same real tokens up to it (groups ignored: the lcp search compares within one)."""
    seen, out = {}, []
    for row, m in zip(ids.tolist(), mask.tolist(), strict=True):
        prefix = ()
        for x, keep in zip(row, m, strict=True):
            if keep:
                prefix += (x,)
                out.append(seen.setdefault(prefix, len(seen)))
    return torch.tensor(out, dtype=torch.int64)


def _exact_lcp(seed):
    """A random batch and its pair common-prefix lengths found with exact prefix ids."""
    _, group, ids, mask, _ = random_groups(seed, holes=seed % 2 == 1)
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    gid, P = group_index(torch.tensor(group), len(group), torch.device("cpu"))
    flat, _, length = real_positions(mask)
    start = length.cumsum(0) - length
    prefix_id = _exact_prefix_ids(ids, mask)
    members, rank = prefix_lcp.members_of_groups(gid, P)
    lcp = prefix_lcp.pair_lcp(lambda a, b, fa, fb: prefix_id[a] == prefix_id[b], start,
                              length, members)
    return ids, mask, gid, P, flat, start, length, members, rank, lcp


@pytest.mark.parametrize("seed", range(10))
def test_pair_lcp_is_the_common_prefix_length(seed):
    ids, mask, _, P, _, _, _, members, _, lcp = _exact_lcp(seed)
    real = [[x for x, k in zip(r, m, strict=True) if k] for r, m in
            zip(ids.tolist(), mask.tolist(), strict=True)]
    for g in range(P):
        for a, i in enumerate(members[g].tolist()):
            for b, j in enumerate(members[g].tolist()):
                if i < 0 or j < 0:
                    assert lcp[g, a, b] == 0
                    continue
                n = 0
                while n < min(len(real[i]), len(real[j])) and real[i][n] == real[j][n]:
                    n += 1
                assert lcp[g, a, b] == n


def _exact_classes_by_every_token(cls, tokens, heads) -> bool:
    """The exactness check of the lcp classes read at every token (as it was first
    written): every token has its representative's token, every representative is its
    own, and where the representative changes inside a response the previous classes
    agree."""
    if not bool((tokens[cls] == tokens).all()) or not bool((cls[cls] == cls).all()):
        return False
    step = torch.diff(cls) != 1
    step[(heads - 1)[heads > 0]] = False
    x = step.nonzero().squeeze(1) + 1
    return bool((cls[x - 1] == cls[cls[x] - 1]).all())


@pytest.mark.parametrize("seed", range(10))
def test_the_exactness_check_reads_only_shared_tokens_and_decides_alike(seed):
    ids, _, gid, _, flat, start, length, members, rank, lcp = _exact_lcp(seed)
    heads = start[length > 0]
    tokens = ids.reshape(-1)[flat]
    cls = prefix_lcp.representative_classes(lcp, members, rank, gid, start, tokens.numel())
    assert prefix_lcp.classes_are_exact(cls, tokens, heads)
    gen = torch.Generator().manual_seed(seed)
    verdicts = set()
    for _ in range(40):  # classes merged or moved at random: both checks decide alike
        bad = cls.clone()
        x = torch.randint(0, cls.numel(), (int(torch.randint(1, 4, (1,), generator=gen)),),
                          generator=gen)
        bad[x] = torch.randint(1, cls.numel(), (x.numel(),), generator=gen)  # 0: only at heads
        want = _exact_classes_by_every_token(bad, tokens, heads)
        assert prefix_lcp.classes_are_exact(bad, tokens, heads) == want
        verdicts.add(want)
    assert False in verdicts


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("unit", ["token", "span"])
def test_prefix_value_is_the_same_bits_with_either_classes(monkeypatch, seed, unit):
    rewards, group, ids, mask, correct = random_groups(seed, holes=seed % 3 == 0)
    kw = dict(rewards=torch.tensor(rewards), group=torch.tensor(group),
              token_ids=torch.tensor(ids), mask=torch.tensor(mask))
    out = {}
    for classes in prefix_value.CLASSES_ALL:
        monkeypatch.setattr(prefix_value, "CLASSES", classes)
        out[classes] = ktae.compute_advantages("prefix-value", **kw, apply="all", unit=unit)
    assert all(torch.equal(v, out["lcp"]) for v in out.values()), list(out)


def test_the_classes_switch_picks_the_algorithm(monkeypatch):
    rewards, group, ids, mask, correct = random_groups(2)
    gid, P = group_index(torch.tensor(group), len(group), torch.device("cpu"))
    calls = []
    real = prefix_lcp.pair_lcp
    monkeypatch.setattr(prefix_lcp, "pair_lcp", lambda *a: calls.append(1) or real(*a))
    args = (torch.tensor(ids), torch.tensor(mask), torch.tensor(correct), gid, P)
    prefix_value.prefix_values(*args)
    assert calls
    calls.clear()
    monkeypatch.setattr(prefix_value, "CLASSES", "unique")
    prefix_value.prefix_values(*args)
    assert not calls


@pytest.mark.parametrize("seed", range(6))
def test_groups_over_the_lcp_limit_take_the_unique_path_and_match_the_reference(
        monkeypatch, seed):
    monkeypatch.setattr(prefix_lcp, "MAX_GROUP", 2)
    calls = []
    real = prefix_lcp.pair_lcp
    monkeypatch.setattr(prefix_lcp, "pair_lcp", lambda *a: calls.append(1) or real(*a))
    rewards, group, ids, mask, correct = random_groups(seed)
    gid, P = group_index(torch.tensor(group), len(group), torch.device("cpu"))
    values, credit = prefix_value.prefix_values(torch.tensor(ids), torch.tensor(mask),
                                                torch.tensor(correct), gid, P)
    v_ref, d_ref = slow_prefix_values(ids, mask, correct, group)
    m = torch.tensor(mask)
    np.testing.assert_allclose(values[m].numpy(), [x for r in v_ref for x in r], atol=1e-12)
    np.testing.assert_allclose(credit[m].numpy(), [x for r in d_ref for x in r], atol=1e-12)
    assert bool(calls) == (max(np.bincount(group)) <= 2)  # lcp only for groups of <= 2


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("unit", ["token", "span", "word"])
@pytest.mark.parametrize("classes", prefix_value.CLASSES_ALL)
def test_prefix_value_is_the_same_bits_in_any_chunking(monkeypatch, seed, unit, classes):
    monkeypatch.setattr(prefix_value, "CLASSES", classes)
    rewards, group, ids, mask, correct = random_groups(seed, holes=seed % 2 == 0)
    kw = dict(rewards=torch.tensor(rewards), group=torch.tensor(group),
              token_ids=torch.tensor(ids), mask=torch.tensor(mask), apply="all", unit=unit,
              correct=torch.tensor(correct))
    if unit == "word":
        kw["word_starts"] = torch.tensor(ids) % 2 == 0
    whole = ktae.compute_advantages("prefix-value", **kw)
    monkeypatch.setattr(prefix_value, "CHUNK_TOKENS", 3)  # about a group per chunk
    chunks = []
    real = prefix_value.group_chunks
    monkeypatch.setattr(prefix_value, "group_chunks",
                        lambda *a, **k: chunks.extend(real(*a, **k)) or chunks)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        chunked = ktae.compute_advantages("prefix-value", **kw)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(whole, chunked)
    mixed = {g for g in set(group.tolist()) if len(set(correct[group == g].tolist())) == 2}
    assert len(chunks) == len(mixed)  # one task per group with both outcomes


@pytest.mark.parametrize("block", [1, 7, 1 << 20])
def test_every_element_of_the_output_is_written_by_one_task(monkeypatch, block):
    # the output starts uninitialised (NaN here): the chunks write their rows, padding
    # included, and the rows of one-class groups get their base advantage (not 0 when
    # the rewards differ above the threshold) in blocks of ``block`` elements
    gen = torch.Generator().manual_seed(block)
    groups, size, T = 9, 4, 6
    group = torch.arange(groups).repeat_interleave(size)
    rewards = torch.rand(groups * size, generator=gen, dtype=torch.float64) + 0.1
    rewards[group % 3 == 0] -= 0.6  # some groups mixed, the others one class
    rewards[group == 4] = 0.0  # one class, equal rewards: base advantage 0
    ids = torch.randint(0, 7, (groups * size, T), generator=gen)
    mask = torch.rand(groups * size, T, generator=gen) < 0.7
    kw = dict(rewards=rewards, group=group, token_ids=ids, mask=mask)
    monkeypatch.setattr(ktae_module, "COUNTING", "sort")
    want = ktae.compute_advantages("ktae", **kw)
    monkeypatch.setattr(chunk_pool, "BASE_BLOCK", block)
    monkeypatch.setattr(ktae_module, "new_output",
                        lambda shape, dtype, device: torch.full(shape, float("nan"),
                                                                dtype=dtype, device=device))
    seq = ktae.compute_advantages("grpo", rewards=rewards, group=group)
    one_class = torch.tensor([len(set((rewards[group == g] > 0).tolist())) == 1
                              for g in group.tolist()])
    threads = torch.get_num_threads()
    try:
        for n, counting in itertools.product((1, 2), ktae_module.COUNTINGS):
            torch.set_num_threads(n)
            monkeypatch.setattr(ktae_module, "COUNTING", counting)
            got = ktae.compute_advantages("ktae", **kw, chunk_tokens=8)
            assert not got.isnan().any()
            assert torch.equal(got.view(torch.int64), want.view(torch.int64))
            assert torch.equal(got[one_class], torch.where(mask, seq[:, None], 0.0)[one_class])
            assert (got[~mask] == 0).all()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("block", [1, 7, 1 << 20])
def test_every_element_of_prefix_values_output_is_written_by_one_task(monkeypatch, block):
    # as KTAE's: the chunks (one per mixed group here) and the blocks of one-class rows
    # write the whole uninitialised (NaN) output
    gen = torch.Generator().manual_seed(block)
    group = torch.arange(9).repeat_interleave(4)
    rewards = torch.rand(36, generator=gen, dtype=torch.float64) + 0.1
    rewards[group % 3 == 0] -= 0.6
    rewards[group == 4] = 0.0
    ids = torch.randint(0, 3, (36, 6), generator=gen)
    mask = torch.rand(36, 6, generator=gen) < 0.7
    kw = dict(rewards=rewards, group=group, token_ids=ids, mask=mask, apply="all")
    want = ktae.compute_advantages("prefix-value", **kw)
    monkeypatch.setattr(chunk_pool, "BASE_BLOCK", block)
    monkeypatch.setattr(prefix_value, "CHUNK_TOKENS", 3)
    monkeypatch.setattr(prefix_value, "new_output",
                        lambda shape, dtype, device: torch.full(shape, float("nan"),
                                                                dtype=dtype, device=device))
    threads = torch.get_num_threads()
    try:
        for n, classes in itertools.product((1, 2), prefix_value.CLASSES_ALL):
            torch.set_num_threads(n)
            monkeypatch.setattr(prefix_value, "CLASSES", classes)
            got = ktae.compute_advantages("prefix-value", **kw)
            assert not got.isnan().any() and (got[~mask] == 0).all()
            assert torch.equal(got.view(torch.int64), want.view(torch.int64))
    finally:
        torch.set_num_threads(threads)


def test_chunks_number_their_kept_groups_densely():
    # groups 0..11, groups 1, 2, 5, 6, 7 left out (one class only): a chunk's (group, token)
    # keys span the groups it counts, not the gaps between them
    group, ids, mask, correct = zipf_batch(0, groups=12, size=4, max_len=40)
    batch = ktae.core.advantages.make_batch(rewards=correct.double(), group=group,
                                            token_ids=ids, mask=mask)
    keep = torch.ones(12, dtype=torch.bool)
    keep[[1, 2, 5, 6, 7]] = False
    for chunk_tokens in (30, 1 << 20):
        chunks = ktae_module._chunks(batch, correct, chunk_tokens, keep)
        kept = []
        for c in chunks:
            rows = c.rows if isinstance(c.rows, torch.Tensor) else torch.arange(batch.gid.numel())[c.rows]
            groups = batch.gid[rows]
            assert keep[groups].all()
            # ranks of the chunk's groups among the kept ones, from 0, in the batch's order
            rank = torch.cumsum(keep, 0)[groups] - 1
            assert torch.equal(c.gid, rank - rank.min()) and c.num_groups == len(set(rank.tolist()))
            kept += groups.unique().tolist()
        assert sorted(kept) == keep.nonzero().squeeze(1).tolist()
