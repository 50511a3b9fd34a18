"""Prompts longer than the model's context are reported, never a silent 0%; results name
their data; ``--data-dir`` and ``--threads`` do what they say."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from test_train_helpers import save_tiny_model

from ktae.cli import main
from ktae.models import build_char_tokenizer

SHORT = ["--template", "compact", "--max-new-tokens", "4", "--no-progress"]
LONG_PROBLEM = "+".join(["1"] * 80)  # 159 characters: past the tiny model's 128 positions


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.set_num_threads(1)
    return save_tiny_model(tmp_path_factory.mktemp("ctx") / "model")  # context 128


@pytest.fixture()
def data(tmp_path):
    path = tmp_path / "data"
    path.mkdir()
    rows = [("1+1", "2"), (LONG_PROBLEM, "80"), ("2+2", "4")]
    (path / "math500.jsonl").write_text("".join(
        json.dumps({"problem": p, "answer": a, "unique_id": f"t/{i}"}) + "\n"
        for i, (p, a) in enumerate(rows)))
    return path


def _results(out):
    return json.loads((out / "results.json").read_text())


def test_long_prompts_are_refused_by_default(model, data, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["eval", str(model), "--benchmarks", "math500", "--data-dir", str(data),
               *SHORT, "-o", str(out)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "math500: 1 of 3 prompts do not fit in the model's context (longest 165 tokens, " \
        "context 128)" in err
    assert "--long-prompts skip" in err
    assert not (out / "results.json").exists()


def test_long_prompts_skip_and_truncate_are_counted(model, data, tmp_path, capsys):
    out = tmp_path / "skip"
    assert main(["eval", str(model), "--benchmarks", "math500", "--data-dir", str(data),
                 *SHORT, "--long-prompts", "skip", "-o", str(out)]) == 0
    assert "1 skipped" in capsys.readouterr().out
    m = _results(out)["benchmarks"]["math500"]
    assert m["n"] == 2
    assert m["long_prompts"] == {"rule": "skip", "count": 1, "longest": 165, "context": 128,
                                 "budget_cut": 0}
    assert _results(out)["config"]["long_prompts"] == "skip"

    out = tmp_path / "truncate"
    assert main(["eval", str(model), "--benchmarks", "math500", "--data-dir", str(data),
                 *SHORT, "--long-prompts", "truncate", "-o", str(out)]) == 0
    assert "1 truncated" in capsys.readouterr().out
    m = _results(out)["benchmarks"]["math500"]
    assert m["n"] == 3 and m["long_prompts"]["count"] == 1
    rows = [json.loads(x) for x in (out / "samples_math500.jsonl").read_text().splitlines()]
    tok = build_char_tokenizer()
    cut = rows[1]["prompt"]
    assert cut.endswith("+1 A:") and len(tok(cut)["input_ids"]) <= 128 - 4
    assert rows[1]["response_tokens"] >= 1


def test_check_prompts_counts_budgets_cut_by_the_context():
    from ktae.eval.context import check_prompts

    tok = build_char_tokenizer()
    prompts = ["Q:1 A:", "Q:" + "1" * 20 + " A:"]  # 7 and 26 tokens with BOS
    recs, kept, report = check_prompts("b", [0, 1], prompts, tok, context=30,
                                       max_new_tokens=8)
    assert kept == prompts and recs == [0, 1]
    assert report == {"rule": "error", "count": 0, "longest": 26, "context": 30,
                      "budget_cut": 1}
    with pytest.raises(ValueError, match="b: all 2 prompts are longer than the model's "
                       r"context \(shortest 7 tokens, context 7\)"):
        check_prompts("b", [0, 1], prompts, tok, context=7, max_new_tokens=8, rule="skip")
    with pytest.raises(ValueError, match="long_prompts: expected one of"):
        check_prompts("b", [0], prompts[:1], tok, context=30, max_new_tokens=8, rule="x")


def test_results_name_their_data(model, data, tmp_path):
    out = tmp_path / "out"
    assert main(["eval", str(model), "--benchmarks", "math500,embedded", "--data-dir",
                 str(data), "--limit", "2", *SHORT, "--long-prompts", "skip",
                 "-o", str(out)]) == 0
    used = _results(out)["data"]
    file = data / "math500.jsonl"
    assert used["math500"]["source"] == "file"
    assert used["math500"]["file"] == str(file.resolve())
    assert used["math500"]["content_sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
    assert used["math500"]["rows"] == 2 and len(used["math500"]["sha256"]) == 64
    assert used["embedded"] == {"source": "embedded", "split": "test", "seed": 0, "rows": 2,
                                "sha256": used["embedded"]["sha256"]}
    out2 = tmp_path / "fixtures"
    assert main(["eval", str(model), "--benchmarks", "gsm8k", "--fixtures", "--limit", "1",
                 *SHORT, "--long-prompts", "truncate", "-o", str(out2)]) == 0
    assert _results(out2)["data"]["gsm8k"]["source"] == "fixture"


def test_data_dir_without_benchmarks_must_hold_a_saved_dataset(model, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["eval", str(model), "--data-dir", str(empty), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"--data-dir: {empty} is empty" in err and "--benchmarks" in err
    assert not (tmp_path / "o" / "results.json").exists()


def test_threads_option_sets_torch_threads(model, tmp_path, monkeypatch):
    seen = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), real(n)))
    before = torch.get_num_threads()
    try:
        assert main(["eval", str(model), "--benchmarks", "embedded", "--limit", "1", *SHORT,
                     "--threads", "2", "-o", str(tmp_path / "o")]) == 0
    finally:
        real(before)
    assert seen == [2]
    assert main(["eval", str(model), "--benchmarks", "embedded", "--limit", "1", *SHORT,
                 "--threads", "0", "-o", str(tmp_path / "p")]) == 2
