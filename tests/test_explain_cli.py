"""``ktae explain`` end to end: JSONL groups (character and byte-level tokenizers), the
shipped model sampling on the spot, a ``ktae train`` run directory, and bad input."""

from __future__ import annotations

import json

import pytest
import torch
from test_explain_helpers import byte_level_tokenizer, token_spans, tooltip_numbers

import ktae
from ktae.cli import main
from ktae.runs.rollouts import read_rollouts


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                    encoding="utf-8")
    return path


GROUPS = [
    {"prompt": "Q:37+45-18 A:", "answer": "64",
     "responses": ["37+45=82. 82-18=64. \\boxed{64}", "37+45=72. 72-18=54. \\boxed{54}",
                   "37+45=82. 82-18=74. \\boxed{74}", "37+45=82. 82-18=64. \\boxed{64}"]},
    {"id": "easy", "prompt": "Q:5+3 A:", "rewards": [1, 0, 0.5],
     "responses": ["5+3=8. \\boxed{8}", "5+3=9. \\boxed{9}", "5+3=8."]},
]


def test_jsonl_page_terminal_and_png(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "groups.jsonl", GROUPS)
    out = tmp_path / "page.html"
    assert main(["explain", str(src), "-o", str(out), "--terminal", "--png",
                 str(tmp_path / "png")]) == 0
    page = out.read_text(encoding="utf-8")
    spans = token_spans(page)
    # the character tokenizer of the shipped model: one token per character
    assert len(spans) == sum(len(r) for g in GROUPS for r in g["responses"])
    assert "reference answer <code>64</code>" in page and "2 of 4 correct" in page
    printed = capsys.readouterr()
    assert "Q:37+45-18 A:" in printed.out and "key tokens" in printed.out
    assert "wrote " in printed.err and str(out) in printed.err
    pngs = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert pngs == ["easy-line-2.png", "line-1.png"]
    # --group picks one group by id; --groups N the first N
    assert main(["explain", str(src), "-o", str(tmp_path / "one.html"), "--group", "easy"]) == 0
    one = (tmp_path / "one.html").read_text(encoding="utf-8")
    assert one.count('<section class="group"') == 1 and "easy (line 2)" in one
    assert main(["explain", str(src), "-o", str(tmp_path / "n.html"), "--groups", "1"]) == 0
    assert (tmp_path / "n.html").read_text().count('<section class="group"') == 1
    # terminal only: no page unless -o is given
    capsys.readouterr()
    assert main(["explain", str(src), "--terminal"]) == 0
    assert "nothing (terminal only)" in capsys.readouterr().err


def test_jsonl_with_a_byte_level_tokenizer(tmp_path):
    tok_dir = tmp_path / "tok"
    tok = byte_level_tokenizer(tok_dir)
    responses = ["un café 😀 \\boxed{42}", "un thé 🤖", "café 😀 \\boxed{42}"]
    src = _write_jsonl(tmp_path / "g.jsonl", [{"prompt": "Q?", "answer": "42",
                                                "responses": responses}])
    out = tmp_path / "p.html"
    assert main(["explain", str(src), "-o", str(out), "--tokenizer", str(tok_dir)]) == 0
    spans = token_spans(out.read_text(encoding="utf-8"))
    ids = [tok(r, add_special_tokens=False)["input_ids"] for r in responses]
    assert len(spans) == sum(map(len, ids))
    assert "".join(s["text"] for s in spans[:len(ids[0])]).replace("\u00b7", " ") == responses[0]
    rewards = torch.tensor([1.0, 0.0, 1.0])
    T = max(map(len, ids))
    tid = torch.tensor([r + [0] * (T - len(r)) for r in ids])
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in ids])
    table = ktae.key_token_table(rewards=rewards, group=[0, 0, 0], token_ids=tid, mask=mask,
                                 ignore_token_ids=[0, 1])
    for span, t in zip(spans, [t for r in ids for t in r], strict=True):
        assert tooltip_numbers(span["title"])["value"] == pytest.approx(
            table.lookup(0, t)["value"], rel=1e-5, abs=1e-12)


