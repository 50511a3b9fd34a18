"""benchmarks/bench_step.py runs end to end on a tiny model and prints what it promises."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
    # every response is --new-tokens long: generation stops only at an id never drawn
    # (generation_seconds checks the lengths it samples)
    assert result["stop_ids"] == [json.loads((tiny_model / "config.json").read_text())
                                  ["vocab_size"]]
    parts = result["ktae_part_medians"]
    assert parts["logprobs"] > 0  # beta > 0: the reference pass
    assert result["floors"]["logprobs"] == pytest.approx(result["floors"]["update"] / 3)
    assert sum(parts[p] for p in ("generation", "scoring", "logprobs", "advantages", "update",
                                  "other")) == pytest.approx(parts["step"], rel=0.05)
    assert f"ktae/TRL = {result['ratio']:.3f}" in out
    for part in ("generation", "logprobs", "update"):
        line = next(x for x in out.splitlines() if x.strip().startswith(part + " "))
        seconds, floor, ratio = (float(v) for v in line.split()[1:4])
        assert ratio == pytest.approx(seconds / floor, rel=0.2, abs=0.02)
        assert line.endswith(result["floor_of"][part])
    assert result["floor_of"]["update"].startswith("6 N T")
    # generation's floor decodes at the rate over the model's own weights; the cached
    # rate's floor is recorded beside it
    rates, n, batch = result["matmul"], result["parameters"], result["batch"]
    prefill = 2 * n * batch * result["prompt_tokens"] / rates["train_flops"]
    for floor, rate in ((result["floors"]["generation"], rates["decode_streamed_flops"]),
                        (result["generation_floor_cached"], rates["decode_flops"])):
        assert floor == pytest.approx(prefill + 2 * n * batch * 6 / rate)
    assert result["floors"]["update"] == pytest.approx(
        6 * result["parameters"] * result["matmul"]["train_rows"]
        / result["matmul"]["train_flops"])


TINY_RECIPE = """\
model: {model}
task: arith@difficulty=0
reward: number
template: compact
num_prompts: 2
num_generations: 2
max_new_tokens: 5
temperature: 0.7
lora_r: 4
lora_alpha: 16
torch_threads: 1
train_size: 50
eval_size: 10
trl:
  gradient_accumulation_steps: 2
