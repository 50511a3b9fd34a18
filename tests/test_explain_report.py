"""The explain page's content: one element per token, signed colours, tooltips equal to
``ktae.key_token_table``, key-token tables, the index, calibration marks, and the
terminal and PNG renderings of the same report."""

from __future__ import annotations

import math
import re

import pytest
import torch
from test_explain_helpers import byte_level_tokenizer, colours, token_spans, tooltip_numbers

import ktae
from ktae.core.methods import Method
from ktae.explain.report import build_report
from ktae.groups.input import GroupInput
from ktae.viz.report_html import report_html

STAT_NAMES = {"a": "a", "b": "b", "c": "c", "d": "d", "p": "p_value", "F": "fisher",
              "IG": "info_gain", "TF_T": "tf_correct", "TF_F": "tf_incorrect", "D": "direction",
              "value": "value"}


@pytest.fixture(scope="module")
def bpe():
    return byte_level_tokenizer()


def _groups(tok):
    def enc(texts):
        return [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]

    return [
        GroupInput(prompt="Q: café?", label="first", rewards=[1.0, 0.0, 1.0, 0.0],
                   responses=enc(["un café 😀 \\boxed{42}", "un thé 🤖", "café 😀 42",
                                  "zoé ça va"])),
        GroupInput(prompt="Q: sum", label="second", rewards=[1.0, 1.0, 0.0],
                   responses=enc(["the sum is 42", "the answer is \\boxed{42}", "the sum"])),
        GroupInput(prompt="all right", label="third", rewards=[1.0, 1.0],
                   responses=enc(["42", "42 😀"])),
        GroupInput(prompt="empty one", label="fourth", rewards=[0.0, 1.0],
                   responses=[[], enc(["é"])[0]]),
    ]


def _flat(groups):
    rows = [r for g in groups for r in g.responses]
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = True
    rewards = torch.tensor([x for g in groups for x in g.rewards], dtype=torch.float64)
    group = [gi for gi, g in enumerate(groups) for _ in g.responses]
    return rows, ids, mask, rewards, group


def test_one_element_per_token_signed_colours_and_tooltips_match_key_token_table(bpe):
    groups = _groups(bpe)
    credit = Method(ignore_token_ids=(bpe.pad_token_id, bpe.eos_token_id))
    report = build_report(groups, credit=credit, tokenizer=bpe, title="t")
    page = report_html(report)
    spans = token_spans(page)
    rows, ids, mask, rewards, group = _flat(groups)
    assert len(spans) == sum(len(r) for r in rows)
    # exactly one element per real token, in order, in the right group and response
    k = 0
    opts = dict(ignore_token_ids=credit.ignore_token_ids)
    table = ktae.key_token_table(rewards=rewards, group=group, token_ids=ids, mask=mask, **opts)
    adv = ktae.compute_advantages("ktae", rewards=rewards, group=group, token_ids=ids, mask=mask,
                                  **opts)
    seq = ktae.compute_advantages("grpo", rewards=rewards, group=group)
    views = [key for key, _ in report.views]
    assert views == ["seq", "token", "diff"]
    b = 0
    for gi, g in enumerate(groups):
        for j, resp in enumerate(g.responses):
            for t, tid in enumerate(resp):
                span = spans[k]
                assert (span["group"], span["response"]) == (f"g{gi}", j)
                nums = tooltip_numbers(span["title"])
                row = table.lookup(gi, tid)
                for short, name in STAT_NAMES.items():
                    assert nums[short] == pytest.approx(row[name], rel=1e-5, abs=1e-12), (short, tid)
                assert f"id {tid} " in span["title"]
                values = {"seq": float(seq[b]), "token": float(adv[b, t]),
                          "diff": float(adv[b, t] - seq[b])}
                shown = dict(re.findall(r"(GRPO|KTAE|KTAE \u2212 GRPO) (-?[\d.e+-]+)",
                                        span["title"].split("\n")[1]))
                assert float(shown["GRPO"]) == pytest.approx(values["seq"], rel=1e-5, abs=1e-9)
                assert float(shown["KTAE"]) == pytest.approx(values["token"], rel=1e-5, abs=1e-9)
                for i, key in enumerate(views):
                    r_, g_, b_ = colours(span["style"])[i]
                    v = values[key]
                    if abs(v) < 1e-12:
                        assert (r_, g_, b_) == (255, 255, 255)
                    elif v > 0:
                        assert r_ > b_, (key, v)
                    else:
                        assert b_ > r_, (key, v)
                k += 1
            b += 1
    # multi-byte characters reach the page intact
    text = "".join(s["text"] for s in spans if s["group"] == "g0" and s["response"] == 0)
    assert "caf" in text and "é" in text and "😀" in text and "\ufffd" not in text


