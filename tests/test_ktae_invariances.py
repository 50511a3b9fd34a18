"""Symmetries of KTAE (docs/method.md §3) that any correct implementation must respect.

Permuting responses within a group, moving whole groups around the batch, relabelling
token ids injectively and changing the padding length leave every advantage unchanged
(permuted accordingly); swapping the correct and incorrect classes negates every
key-token value; the ablations h1 = 0, h2 = 0, h3 = 0 switch off F, IG and TF.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import batch_specs, examples, random_batch, single_thread  # noqa: F401

import ktae

SETTINGS = examples(40)
MODES = st.sampled_from(["exact", "reference"])
ATOL = {"exact": 1e-12, "reference": 1e-6}  # float32 mean/std may move by an ulp


def advantages(batch: dict, **opts) -> np.ndarray:
    rewards = torch.as_tensor(batch["rewards"], dtype=torch.float64)
    return ktae.compute_advantages("ktae", rewards=rewards, group=batch["group"],
                                   token_ids=batch["token_ids"], mask=batch["mask"],
                                   **opts).double().numpy()


def table_by_label(batch: dict, **opts) -> dict:
    """``{(group label, token id): row}`` of the diagnostic table."""
    labels = list(dict.fromkeys(batch["group"]))
    rows = ktae.key_token_table(rewards=torch.as_tensor(batch["rewards"]), group=batch["group"],
                                token_ids=batch["token_ids"], mask=batch["mask"],
                                **opts).to_rows()
    return {(labels[r["group"]], r["token"]): r for r in rows}


def permuted(batch: dict, perm: np.ndarray) -> dict:
    out = {k: v[perm] for k, v in batch.items() if k != "group"}
    out["group"] = [batch["group"][i] for i in perm]
    return out


def within_group_permutation(group: list, rng: np.random.Generator) -> np.ndarray:
    """A permutation that shuffles rows only among the positions of their own group."""
    perm = np.arange(len(group))
    for lab in dict.fromkeys(group):
        pos = np.array([i for i, g in enumerate(group) if g == lab])
        perm[pos] = rng.permutation(pos)
    return perm


@settings(**SETTINGS)
@given(spec=batch_specs(), mode=MODES)
def test_permuting_responses_within_groups(spec, mode):
    batch = random_batch(**spec)
    perm = within_group_permutation(batch["group"], np.random.default_rng(spec["seed"]))
    base = advantages(batch, mode=mode)
    np.testing.assert_allclose(advantages(permuted(batch, perm), mode=mode), base[perm],
                               rtol=0, atol=ATOL[mode])


@settings(**SETTINGS)
@given(spec=batch_specs(), mode=MODES)
def test_moving_groups_around_the_batch(spec, mode):
    batch = random_batch(**spec)
    rng = np.random.default_rng(spec["seed"] + 1)
    labels = list(dict.fromkeys(batch["group"]))
    new_order = [labels[i] for i in rng.permutation(len(labels))]
    # whole groups, contiguous, in a new order (rows keep their order within a group)
    perm = np.array([i for lab in new_order for i, g in enumerate(batch["group"]) if g == lab])
    moved = permuted(batch, perm)
    np.testing.assert_allclose(advantages(moved, mode=mode), advantages(batch, mode=mode)[perm],
                               rtol=0, atol=ATOL[mode])
    before, after = table_by_label(batch, mode=mode), table_by_label(moved, mode=mode)
    assert set(before) == set(after)
    for key, row in before.items():
        for f in ("a", "b", "c", "d", "p_value", "fisher", "info_gain", "value"):
            assert math.isclose(after[key][f], row[f], rel_tol=1e-12, abs_tol=ATOL[mode]), (key, f)


@settings(**SETTINGS)
@given(spec=batch_specs(), mode=MODES, big=st.booleans())
def test_relabelling_token_ids(spec, mode, big):
    batch = random_batch(**spec)
    rng = np.random.default_rng(spec["seed"] + 2)
    ids = np.unique(batch["token_ids"])
    high = 256_000 if big else 151_936
    new = rng.choice(np.arange(high), size=len(ids), replace=False)
    new[new == 151643] = high  # keep the runtime's special id out of the relabelling
    relabel = dict(zip(ids.tolist(), new.tolist(), strict=True))
    moved = {**batch, "token_ids": np.vectorize(relabel.get)(batch["token_ids"])}
    np.testing.assert_allclose(advantages(moved, mode=mode), advantages(batch, mode=mode),
                               rtol=0, atol=ATOL[mode])
    before, after = table_by_label(batch, mode=mode), table_by_label(moved, mode=mode)
    assert {(g, relabel[t]) for g, t in before} == set(after)
    for (g, t), row in before.items():
        assert after[(g, relabel[t])]["value"] == row["value"]


def _padded(batch: dict, seed: int, extra: int, left: bool) -> dict:
    """``batch`` with ``extra`` padding columns (random ids, mask 0) on the left or right."""
    B = len(batch["rewards"])
    pad_tok = np.random.default_rng(seed + 3).integers(0, 50_000, size=(B, extra))

    def cat(x, y):
        return np.concatenate([y, x] if left else [x, y], 1)

    return {**batch, "token_ids": cat(batch["token_ids"], pad_tok),
            "mask": cat(batch["mask"], np.zeros((B, extra), dtype=np.int64))}


def _split_padding(values: np.ndarray, extra: int, left: bool):
    """``(original columns, padding columns)`` of a ``_padded`` batch's output."""
    if left:
        return values[:, extra:], values[:, :extra]
    return values[:, :-extra], values[:, -extra:]


