"""--protocol ktae|taco, per-benchmark --k, and what reaches each generation backend."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import torch
from test_train_helpers import save_tiny_model

from ktae.cli import main
from ktae.eval.benchmarks import BenchmarkRecord
from ktae.eval.prompts import QWEN_MATH_INSTRUCTION, build_prompt
from ktae.eval.protocols import PROTOCOLS, parse_k, resolve_settings
from ktae.models import build_char_tokenizer, build_tiny_model
from ktae.models.generate import SamplingConfig, hf_generate_kwargs, vllm_sampling_kwargs

MATH = ["aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench"]
SCIENCE = ["mmlu_pro", "gpqa_diamond"]


def test_ktae_preset_is_the_released_evaluation():
    """KTAE's eval/run_eval.sh: template 'our' (the Qwen-Math system prompt), greedy,
    N_SAMPLING=1; the 3,000 new tokens eval_baseline.py ran with (run_eval.sh's
    max_tokens=8000 is never passed on)."""
    s = resolve_settings(MATH + ["gsm8k", "embedded"], protocol="ktae")
    assert (s.template, s.temperature, s.top_p, s.max_new_tokens) == \
        ("qwen-math-system", 0.0, 1.0, 3000)
    assert set(s.k.values()) == {1}
    assert set(s.sources.values()) == {"protocol ktae"}
    assert s.grader == "ktae-authors"  # the grader of the published scores


def test_taco_preset_is_appendix_a():
    s = resolve_settings(MATH + SCIENCE + ["gsm8k"], protocol="taco")
    assert (s.temperature, s.top_p, s.max_new_tokens) == (0.7, 0.9, 16384)
    assert s.k == {"aime24": 32, "aime25": 32, "amc23": 32, "math500": 4, "minerva": 4,
                   "olympiadbench": 4, "mmlu_pro": 16, "gpqa_diamond": 16, "gsm8k": 1}
    # the KTAE suite's AMC split (AMC 2022 and 2023) is sampled as AMC
    assert resolve_settings(["amc22-23"], protocol="taco").k == {"amc22-23": 32}
    # the quoted instruction after the problem, as the user turn; its grading rule; the
    # AIME sets it cites
    assert s.template == "auto" and s.grader == "taco"
    assert PROTOCOLS["taco"].hub_sources == {"aime24": ("math-ai/aime24", "test"),
                                             "aime25": ("math-ai/aime25", "test")}


def test_explicit_flags_override_the_preset():
    s = resolve_settings(["aime24", "math500"], protocol="taco", temperature=1.0, top_p=0.95,
                         max_new_tokens=64, template="chat", k="aime24=8",
                         grader="default")
    assert (s.template, s.temperature, s.top_p, s.max_new_tokens) == ("chat", 1.0, 0.95, 64)
    assert s.k == {"aime24": 8, "math500": 4}
    assert s.sources == {"template": "given", "temperature": "given", "top_p": "given",
                         "max_new_tokens": "given", "k": "given and protocol taco",
                         "grader": "given"}
    assert s.grader == "default"
    assert resolve_settings(["aime24", "math500"], protocol="taco", k="2").k == \
        {"aime24": 2, "math500": 2}
    plain = resolve_settings(["embedded"])
    assert (plain.template, plain.temperature, plain.top_p, plain.max_new_tokens,
            plain.k) == (None, None, 1.0, None, {"embedded": 1})


def test_parse_k():
    assert parse_k("4") == (4, {})
    assert parse_k("aime24=32,math500=4") == (None, {"aime24": 32, "math500": 4})
    assert parse_k(" 2 , aime24 = 8") == (2, {"aime24": 8})
    for bad, message in (("0", "positive"), ("x", "positive"), ("aime24=0", "aime24"),
                         ("2,3", "one bare"), ("a=1,a=2", "twice"), ("=3", "name=k"),
                         ("4,", "empty"), ("", "expected"), ("1.5", "positive")):
        with pytest.raises(ValueError, match=message) as e:
            parse_k(bad)
        assert str(e.value).startswith("--k")
    with pytest.raises(ValueError, match="--k: gsm8k not among the benchmarks"):
        resolve_settings(["aime24"], k="gsm8k=4")
    with pytest.raises(ValueError, match="--protocol"):
        resolve_settings(["aime24"], protocol="deepseek")


def test_qwen_math_system_template_is_the_authors_string():
    """Exactly apply_qwen_math_template of the KTAE authors' eval_baseline.py."""
    rec = BenchmarkRecord("0", "What is $1+1$?", "2", "math500")
    assert build_prompt(rec, "qwen-math-system") == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within "
        "\\boxed{}.<|im_end|>\n<|im_start|>user\nWhat is $1+1$?<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert QWEN_MATH_INSTRUCTION in build_prompt(rec, "qwen-math-system")
    embedded = BenchmarkRecord("e0", "3+4", "7", "embedded")
    assert "<|im_start|>user\nCompute 3+4.<|im_end|>" in build_prompt(embedded,
                                                                     "qwen-math-system")


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_each_preset_maps_one_to_one_onto_both_backends(protocol):
    p = PROTOCOLS[protocol]
    for bench in MATH + SCIENCE:
        s = SamplingConfig(k=p.k_for(bench), temperature=p.temperature, top_p=p.top_p,
                           max_new_tokens=p.max_new_tokens, seed=3)
        v = vllm_sampling_kwargs(s)
        assert v == {"n": p.k_for(bench), "temperature": p.temperature,
                     "top_p": p.top_p, "max_tokens": p.max_new_tokens, "seed": 3}
        h = hf_generate_kwargs(s)
        assert (h["num_return_sequences"], h["max_new_tokens"]) == \
            (p.k_for(bench), p.max_new_tokens)
        if p.temperature > 0:
            assert (h["do_sample"], h["temperature"], h["top_p"], h["top_k"]) == \
                (True, p.temperature, p.top_p, 0)
        else:
            assert h["do_sample"] is False and h["temperature"] is None


