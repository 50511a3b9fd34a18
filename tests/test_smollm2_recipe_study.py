"""studies/smollm2-recipe/arith_baseline.py end to end on a tiny random model with a chat
template: its problems, its counts and the JSON the ``arith-baseline`` table reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "studies" / "smollm2-recipe" / "arith_baseline.py"


def test_arith_baseline_writes_consistent_rates_for_each_difficulty(tmp_path):
    from ktae.models import build_char_tokenizer, build_tiny_model
    from ktae.tasks import arith

    torch.manual_seed(0)
    tok = build_char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64,
                             num_heads=2, seed=0, max_position_embeddings=512)
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    out = tmp_path / "baseline.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--model", str(tmp_path / "model"),
                           "--difficulty", "0,3", "--problems", "3", "--samples", "2",
                           "--max-new-tokens", "3", "--temperature", "0.6", "--seed", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert (data["max_new_tokens"], data["seed"]) == (3, 1)
    assert sorted(data["results"]) == ["0", "3"]
    printed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["difficulty"] for r in printed] == [0, 3]
    for d, row in data["results"].items():
        assert row == next(r for r in printed if r["difficulty"] == int(d))
        passes = row["passes_per_problem"]
        assert len(passes) == 3 and all(0 <= p <= 2 for p in passes)
        assert row["sampled_pass"] == sum(passes) / 6
        assert row["mixed_groups"] == sum(p == 1 for p in passes) / 3
        assert 0 <= row["greedy_accuracy"] <= 1 and 0 <= row["truncated"] <= 1
        assert 0 < row["mean_tokens"]
        kinds = {q.kind for q in arith.generate(3, split="train", seed=1, difficulty=int(d))}
        assert set(row["pass_by_kind"]) == kinds