@pytest.mark.parametrize("records, args, message", [
    (None, [], "INPUT: no such file or directory"),
    ([{"prompt": "p", "answer": "1"}], [], "no 'responses'"),
    ([{"prompt": "p", "responses": ["\\boxed{1}"], "answer": "1"}], [], "at least 2 responses"),
    ([{"prompt": "p", "responses": ["a", "b"]}], [], "'rewards' (one per response) or"),
    ([{"prompt": "p", "responses": ["a", "b"], "rewards": [1]}], [], "expected 'rewards' as 2"),
    (GROUPS, ["--credit", "bogus"], "credit: 'bogus' is not a registered"),
    (GROUPS, ["--credit", "ktae+taco"], "needs per-token log-probs and entropies"),
    (GROUPS, ["--credit", "gtpo"], "estimator 'gtpo' needs the rollout policy's entropies"),
    (GROUPS, ["--group", "zzz"], "group: no group with id 'zzz'"),
    (GROUPS, ["--step", "3"], "step: only a run directory"),
    (GROUPS, ["--groups", "0"], "groups: expected a positive integer"),
])
def test_bad_input_is_a_clear_error(tmp_path, capsys, records, args, message):
    src = tmp_path / "in.jsonl"
    if records is not None:
        _write_jsonl(src, records)
    assert main(["explain", str(src), "-o", str(tmp_path / "x.html"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ktae explain: ") and message in err, err
    assert not (tmp_path / "x.html").exists()


def test_no_input_and_bad_run_directory(tmp_path, capsys):
    assert main(["explain"]) == 2
    assert "INPUT: give a run directory" in capsys.readouterr().err
    assert main(["explain", str(tmp_path)]) == 2
    assert "holds no rollouts.jsonl" in capsys.readouterr().err


@pytest.mark.slow
def test_model_default_samples_on_the_spot(tmp_path):
    out = tmp_path / "m.html"
    assert main(["explain", "--model", "default", "-o", str(out), "--groups", "2",
                 "--num-generations", "4"]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.count('<section class="group"') == 2 and "Q:" in page
    assert page.count('class="resp"') == 8 and len(token_spans(page)) > 8
    # own prompts; with a calibration the model scores its responses (log-prob, entropy)
    prompts = _write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Q:5+3 A:", "answer": "8"},
                                                        {"question": "Q:9-4 A:", "answer": 5}])
    assert main(["explain", "--model", "default", "-o", str(out), "--overwrite", "--group", "1",
                 "--prompts", str(prompts), "--num-generations", "3",
                 "--credit", "ktae+taco"]) == 0
    page = out.read_text(encoding="utf-8")
    assert "<h2>prompt 1</h2>" in page and "Q:9-4 A:" in page and "Q:5+3" not in page
    spans = token_spans(page)
    nums = tooltip_numbers(spans[0]["title"])
    assert nums["logp"] <= 0 and nums["entropy"] >= 0 and nums["weight"] in (0.1, 1.0)


def _train_recording(run, *args) -> int:
    """A few-step GRPO run on the shipped model that records 2 groups of every step."""
    return main(["train", "--num-prompts", "2", "--num-generations", "4",
                 "--max-new-tokens", "16", "--eval-size", "4", "--eval-every", "0",
                 "--train-size", "32", "--save-every", "0", "--no-progress", "--algo", "grpo",
                 "--rollout-every", "1", "--rollout-groups", "2", "--output-dir", str(run),
                 *args])


@pytest.mark.slow
def test_train_then_explain_the_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train_recording(run, "--max-steps", "2", "--credit", "ktae+taco",
                            "--taco-alpha", "0.9") == 0
    header, records = read_rollouts(run / "rollouts.jsonl")
    assert header["estimator"] == "ktae" and header["calibration"] == "taco"
    assert [(r["step"], r["group"]) for r in records] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    opts = header["estimator_options"]
    for rec in records:
        # the recorded advantages are KTAE's on the recorded tokens (a group is self-contained)
        ids = rec["responses"]
        T = max(map(len, ids))
        tid = torch.tensor([r + [0] * (T - len(r)) for r in ids])
        mask = torch.tensor([[True] * len(r) + [False] * (T - len(r)) for r in ids])
        adv = ktae.compute_advantages(
            "ktae", rewards=torch.tensor(rec["rewards"]), group=[0] * len(ids), token_ids=tid,
            mask=mask, correct=torch.tensor(rec["correct"]),
            ignore_token_ids=header["ignore_token_ids"], **opts)
        for i, row in enumerate(rec["advantages"]):
            assert row == pytest.approx(adv[i, :len(ids[i])].tolist(), rel=1e-5, abs=1e-5)
        # and the recorded weights are TACO's on the recorded log-probs and entropies
        lp = torch.tensor([r + [0.0] * (T - len(r)) for r in rec["logprobs"]])
        H = torch.tensor([r + [0.0] * (T - len(r)) for r in rec["entropies"]])
        res = ktae.calibrate_advantages("taco", adv, logprobs=lp, entropies=H, mask=mask,
                                        **header["calibration_options"])
        for i, (w, f) in enumerate(zip(rec["weights"], rec["flagged"], strict=True)):
            assert w == pytest.approx(res.weights[i, :len(ids[i])].tolist(), rel=1e-5)
            assert f == [int(x) for x in res.flagged[i, :len(ids[i])].tolist()]
    out = tmp_path / "run.html"
    capsys.readouterr()
    assert main(["explain", str(run), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "step 2 \u00b7 group 0" in page and "step 1 \u00b7 group" not in page
    spans = token_spans(page)
    assert len(spans) == sum(len(r) for rec in records[2:] for r in rec["responses"])
    assert "trained with credit ktae+taco" in page
    assert main(["explain", str(run), "-o", str(out), "--overwrite", "--step", "1",
                 "--credit", "grpo"]) == 0
    page = out.read_text(encoding="utf-8")
    assert "step 1 \u00b7 group 1" in page and 'id="view-token"' not in page
    assert main(["explain", str(run), "--step", "7"]) == 2
    assert "step: 7 was not recorded; recorded steps: [1, 2]" in capsys.readouterr().err


@pytest.mark.slow
def test_gtpo_run_records_the_entropies_its_estimator_read(tmp_path, capsys):
    run = tmp_path / "gtpo"
    assert _train_recording(run, "--max-steps", "1", "--credit", "gtpo") == 0
    header, records = read_rollouts(run / "rollouts.jsonl")
    assert header["estimator"] == "gtpo" and len(records) == 2
    for rec in records:
        ids = rec["responses"]
        assert [len(e) for e in rec["old_entropies"]] == [len(r) for r in ids]
        assert "entropies" not in rec  # no calibration: the current policy's are not kept
        # the recorded advantages are GTPO's on the recorded tokens and entropies
        T = max(map(len, ids))
        mask = torch.tensor([[True] * len(r) + [False] * (T - len(r)) for r in ids])
        H = torch.tensor([e + [0.0] * (T - len(e)) for e in rec["old_entropies"]])
        adv = ktae.compute_advantages(
            "gtpo", rewards=torch.tensor(rec["rewards"]), group=[0] * len(ids), mask=mask,
            entropies=H, correct=torch.tensor(rec["correct"]), **header["estimator_options"])
        for i, row in enumerate(rec["advantages"]):
            assert row == pytest.approx(adv[i, :len(ids[i])].tolist(), rel=1e-4, abs=1e-4)
    out = tmp_path / "gtpo.html"
    capsys.readouterr()
    assert main(["explain", str(run), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "trained with credit gtpo" in page and 'id="view-token"' in page
    assert len(token_spans(page)) == sum(len(r) for rec in records for r in rec["responses"])
    # JSONL responses: --model scores them, its entropies standing in for the rollout's
    src = _write_jsonl(tmp_path / "in.jsonl", GROUPS)
    assert main(["explain", str(src), "--credit", "gtpo", "--model", "default",
                 "-o", str(out), "--overwrite"]) == 0
    assert 'id="view-token"' in out.read_text(encoding="utf-8")


def test_page_outlines_locally_wrong_characters(tmp_path):
    import re

    src = _write_jsonl(tmp_path / "groups.jsonl", GROUPS)
    out = tmp_path / "page.html"
    assert main(["explain", str(src), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    # group 1: "72" (forgotten carry) and "74" (forgotten borrow); group 2: the "9"s of
    # 5+3=9 (the box copies the last result, so only the equation's 9 is wrong)
    wrong = re.findall(r'<span class="lw">([^<]*)</span>', page)
    assert wrong == ["7", "2", "7", "4", "9"]
    assert "locally wrong characters (exact labels)" in page
    assert "locally wrong (exact label)" in page  # in the tooltip
    # user-given spans take the place of the embedded labels; a span outside the text fails
    spans = [{"prompt": "say hi", "rewards": [1, 0], "responses": ["hi there", "bye"],
              "wrong": [[], [[0, 3]]]}]
    src2 = _write_jsonl(tmp_path / "spans.jsonl", spans)
    assert main(["explain", str(src2), "-o", str(out), "--overwrite"]) == 0
    assert re.findall(r'<span class="lw">([^<]*)</span>', out.read_text()) == ["b", "y", "e"]
    spans[0]["wrong"] = [[], [[1, 9]]]
    _write_jsonl(src2, spans)
    assert main(["explain", str(src2), "-o", str(out), "--overwrite"]) == 2


def test_credit_with_its_own_settings(tmp_path):
    src = _write_jsonl(tmp_path / "groups.jsonl", GROUPS)
    out = tmp_path / "page.html"
    assert main(["explain", str(src), "-o", str(out), "--credit", "ktae@ngram=2"]) == 0
    page = out.read_text(encoding="utf-8")
    assert "credit: ktae (base=grpo, mode=exact, ngram=2)" in page
    assert "key span" in page
    assert main(["explain", str(src), "-o", str(out), "--overwrite",
                 "--credit", "ktae@bogus=2"]) == 2