"""



@pytest.mark.slow
def test_the_self_teacher_step_beside_the_plain_one(tiny_model, tmp_path, capsys):
    out = subprocess.run(
        [sys.executable, str(BENCH), "--model", str(tiny_model), "--prompts", "2",
         "--generations", "2", "--new-tokens", "6", "--threads", "1", "--rounds", "2",
         "--only", "step", "--kinds", "ktae,sdpo", "--json", str(tmp_path / "b.json")],
        capture_output=True, text=True, check=True, timeout=600).stdout
    result = json.loads((tmp_path / "b.json").read_text())
    assert [len(result["steps"][k]) for k in ("ktae", "sdpo")] == [2, 2]
    med = {k: statistics.median(v) for k, v in result["steps"].items()}
    assert result["ratio_sdpo"] == pytest.approx(med["sdpo"] / med["ktae"])
    assert f"sdpo/none = {result['ratio_sdpo']:.3f}" in out
    cpu = {k: statistics.median(v) for k, v in result["step_cpu"].items()}
    assert result["ratio_sdpo_cpu"] == pytest.approx(cpu["sdpo"] / cpu["ktae"])
    # --credit sdpo reaches the trainer: its log-prob part holds the policy's and the
    # teacher's passes, which --credit none (beta 0, one update per batch) does not run
    logprobs = {k: statistics.median(p["logprobs"] for p in parts)
                for k, parts in (("ktae", result["ktae_parts"]), ("sdpo", result["sdpo_parts"]))}
    assert logprobs["sdpo"] > 0 and logprobs["ktae"] < logprobs["sdpo"]
    sys.path.insert(0, str(BENCH.parent))
    import bench_step

    with pytest.raises(SystemExit) as bad:  # refused before anything runs: in this process
        bench_step.main(["--kinds", "ktae,sdpx"])
    assert bad.value.code == 2 and "--kinds: expected ktae" in capsys.readouterr().err


def test_recipe_memory_runs_each_split_and_compares_their_steps(tiny_model, tmp_path):
    """recipe_memory.py: one ``ktae train`` per split, each process's peak memory, and the
    same steps in one micro-batch and in two (the same rewards, the loss and gradient norm
    to float rounding)."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(TINY_RECIPE.format(model=tiny_model))
    out = subprocess.run(
        [sys.executable, str(BENCH.parent / "recipe_memory.py"), "--recipe", str(recipe),
         "--splits", "1,2", "--precisions", "float32", "--json", str(tmp_path / "m.json")],
        capture_output=True, text=True, check=True, timeout=600).stdout
    rows = json.loads((tmp_path / "m.json").read_text())["rows"]
    assert [(r["micro_batches"], r["rows_per_micro_batch"]) for r in rows] == [(1, 4), (2, 2)]
    for row in rows:
        assert 0.1 < row["peak_gb"] < 50 and [s["step"] for s in row["steps"]] == [1, 2]
    against = rows[1]["against_first"]
    assert against["rewards_equal"] and against["loss"] < 1e-5 and against["grad_norm"] < 1e-5
    assert "float32  2 against 1 micro-batch(es): rewards equal" in out
    bad = subprocess.run([sys.executable, str(BENCH.parent / "recipe_memory.py"), "--recipe",
                          str(recipe), "--splits", "3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--splits: expected divisors of the recipe's 4 rows" in bad.stderr

def test_streamed_matmul_rate_reads_one_matrix_per_layer(monkeypatch):
    """``streamed``: every entry of the shapes multiplies its own weight matrix, in order
    (a forward pass's reads); otherwise one matrix per distinct shape, reused."""
    sys.path.insert(0, str(BENCH.parent))
    import bench_step

    shapes = [(8, 4), (4, 6), (8, 4), (4, 6), (6, 3)]
    seen = []
    real = torch.mm

    def recorded(a, b):
        seen.append((tuple(a.shape), tuple(b.shape), b.data_ptr()))
        return real(a, b)

    monkeypatch.setattr(torch, "mm", recorded)
    for streamed, weights in ((True, 5), (False, 3)):
        seen.clear()
        assert bench_step.matmul_rate(shapes, 2, repeats=1, streamed=streamed) > 0
        timed = seen[len(seen) // 2:]  # after the warm-up: one pass
        assert len(timed) == len(shapes) and {b[1] for b in timed} == set(shapes)
        assert all(a == (2, b[0]) for a, b, _ in timed)
        assert len({ptr for *_, ptr in timed}) == weights
        if streamed:
            assert [b for _, b, _ in timed] == shapes


def test_lora_sizes_and_floor_flops():
    """N_b, N_h and N_a of a peft model counted by hand; 4 N_b T + 4 N_h T_c + 6 N_a T."""
    peft = pytest.importorskip("peft")
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(BENCH.parent))
    from bench_step import lora_sizes, lora_update_flops

    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    model = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules="all-linear",
                                                       task_type="CAUSAL_LM"))
    per_layer = 16 * 16 * 2 + 16 * 8 * 2 + 16 * 24 * 3      # q, o; k, v; gate, up, down
    adapters = 2 * ((16 + 16) * 2 + (16 + 8) * 2 + (16 + 24) * 3)
    assert lora_sizes(model) == {"body": 2 * per_layer, "head": 50 * 16,
                                 "adapters": 2 * adapters}
    assert lora_update_flops(lora_sizes(model), tokens=30, scored=12) == (
        4 * 2 * per_layer * 30 + 4 * 50 * 16 * 12 + 6 * 2 * adapters * 30)


