"""benchmarks/bench_step.py runs end to end on a tiny model and prints what it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_step.py"


@pytest.mark.slow
def test_tiny_model_step_against_floor_and_trl(tiny_model, tmp_path):
    out = subprocess.run(
        [sys.executable, str(BENCH), "--model", str(tiny_model), "--prompts", "2",
         "--generations", "2", "--new-tokens", "6", "--threads", "1", "--rounds", "1", "--steps", "2",
         "--beta", "0.04", "--json", str(tmp_path / "b.json")],
        capture_output=True, text=True, check=True, timeout=600).stdout
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["batch"] == 4 and result["new_tokens"] == 6
    assert result["matmul"]["train_rows"] == 4 * (result["prompt_tokens"] + 6)
    assert result["matmul"]["train_flops"] > 0 and result["matmul"]["decode_flops"] > 0
    assert set(result["passes"]) == {"forward", "forward, with gradients", "backward"}
    assert min(result["passes"].values()) > 0 and "x" in out.split("own passes")[1]
    gens = result["generation"]
    assert {"dynamic cache", "static cache"} <= set(gens) and min(gens.values()) > 0
    # two steps per trainer per turn, each timed; the medians are of the second ones
    assert [len(result["steps"][k]) for k in ("ktae", "trl")] == [2, 2]
    assert result["first_step_medians"] == {k: result["steps"][k][0] for k in ("ktae", "trl")}
    assert result["ratio"] == pytest.approx(result["steps"]["ktae"][1] / result["steps"]["trl"][1])
    assert "first steps of each turn" in out
    parts = result["ktae_part_medians"]
    assert parts["logprobs"] > 0  # beta > 0: the reference pass
    assert result["floors"]["logprobs"] == pytest.approx(result["floors"]["update"] / 3)
    assert sum(parts[p] for p in ("generation", "scoring", "logprobs", "advantages", "update",
                                  "other")) == pytest.approx(parts["step"], rel=0.05)
    assert f"ktae/TRL = {result['ratio']:.3f}" in out
    for part in ("generation", "logprobs", "update"):
        line = next(x for x in out.splitlines() if x.strip().startswith(part + " "))
        seconds, floor, ratio = (float(v) for v in line.split()[1:])
        assert ratio == pytest.approx(seconds / floor, rel=0.2, abs=0.02)