def test_vllm_mapping_of_greedy_and_default_temperatures():
    assert vllm_sampling_kwargs(SamplingConfig(k=1, top_p=0.5, max_new_tokens=7)) == \
        {"n": 1, "temperature": 0.0, "top_p": 1.0, "max_tokens": 7, "seed": 0}
    assert vllm_sampling_kwargs(SamplingConfig(k=4, max_new_tokens=7, seed=9)) == \
        {"n": 4, "temperature": 0.6, "top_p": 1.0, "max_tokens": 7, "seed": 9}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return save_tiny_model(tmp_path_factory.mktemp("tiny-protocol"), max_position_embeddings=1024)


def test_ktae_eval_protocol_taco_end_to_end(model_dir, tmp_path, capsys):
    out = tmp_path / "taco"
    rc = main(["eval", str(model_dir), "--protocol", "taco", "--benchmarks",
               "aime24,math500,gpqa_diamond", "--fixtures", "--limit", "2",
               "--max-new-tokens", "3", "--no-progress", "-o", str(out)])
    assert rc == 0
    stdout = capsys.readouterr().out
    assert "protocol taco (TACO paper, Appendix A)" in stdout
    assert "temperature 0.7 (protocol taco), top-p 0.9 (protocol taco); " \
           "k aime24=32, math500=4, gpqa_diamond=16 (protocol taco)" in stdout
    header = next(line for line in stdout.splitlines() if "benchmark" in line).split()
    assert header[:11] == ["benchmark", "n", "k", "avg@k", "±std", "pass@k", "maj@k", "fmt",
                           "trunc", "len", "max"]
    assert any(line.split()[:3] == ["gpqa_diamond", "2", "16"] for line in stdout.splitlines())
    results = json.loads((out / "results.json").read_text())
    config = results["config"]
    assert config["protocol"]["name"] == "taco" and config["protocol"]["max_new_tokens"] == 16384
    assert config["k"] == {"aime24": 32, "math500": 4, "gpqa_diamond": 16}
    assert config["max_new_tokens"] == 3 and config["max_new_tokens_source"] == "given"
    # auto: the tiny model has no chat template, so the plain Qwen-Math user message,
    # which holds the instruction the TACO paper quotes
    assert config["template"] == "qwen-math"
    assert config["template_source"] == "protocol taco"
    assert config["grader"] == "taco" and "grader taco (protocol taco)" in stdout
    for name, k in config["k"].items():
        m = results["benchmarks"][name]
        assert (m["n"], m["k"], m["num_samples"]) == (2, k, 2 * k)
        assert list(m["pass_at"]) == [str(j) for j in range(1, k + 1)]
        assert config["backend_arguments"][name] == {
            "max_new_tokens": 3, "num_return_sequences": k, "do_sample": True,
            "temperature": 0.7, "top_p": 0.9, "top_k": 0}
        rows = [json.loads(x) for x in (out / f"samples_{name}.jsonl").read_text().splitlines()]
        assert len(rows) == 2 * k and all(r["response_tokens"] <= 3 for r in rows)
        if name != "gpqa_diamond":
            assert all(r["prompt"].endswith("Please reason step by step, and put your final "
                                             "answer within \\boxed{}.") for r in rows)
        # a random model rarely stops within 3 tokens: the rate is what the rows say
        assert m["truncation_rate"] == pytest.approx(sum(r["truncated"] for r in rows) / len(rows))