@pytest.mark.slow
def test_lora_recipe_step_of_two_trees(tiny_model, tmp_path):
    """--lora reads the recipe's batch, tokens, micro-batches and adapters; bench_step_ab
    runs each tree (here this one twice) in its own process and prints the parts; on a CPU
    with bfloat16 instructions the new tree's runs are --bf16 (--new-args), their floors at
    the bfloat16 matmul rate."""
    from cpu_bf16 import NATIVE_BF16

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(TINY_RECIPE.format(model=tiny_model))
    src = str(BENCH.parents[1] / "src")
    bf16 = NATIVE_BF16 is not None
    out = subprocess.run(
        [sys.executable, str(BENCH.parent / "bench_step_ab.py"), src, "--rounds", "1",
         *(["--new-args=--bf16"] if bf16 else []),
         "--json", str(tmp_path / "ab.json"), "--", "--lora", str(recipe)],
        capture_output=True, text=True, check=True, timeout=600).stdout
    result = json.loads((tmp_path / "ab.json").read_text())
    for tree in ("old", "new"):
        (run,) = result["runs"][tree]
        assert run["ktae_src"] == str(Path(src) / "ktae")
        assert run["bf16"] == (bf16 and tree == "new")
        assert run["batch"] == 4 and run["new_tokens"] == 5 and run["lora"] == str(recipe)
        assert run["trl_settings"] == {"gradient_accumulation_steps": 2}
        assert set(run["steps"]) == {"ktae"}  # --kinds ktae: no TRL trainer
        assert run["micro_batches_by_prompt"] is True  # grpo, no calibration
        sizes = run["lora_sizes"]
        assert sizes["adapters"] > 0 and run["floor_of"]["update"].endswith("(LoRA)")
        tokens = run["matmul"]["train_rows"]
        assert run["lora_update_flops"] == 4 * sizes["body"] * tokens + 4 * sizes["head"] * 4 * 5 \
            + 6 * sizes["adapters"] * tokens
        assert run["floors"]["update"] == pytest.approx(
            run["lora_update_flops"] / run["matmul"]["train_flops"])
        own = run["lora_passes"]
        assert own["total"] == pytest.approx(own["forward"] + own["backward"])
        assert own["x_floor"] == pytest.approx(own["total"] / run["floors"]["update"])
    assert "update, no trainer" in result["table"]
    cpu = result["table"]["step, CPU time"]
    assert 0 < cpu["new"] and 0 < cpu["old"]
    shared = result["table"]["generation, 1 prefill/prompt"]
    assert shared["new_floor"] < result["table"]["generation"]["new_floor"]  # 2 prompts, 4 rows
    cached = result["table"]["generation, cached rate"]
    assert cached["new_floor"] == pytest.approx(statistics.median(
        r["generation_floor_cached"] for r in result["runs"]["new"]))
    prefix = result["table"]["update, 1 prefix/prompt"]
    assert 0 < prefix["new_floor"] < result["table"]["update"]["new_floor"]
    again = subprocess.run(
        [sys.executable, str(BENCH.parent / "bench_step_ab.py"), str(tmp_path / "ab.json"),
         "--from-json"], capture_output=True, text=True, check=True, timeout=60).stdout
    assert again.splitlines()[-12:] == out.splitlines()[-12:]
    update = next(x for x in out.splitlines() if x.startswith("update "))
    assert update.endswith("(LoRA)") and len(update.split()) > 7
    assert "load average" in out


def _bench_step_ab():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_step_ab", BENCH.parent / "bench_step_ab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_expected_distinct_prompts_of_a_micro_batch_against_enumeration():
    from itertools import combinations

    ab = _bench_step_ab()
    for groups, size, rows in [(2, 2, 2), (3, 2, 3), (4, 3, 5), (4, 8, 8)]:
        members = [g for g in range(groups) for _ in range(size)]
        if groups * size <= 12:
            draws = [len({members[i] for i in c})
                     for c in combinations(range(groups * size), rows)]
            assert ab.expected_distinct(groups, size, rows) == pytest.approx(sum(draws) / len(draws))
    assert ab.expected_distinct(4, 8, 32) == 4 and ab.expected_distinct(4, 8, 1) == 1
    assert ab.expected_distinct(4, 8, 8) == pytest.approx(3.7203, abs=1e-4)


