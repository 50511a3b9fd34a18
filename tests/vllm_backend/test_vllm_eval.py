"""``ktae eval --backend vllm`` with real engines of vLLM's CPU build: what results.json
and the cache key record of the engine, greedy completions against the transformers
backend on the same prompts (the shipped tiny model, and SmolLM2-135M-Instruct), and a
quiet start-up."""

from __future__ import annotations

import json

import pytest

from ktae.cli import main

pytestmark = pytest.mark.slow


def _samples(out) -> list[dict]:
    return [json.loads(line) for line in (out / "samples_embedded.jsonl").read_text().splitlines()]


def _eval(model, out, *extra) -> dict:
    assert main(["eval", model, "--benchmarks", "embedded", "--no-progress", "-o", str(out),
                 *extra]) == 0
    return json.loads((out / "results.json").read_text())


def test_engine_recorded_cached_and_greedy_like_transformers(default_model, tmp_path, capfd):
    from ktae.eval.vllm_engine import vllm_distribution

    args = ("--limit", "6", "--max-new-tokens", "12", "--dtype", "float32")
    results = _eval(default_model, tmp_path / "v", "--backend", "vllm", *args)
    logged = capfd.readouterr()
    config = results["config"]
    name, version = vllm_distribution()
    engine = config["engine"]
    assert engine["dtype"] == "float32" and engine["dtype_requested"] == "float32"
    assert (engine["distribution"], engine["version"]) == (name, version)
    assert config["backend"] == "vllm" and engine["seed"] == 0
    key_engine = config["cache_key"]["settings"]["engine"]
    assert {k: engine[k] for k in key_engine} == key_engine  # the key holds what ran
    assert config["backend_arguments"]["embedded"]["temperature"] == 0
    # quiet start-up: none of vLLM's INFO lines (dozens of them with --verbose)
    assert " INFO " not in logged.out + logged.err

    again = tmp_path / "v"
    assert main(["eval", default_model, "--benchmarks", "embedded", "--no-progress", "-o",
                 str(again), "--backend", "vllm", *args]) == 0
    assert "cached:" in capfd.readouterr().out

    hf = _eval(default_model, tmp_path / "h", "--backend", "hf", *args)
    assert hf["config"]["backend"] == "hf" and "engine" not in hf["config"]
    v_rows, h_rows = _samples(tmp_path / "v"), _samples(tmp_path / "h")
    assert [r["completion"] for r in v_rows] == [r["completion"] for r in h_rows]


def test_smollm2_float32_greedy_agrees_with_transformers(smollm2, tmp_path):
    """20 chat-template arithmetic prompts, 32 greedy tokens: the same completions from
    both engines at float32 (benchmarks/vllm_agreement.py measures 100 prompts and
    explains each difference by the top-2 logit gap)."""
    args = ("--limit", "20", "--max-new-tokens", "32", "--template", "chat",
            "--dtype", "float32")
    v = _eval(smollm2, tmp_path / "v", "--backend", "vllm", *args)
    assert v["config"]["engine"]["dtype"] == "float32"
    _eval(smollm2, tmp_path / "h", "--backend", "hf", *args)
    same = sum(a["completion"] == b["completion"] for a, b in
               zip(_samples(tmp_path / "v"), _samples(tmp_path / "h"), strict=True))
    assert same >= 19, same
