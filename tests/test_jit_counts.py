"""The compiled pass over a chunk (:mod:`ktae.core.jit_counts`): its counts against the
sort's, its values against the oracle and every other path, bit for bit, and when it runs.
numba comes with ``ktae[fast]`` (in ``dev``): CI runs these."""

from __future__ import annotations

import pytest
import torch
from oracle import exact_ktae
from test_sortfree_counts import _rows, _spy, zipf_batch

import ktae
from ktae.core import jit_counts, scatter_counts
from ktae.core import ktae as ktae_module
from ktae.core.groups import group_index
from ktae.core.ngrams import find_spans
from ktae.core.token_counts import count_units, real_positions

pytest.importorskip("numba", reason="numba is not installed (pip install 'ktae[fast]')")


def _batch(seed: int, groups: int, size: int, T: int, vocab: int, dtype=torch.int64):
    gen = torch.Generator().manual_seed(seed)
    group = torch.randperm(groups * size, generator=gen) % groups  # groups interleaved
    ids = torch.randint(0, vocab, (groups * size, T), generator=gen).to(dtype)
    mask = torch.rand(groups * size, T, generator=gen) < 0.7
    mask[1] = False  # an empty response
    correct = torch.rand(groups * size, generator=gen) < 0.5
    return group, ids, mask, correct


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("groups", "size", "vocab", "dtype"), [
    (5, 8, 7, torch.int64),  # few ids: every pair repeats
    (3, 100, 40, torch.int64),  # groups over the bitmaps' limit of 64 responses
    (4, 6, 30_000, torch.int32),
    (6, 4, 2000, torch.int16),
    (6, 4, 200, torch.uint8),
])
def test_counts_equal_the_sorted_counts(seed, groups, size, vocab, dtype):
    group, ids, mask, correct = _batch(seed, groups, size, 11, vocab, dtype)
    gid, P = group_index(group, group.numel(), torch.device("cpu"))
    flat, row, row_len = real_positions(mask)
    want = count_units(ids.reshape(-1)[flat].long(), row, row_len, gid, P, correct)
    order = torch.argsort(gid, stable=True)
    rows = order.numpy()
    inverse, grp, token, a, b, cc, ci = jit_counts.count_rows(
        ids, mask, rows, gid[order].numpy(), correct[order].numpy())
    got = type(want)(group=grp, token=token, a=a, b=b, count_correct=cc, count_incorrect=ci,
                     run_length=cc + ci, order=None, group_n_correct=want.group_n_correct,
                     group_n_incorrect=want.group_n_incorrect,
                     group_len_correct=want.group_len_correct,
                     group_len_incorrect=want.group_len_incorrect)
    assert _rows(got) == _rows(want)
    # the k-th real token read (rows in ``rows``' order) belongs to pair inverse[k]
    read = torch.cat([ids[r][mask[r]].long() for r in rows.tolist()])
    groups_read = torch.cat([gid[r].expand(int(mask[r].sum())) for r in rows.tolist()])
    assert torch.equal(token[inverse.long()], read) and torch.equal(grp[inverse.long()],
                                                                   groups_read)


def test_ids_too_sparse_for_a_table_are_left_to_the_torch_path():
    group, ids, mask, correct = _batch(0, 3, 4, 9, 50)
    rows, gid = torch.arange(12).numpy(), torch.zeros(12, dtype=torch.int64).numpy()
    assert jit_counts.count_rows(ids + (1 << 40), mask, rows, gid, correct.numpy()) is None
    assert jit_counts.count_rows(ids, torch.zeros_like(mask), rows, gid,
                                 correct.numpy()) is None  # no real token


def test_a_negative_id_is_refused_in_one_line():
    group, ids, mask, correct = _batch(0, 2, 4, 6, 9)
    ids[2, 3], mask[2, 3] = -4, True
    with pytest.raises(ValueError, match=r"^token_ids: expected non-negative ids where mask"):
        ktae.compute_advantages("ktae", rewards=correct.double(), group=group,
                                token_ids=ids, mask=mask)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("opts", [{}, {"mode": "reference"}, {"ignore_token_ids": [0, 1]},
                                  {"apply": "wrong", "base": "rloo"},
                                  {"variant": "paper", "chunk_tokens": 64}])
def test_values_are_the_same_bits_as_the_sorts_and_the_oracles(monkeypatch, seed, opts):
    group, ids, mask, correct = zipf_batch(seed, groups=5, size=70, max_len=40)  # > 64
    kw = dict(rewards=correct.double(), group=group, token_ids=ids, mask=mask)
    out = {}
    for counting in ("jit", "sort"):
        monkeypatch.setattr(ktae_module, "COUNTING", counting)
        out[counting] = ktae.compute_advantages("ktae", **kw, **opts)
    assert torch.equal(out["jit"], out["sort"])
    if not opts:
        want = exact_ktae(**{k: v.numpy() for k, v in kw.items()})
        assert torch.allclose(out["jit"].double(), torch.as_tensor(want).double(), rtol=0,
                              atol=1e-6)