def test_taco_protocol_on_the_saved_ktae_suite(model_dir, tmp_path, capsys):
    """The KTAE evaluation suite (a saved DatasetDict) under --protocol taco: every split
    gets the paper's k under the name it is reported as, whether --benchmarks is left out
    or names the splits by their own names (amc -> amc22-23)."""
    from ktae.eval.benchmarks import FIXTURE_DIR

    suite = FIXTURE_DIR / "ktae_suite"
    want = {"aime24": 32, "amc22-23": 32, "math500": 4, "minerva": 4, "olympiadbench": 4}
    out = tmp_path / "suite"
    assert main(["eval", str(model_dir), "--protocol", "taco", "--data-dir", str(suite),
                 "--limit", "1", "--max-new-tokens", "1", "--no-progress", "-o",
                 str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["k"] == want
    assert {n: m["k"] for n, m in results["benchmarks"].items()} == want
    out2 = tmp_path / "named"
    assert main(["eval", str(model_dir), "--protocol", "taco", "--data-dir", str(suite),
                 "--benchmarks", "amc,aime24,aime", "--limit", "1", "--max-new-tokens", "1",
                 "--no-progress", "-o", str(out2)]) == 0
    config = json.loads((out2 / "results.json").read_text())["config"]
    assert config["benchmarks"] == ["amc22-23", "aime24"]
    assert config["k"] == {"amc22-23": 32, "aime24": 32}
    assert (out2 / "samples_amc22-23.jsonl").is_file()
    capsys.readouterr()


def test_ktae_eval_protocol_ktae_records_and_prints(model_dir, tmp_path, capsys):
    out = tmp_path / "ktae"
    rc = main(["eval", str(model_dir), "--protocol", "ktae", "--benchmarks", "amc23",
               "--fixtures", "--limit", "2", "--max-new-tokens", "2", "--no-progress",
               "-o", str(out)])
    assert rc == 0
    stdout = capsys.readouterr().out
    assert "protocol ktae (the KTAE authors' eval/run_eval.sh and eval_baseline.py)" in stdout
    assert "decoding: greedy (protocol ktae)" in stdout
    assert "template qwen-math-system (protocol ktae), at most 2 new tokens (given)" in stdout
    config = json.loads((out / "results.json").read_text())["config"]
    assert config["protocol"] == PROTOCOLS["ktae"].as_dict()
    assert config["k"] == {"amc23": 1} and config["temperature"] == {"amc23": 0.0}
    assert config["settings_sources"]["temperature"] == "protocol ktae"
    assert config["grader"] == "ktae-authors"


def test_ktae_preset_with_k_above_one_needs_a_temperature(model_dir, tmp_path, capsys):
    rc = main(["eval", str(model_dir), "--protocol", "ktae", "--k", "4", "--benchmarks",
               "amc23", "--fixtures", "-o", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and "temperature: k > 1 samples need temperature > 0" in err
    assert "(benchmark amc23, k=4)" in err
    rc = main(["eval", str(model_dir), "--k", "aime24=4", "--benchmarks", "amc23",
               "--fixtures", "-o", str(tmp_path / "x")])
    assert rc == 2 and "--k: aime24 not among the benchmarks" in capsys.readouterr().err


def test_backend_vllm_without_vllm_is_one_error_line(model_dir, tmp_path, capsys):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    rc = main(["eval", str(model_dir), "--backend", "vllm", "--protocol", "taco",
               "--benchmarks", "aime24", "--fixtures", "-o", str(tmp_path / "v")])
    assert rc == 2 and "--backend vllm: vLLM is not installed" in capsys.readouterr().err


def test_evaluate_takes_k_per_benchmark_and_names_a_missing_one(monkeypatch):
    from ktae.eval import evaluate
    from ktae.eval import runner as runner_mod
    from ktae.models.generate import Generation

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, intermediate_size=32,
                             num_heads=2)
    recs = [BenchmarkRecord("0", "1+1", "2", "custom")]
    seen = []

    def fake_generate(model, tokenizer, prompts, sampling, **kwargs):
        seen.append((sampling.k, sampling.effective_temperature))
        return [[Generation("\\boxed{2}", 1)] * sampling.k]

    monkeypatch.setattr(runner_mod, "generate_hf", fake_generate)
    res = evaluate(model, tok, {"a": recs, "b": recs}, k={"a": 1, "b": 3}, template="compact")
    assert seen == [(1, 0.0), (3, 0.6)]  # greedy at k = 1, sampled above
    assert res["config"]["k"] == {"a": 1, "b": 3}
    assert res["config"]["temperature"] == {"a": 0.0, "b": 0.6}
    assert res["benchmarks"]["b"]["num_samples"] == 3
    with pytest.raises(ValueError, match="k: no sample count for b"):
        evaluate(model, tok, {"a": recs, "b": recs}, k={"a": 1}, template="compact")


def test_taco_reads_aime_from_the_sets_the_paper_cites(monkeypatch):
    """math-ai/aime24 (answers in the solution's box) and math-ai/aime25 replace ktae's
    default AIME sources under --protocol taco; other benchmarks keep theirs."""
    import ktae.eval.benchmarks as bench
    from ktae.data import arrow_rows
    from ktae.eval.runner import load_records

    tables = {
        "math-ai/aime24": [{"id": 60, "problem": "P24", "solution": "so $\\boxed{204}$."}],
        "math-ai/aime25": [{"id": "0", "problem": "P25", "answer": "70"}],
        "HuggingFaceH4/MATH-500": [{"unique_id": "u", "problem": "P", "answer": "1"}],
    }
    calls = []

    def fake_hub(spec, split):
        calls.append((spec.hub_path, split))
        return arrow_rows(pa.Table.from_pylist(tables[spec.hub_path]), spec.hub_path)

    monkeypatch.setattr(bench, "_load_hub", fake_hub)
    recs = load_records(["aime24", "aime25", "math500"],
                        hub_sources=PROTOCOLS["taco"].hub_sources)
    assert calls == [("math-ai/aime24", "test"), ("math-ai/aime25", "test"),
                     ("HuggingFaceH4/MATH-500", "test")]
    assert [(r.problem, r.answer) for n in ("aime24", "aime25") for r in recs[n]] == \
        [("P24", "204"), ("P25", "70")]
