"""studies/claims: the harnesses behind studies/claims/report.md, on the SmolLM2 responses
of ``tests/data/smollm2_arithmetic_samples.jsonl.gz``."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import random
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "claims"
SAMPLES = ROOT / "tests" / "data" / "smollm2_arithmetic_samples.jsonl.gz"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, STUDY / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _records() -> list[dict]:
    with gzip.open(SAMPLES, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_the_fixture_holds_the_sampler_s_problems_and_exact_answers():
    """The sampler at its default seed writes the fixture's problems, in order, with
    their answers; each answer is the problem's arithmetic, recomputed here."""
    sampler = _load("sample_arithmetic_responses")
    rng = random.Random(0)
    records = _records()
    assert len(records) == 500
    for rec in records:
        text, answer = sampler.make_problem(rng)
        assert (rec["problem"], rec["answer"]) == (text, str(answer))
    kinds = {"+": 0, "-": 0, "*": 0, "/": 0}
    for rec in records:
        words = rec["problem"].removeprefix("What is ").removesuffix("?").split()
        if len(words) == 3 and words[1] in kinds:
            a, op, b = int(words[0]), words[1], int(words[2])
            kinds[op] += 1
            exact = {"+": a + b, "-": a - b, "*": a * b, "/": Fraction(a, b)}[op]
            assert Fraction(rec["answer"]) == exact
    assert all(kinds.values())  # every bare operation is among the problems


def test_wilson_interval_matches_its_closed_form():
    wilson = _load("claims_rate").wilson
    z = 1.959964
    for k, n in ((0, 4), (2, 28), (5, 5), (37, 100)):
        p = k / n
        centre = (k + z * z / 2) / (n + z * z)
        half = z * math.sqrt(n * p * (1 - p) + z * z / 4) / (n + z * z)
        low, high = wilson(k, n)
        assert low == pytest.approx(centre - half, abs=1e-12)
        assert high == pytest.approx(centre + half, abs=1e-12)
        assert low <= p <= high
    assert all(math.isnan(v) for v in wilson(0, 0))


def test_claims_rate_prints_the_report_s_figures():
    out = subprocess.run([sys.executable, str(STUDY / "claims_rate.py"), str(SAMPLES)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [
        "500 responses, 307 with a claim; 508 claims, 383 false (75.4%)",
        "explicit: 4 right answers, 0 of them with a false claim (0.0%, 95% Wilson interval "
        "0.0% to 49.0%)",
        "number reward: 28 right answers, 2 of them with a false claim (7.1%, 95% Wilson "
        "interval 2.0% to 22.6%)",
    ]
    report = (STUDY / "report.md").read_text()
    assert all(line in report for line in out)
