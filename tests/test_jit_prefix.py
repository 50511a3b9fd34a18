"""Prefix-value in the compiled loops (:func:`ktae.core.jit_counts.prefix_class_rows` and
:func:`ktae.core.jit_counts.write_prefix_rows`): its classes against the hashed ones, its
advantages the same bits as the torch path and equal to the oracle, and when it runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prefix_value_oracle import slow_prefix_value_advantages
from test_prefix_value import random_groups
from test_sortfree_counts import _spy, zipf_batch

import ktae
from ktae.core import jit_counts, prefix_lcp, prefix_value
from ktae.core.groups import group_index

pytest.importorskip("numba", reason="numba is not installed (pip install 'ktae[fast]')")


def _kw(rewards, group, ids, mask, correct, dtype=torch.float64):
    return dict(rewards=torch.tensor(rewards).to(dtype), group=torch.tensor(group),
                token_ids=torch.tensor(ids), mask=torch.tensor(mask),
                correct=torch.tensor(correct))


def _each(monkeypatch, kw, *names, **opts) -> dict:
    out = {}
    for name in names:
        monkeypatch.setattr(prefix_value, "CLASSES", name)
        out[name] = ktae.compute_advantages("prefix-value", **kw, **opts)
    return out


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("holes", [False, True])
def test_classes_are_the_hashed_classes_named_alike(seed, holes):
    # the trie names a class by its first token in group order, as the lcp path names it
    # by its lowest-ranked member's token: the same tensors, not only the same partition
    rewards, group, ids, mask, correct = random_groups(seed, holes=holes)
    gid, P = group_index(torch.tensor(group), len(group), torch.device("cpu"))
    args = (torch.tensor(ids), torch.tensor(mask), gid, P)
    lcp = prefix_value.prefix_classes(*args, classes="lcp")
    jit = prefix_value.prefix_classes(*args, classes="jit")
    for a, b in zip(lcp, jit, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("apply", ["wrong", "all", "right"])
@pytest.mark.parametrize("weight", [1.0, 0.3, 0.0])
@pytest.mark.parametrize("total", ["keep", "add"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_token_credit_is_the_same_bits_as_the_torch_path_and_equals_the_oracle(
        monkeypatch, seed, apply, weight, total, dtype):
    rewards, group, ids, mask, correct = random_groups(seed, holes=seed % 2 == 1)
    opts = dict(apply=apply, weight=weight, total=total)
    out = _each(monkeypatch, _kw(rewards, group, ids, mask, correct, dtype), "lcp", "jit",
                **opts)
    assert out["jit"].dtype == dtype
    assert torch.equal(out["jit"], out["lcp"])
    ref = slow_prefix_value_advantages(rewards.astype(np.float32 if dtype == torch.float32
                                                      else np.float64).astype(np.float64),
                                       group, ids, mask, correct, **opts)
    tol = 1e-9 if dtype == torch.float64 else 1e-5
    np.testing.assert_allclose(out["jit"].double().numpy(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shift", [0, 1 << 40])  # ids at any width: the trie keys are exact
def test_heavy_tailed_batches_with_groups_over_the_lcp_limit(monkeypatch, seed, shift):
    group, ids, mask, correct = zipf_batch(seed, groups=3, size=70, max_len=120, shift=shift)
    ids[1::5, :40] = ids[0, :40]  # long shared prefixes
    kw = dict(rewards=correct.double(), group=group, token_ids=ids, mask=mask)
    out = _each(monkeypatch, kw, "lcp", "unique", "jit", apply="all")
    assert torch.equal(out["jit"], out["lcp"]) and torch.equal(out["jit"], out["unique"])
    ref = slow_prefix_value_advantages(correct.double().numpy(), group.numpy(), ids.numpy(),
                                       mask.numpy(), correct.numpy(), apply="all")
    np.testing.assert_allclose(out["jit"].numpy(), ref, rtol=1e-9, atol=1e-9)


def test_work_arrays_kept_between_batches_of_other_sizes(monkeypatch):
    # each thread keeps its table and its stamps from one call to the next: a larger
    # batch grows them, a smaller one reuses a part, and no class leaks between calls
    monkeypatch.setattr(prefix_value, "CLASSES", "jit")
    for seed, (groups, size, max_len) in enumerate([(2, 4, 30), (4, 40, 400), (3, 3, 10),
                                                    (4, 40, 400), (2, 4, 30)]):
        group, ids, mask, correct = zipf_batch(seed, groups=groups, size=size, max_len=max_len,
                                               vocab=50)
        kw = dict(rewards=correct.double(), group=group, token_ids=ids, mask=mask)
        got = ktae.compute_advantages("prefix-value", **kw, apply="all")
        ref = slow_prefix_value_advantages(correct.double().numpy(), group.numpy(),
                                           ids.numpy(), mask.numpy(), correct.numpy(),
                                           apply="all")
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-9, atol=1e-9)


def _calls(monkeypatch) -> list:
    calls = []
    _spy(monkeypatch, jit_counts, "prefix_class_rows", calls)
    _spy(monkeypatch, jit_counts, "write_prefix_rows", calls)
    _spy(monkeypatch, prefix_lcp, "pair_lcp", calls)
    return calls


@pytest.mark.parametrize(("threshold", "opts", "dtype", "expected"), [
    (1 << 20, {}, torch.float32, ["pair_lcp"]),  # a small batch: the torch path
    (0, {}, torch.float32, ["prefix_class_rows", "write_prefix_rows"]),
    (0, {}, torch.float64, ["prefix_class_rows", "write_prefix_rows"]),
    # the classes from the loops, the units' means in torch
    (0, {"unit": "span"}, torch.float32, ["prefix_class_rows"]),
    (0, {"unit": "word"}, torch.float32, ["prefix_class_rows"]),
])
def test_auto_takes_the_loops_on_large_batches(monkeypatch, threshold, opts, dtype,
                                               expected):
    rewards, group, ids, mask, correct = random_groups(4)
    if opts.get("unit") == "word":
        opts = {**opts, "word_starts": torch.tensor(ids) % 2 == 0}
    monkeypatch.setattr(prefix_value, "JIT_MIN_POSITIONS", threshold)
    monkeypatch.setattr(prefix_value, "CHUNK_TOKENS", 1 << 20)  # one chunk
    kw = _kw(rewards, group, ids, mask, correct, dtype)
    calls = _calls(monkeypatch)
    got = ktae.compute_advantages("prefix-value", **kw, apply="all", **opts)
    assert sorted(set(calls)) == sorted(expected)
    monkeypatch.setattr(prefix_value, "CLASSES", "lcp")
    assert torch.equal(got, ktae.compute_advantages("prefix-value", **kw, apply="all", **opts))


def test_forced_loops_where_they_cannot_run_take_the_lcp_path(monkeypatch):
    """``CLASSES = "jit"`` on a batch the loops cannot read (a CUDA batch, or no numba):
    the hashed lcp path, not the sort over every prefix hash."""
    rewards, group, ids, mask, correct = random_groups(5)
    kw = _kw(rewards, group, ids, mask, correct)
    monkeypatch.setattr(prefix_value, "CLASSES", "lcp")
    expected = ktae.compute_advantages("prefix-value", **kw, apply="all")
    monkeypatch.setattr(prefix_value, "CLASSES", "jit")
    monkeypatch.setattr(jit_counts, "usable", lambda token_ids, mask: False)
    calls = _calls(monkeypatch)
    got = ktae.compute_advantages("prefix-value", **kw, apply="all")
    assert set(calls) == {"pair_lcp"}
    assert torch.equal(got, expected)


@pytest.mark.parametrize("classes", ["lcp", "jit"])
def test_a_negative_id_is_refused_in_one_line(monkeypatch, classes):
    monkeypatch.setattr(prefix_value, "CLASSES", classes)
    kw = dict(rewards=torch.tensor([1.0, 0.0, 1.0]), group=torch.tensor([0, 0, 0]),
              token_ids=torch.tensor([[4, 2], [4, 5], [4, -3]]),
              mask=torch.tensor([[True, True], [True, False], [True, True]]))
    with pytest.raises(ValueError, match=r"^token_ids: expected non-negative ids[^\n]*$"):
        ktae.compute_advantages("prefix-value", **kw, apply="all")