def test_shared_prefix_floor_counts_each_distinct_prompt_once_a_micro_batch():
    ab = _bench_step_ab()
    run = {"lora_sizes": {"body": 100, "head": 10, "adapters": 1}, "batch": 4, "prompts": 2,
           "new_tokens": 3, "prompt_tokens": 5, "trl_settings": {"gradient_accumulation_steps": 2},
           "matmul": {"train_flops": 2.0}}
    distinct = 2 * (2 * (1 - 1 / 6))  # 2 micro-batches of 2 rows from 2 prompts x 2 rows
    tokens = 4 * 4 + distinct * 4
    assert ab.shared_prefix_floor(run) == pytest.approx(
        (4 * 100 * tokens + 4 * 10 * 12 + 6 * tokens) / 2.0)
    run["micro_batches_by_prompt"] = True  # the trainer keeps the batch in prompt order
    tokens = 4 * 4 + 2 * 4  # each micro-batch is one prompt's 2 rows
    assert ab.shared_prefix_floor(run) == pytest.approx(
        (4 * 100 * tokens + 4 * 10 * 12 + 6 * tokens) / 2.0)


def test_spanned_groups_of_consecutive_micro_batches_against_enumeration():
    ab = _bench_step_ab()
    for groups, size, rows in [(4, 8, 8), (4, 8, 12), (2, 4, 8), (3, 2, 4), (5, 3, 1), (4, 8, 32)]:
        members = [g for g in range(groups) for _ in range(size)]
        blocks = [members[i:i + rows] for i in range(0, groups * size, rows)]
        assert ab.spanned_groups(groups, size, rows) == sum(len(set(b)) for b in blocks)
    assert ab.spanned_groups(4, 8, 8) == 4 < 4 * ab.expected_distinct(4, 8, 8)


FAKE_VLLM_PYTHON = """#!/bin/sh
# stands in for a vLLM environment's Python running bench_vllm_step.py steps
echo "$@" >> "{log}"
while [ $# -gt 0 ]; do
  if [ "$1" = "--out-dir" ]; then out="$2"; fi
  if [ "$1" = "--first" ]; then first="$2"; fi
  shift
done
mkdir -p "$out"
if [ "$first" = "vllm" ]; then v=30; else v=20; fi
printf '{{"steps after the first": {{"hf": {{"step_time": 40, "generation_seconds": 20, \
"logprob_seconds": 0, "update_seconds": 19}}, "vllm": {{"step_time": %s, \
"generation_seconds": 8, "logprob_seconds": 1, "update_seconds": 19}}, "ratio": 0}}}}' \
"$v" > "$out/summary.json"
"""


def test_vllm_rounds_alternate_their_order_and_make_one_table(tmp_path):
    """--vllm: each round runs bench_vllm_step.py steps with the given Python, hf first in
    even rounds and vLLM first in odd ones; the table holds the medians over rounds and the
    median of each round's ratio."""
    ab = _bench_step_ab()
    fake = tmp_path / "python"
    fake.write_text(FAKE_VLLM_PYTHON.format(log=tmp_path / "calls.log"))
    fake.chmod(0o755)
    rounds = [ab.vllm_round(str(fake), tmp_path / f"v{r}", 3, first)
              for r, first in enumerate(("hf", "vllm", "hf"))]
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert all("bench_vllm_step.py steps" in c and "--steps 3" in c and "--rounds 1" in c
               and "--bracket 0" in c for c in calls)
    assert [c.split("--first ")[1].split()[0] for c in calls] == ["hf", "vllm", "hf"]
    table = ab.vllm_table(rounds)
    assert table["step"] == {"hf": 40, "vllm": 20, "ratio": 0.5}
    assert table["generation"]["ratio"] == pytest.approx(0.4)
    assert math.isnan(table["logprob"]["ratio"])  # transformers ran no such pass


