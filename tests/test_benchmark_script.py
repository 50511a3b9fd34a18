"""The advantage benchmark runs end to end on its small preset and prints its table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_bf16 import needs_native_bf16

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_advantages.py"


def test_small_preset_prints_ratios_and_memory(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH), "--preset", "small", "--repeats", "1",
                          "--threads", "1", "--ngram", "1,2", "--json", str(tmp_path / "b.json")],
                         capture_output=True, text=True, check=True, timeout=300).stdout
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
    record = json.loads((tmp_path / "b.json").read_text())  # the same figures as the table
    assert record["preset"] == "small" and record["threads"] == 1 and record["contend"] == 0
    assert len(record["load_average"]) == 2
    for name, values in cells.items():
        row = record["rows"][name]
        assert f"{row['median_seconds']:.4f}" == f"{values[0]:.4f}"
        assert f"{row['median_x_sort']:.2f}" == f"{values[1]:.2f}"
        if len(values) > 2:  # the rows with a memory probe
            assert f"{row['peak_extra_x_input']:.2f}" == f"{values[2]:.2f}"


def test_zipf_batch_is_timed_and_recorded_with_the_cpu(tmp_path):
    sys.path.insert(0, str(BENCH.parent))
    from synthetic import PRESETS, make_batch

    out = subprocess.run([sys.executable, str(BENCH), "--preset", "small", "--repeats", "1",
                          "--threads", "1", "--zipf", "--no-reference", "--no-memory",
                          "--kernel", "default", "--json", str(tmp_path / "z.json")],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    record = json.loads((tmp_path / "z.json").read_text())
    assert record["cpu_capability"] == "DEFAULT"  # --kernel: torch's kernel level
    zipf = make_batch(*PRESETS["small"], zipf=True)
    topics = make_batch(*PRESETS["small"])
    assert record["zipf"] is True and "(zipf ids)" in out
    assert record["real_tokens"] == zipf.num_tokens != topics.num_tokens
    assert record["cpu"] and record["cpu_capability"] in out
    assert record["rows"]["ktae exact"]["median_x_sort"] > 0

    def distinct_per_token(batch) -> float:  # the batch's (group, token) pairs per token
        keys = (batch.group[:, None] * 151_936 + batch.token_ids)[batch.mask]
        return keys.unique().numel() / keys.numel()

    # ids over the whole vocabulary, no topic vocabulary: more distinct tokens per group
    assert distinct_per_token(zipf) > 1.2 * distinct_per_token(topics)
    lengths = zipf.mask.sum(1).double()
    assert lengths.mean() > 1.1 * lengths.median()  # log-normal: a long right tail


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
    """The graded split's row beside thresholded KTAE's, each with its memory probe; the
    reference mode's row and probe (test_small_preset_prints_ratios_and_memory checks
    them) are left out (``--no-reference``)."""
    out = subprocess.run([sys.executable, str(BENCH), "--preset", "small", "--repeats", "1",
                          "--threads", "1", "--rewards", "graded", "--no-reference"],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    assert "graded rewards" in out and "x threshold" in out
    assert "thresholded KTAE at reward_threshold=0.5" in out
    cells = {}
    for name in ("ktae exact", "ktae graded"):
        line = next(x for x in out.splitlines() if x.startswith(name + " "))
        cells[name] = [float(v) for v in line[len(name):].split()]
    assert cells["ktae exact"][3] == 1.0  # thresholded KTAE's ratio to itself
    assert not any(x.startswith("ktae reference") for x in out.splitlines())
    seconds, ratio, memory, to_threshold = cells["ktae graded"]
    assert seconds > 0 and ratio > 0 and memory >= 0 and to_threshold > 0


def test_cli_threads_benchmark_parses_its_options_and_prints_its_table():
    script = BENCH.parent / "bench_cli_threads.py"
    out = subprocess.run([sys.executable, str(script), "--dry-run", "--commands",
                          "simulate,train", "--contend", "0,2", "--threads", "1,2"],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    assert "simulate [1, 2] (default 1)" in out and "train [1, 2] (default 1)" in out
    rows = [ln.split("|")[1:-1] for ln in out.splitlines() if ln.startswith("| simulate ")
            or ln.startswith("| train ")]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        ("simulate", "0"), ("train", "0"), ("simulate", "2"), ("train", "2")]
    for r in rows:  # made-up times 1 + i + K s: the default (1 thread) is the best
        assert r[3].strip() == "1" and float(r[-1]) == 1.0
        assert float(r[2]) >= 0  # the load average
    bad = subprocess.run([sys.executable, str(script), "--dry-run", "--commands", "nope"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "unknown command(s) nope" in bad.stderr


def _import_benchmark(name: str):
    """benchmarks/<name>.py as a module, to run its ``main(argv)`` in this process (no
    interpreter and torch to start for a run that takes milliseconds)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, BENCH.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_attention_kernel_benchmark_times_both_kernels_on_the_same_attention(
        tmp_path, capsys, keep_threads):
    """The update's shapes and the refusals in this process; the decoding table in its
    own (it keeps freed memory for reuse, a process-wide setting)."""
    bench = BENCH.parent / "bench_attention_kernel.py"
    module = _import_benchmark("bench_attention_kernel")
    module.main(["--rows", "2", "--heads", "4", "--kv-heads", "2", "--rounds", "2", "--json",
                 str(tmp_path / "a.json")])
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "a.json").read_text())
    assert [(r["queries"], r["keys"]) for r in record["rows"]] == [(124, 124), (64, 124), (60, 60)]
    for r in record["rows"]:
        assert r["flash_s"] > 0 and r["math_s"] > 0 and r["largest_difference"] <= 1e-4
        assert r["math_over_flash"] == pytest.approx(r["math_s"] / r["flash_s"])
        assert r["gqa_over_flash"] == pytest.approx(r["flash_gqa_s"] / r["flash_s"])
        assert f"| {r['queries']} x {r['keys']} |" in out
    for argv, message in ((["--rounds", "0"], "--rounds: expected a positive integer"),
                          (["--kv-heads", "2"], "--kv-heads: expected a divisor of --heads")):
        with pytest.raises(SystemExit) as bad:
            module.main(argv)
        assert bad.value.code == 2 and message in capsys.readouterr().err
    out = subprocess.run([sys.executable, str(bench), "--decoding", "--rows", "4", "--heads",
                          "4", "--kv-heads", "2", "--rounds", "2", "--json",
                          str(tmp_path / "d.json")],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    record = json.loads((tmp_path / "d.json").read_text())
    assert record["args"]["decoding"] and record["args"]["rows"] == 4
    assert [r["keys"] for r in record["rows"]] == [60, 92, 124]
    for r in record["rows"]:  # ktae's decoding attention against transformers' path
        assert r["sdpa_s"] > 0 and r["matmul_s"] > 0 and r["largest_difference"] <= 1e-4
        assert r["matmul_over_sdpa"] == pytest.approx(r["matmul_s"] / r["sdpa_s"])
        assert f"| {r['keys']} |" in out


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=needs_native_bf16)])
def test_allocator_benchmark_runs_both_settings_and_the_kept_one_reuses_pages(tmp_path, dtype):
    """The recipe's vocabulary-sized tensors, in float32 (``--dtype``) on any CPU and in
    the recipe's bfloat16 (the default) where the CPU multiplies it natively; a narrow
    hidden size (``--hidden 64``) keeps the products cheap and those tensors' size."""
    from ktae.train.allocator import _glibc

    if _glibc() is None:
        pytest.skip("the setting is glibc's")
    bench = BENCH.parent / "bench_allocator.py"
    dtype_args = ["--dtype", dtype] if dtype != "bfloat16" else []
    out = subprocess.run([sys.executable, str(bench), "--processes", "1", "--hidden", "64",
                          *dtype_args, "--json", str(tmp_path / "m.json")],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    record = json.loads((tmp_path / "m.json").read_text())
    assert record["dtype"] == dtype and record["hidden"] == 64
    assert [r["dtype"] for rs in record["runs"].values() for r in rs] == [f"torch.{dtype}"] * 2
    assert [r["kept"] for r in record["runs"]["kept"]] == [True]
    assert [r["kept"] for r in record["runs"]["default"]] == [False]
    med = record["medians"]
    # the default maps each vocabulary-sized tensor afresh; the kept setting reuses them
    assert med["default"]["faults"] > 10 * med["kept"]["faults"]
    assert record["kept_over_default"] == pytest.approx(med["kept"]["seconds"]
                                                        / med["default"]["seconds"])
    assert "| kept |" in out and "kept / default:" in out


def test_bf16_path_under_the_isa_limit_is_emulated(tmp_path, monkeypatch, capsys):
    """benchmarks/bf16_path.py under ONEDNN_MAX_CPU_ISA=AVX2: ktae sees no native bfloat16
    whatever the CPU, no oneDNN bfloat16 kernel runs, and the product is slower than
    float32's (``--expect emulated`` holds, ``--expect native`` fails naming why). Its
    ``main`` runs in this process: ktae's decision reads the limit from the environment
    when asked, and the products run in the child process it starts, which inherits it."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # any CPU: ktae then sees no bfloat16
    bf16_path = _import_benchmark("bf16_path")
    args = ["--rows", "4", "--vocab", "4096", "--repeats", "1", "--json",
            str(tmp_path / "p.json"), "--expect"]
    bf16_path.main([*args, "emulated"])
    stdout = capsys.readouterr().out
    record = json.loads((tmp_path / "p.json").read_text())
    assert record["ktae_native_bf16"] is None and record["onednn_max_cpu_isa"] == "AVX2"
    assert (record["rows"], record["vocab"], record["repeats"]) == (4, 4096, 1)
    assert record["bf16_over_float32"] == pytest.approx(
        record["seconds"]["bfloat16"] / record["seconds"]["float32"])
    assert record["bf16_over_float32"] > 1
    assert not any(isa in impl for impl in record["onednn_impls"]["bfloat16"]
                   for isa in ("avx512_core_bf16", "amx"))
    assert "ktae native bfloat16: None" in stdout
    with pytest.raises(SystemExit) as native:  # a message: the script exits 1
        bf16_path.main([*args, "native"])
    assert str(native.value.code).startswith(
        "bf16_path: expected native bfloat16 products; ktae sees no native bfloat16")


@pytest.mark.parametrize("arg", ["--rows", "--vocab", "--repeats"])
def test_bf16_path_refuses_a_non_positive_size(arg, capsys):
    with pytest.raises(SystemExit) as done:  # refused before the child starts
        _import_benchmark("bf16_path").main([arg, "0"])
    assert done.value.code == 2
    assert f"{arg}: expected a positive integer, got 0" in capsys.readouterr().err


def test_compare_times_the_replaced_and_the_torch_paths_in_the_same_rounds(tmp_path):
    pytest.importorskip("numba", reason="numba is not installed (pip install 'ktae[fast]')")
    subprocess.run([sys.executable, str(BENCH), "--preset", "small", "--repeats", "2",
                    "--threads", "1", "--ngram", "1,3", "--compare", "--no-reference",
                    "--no-memory", "--prefix-value", "--json", str(tmp_path / "c.json")],
                   capture_output=True, text=True, check=True, timeout=300)
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    # the small preset is under JIT_MIN_POSITIONS: the loops are also timed forced
    for unit in ("ktae exact", "ktae ngram=3"):
        assert {unit + s for s in ("", " [sort]", " [torch]", " [jit]")} <= set(rows)
    assert {"prefix-value" + s for s in ("", " [unique]", " [lcp]", " [jit]")} <= set(rows)
    assert all(len(r["seconds"]) == 2 for r in rows.values() if "seconds" in r)
