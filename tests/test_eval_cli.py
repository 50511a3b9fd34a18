"""End-to-end ``ktae eval`` on a tiny random local model, and the evaluate() pipeline."""

from __future__ import annotations

import json

import pytest
import torch

from ktae.cli import main
from ktae.eval import BenchmarkRecord, evaluate, load_benchmark
from ktae.eval import runner as runner_mod
from ktae.eval.benchmarks import BENCHMARKS, fixture_path
from ktae.models import build_char_tokenizer, build_tiny_model
from ktae.models.generate import Generation, SamplingConfig, generate_hf
from ktae.rewards import math_reward

AUTHOR_FIELDS = ("results", "avg", "avg_lens", "max_lens", "formatted")
METRICS = ("accuracy", "pass_at_k", "mean_response_length", "max_response_length",
           "formatted_rate", "n", "k", "num_samples", "timeouts")


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64,
                             num_heads=2, max_position_embeddings=1024)
    return model, tok


@pytest.fixture(scope="module")
def model_dir(tiny, tmp_path_factory):
    model, tok = tiny
    path = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_ktae_eval_end_to_end(model_dir, tmp_path):
    out = tmp_path / "out"
    names = [*BENCHMARKS, "embedded"]
    rc = main(["eval", str(model_dir), "--benchmarks", ",".join(names), "--fixtures",
               "--limit", "4", "--max-new-tokens", "10", "--template", "compact",
               "--batch-size", "3", "--output-dir", str(out)])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert set(AUTHOR_FIELDS) <= set(results)
    assert list(results["benchmarks"]) == names
    assert results["config"]["template"] == "compact"
    assert results["config"]["k"] == dict.fromkeys(names, 1)
    for name in names:
        m = results["benchmarks"][name]
        assert set(METRICS) <= set(m)
        expected_n = 4 if name == "embedded" else min(4, len(load_benchmark(
            name, path=fixture_path(name))))
        rows = _read_jsonl(out / f"samples_{name}.jsonl")
        assert m["n"] == expected_n == len(rows) and m["k"] == 1
        for row in rows:
            assert {"prompt", "completion", "extracted", "correct", "answer",
                    "response_tokens"} <= set(row)
            assert row["prompt"].startswith("Q:") and row["prompt"].endswith(" A:")
            assert 1 <= row["response_tokens"] <= 10
            r = math_reward(row["completion"], row["answer"])
            assert (r.correct, r.extracted, r.formatted) == \
                (row["correct"], row["extracted"], row["formatted"])
        assert m["accuracy"] == pytest.approx(sum(r["correct"] for r in rows) / len(rows))
        assert m["formatted_rate"] == pytest.approx(sum(r["formatted"] for r in rows) / len(rows))
        assert m["max_response_length"] == max(r["response_tokens"] for r in rows)
        assert m["mean_response_length"] == pytest.approx(
            sum(r["response_tokens"] for r in rows) / len(rows))
        assert results["results"][name] == m["accuracy"]
        assert results["avg_lens"][name] == m["mean_response_length"]
        assert results["max_lens"][name] == m["max_response_length"]
        assert results["formatted"][name] == m["formatted_rate"]
    assert results["avg"] == pytest.approx(sum(results["results"].values()) / len(names))


def test_ktae_eval_avg_at_k(model_dir, tmp_path):
    out = tmp_path / "k"
    rc = main(["eval", str(model_dir), "--benchmarks", "embedded", "--limit", "3", "--k", "2",
               "--temperature", "1.0", "--top-p", "0.9", "--max-new-tokens", "6",
               "-o", str(out), "--no-progress"])
    assert rc == 0
    rows = _read_jsonl(out / "samples_embedded.jsonl")
    assert [(r["index"], r["sample"]) for r in rows] == [(i, j) for i in range(3) for j in (0, 1)]
    m = json.loads((out / "results.json").read_text())["benchmarks"]["embedded"]
    assert (m["n"], m["k"], m["num_samples"]) == (3, 2, 6)
    assert m["pass_at_k"] >= m["accuracy"]
    # auto template: the char tokenizer has no chat template -> qwen-math prompts
    assert rows[0]["prompt"].startswith("Compute ")