@settings(**SETTINGS)
@given(spec=batch_specs(), mode=MODES, extra=st.integers(1, 5), left=st.booleans())
def test_padding_length(spec, mode, extra, left):
    batch = random_batch(**spec)
    padded = _padded(batch, spec["seed"], extra, left)
    core, pad = _split_padding(advantages(padded, mode=mode), extra, left)
    np.testing.assert_allclose(core, advantages(batch, mode=mode), rtol=0, atol=ATOL[mode])
    assert pad.sum() == 0


@settings(**SETTINGS)
@given(spec=batch_specs(), data=st.data())
def test_swapping_classes_negates_values(spec, data):
    batch = random_batch(**spec)
    B = len(batch["rewards"])
    correct = np.array(data.draw(st.lists(st.booleans(), min_size=B, max_size=B)))
    opts = dict(base=data.draw(st.sampled_from(["grpo", "drgrpo", "rloo"])),
                h3=data.draw(st.sampled_from([0.0, 1.0])),
                variant=data.draw(st.sampled_from(["runtime", "paper"])))
    t1 = table_by_label(batch, correct=correct, **opts)
    t2 = table_by_label(batch, correct=~correct, **opts)
    assert set(t1) == set(t2)
    for key, row in t1.items():
        assert math.isclose(t2[key]["value"], -row["value"], rel_tol=1e-9, abs_tol=1e-12), key
        assert (t2[key]["a"], t2[key]["c"]) == (row["b"], row["d"])
        assert math.isclose(t2[key]["p_value"], row["p_value"], rel_tol=1e-12)
    # on the advantages: A_KTAE - A_base is negated
    seq = ktae.compute_advantages(opts["base"], rewards=torch.as_tensor(batch["rewards"]),
                                  group=batch["group"], token_ids=batch["token_ids"],
                                  mask=batch["mask"]).numpy()
    v1 = advantages(batch, correct=correct, **opts) - seq
    v2 = advantages(batch, correct=~correct, **opts) - seq
    np.testing.assert_allclose(v2, -v1, rtol=0, atol=1e-12)


def _sigmoid_scale(k: float) -> float:
    return 2.0 / (1.0 + math.exp(-k)) - 1.0 if k > -700 else -1.0


@settings(**SETTINGS)
@given(spec=batch_specs())
def test_ablations(spec):
    batch = random_batch(**spec)
    # h3 = 0: D is Cohen's h alone, so the BM25 parameters no longer matter
    pure = table_by_label(batch, h3=0.0)
    other = table_by_label(batch, h3=0.0, k1=0.7, b=1.0)
    for key, row in pure.items():
        a, b, c, d = (row[f] for f in "abcd")
        if a + c == 0 or b + d == 0:
            continue  # one-class group: no direction, value 0
        h = math.asin(math.sqrt(a / (a + c))) - math.asin(math.sqrt(b / (b + d)))
        assert math.isclose(row["direction"], h, abs_tol=1e-12), key
        assert math.isclose(other[key]["value"], row["value"], abs_tol=1e-12), key
    # h1 = 0: F is off, k = IG * D; h2 = 0: IG is off, k = F * D
    for h1, h2, field in ((0.0, 1.0, "info_gain"), (1.0, 0.0, "fisher")):
        t = table_by_label(batch, h1=h1, h2=h2)
        full = table_by_label(batch)
        for key, row in t.items():
            assert row["direction"] == full[key]["direction"]
            if row["a"] + row["c"] == 0 or row["b"] + row["d"] == 0:
                assert row["value"] == 0.0
                continue  # one-class group
            expect = _sigmoid_scale(row[field] * row["direction"])
            assert math.isclose(row["value"], expect, rel_tol=1e-9, abs_tol=1e-12), (key, field)


