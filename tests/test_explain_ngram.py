"""KTAE over spans in the diagnostics: ``KeyTokenTable.token_rows`` and ``ktae explain``
pages of an n-gram run (each token shows the covering span of largest |value|)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from oracle import random_batch, response_spans
from test_explain_helpers import byte_level_tokenizer, token_spans

import ktae
from ktae.core.methods import Method
from ktae.explain.report import build_report
from ktae.groups.input import GroupInput
from ktae.viz.report_html import report_html


def _dominant_rows(table, batch, n, ignored):
    """Brute force: for each real token, the covering span row of largest |value|."""
    rows = {(r["group"], r["span"]): i for i, r in enumerate(table.to_rows())}
    labels = list(dict.fromkeys(batch["group"]))
    tok, mask = batch["token_ids"], batch["mask"].astype(bool)
    out = np.full(tok.shape, -1)
    for i in range(tok.shape[0]):
        g = labels.index(batch["group"][i])
        starts = {t: rows[(g, ids)] for t, ids in response_spans(tok, mask, i, n, set(ignored))}
        for t in range(tok.shape[1]):
            best, mag = -1, -1.0
            for s in range(t - n + 1, t + 1):
                if s in starts and abs(float(table.value[starts[s]])) > mag:
                    best, mag = starts[s], abs(float(table.value[starts[s]]))
            out[i, t] = best if mask[i, t] else -1
    return out


@pytest.mark.parametrize("seed, n", [(0, 2), (1, 3), (2, 2)])
def test_token_rows(seed, n):
    batch = random_batch(seed, sizes=[6, 5, 4], vocab=4, max_len=9, left_pad=seed == 1)
    ignored = [int(batch["token_ids"][0, 0])] if seed == 2 else []
    kw = dict(rewards=batch["rewards"], group=batch["group"], token_ids=batch["token_ids"],
              mask=batch["mask"], ignore_token_ids=ignored)
    labels = list(dict.fromkeys(batch["group"]))
    gid = torch.tensor([labels.index(g) for g in batch["group"]])
    ids, mask = torch.from_numpy(batch["token_ids"]), torch.from_numpy(batch["mask"])
    spans = ktae.key_token_table(**kw, ngram=n)
    got = spans.token_rows(gid, ids, mask, ignored).numpy()
    assert (got == _dominant_rows(spans, batch, n, ignored)).all()
    uni = ktae.key_token_table(**kw)
    rows = uni.token_rows(gid, ids, mask).numpy()
    for i, j in zip(*np.nonzero(batch["mask"]), strict=True):
        row = uni.to_rows()[rows[i, j]]
        assert (row["group"], row["token"]) == (int(gid[i]), int(ids[i, j]))
    assert (rows[batch["mask"] == 0] == -1).all()


def test_explain_page_of_a_span_run():
    tok = byte_level_tokenizer()

    def enc(texts):
        return [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]

    groups = [GroupInput(prompt="Q", label="g", rewards=[1.0, 1.0, 0.0, 0.0],
                         responses=enc(["the sum is 42", "the answer is 42", "the sum is 24",
                                        "é"]))]
    credit = Method(estimator_options={"ngram": 2},
                        ignore_token_ids=(tok.pad_token_id, tok.eos_token_id))
    report = build_report(groups, credit=credit, tokenizer=tok)
    resp = report.groups[0].responses
    stats = [s for r in resp for s in r.stats]
    assert any(s is None for s in stats)  # the one-token answer and every EOS
    assert all("span" in s and len(s["span"]) == 2 for s in stats if s is not None)
    rows = report.groups[0].positive + report.groups[0].negative
    assert rows and all(len(r["span"]) == 2 and r["text"] for r in rows)
    # the token view is KTAE over bigrams
    ids = [r for g in groups for r in g.responses]
    T = max(map(len, ids))
    mat = torch.tensor([r + [0] * (T - len(r)) for r in ids])
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in ids]).bool()
    adv = ktae.compute_advantages("ktae", rewards=[1.0, 1.0, 0.0, 0.0], group=[0] * 4,
                                  token_ids=mat, mask=mask, ngram=2,
                                  ignore_token_ids=[tok.pad_token_id, tok.eos_token_id],
                                  correct=torch.tensor([True, True, False, False]))
    for i, r in enumerate(resp):
        np.testing.assert_allclose(r.values["token"], adv[i, :len(ids[i])].tolist(), atol=1e-6)
    page = report_html(report)
    titles = [s["title"] for s in token_spans(page)]
    assert sum("key span: none covers this token" in t for t in titles) == sum(
        s is None for s in stats)
    assert any("key span '" in t for t in titles)


def test_explain_page_of_a_graded_run():
    """A run trained with ``split=graded``: the page's token view and key-token table are
    graded KTAE on the rewards (no correctness passed), with the soft counts."""
    tok = byte_level_tokenizer()

    def enc(texts):
        return [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]

    rewards = [1.0, 0.2, 0.0, 0.6]
    groups = [GroupInput(prompt="Q", label="g", rewards=rewards,
                         responses=enc(["the sum is 42", "the sum is 24", "no", "sum 42"]))]
    ignored = (tok.pad_token_id, tok.eos_token_id)
    credit = Method(estimator_options={"split": "graded"}, ignore_token_ids=ignored)
    report = build_report(groups, credit=credit, tokenizer=tok)
    ids = [r for g in groups for r in g.responses]
    T = max(map(len, ids))
    mat = torch.tensor([r + [0] * (T - len(r)) for r in ids])
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in ids]).bool()
    adv = ktae.compute_advantages("ktae", rewards=rewards, group=[0] * 4, token_ids=mat,
                                  mask=mask, split="graded", ignore_token_ids=list(ignored))
    for i, r in enumerate(report.groups[0].responses):
        np.testing.assert_allclose(r.values["token"], adv[i, :len(ids[i])].tolist(), atol=1e-6)
    stats = [s for r in report.groups[0].responses for s in r.stats if s is not None]
    assert any(s["a"] != int(s["a"]) for s in stats)  # soft counts
    from ktae.viz.credit import count_text

    assert count_text(1.0) == "1" and count_text(0.6666) == "0.667"
    page = report_html(report)
    assert "a=1.6" in page or "a=1.60" in page or any(
        "a=" in s["title"] and "." in s["title"].split("a=")[1].split()[0]
        for s in token_spans(page))