def test_bench_vllm_step_order_of_backends(monkeypatch, tmp_path):
    """bench_vllm_step.py steps --first vllm starts each pair with vLLM."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_vllm_step",
                                                  BENCH.parent / "bench_vllm_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    seen = []

    def train_once(out, backend, **kw):
        seen.append(backend)
        return {"backend": backend, "rows": [{k: 1.0 for k in module.PARTS}] * 2,
                "checks": [], "wall_seconds": 1.0, "load_start": 0.0, "load_end": 0.0}

    monkeypatch.setattr(module, "train_once", train_once)
    monkeypatch.setattr(sys, "argv", ["x", "steps", "--out-dir", str(tmp_path / "o"),
                                      "--rounds", "2", "--bracket", "1", "--first", "vllm"])
    module.main()
    assert seen == ["vllm", "hf", "vllm", "hf", "vllm"]


def test_profile_by_kind_sorts_a_real_profile():
    """profile_step's kinds from a real profile: a product, the attention kernel, an
    operation over a vocabulary-sized last dimension, and an elementwise rest, each in
    its own kind, summing to the profile's self time."""
    sys.path.insert(0, str(BENCH.parent))
    from profile_step import by_kind

    vocab = 97
    x, w = torch.randn(16, 32), torch.randn(32, 48)
    q = torch.randn(1, 2, 5, 8)
    logits = torch.randn(4, vocab)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        torch.mm(x, w)
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
        torch.log_softmax(logits, -1)
        torch.sin(x)
    events = prof.key_averages(group_by_input_shape=True)
    kinds = by_kind(events, vocab)
    assert list(kinds) == ["products", "attention", "vocabulary-sized", "the rest"]
    assert all(seconds > 0 for seconds in kinds.values())
    assert sum(kinds.values()) == pytest.approx(
        sum(e.self_cpu_time_total for e in events) / 1e6)
    assert by_kind(events, vocab + 1)["vocabulary-sized"] == 0  # no tensor of that size


@pytest.mark.slow
@pytest.mark.parametrize("ktae", [False, True])
def test_bench_compile_times_eager_and_compiled_layers(tiny_model, tmp_path, ktae):
    """bench_compile on a tiny recipe: the compiled layers give eager's log-probs, both
    variants are timed each round, and the pay-back count follows from the medians; the
    trainer's path (--ktae) compiles the prompt's pass and the responses' apart.

    The compilation is the test's cost: the recipe adapts one projection (q_proj) rather
    than every linear layer, a smaller graph to trace and fewer kernels to build, and
    inductor builds them in this process (one compile thread) rather than starting a pool
    of interpreters, which a suite running on every core gains nothing from."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(TINY_RECIPE.format(model=tiny_model) + "lora_target_modules: [q_proj]\n")
    out = subprocess.run(
        [sys.executable, str(BENCH.parent / "bench_compile.py"), "--recipe", str(recipe),
         "--float32", "--rounds", "2", "--lengths", "9,12", "--json", str(tmp_path / "c.json"),
         *(["--ktae"] if ktae else [])],
        capture_output=True, text=True, check=True, timeout=600,
        env={**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}).stdout
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["rows"] == 2 and result["new_tokens"] == 5 and not result["bf16"]
    assert result["ktae_path"] == ktae and f"compiled graphs: {result['unique_graphs']}" in out
    assert result["unique_graphs"] >= (2 if ktae else 1)
    assert result["logp_sum"]["compiled"] == pytest.approx(result["logp_sum"]["eager"], rel=1e-3)
    med = result["medians"]
    for name in ("eager", "compiled"):
        assert len(result["times"][name]) == 2 and min(result["times"][name]) > 0
        assert med[name] == pytest.approx(statistics.median(result["times"][name]))
    assert result["compiled_over_eager"] == pytest.approx(med["compiled"] / med["eager"])
    if med["eager"] > med["compiled"]:
        assert result["passes_to_pay"] == pytest.approx(
            (result["first_compiled_s"] - med["compiled"]) / (med["eager"] - med["compiled"]))
        assert f"after {result['passes_to_pay']:.0f} passes" in out
    else:
        assert result["passes_to_pay"] is None and "pays never" in out
