"""Training prompts: the embedded task (disjoint held-out split) and JSONL files."""

from __future__ import annotations

import json

import pytest
from test_train_helpers import assert_refused

from ktae.train.data import load_task


def test_embedded_train_and_heldout_are_disjoint():
    train, held = load_task("embedded", template="compact", train_size=300, eval_size=50, seed=1)
    assert len(train) == 300 and len(held) == 50
    assert train[0]["prompt"].startswith("Q:") and train[0]["prompt"].endswith(" A:")
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert all(isinstance(r["carry"], bool) for r in held)
    # the held-out set does not depend on the training seed
    _, held2 = load_task("embedded", template="compact", train_size=10, eval_size=50, seed=7)
    assert held2 == held


def test_jsonl_task(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [{"question": f"What is {i}+1?", "answer": i + 1} for i in range(10)]
    rows[3] = {"problem": "What is 3+1?", "answer": "4"}
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    train, held = load_task(f"jsonl:{path}", template="qwen-math", train_size=1, eval_size=5,
                            seed=0)
    assert len(train) == 8 and len(held) == 2  # at most a fifth held out
    assert train[3]["prompt"].startswith("What is 3+1?\n") and "\\boxed{}" in train[3]["prompt"]
    assert held[-1]["answer"] == "10"
    with pytest.raises(ValueError, match="no such file"):
        load_task(f"jsonl:{tmp_path / 'missing.jsonl'}", template="compact", train_size=1,
                  eval_size=1, seed=0)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"answer": 1}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl has no column for 'problem'"):
        load_task(f"jsonl:{tmp_path / 'bad.jsonl'}", template="compact", train_size=1,
                  eval_size=1, seed=0)


@pytest.mark.parametrize("content, match", [
    (b"", "holds no problems"),
    (b"\n\n", "holds no problems"),
    (b'{"question": "1+1?", "answer": 2}\n{"question": "2+2?", "answer": \n',
     r"t\.jsonl, line 2: invalid JSON"),
    (b'{"question": "1+1?", "answer": null}\n', r"t\.jsonl, line 1: answer: .*got null"),
    (b'{"question": "1+1?", "answer": true}\n', r"t\.jsonl, line 1: answer: .*got True"),
    (b'[1, 2]\n', r"t\.jsonl, line 1: expected a JSON object"),
    (b'{"question": "", "answer": 1}\n', r"t\.jsonl, line 1: expected a non-empty problem"),
    (b'{"question": "caf\xe9", "answer": 1}\n', r"t\.jsonl, line 1: not valid UTF-8"),
    (b'{"question": "1+1?", "answer": 2}\n' * 3, "holds 3 problem.*at least 5"),
])
def test_bad_task_files_name_the_problem(tmp_path, content, match):
    from ktae.train.data import read_task

    path = tmp_path / "t.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match) as info:
        read_task(f"jsonl:{path}", train_size=1, eval_size=5, seed=0)
    assert "\n" not in str(info.value)


def test_task_checks_run_before_any_model_loads(tmp_path, capsys, monkeypatch):
    """``ktae train`` refuses a bad task file, a misspelled option and too few training
    problems with one line each, without loading a model."""
    from ktae.cli import main
    from ktae.train import session

    def no_model(cfg, path=None):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(session, "load_model", no_model)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?", "answer": 2}\n{oops}\n')
    small = tmp_path / "small.jsonl"
    small.write_text('{"question": "1+1?", "answer": 2}\n' * 6)
    cases = [
        (["--task", f"jsonl:{bad}"], "line 2"),
        (["--task", f"jsonl:{tmp_path / 'nope.jsonl'}"], "nope.jsonl: no such file"),
        (["--task", f"jsonl:{small}", "--num-prompts", "8"], "fewer than num_prompts=8"),
        (["--estimator-option", "h_1=1"], "h_1"),
        (["--config", str(tmp_path / "missing.yaml")], "not found"),
        (["--trl", "per_device_train_batch_size=4"], "use --num-prompts"),
        (["--trl", "use_vlm=true"], "did you mean 'use_vllm'"),
        (["--trl", "use_vllm=perhaps"], "trl: use_vllm: expected true/false"),
        (["--model", str(tmp_path / "no-such-model")], "model: no such directory"),
    ]
    assert_refused(main, capsys, tmp_path / "out", cases)


def _short_context_model(positions=48):
    from ktae.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    return build_tiny_model(tok, hidden_size=16, num_layers=1, intermediate_size=32,
                            num_heads=2, max_position_embeddings=positions), tok


def test_prompts_are_checked_against_the_models_context(tmp_path):
    from ktae.train.data import format_task, read_task

    model, tok = _short_context_model(48)  # 48 positions: prompts of 48 - 8 = 40 tokens fit
    path = tmp_path / "t.jsonl"
    rows = [{"question": f"{i}+1", "answer": i + 1} for i in range(10)]
    rows[2] = {"question": "1+" * 30 + "1", "answer": "31"}  # 61 characters
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = read_task(f"jsonl:{path}", train_size=1, eval_size=2, seed=0)
    # without the model nothing is checked (and the row reaches generation whole)
    train, _ = format_task(task, "compact", tok)
    assert len(train) == 8
    with pytest.raises(ValueError) as err:
        format_task(task, "compact", tok, model=model, max_new_tokens=8)
    message = str(err.value)
    assert message.startswith("task: training row 2 has a prompt of 67 tokens; "
                              "with max_new_tokens=8 it does not fit in the model's context "
                              "of 48 tokens") and "\n" not in message
    skipped, held = format_task(task, "compact", tok, model=model, max_new_tokens=8,
                                long_prompts="skip")
    assert len(skipped) == 7 and "1+1+1+1" not in "".join(r["prompt"] for r in skipped)
    assert len(held) == 2
    cut, _ = format_task(task, "compact", tok, model=model, max_new_tokens=8,
                         long_prompts="truncate")
    assert len(cut) == 8 and len(tok(cut[2]["prompt"])["input_ids"]) <= 40
    assert cut[2]["prompt"].endswith("+1 A:")
    with pytest.raises(ValueError, match="max_new_tokens: 48 leaves no room"):
        format_task(task, "compact", tok, model=model, max_new_tokens=48)


def test_embedded_prompts_fit_the_shipped_context():
    from ktae.train.data import format_task, read_task

    model, tok = _short_context_model(128)
    task = read_task("embedded", train_size=20, eval_size=5, seed=0)
    train, held = format_task(task, "compact", tok, model=model, max_new_tokens=40)
    assert len(train) == 20 and len(held) == 5