def test_key_token_rows_index_and_self_contained_page(bpe):
    report = build_report(_groups(bpe), credit=Method(ignore_token_ids=(0, 1)),
                          tokenizer=bpe, title="<t>", top_rows=3)
    first = report.groups[0]
    assert first.positive and first.negative
    assert [r["value"] for r in first.positive] == sorted((r["value"] for r in first.positive),
                                                          reverse=True)
    assert [r["value"] for r in first.negative] == sorted(r["value"] for r in first.negative)
    assert all(r["value"] > 0 for r in first.positive) and len(first.positive) <= 3
    assert all(r["value"] < 0 for r in first.negative)
    assert first.zero_tokens > 0
    # a group with one class has no key tokens; the empty response renders no token
    assert report.groups[2].positive == [] and report.groups[2].negative == []
    assert report.groups[3].responses[0].token_ids == []
    ranked = [g.label for g in report.ranked()]
    divs = [g.divergence for g in report.ranked()]
    assert divs == sorted(divs, reverse=True) and ranked[-1] in ("third",)
    page = report_html(report)
    index = page[page.index('<nav class="index">'):page.index("</nav>")]
    assert [m for m in re.findall(r'href="#(g\d)"', index)] == [g.anchor for g in report.ranked()]
    for bad in ("<script", "src=", "<link", "url(", "@import", "http://", "https://"):
        assert bad not in page
    assert "&lt;t&gt;" in page and "<h1><t>" not in page
    one = build_report(_groups(bpe)[:1], credit=Method(), tokenizer=bpe)
    assert '<nav class="index">' not in report_html(one)


def test_calibration_outlines_flagged_tokens_with_logprob_entropy_weight(bpe):
    groups = _groups(bpe)[:2]
    for g in groups:
        g.logprobs = [[-0.05 * (t % 9) - 0.5 * (t % 2) for t in range(len(r))] for r in g.responses]
        g.entropies = [[0.3 + 0.01 * t for t in range(len(r))] for r in g.responses]
    credit = Method(calibration="taco", calibration_options={"alpha": 0.7, "lam": 0.9})
    report = build_report(groups, credit=credit, tokenizer=bpe)
    assert [k for k, _ in report.views] == ["seq", "token", "final", "diff"]
    assert report.default_view == "final"
    spans = token_spans(report_html(report))
    rows, ids, mask, rewards, group = _flat(groups)
    adv = ktae.compute_advantages("ktae", rewards=rewards, group=group, token_ids=ids, mask=mask)
    lp = torch.zeros(ids.shape, dtype=torch.float64)
    H = torch.zeros(ids.shape, dtype=torch.float64)
    b = 0
    for g in groups:
        for lps, hs in zip(g.logprobs, g.entropies, strict=True):
            lp[b, :len(lps)] = torch.tensor(lps, dtype=torch.float64)
            H[b, :len(hs)] = torch.tensor(hs, dtype=torch.float64)
            b += 1
    res = ktae.calibrate_advantages("taco", adv.double(), logprobs=lp, entropies=H, mask=mask,
                                    alpha=0.7, lam=0.9)
    flat = [(i, t) for i, r in enumerate(rows) for t in range(len(r))]
    assert len(spans) == len(flat)
    n_flagged = 0
    for span, (i, t) in zip(spans, flat, strict=True):
        flagged = bool(res.flagged[i, t])
        assert ("flag" in span["classes"]) == flagged
        n_flagged += flagged
        nums = tooltip_numbers(span["title"])
        assert nums["logp"] == pytest.approx(float(lp[i, t]), rel=1e-5, abs=1e-9)
        assert nums["entropy"] == pytest.approx(float(H[i, t]), rel=1e-5)
        assert nums["weight"] == pytest.approx(float(res.weights[i, t]), rel=1e-5)
        assert ("flagged" in span["title"]) == flagged
    assert n_flagged > 0
    page = report_html(report)
    assert "<h3>Flagged tokens</h3><div class=\"scroll\"><table>" in page


def test_recorded_run_values_and_loss_mask(bpe):
    groups = _groups(bpe)[:1]
    g = groups[0]
    g.trained = [[0.5] * len(r) for r in g.responses]
    g.weights = [[1.0] * len(r) for r in g.responses]
    g.weights[0][0] = 0.1
    g.flagged = [[0] * len(r) for r in g.responses]
    g.flagged[0][0] = 1
    g.loss_mask = [[1] * len(r) for r in g.responses]
    g.loss_mask[1][0] = 0
    g.logprobs = [[-1.0] * len(r) for r in g.responses]
    g.entropies = [[0.5] * len(r) for r in g.responses]
    credit = Method(calibration="taco")
    report = build_report(groups, credit=credit, tokenizer=bpe, use_recorded=True)
    resp = report.groups[0].responses
    assert resp[0].values["token"][0] == 0.5 and resp[0].values["final"][0] == pytest.approx(0.05)
    assert resp[1].in_loss[0] is False and resp[0].flagged[0] is True
    assert any("largest difference" in m for m in report.meta)
    spans = token_spans(report_html(report))
    assert "flag" in spans[0]["classes"]
    second = len(g.responses[0])
    assert "out" in spans[second]["classes"] and "left out of the loss" in spans[second]["title"]