@pytest.mark.parametrize(("shift", "least", "path"), [
    (0, 0, "write_rows"),
    (1 << 40, 0, "count_units"),  # ids too sparse for a table over their range: the sort
    (0, None, "dense_ids"),  # a batch under JIT_MIN_POSITIONS: the torch bitmaps
])
def test_auto_runs_the_loops_where_the_ids_are_dense(monkeypatch, shift, least, path):
    if least is not None:
        monkeypatch.setattr(ktae_module, "JIT_MIN_POSITIONS", least)
    group, ids, mask, correct = zipf_batch(0, 6, 8, 3000, shift=shift)
    assert mask.numel() < ktae_module.JIT_MIN_POSITIONS or least is not None
    calls: list = []
    for name, module in (("write_rows", jit_counts), ("count_units", ktae_module),
                         ("dense_ids", scatter_counts)):
        _spy(monkeypatch, module, name, calls)
    kw = dict(rewards=correct.double(), group=group, token_ids=ids, mask=mask)
    auto = ktae.compute_advantages("ktae", **kw)
    assert set(calls) == {path}
    monkeypatch.setattr(ktae_module, "COUNTING", "sort")
    assert torch.equal(ktae.compute_advantages("ktae", **kw), auto)


def test_graded_splits_take_the_torch_path(monkeypatch):
    monkeypatch.setattr(ktae_module, "JIT_MIN_POSITIONS", 0)
    group, ids, mask, correct = zipf_batch(1, 4, 6, 50)
    calls: list = []
    _spy(monkeypatch, jit_counts, "count_rows", calls)
    _spy(monkeypatch, jit_counts, "count_span_rows", calls)
    kw = dict(group=group, token_ids=ids, mask=mask)
    ktae.compute_advantages("ktae", **kw, split="graded",
                            rewards=torch.rand(group.numel(), dtype=torch.float64))
    assert not calls
    ktae.compute_advantages("ktae", **kw, rewards=correct.double())
    ktae.compute_advantages("ktae", **kw, rewards=correct.double(), ngram=3)
    assert calls == ["count_rows", "count_span_rows"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("n", "ignored"), [(2, []), (3, []), (3, [0, 2]), (5, [1])])
def test_span_counts_equal_the_sorted_counts(seed, n, ignored):
    group, ids, mask, correct = _batch(seed, 4, 6, 13, 6)  # few ids: spans repeat
    mask[3, 5] = False  # a hole in a response: no span crosses it
    gid, P = group_index(group, group.numel(), torch.device("cpu"))
    flat, row, _ = real_positions(mask)
    spans, key = find_spans(ids, mask, n, tuple(ignored), flat=flat, row=row, dense=False)
    want = count_units(key.clone(), spans.row, spans.row_len, gid, P, correct)
    order = torch.argsort(gid, stable=True)
    rows = order.numpy()
    got = jit_counts.count_span_rows(ids, mask, rows, gid[order].numpy(),
                                     correct[order].numpy(), n,
                                     torch.tensor(ignored, dtype=torch.int64).numpy(), 13 * 6)
    span_at, row_spans, grp, code, a, b, cc, ci = got
    assert torch.equal(torch.empty_like(row_spans).index_copy_(0, order, row_spans),
                       spans.row_len)
    got_rows = sorted(zip(*(c.tolist() for c in (grp, code, a, b, cc, ci, cc + ci)),
                          strict=True))
    want_rows = sorted(zip(*(c.tolist() for c in (want.group, want.token, want.a, want.b,
                                                    want.count_correct, want.count_incorrect,
                                                    want.run_length)), strict=True))
    assert got_rows == want_rows  # the same codes: each span's ids in base max id + 1
    # the span starting at each real token read, in the order read
    starts = torch.zeros(flat.numel(), dtype=torch.bool).index_fill_(0, spans.start, True)
    read_starts = torch.cat([starts[row == r] for r in rows.tolist()])
    assert torch.equal(span_at >= 0, read_starts)


def test_span_codes_past_62_bits_are_left_to_the_torch_path(monkeypatch):
    group, ids, mask, correct = zipf_batch(2, 4, 6, 60)  # a 152k vocabulary: 4-grams pass
    rows = torch.arange(group.numel()).numpy()
    args = (ids, mask, rows, torch.zeros_like(group).numpy(), correct.numpy())
    none = torch.zeros(0, dtype=torch.int64).numpy()
    assert jit_counts.count_span_rows(*args, 4, none, 24 * 60) is None
    assert jit_counts.count_span_rows(*args, 3, none, 24 * 60) is not None
    kw = dict(rewards=correct.double(), group=group, token_ids=ids, mask=mask, ngram=4)
    auto = ktae.compute_advantages("ktae", **kw)
    monkeypatch.setattr(ktae_module, "COUNTING", "sort")
    assert torch.equal(ktae.compute_advantages("ktae", **kw), auto)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("opts", [{"ngram": 2}, {"ngram": 3, "ngram_reduce": "maxabs"},
                                  {"ngram": 3, "ignore_token_ids": [3, 4], "chunk_tokens": 64}])
def test_span_values_are_the_same_bits_as_the_sorts(monkeypatch, seed, opts):
    group, ids, mask, correct = _batch(seed, 5, 8, 17, 5)  # few ids: mirrored tables tie
    mask[:, 7] &= torch.arange(group.numel()) % 3 == 0  # holes inside responses
    kw = dict(rewards=correct.double(), group=group, token_ids=ids, mask=mask, **opts)
    out = {}
    for counting in ("jit", "sort"):
        monkeypatch.setattr(ktae_module, "COUNTING", counting)
        out[counting] = ktae.compute_advantages("ktae", **kw)
    assert torch.equal(out["jit"].view(torch.int64), out["sort"].view(torch.int64))