# ------------------------------------------------------------------- n-grams (exact mode)

NGRAM_OPTS = st.fixed_dictionaries({"ngram": st.sampled_from([2, 3]),
                                    "ngram_reduce": st.sampled_from(["maxabs", "mean"])})
NGRAM_SETTINGS = examples(25)


def span_table_by_label(batch: dict, **opts) -> dict:
    """``{(group label, span token ids): row}`` of an n-gram table."""
    labels = list(dict.fromkeys(batch["group"]))
    rows = ktae.key_token_table(rewards=torch.as_tensor(batch["rewards"]), group=batch["group"],
                                token_ids=batch["token_ids"], mask=batch["mask"],
                                **opts).to_rows()
    return {(labels[r["group"]], r["span"]): r for r in rows}


@settings(**NGRAM_SETTINGS)
@given(spec=batch_specs(vocab=(2, 6)), opts=NGRAM_OPTS)
def test_ngram_permuting_responses_within_groups(spec, opts):
    batch = random_batch(**spec)
    perm = within_group_permutation(batch["group"], np.random.default_rng(spec["seed"]))
    np.testing.assert_allclose(advantages(permuted(batch, perm), **opts),
                               advantages(batch, **opts)[perm], rtol=0, atol=1e-12)


@settings(**NGRAM_SETTINGS)
@given(spec=batch_specs(vocab=(2, 6)), opts=NGRAM_OPTS, big=st.booleans())
def test_ngram_relabelling_token_ids(spec, opts, big):
    batch = random_batch(**spec)
    rng = np.random.default_rng(spec["seed"] + 2)
    ids = np.unique(batch["token_ids"])
    new = rng.choice(2**40 if big else 151_936, size=len(ids), replace=False)
    relabel = dict(zip(ids.tolist(), new.tolist(), strict=True))
    moved = {**batch, "token_ids": np.vectorize(relabel.get)(batch["token_ids"])}
    np.testing.assert_allclose(advantages(moved, **opts), advantages(batch, **opts),
                               rtol=0, atol=1e-12)
    before, after = span_table_by_label(batch, **opts), span_table_by_label(moved, **opts)
    assert {(g, tuple(relabel[t] for t in span)) for g, span in before} == set(after)
    for (g, span), row in before.items():
        assert after[(g, tuple(relabel[t] for t in span))]["value"] == row["value"]


@settings(**NGRAM_SETTINGS)
@given(spec=batch_specs(vocab=(2, 6)), opts=NGRAM_OPTS, extra=st.integers(1, 5),
       left=st.booleans())
def test_ngram_padding_length(spec, opts, extra, left):
    batch = random_batch(**spec)
    padded = _padded(batch, spec["seed"], extra, left)
    core, pad = _split_padding(advantages(padded, **opts), extra, left)
    np.testing.assert_allclose(core, advantages(batch, **opts), rtol=0, atol=1e-12)
    assert pad.sum() == 0


@settings(**NGRAM_SETTINGS)
@given(spec=batch_specs(vocab=(2, 6)), opts=NGRAM_OPTS, data=st.data())
def test_ngram_swapping_classes_negates_span_values(spec, opts, data):
    batch = random_batch(**spec)
    B = len(batch["rewards"])
    correct = np.array(data.draw(st.lists(st.booleans(), min_size=B, max_size=B)))
    t1 = span_table_by_label(batch, correct=correct, **opts)
    t2 = span_table_by_label(batch, correct=~correct, **opts)
    assert set(t1) == set(t2)
    for key, row in t1.items():
        assert math.isclose(t2[key]["value"], -row["value"], rel_tol=1e-9, abs_tol=1e-12), key
