"""Each benchmark that no other test runs, end to end at tiny sizes: on a tiny random model
with a chat template (and a LoRA recipe on it) where the benchmark loads a model, with
vLLM faked where it needs vLLM. Each checks what the benchmark promises to print or write,
not how fast anything was."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

RECIPE = """\
model: {model}
task: arith@difficulty=0
reward: number
template: compact
num_prompts: 2
num_generations: 2
max_new_tokens: 4
temperature: 0.7
lora_r: 4
lora_alpha: 16
torch_threads: 1
train_size: 50
eval_size: 10
trl:
  gradient_accumulation_steps: 2
"""


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    """A tiny random Llama with the character tokenizer and a plain chat template."""
    from ktae.models import build_char_tokenizer, build_tiny_model

    path = tmp_path_factory.mktemp("chat") / "model"
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64,
                             num_heads=2, seed=0, max_position_embeddings=512)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    torch.set_num_threads(threads)
    return path


@pytest.fixture(scope="module")
def recipe(chat_model, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("recipe") / "recipe.yaml"
    path.write_text(RECIPE.format(model=chat_model))
    return path


def _run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"smoke_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_contention_times_every_cost_against_the_sort():
    out = _run("bench_contention.py", "--preset", "small", "--contend", "0", "--threads", "1",
               "--repeats", "1").splitlines()
    assert out[0].startswith("preset small: ")
    head = next(i for i, line in enumerate(out) if line.split()[:2] == ["K", "thr"])
    for name in ("sort (floor)", "ktae exact", "ktae reference", "taco", "stapo", "gtpo",
                 "policy loss + backward"):
        assert name in out[head]
    row = out[head + 1].split()
    assert row[:2] == ["0", "1"] and len(row) == 2 + 3 * 7
    assert row[3:5] == ["1.00x", "1.00"]  # the sort against itself, and 1 thread against 1
    # seconds to 2 decimals (a fast CPU may print 0.00s); every cost's ratio to the sort
    assert all(float(s.rstrip("s")) >= 0 for s in row[2::3])
    assert all(float(r.rstrip("x")) > 0 for r in row[3::3])


def test_counting_times_each_path_on_both_batches(tmp_path):
    out = tmp_path / "counting.json"
    _run("bench_counting.py", "--groups", "1", "--repeats", "1", "--json", str(out))
    data = json.loads(out.read_text())
    assert (data["groups"], data["repeats"]) == (1, 1)
    assert set(data["batches"]) == {"topics", "zipf"}
    for batch in data["batches"].values():
        assert batch["tokens"] > 0
        rows = batch["rows"]
        assert {"sort", "bitmap", "hashed"} <= set(rows)
        assert rows["sort"]["median_x_sort"] == 1.0
        for row in rows.values():
            assert row["median_ms"] > 0
            assert row["median_x_sort"] == pytest.approx(row["median_ms"] / rows["sort"]["median_ms"])


def test_data_memory_measures_both_steps_on_the_rows_it_wrote():
    out = _run("data_memory.py", "--rows", "50", "--chars", "40").splitlines()
    assert out[0].startswith("50 rows, problems ")
    for mode, line in zip(("load", "format"), out[1:3], strict=True):
        assert line.split(":")[0].strip() == mode and "50 rows" in line
        base = float(line.split("baseline ")[1].split()[0])
        peak = float(line.split("peak ")[1].split()[0])
        assert 0 < base <= peak


def test_logprob_head_times_three_passes_against_6nt(chat_model, tmp_path):
    out = tmp_path / "head.json"
    _run("bench_logprob_head.py", "--model", str(chat_model), "--rows", "2", "--prompt", "5",
         "--completion", "4", "--rounds", "2", "--json", str(out))
    data = json.loads(out.read_text())
    assert (data["rows"], data["prompt"], data["completion"]) == (2, 5, 4)
    n = sum(p.numel() for p in _tiny_parameters(chat_model))
    assert data["parameters"] == n
    assert data["floor_6NT"] == pytest.approx(6 * n * 2 * 9 / data["matmul_flops"])
    assert set(data["passes"]) == {"TRL's fused head", "ktae's full head", "backbone alone"}
    for p in data["passes"].values():
        assert p["total"] == pytest.approx(p["forward"] + p["backward"])


def _tiny_parameters(path: Path):
    from transformers import AutoModelForCausalLM

    return list(AutoModelForCausalLM.from_pretrained(path).parameters())


def test_sampling_measures_the_draw_attention_and_the_lora_forward(chat_model, recipe, tmp_path):
    out = tmp_path / "sampling.json"
    _run("bench_sampling.py", "--model", str(chat_model), "--recipe", str(recipe), "--repeats",
         "1", "--json", str(out))
    data = json.loads(out.read_text())
    draw, attention, lora = data["draw"], data["attention"], data["lora"]
    assert draw["rows"] == 4 and draw["ratio"] == pytest.approx(
        draw["categorical_ms"] / draw["torch_multinomial_ms"])
    assert attention["heads"] == 2 and attention["ratio"] == pytest.approx(
        attention["float32_ms"] / attention["bfloat16_ms"])
    assert lora["adapter"].startswith("random")
    merged = lora["rows"]["float32, merged"]
    assert merged["max_vs_float32"] < 1e-4  # merging the adapter changes only rounding


def test_self_teacher_times_its_pass_against_the_policy_pass(chat_model, tmp_path):
    out = tmp_path / "teacher.json"
    _run("bench_self_teacher.py", "--model", str(chat_model), "--prompts", "1",
         "--generations", "2", "--new-tokens", "4", "--rows-per-pass", "2", "--rounds", "1",
         "--out", str(out))
    data = json.loads(out.read_text())
    assert (data["rows"], data["new_tokens"], data["rounds"]) == (2, 4, 1)
    # the teacher reads each row after a privileged prompt: more tokens than the policy
    assert data["tokens_teacher_pass"] > data["tokens_policy_pass"] == 2 * (
        data["prompt_tokens"] + 4)
    med = data["median_seconds"]
    assert data["teacher_over_policy"] == pytest.approx(med["teacher_pass"] / med["policy_pass"])
    assert data["teacher_over_policy_by_round"] == [data["teacher_over_policy"]]


def test_importance_times_the_three_ways(chat_model):
    out = _run("bench_importance.py", "--model", str(chat_model), "--prompts", "2",
               "--samples", "2", "--rounds", "1", "--max-new-tokens", "4").splitlines()
    assert out[0].startswith("2 groups, 4 responses")
    head = next(i for i, line in enumerate(out) if line.startswith("way "))
    rows = {line[:14].strip(): line[14:].split() for line in out[head + 1:head + 4]}
    assert set(rows) == {"two passes", "cache", "cache, split"}
    assert rows["two passes"][2:] == ["1.00", "1.00"]


def test_importance_memory_measures_a_rows_setting_in_its_own_process(recipe, tmp_path):
    """One setting (each costs a fresh interpreter): the child's peaks, the importance's
    seconds and its sum, as written and as returned."""
    out = tmp_path / "memory.json"  # the parent in-process, the setting in its child
    returned = _load("importance_memory").main(
        ["--recipe", str(recipe), "--rows", "1", "--prompts", "1", "--generations", "2",
         "--new-tokens", "3", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(returned))
    (r,) = data
    assert (r["rows_per_pass"], r["batch"], r["new_tokens"]) == (1, 2, 3)
    assert r["peak_after_gib"] >= r["peak_before_gib"] > 0
    assert r["added_gib"] == pytest.approx(r["peak_after_gib"] - r["peak_before_gib"], abs=1e-3)
    assert r["seconds"] > 0 and math.isfinite(r["importance_sum"]) and r["importance_sum"] != 0


def test_bf16_drift_compares_both_precisions(recipe, tmp_path, monkeypatch, keep_threads):
    """Run in-process with the CPU check passed: on a CPU without native bfloat16 the tiny
    model's products are emulated, slowly but at this size in well under a second."""
    import ktae.train.precision as precision

    drift = _load("bf16_drift")
    assert drift.first_difference((1, 2, 3), (1, 2, 3)) is None
    assert drift.first_difference((1, 2, 3), (1, 5, 3)) == 1
    assert drift.first_difference((1, 2), (1, 2, 3)) == 2
    monkeypatch.setattr(precision, "check_bf16", lambda device: "bfloat16 (test)")
    out = tmp_path / "drift.json"
    result = drift.main(["--recipe", str(recipe), "--prompts", "3", "--rounds", "2",
                         "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert (result["prompts"], result["max_new_tokens"]) == (3, 4)
    assert result["identical"] + len(result["first_difference"]) == 3
    for r in result["precisions"].values():
        assert len(r["all_seconds"]) == 2 and 0 <= r["accuracy"] <= 1
    f32, b16 = result["precisions"]["float32"], result["precisions"]["bfloat16"]
    assert result["speed_ratio"] == pytest.approx(b16["seconds"] / f32["seconds"])


class _FakeLLM:
    """Stands in for a vLLM engine: generates with the transformers model it is given."""

    def __init__(self, path):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path).eval()


def test_generation_rates_both_engines_per_workload(chat_model, tmp_path, monkeypatch,
                                                    keep_threads):
    """bench_generation with vLLM faked by transformers: each workload's rates over the
    rounds, their medians and vLLM's ratio, for each number of busy processes."""
    import ktae.eval.vllm_engine as engine
    from ktae.models.generate import generate_hf

    calls = []

    def generate_vllm(llm, tokenizer, prompts, sampling, add_special_tokens=True):
        calls.append((len(prompts), sampling.k))
        return generate_hf(llm.model, tokenizer, prompts, sampling, batch_size=len(prompts),
                           add_special_tokens=add_special_tokens)

    monkeypatch.setattr(engine, "load_vllm", lambda path, dtype: _FakeLLM(path))
    monkeypatch.setattr(engine, "generate_vllm", generate_vllm)
    monkeypatch.setattr(engine, "engine_settings",
                        lambda llm, requested_dtype: {"dtype": requested_dtype})
    bench = _load("bench_generation")
    out = tmp_path / "generation.json"
    assert bench.main(["--model", str(chat_model), "--eval-batch", "2", "--train-batch", "4",
                       "--generations", "2", "--new-tokens", "3", "--rounds", "2",
                       "--threads", "1", "--contend", "0,1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["engine"] == {"dtype": "float32"} and data["new_tokens"] == 3
    assert [(r["contend"], r["workload"], r["responses"]) for r in data["results"]] == [
        (0, "eval", 2), (0, "train", 4), (1, "eval", 2), (1, "train", 4)]
    for r in data["results"]:
        assert all(len(v) == 2 for v in r["rounds"].values())
        assert r["ratio"] == pytest.approx(r["vllm_tokens_per_s"] / r["hf_tokens_per_s"],
                                           abs=0.01)
    # a warm-up call, then two rounds of each workload at each contention
    assert calls == [(2, 1)] + [(2, 1), (2, 1), (2, 2), (2, 2)] * 2


FAKE_PYTHON = """#!/bin/sh
echo "$@" >> "{log}"
"""


def test_vllm_step_time_runs_the_steps_then_both_parts(tmp_path):
    """benchmarks/vllm_step_time.sh with a stand-in for the vLLM environment's Python: the
    three bench_vllm_step.py commands, in order, into the output folder it was given."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON.format(log=tmp_path / "calls.log"))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=str(fake))
    done = subprocess.run(["bash", str(BENCH / "vllm_step_time.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert out.is_dir()
    script = str(BENCH / "bench_vllm_step.py")
    calls = [line.split() for line in (tmp_path / "calls.log").read_text().splitlines()]
    assert calls == [
        [script, "steps", "--out-dir", f"{out}/steps", "--steps", "3", "--rounds", "2",
         "--bracket", "1"],
        [script, "parts", "--out", f"{out}/parts.json"],
        [script, "parts", "--vllm-lora", "--out", f"{out}/parts-lora.json", "--out-dir-lora",
         f"{out}/adapters"]]
    bad = subprocess.run(["bash", str(BENCH / "vllm_step_time.sh")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "usage: vllm_step_time.sh OUT" in bad.stderr


def test_vllm_agreement_finds_a_flipped_token_and_its_top2_gap(chat_model, tmp_path,
                                                               monkeypatch, keep_threads):
    """vllm_agreement with vLLM faked by transformers' own greedy completions, one of them
    changed to transformers' runner-up at its second token: that prompt differs there,
    with vLLM's token ranked 2 and the top-2 gap transformers' logits give; the others
    agree. A second run reads transformers' completions from --hf-cache."""
    import ktae.eval.vllm_engine as engine
    from ktae.models.generate import generate_hf

    def generate_vllm(llm, tokenizer, prompts, sampling, add_special_tokens=True):
        gens = generate_hf(llm.model, tokenizer, prompts, sampling, batch_size=len(prompts),
                           add_special_tokens=add_special_tokens)
        first = gens[0][0]
        ids = tokenizer(prompts[0], add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = llm.model(torch.tensor([ids + list(first.token_ids[:1])])).logits[0, -1]
        runner_up = int(torch.topk(logits, 2).indices[1])
        flipped = dataclasses.replace(first, token_ids=(*first.token_ids[:1], runner_up))
        return [[flipped]] + gens[1:]

    monkeypatch.setattr(engine, "load_vllm", lambda path, dtype: _FakeLLM(path))
    monkeypatch.setattr(engine, "generate_vllm", generate_vllm)
    monkeypatch.setattr(engine, "engine_settings",
                        lambda llm, requested_dtype: {"dtype": requested_dtype})
    bench = _load("vllm_agreement")
    cache = tmp_path / "hf.json"
    args = ["--model", str(chat_model), "--limit", "3", "--max-new-tokens", "4", "--threads",
            "1", "--hf-cache", str(cache)]
    assert bench.main([*args, "--out", str(tmp_path / "a.json")]) == 0
    report = json.loads((tmp_path / "a.json").read_text())
    assert (report["prompts"], report["identical"], report["differ"]) == (3, 2, 1)
    (d,) = report["disagreements"]
    assert (d["prompt"], d["position"], d["vllm_token_rank"]) == (0, 1, 2)
    assert d["top2_gap"] == pytest.approx(d["gap_hf_vs_vllm_token"]) and d["top2_gap"] >= 0
    assert report["vllm_token_is_hf_runner_up"] == 1
    assert report["largest_top2_gap_at_a_difference"] == d["top2_gap"]
    saved = json.loads(cache.read_text())
    assert bench.main([*args, "--out", str(tmp_path / "b.json")]) == 0
    again = json.loads((tmp_path / "b.json").read_text())
    assert again["seconds"]["hf"] == round(saved["seconds"], 1)  # read, not measured again
    assert again["disagreements"] == report["disagreements"]
