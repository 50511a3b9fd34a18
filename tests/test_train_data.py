"""Training prompts: the embedded task (disjoint held-out split) and JSONL files."""

from __future__ import annotations

import json

import pytest

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
    with pytest.raises(ValueError, match="not found"):
        load_task(f"jsonl:{tmp_path / 'missing.jsonl'}", template="compact", train_size=1,
                  eval_size=1, seed=0)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"answer": 1}) + "\n")
    with pytest.raises(ValueError, match="line 1"):
        load_task(f"jsonl:{tmp_path / 'bad.jsonl'}", template="compact", train_size=1,
                  eval_size=1, seed=0)