def test_evaluate_scores_what_the_model_says(tiny, monkeypatch):
    """With generation replaced by known answers, every metric is exact."""
    model, tok = tiny
    recs = [BenchmarkRecord(str(i), f"{i}+{i}", str(2 * i), "custom") for i in range(4)]

    def fake_generate(model, tokenizer, prompts, sampling, **kwargs):
        assert len(prompts) == 4 and sampling.k == 2
        kwargs["on_batch"](len(prompts))
        # problem i: sample 0 right for even i, sample 1 always unformatted
        return [[Generation(f"so \\boxed{{{2 * i + (i % 2)}}}", 3 + i), Generation("eh", 1)]
                for i in range(4)]

    monkeypatch.setattr(runner_mod, "generate_hf", fake_generate)
    res = evaluate(model, tok, {"custom": recs}, k=2, temperature=0.7, template="compact",
                   show_progress=True)
    m = res["benchmarks"]["custom"]
    assert m["accuracy"] == pytest.approx(2 / 8)
    assert m["pass_at_k"] == pytest.approx(2 / 4)
    assert m["formatted_rate"] == pytest.approx(4 / 8)
    assert m["mean_response_length"] == pytest.approx((3 + 4 + 5 + 6 + 4) / 8)
    assert m["max_response_length"] == 6
    assert [r["correct"] for r in res["samples"]["custom"]] == \
        [True, False, False, False, True, False, False, False]


def test_generate_hf_stops_at_eos_and_restores_state(tiny):
    model, tok = tiny
    prompts = ["Q:1+1 A:", "Q:22+3 A:"]
    model.train()
    tok.padding_side = "right"
    first = generate_hf(model, tok, prompts, SamplingConfig(max_new_tokens=5), batch_size=1)
    assert model.training and tok.padding_side == "right"
    assert [len(g) for g in first] == [1, 1] and all(g[0].num_tokens == 5 for g in first)
    # make the first greedily generated token of prompt 0 an end-of-sequence token
    enc = tok(prompts[:1], return_tensors="pt")
    with torch.no_grad():
        t0 = int(model(**enc).logits[0, -1].argmax())
    old = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [old, t0]
    try:
        again = generate_hf(model, tok, prompts[:1], SamplingConfig(max_new_tokens=5))
    finally:
        model.generation_config.eos_token_id = old
    assert again[0][0].num_tokens == 1
    assert again[0][0].text == tok.decode([t0], skip_special_tokens=True)
    # batching does not change greedy outputs (left padding)
    assert generate_hf(model, tok, prompts, SamplingConfig(max_new_tokens=5), batch_size=2) \
        == first


@pytest.mark.parametrize("kwargs, name", [
    ({"k": 0}, "k"), ({"k": 2, "temperature": 0}, "temperature"),
    ({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
    ({"max_new_tokens": 0}, "max_new_tokens")])
def test_sampling_config_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingConfig(**kwargs)


def test_evaluate_validation(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="benchmarks"):
        evaluate(model, tok, "embedded")
    with pytest.raises(ValueError, match="backend"):
        evaluate(model, tok, ["embedded"], backend="tpu")
    with pytest.raises(ValueError, match="template"):
        evaluate(model, tok, ["embedded"], template="chat", limit=1)


def test_ktae_eval_data_dir_and_errors(model_dir, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "gsm8k.jsonl").write_text(fixture_path("gsm8k").read_text())
    out = tmp_path / "dd"
    assert main(["eval", str(model_dir), "--benchmarks", "gsm8k", "--data-dir", str(data),
                 "--limit", "2", "--max-new-tokens", "4", "--output-dir", str(out),
                 "--no-progress"]) == 0
    rows = _read_jsonl(out / "samples_gsm8k.jsonl")
    assert [r["answer"] for r in rows] == ["72", "10"]
    assert "gsm8k" in capsys.readouterr().out  # the results table
    assert main(["eval", str(model_dir), "--benchmarks", "nope", "--no-progress"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err
    assert main(["eval", str(model_dir), "--benchmarks", "embedded", "--k", "2",
                 "--temperature", "0", "--output-dir", str(out)]) == 2


def test_generation_leaves_the_global_rng_alone():
    """Evaluating inside a training loop must not change the training trajectory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ktae.models.generate import SamplingConfig, generate_hf
    from ktae.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    generate_hf(model, tok, ["Q:1+2 A:"], SamplingConfig(k=2, temperature=1.0, max_new_tokens=4))
    assert torch.equal(torch.rand(3), expected)