def test_recorded_loss_mask_without_calibration(bpe):
    g = _groups(bpe)[0]
    g.trained = [[0.25] * len(r) for r in g.responses]
    g.loss_mask = [None, [0] * len(g.responses[1]), None, None]
    report = build_report([g], credit=Method(), tokenizer=bpe, use_recorded=True)
    assert report.partial_loss and not report.calibrated
    page = report_html(report)
    spans = token_spans(page)
    outs = [s for s in spans if "out" in s["classes"]]
    assert len(outs) == len(g.responses[1]) and all(s["response"] == 1 for s in outs)
    assert "left out of the loss</span>" in page


def test_bad_groups_and_missing_calibration_inputs(bpe):
    one = GroupInput(prompt="p", responses=[[5, 6]], rewards=[1.0], label="lonely")
    with pytest.raises(ValueError, match="^lonely: expected at least 2 responses"):
        build_report([one], credit=Method(), tokenizer=bpe)
    two = GroupInput(prompt="p", responses=[[5, 6], [7]], rewards=[1.0, 0.0])
    with pytest.raises(ValueError, match="log-probs and entropies"):
        build_report([two], credit=Method(calibration="taco"), tokenizer=bpe)
    with pytest.raises(ValueError, match="one reward per response"):
        build_report([GroupInput(prompt="p", responses=[[5], [6]], rewards=[1.0])],
                     credit=Method(), tokenizer=bpe)
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        Method(estimator="nope")


def test_sequence_level_credit_has_one_view(bpe):
    report = build_report(_groups(bpe)[:2], credit=Method(estimator="grpo"), tokenizer=bpe)
    assert report.views == [("seq", "GRPO")] and report.default_view == "seq"
    assert all(g.divergence == 0 for g in report.groups)


def test_terminal_and_png(bpe, tmp_path):
    from rich.console import Console

    from ktae.viz.report_png import group_png
    from ktae.viz.report_terminal import print_report

    report = build_report(_groups(bpe), credit=Method(), tokenizer=bpe, title="T")
    console = Console(record=True, width=120, color_system="truecolor")
    print_report(report, console)
    text = console.export_text()
    assert "first" in text and "café" in text and "key tokens" in text
    assert "#0 correct" in text and "wrong" in text
    styled = console.export_html(inline_styles=True)
    assert "background-color: #" in styled  # tokens carry their colours
    with pytest.raises(ValueError, match="^view:"):
        print_report(report, console, view="nope")
    path = tmp_path / "g.png"
    group_png(report, report.groups[0], path)
    import numpy as np
    from PIL import Image

    im = np.asarray(Image.open(path).convert("RGB")).astype(int)
    assert im.shape[0] > 200 and im.shape[1] > 200
    r, g, b = im[..., 0], im[..., 1], im[..., 2]
    reds = int(((r > 150) & (g < 120) & (b < 120)).sum())
    blues = int(((b > 150) & (r < 120)).sum())
    assert reds > 50 and blues > 50  # both signs of credit are drawn


def test_adv_reweight_uses_the_scored_log_probs_as_the_rollout_policy(bpe):
    groups = _groups(bpe)[:1]
    for g in groups:
        g.logprobs = [[-0.1 * (t % 5) for t in range(len(r))] for r in g.responses]
        g.entropies = [[0.5] * len(r) for r in g.responses]
    report = build_report(groups, credit=Method(calibration="adv-reweight"), tokenizer=bpe)
    spans = token_spans(report_html(report))
    rows = [t for g in groups for r in g.logprobs for t in r]
    assert len(spans) == len(rows)
    for span, lp in zip(spans, rows, strict=True):
        weight = tooltip_numbers(span["title"])["weight"]
        assert weight == pytest.approx(0.1 * math.exp(lp) + 0.9, rel=1e-5)


def test_gtpo_reads_the_rollout_entropies_and_correctness(bpe):
    groups = _groups(bpe)[:2]
    # shaped rewards: response 3 of the first group is correct with a reward of 0
    groups[0].rewards, groups[0].correct = [1.0, -0.5, 0.0, 0.0], [True, False, True, False]
    for g in groups:
        g.old_entropies = [[0.1 + 0.05 * (t % 7) for t in range(len(r))] for r in g.responses]
        g.entropies = [[9.0] * len(r) for r in g.responses]  # current policy: not GTPO's
    report = build_report(groups, credit=Method(estimator="gtpo"), tokenizer=bpe)
    rows, _, mask, rewards, group = _flat(groups)
    T = mask.shape[1]
    H = torch.tensor([e + [0.0] * (T - len(e)) for g in groups for e in g.old_entropies])
    correct = torch.tensor([c for g in groups for c in (g.correct or [x > 0 for x in g.rewards])])
    want = ktae.compute_advantages("gtpo", rewards=rewards, group=group, mask=mask,
                                   entropies=H, correct=correct)
    got = [r.values["token"] for g in report.groups for r in g.responses]
    for i, row in enumerate(got):
        assert row == pytest.approx(want[i, :len(rows[i])].tolist(), abs=1e-9)
    groups[0].old_entropies = None  # without them (and with no scores) it says what is missing
    for g in groups:
        g.entropies = None
    with pytest.raises(ValueError, match="estimator 'gtpo' needs the rollout policy's entropies"):
        build_report(groups, credit=Method(estimator="gtpo"), tokenizer=bpe)
