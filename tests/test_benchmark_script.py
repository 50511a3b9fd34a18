"""The advantage benchmark runs end to end on its small preset and prints its table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_advantages.py"


def test_small_preset_prints_ratios_and_memory():
    out = subprocess.run([sys.executable, str(BENCH), "--preset", "small", "--repeats", "1",
                          "--threads", "1", "--ngram", "1,2"], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    cells = {}
    for name in ("sort (floor)", "grpo", "ktae exact", "ktae reference", "ktae ngram=2"):
        line = next(x for x in out.splitlines() if x.startswith(name + " "))
        cells[name] = [float(v) for v in line[len(name):].split()]
    assert cells["sort (floor)"][1] == 1.0  # the floor's ratio to itself
    for name in ("ktae exact", "ktae reference", "ktae ngram=2"):
        seconds, ratio, memory, to_unigram = cells[name]
        assert seconds > 0 and ratio > 0 and memory >= 0 and to_unigram > 0
    assert cells["ktae exact"][3] == 1.0  # the unigram's ratio to itself
    assert "x ngram=1" in out and "ngram_reduce='mean'" in out


@pytest.mark.slow
def test_ngram_coverage_script(tmp_path):
    script = BENCH.parent / "ngram_coverage.py"
    out = subprocess.run([sys.executable, str(script), "--prompts", "6", "--samples", "4",
                          "--ngram", "1,2", "--json", str(tmp_path / "c.json")],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    assert "6 held-out prompts x 4 samples" in out
    table = [ln for ln in out.splitlines() if ln.startswith("| 1 ") or ln.startswith("| 2 ")]
    assert len(table) == 3  # N = 1, and N = 2 with both reductions
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert [(r["ngram"], r["reduce"]) for r in rows] == [(1, "mean"), (2, "mean"), (2, "maxabs")]
    for r in rows:
        assert 0 <= r["nonzero_all"] <= 1


def test_graded_rewards_time_the_graded_split_against_the_threshold():
    out = subprocess.run([sys.executable, str(BENCH), "--preset", "small", "--repeats", "1",
                          "--threads", "1", "--rewards", "graded"], capture_output=True,
                         text=True, check=True, timeout=300).stdout
    assert "graded rewards" in out and "x threshold" in out
    assert "thresholded KTAE at reward_threshold=0.5" in out
    cells = {}
    for name in ("ktae exact", "ktae graded"):
        line = next(x for x in out.splitlines() if x.startswith(name + " "))
        cells[name] = [float(v) for v in line[len(name):].split()]
    assert cells["ktae exact"][3] == 1.0  # thresholded KTAE's ratio to itself
    seconds, ratio, memory, to_threshold = cells["ktae graded"]
    assert seconds > 0 and ratio > 0 and memory >= 0 and to_threshold > 0
