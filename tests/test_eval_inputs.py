"""``ktae eval`` refuses bad input before loading anything (one error line, exit 2), finds
models locally, in the hub cache or (only when reachable) on the hub, and evaluates a
model with the template and budget it was trained with (``ktae_generation.json``)."""

from __future__ import annotations

import http.server
import json
import logging
import socket
import threading
import time
import warnings

import pytest
import torch

from ktae.cli import main
from ktae.eval import (
    GENERATION_FILE,
    evaluate,
    generation_defaults,
    load_benchmark,
    save_generation_defaults,
)
from ktae.eval import runner as runner_mod
from ktae.eval.benchmarks import BenchmarkRecord
from ktae.models import build_char_tokenizer, build_tiny_model
from ktae.models import warmstart as ws
from ktae.models.generate import Generation, SamplingConfig, context_length, generate_hf
from ktae.models.generation_defaults import resolve_generation
from ktae.models.model_path import resolve_model_path

# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64,
                             num_heads=2, max_position_embeddings=256)
    return model, tok


@pytest.fixture()
def model_dir(tiny, tmp_path):
    model, tok = tiny
    path = tmp_path / "tiny-model"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture()
def no_loading(monkeypatch):
    """Fail the test if ktae eval gets as far as loading a tokenizer or model."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("loaded a model although the input was bad")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.fixture
def hub_calls(monkeypatch):
    """What a failing ``ktae eval`` asked of the network: the hub requests made through
    huggingface_hub's session, and any sleep (a retry's back-off). Deterministic
    stand-ins for a wall-clock bound on "fails at once"."""
    import huggingface_hub.utils

    calls = {"requests": [], "sleeps": []}
    real = huggingface_hub.utils.get_session

    class Counting:
        def __init__(self, session):
            self._session = session

        def __getattr__(self, name):
            attr = getattr(self._session, name)
            if name in ("head", "get", "request", "send", "stream"):
                def counted(*a, **kw):
                    calls["requests"].append((name, a[:1]))
                    return attr(*a, **kw)

                return counted
            return attr

    monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda: Counting(real()))
    monkeypatch.setattr(time, "sleep", lambda seconds: calls["sleeps"].append(seconds))
    return calls


def _eval(capsys, *args):
    rc = main(["eval", *args, "--no-progress"])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _one_error_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("ktae eval: "), err
    assert "Traceback" not in err
    return lines[0]


# --------------------------------------------------------------------------- MODEL


def test_missing_model_directory_fails_fast_naming_it(capsys, tmp_path, no_loading, hub_calls):
    missing = tmp_path / "runs" / "dapo-ktae-seed0" / "final"
    rc, _, err = _eval(capsys, str(missing), "--output-dir", str(tmp_path / "o"))
    assert rc == 2 and hub_calls == {"requests": [], "sleeps": []}  # no network, no wait
    assert f"MODEL: no such directory: {missing}" in _one_error_line(err)
    assert not (tmp_path / "o").exists()


def test_model_argument_that_is_not_a_model(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ValueError, match=f"MODEL: {f} is a file"):
        resolve_model_path(str(f))
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=rf"MODEL: {run} is not a model directory \(no "
                                         rf"config.json\); the run's model is in {run}/final"):
        resolve_model_path(str(run))
    with pytest.raises(ValueError, match="MODEL: expected a model directory or hub id"):
        resolve_model_path("")
    adapters = tmp_path / "lora-final"
    adapters.mkdir()
    (adapters / "adapter_config.json").write_text("{}")
    assert resolve_model_path(str(adapters)) == str(adapters)


def test_default_names_the_shipped_model_unless_a_directory_has_that_name(tmp_path,
                                                                          monkeypatch):
    from ktae.models.warmstart import default_model_path

    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("default") == str(default_model_path())
    (tmp_path / "default").mkdir()
    (tmp_path / "default" / "config.json").write_text("{}")
    assert resolve_model_path("default") == "default"


@pytest.mark.slow
def test_eval_prints_no_weight_loading_bar(tmp_path, capfd):
    from ktae.cli import main

    assert main(["eval", "default", "--benchmarks", "embedded", "--limit", "2",
                 "-o", str(tmp_path / "out")]) == 0
    out, err = capfd.readouterr()
    assert "Loading weights" not in out + err


def _fake_hub_cache(root, repo_id: str, model_dir) -> str:
    """The hub cache layout for ``repo_id`` holding the files of ``model_dir``."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("ab" * 20)
    snapshot.mkdir(parents=True)
    for f in model_dir.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("ab" * 20)
    return str(snapshot)


def test_hub_id_in_the_local_cache_is_evaluated_offline(model_dir, tmp_path, monkeypatch,
                                                       capsys):
    cache = tmp_path / "hub-cache"
    save_generation_defaults(model_dir, template="compact", max_new_tokens=5)
    snapshot = _fake_hub_cache(cache, "some-org/tiny-math", model_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # any network use would fail
    assert resolve_model_path("some-org/tiny-math") == snapshot
    out = tmp_path / "o"
    rc, stdout, err = _eval(capsys, "some-org/tiny-math", "--benchmarks", "embedded",
                            "--limit", "2", "--output-dir", str(out))
    assert rc == 0, err
    config = json.loads((out / "results.json").read_text())["config"]
    assert config["template"] == "compact" and config["max_new_tokens"] == 5
    assert config["max_new_tokens_source"] == f"{snapshot}/{GENERATION_FILE}"


def test_hub_id_offline_and_not_cached_fails_at_once(tmp_path, monkeypatch, capsys,
                                                     no_loading, hub_calls):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    rc, _, err = _eval(capsys, "Qwen/Qwen2.5-Math-7B", "--output-dir", str(tmp_path / "o"))
    assert rc == 2 and hub_calls == {"requests": [], "sleeps": []}  # offline: no request
    line = _one_error_line(err)
    assert "MODEL: Qwen/Qwen2.5-Math-7B is neither a local directory nor in the Hugging " \
           "Face cache, and HF_HUB_OFFLINE is set" in line


def _online(monkeypatch, tmp_path, endpoint: str) -> None:
    """As on a machine with network (CI exports HF_HUB_OFFLINE=1 for everything else)."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_ENDPOINT", endpoint)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_hub_is_one_quick_error(tmp_path, monkeypatch, capsys, no_loading,
                                            hub_calls):
    _online(monkeypatch, tmp_path, f"http://127.0.0.1:{_closed_port()}")
    rc, _, err = _eval(capsys, "Qwen/Qwen2.5-Math-7B")
    assert rc == 2
    assert [name for name, _ in hub_calls["requests"]] == ["head"]  # one request,
    assert hub_calls["sleeps"] == []  # no retries, no back-off
    assert "the hub at http://127.0.0.1:" in _one_error_line(err)
    assert "cannot be reached" in err


class _Hub(http.server.BaseHTTPRequestHandler):
    """Answers HEAD .../resolve/main/config.json: 200 for known/model, 404 otherwise."""

    def do_HEAD(self):  # noqa: N802 - the http.server protocol
        self.send_response(200 if self.path.startswith("/known/model/") else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_reachable_hub_keeps_the_hub_id(tmp_path, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _online(monkeypatch, tmp_path, f"http://127.0.0.1:{server.server_address[1]}")
        assert resolve_model_path("known/model") == "known/model"  # transformers downloads it
        with pytest.raises(ValueError, match="MODEL: unknown/model is not a local directory "
                                             "and the hub has no model of that name"):
            resolve_model_path("unknown/model")
    finally:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------- output dir, data


def test_output_dir_that_is_a_file_is_refused_before_loading(model_dir, tmp_path, capsys,
                                                             no_loading):
    target = tmp_path / "results.txt"
    target.write_text("keep me")
    rc, _, err = _eval(capsys, str(model_dir), "--output-dir", str(target))
    assert rc == 2
    assert f"--output-dir: {target} exists and is not a directory" in _one_error_line(err)
    assert target.read_text() == "keep me"
    rc, _, err = _eval(capsys, str(model_dir), "--output-dir", str(target / "sub"))
    assert rc == 2 and f"--output-dir: cannot create {target / 'sub'}" in _one_error_line(err)


def test_evaluate_refuses_an_output_dir_file_before_generating(tiny, tmp_path, monkeypatch):
    model, tok = tiny
    monkeypatch.setattr(runner_mod, "generate_hf", lambda *a, **k: pytest.fail("generated"))
    target = tmp_path / "f"
    target.write_text("")
    with pytest.raises(ValueError, match="output_dir: .* exists and is not a directory"):
        evaluate(model, tok, ["embedded"], limit=1, output_dir=target, template="compact")


def test_empty_benchmarks_are_errors(model_dir, tiny, tmp_path, capsys, no_loading):
    data = tmp_path / "data"
    data.mkdir()
    (data / "gsm8k.jsonl").write_text("\n\n")
    rc, _, err = _eval(capsys, str(model_dir), "--benchmarks", "gsm8k", "--data-dir", str(data),
                       "--output-dir", str(tmp_path / "o"))
    assert rc == 2
    assert f"{data / 'gsm8k.jsonl'}: no records for benchmark 'gsm8k'" in _one_error_line(err)
    model, tok = tiny
    with pytest.raises(ValueError, match="benchmarks: 'custom' has no records"):
        evaluate(model, tok, {"custom": []})


@pytest.mark.parametrize("content, message", [
    (b'{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?", "answer": "#### 4"\n',
     "line 2: invalid JSON"),
    (b'{"question": "1+1?", "answer": "#### 2"}\n\n{"question": "\xff\xfe", "answer": "#### 4"}\n',
     "line 3: not valid UTF-8"),
    (b'{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?", "answer": null}\n',
     "line 2: answer: expected a GSM8K solution (a string), got null"),
    (b'{"question": "1+1?", "answer": "#### 2"}\n[1, 2]\n', "line 2: expected a JSON object"),
    (b'{"question": "", "answer": "#### 2"}\n', "line 1: expected a non-empty problem"),
])
def test_bad_data_file_errors_name_file_and_line(model_dir, tmp_path, capsys, no_loading,
                                                 content, message):
    data = tmp_path / "data"
    data.mkdir()
    (data / "gsm8k.jsonl").write_bytes(content)
    rc, _, err = _eval(capsys, str(model_dir), "--benchmarks", "gsm8k", "--data-dir", str(data),
                       "--output-dir", str(tmp_path / "o"))
    assert rc == 2
    assert f"{data / 'gsm8k.jsonl'}, {message}" in _one_error_line(err)


def test_null_and_empty_answers_in_other_schemas(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps([{"problem": "x", "answer": "1"}, {"problem": "y", "answer": None}]))
    with pytest.raises(ValueError, match=f"{path}, record 1: answer: expected a string, "
                                         "number or list, got null"):
        load_benchmark("b", path=path)
    path.write_text(json.dumps([{"problem": "x", "answer": " $ $ "}]))
    with pytest.raises(ValueError, match="record 0: answer: expected a non-empty answer"):
        load_benchmark("b", path=path)
    bad = tmp_path / "c.json"
    bad.write_text('[{"problem": "x",\n "answer": }]')
    with pytest.raises(ValueError, match=f"{bad}, line 2: invalid JSON"):
        load_benchmark("c", path=bad)


def test_bad_decoding_options_are_refused_before_loading(model_dir, tmp_path, capsys,
                                                         no_loading):
    for args, name in ((["--k", "0"], "--k"), (["--max-new-tokens", "0"], "max_new_tokens"),
                       (["--batch-size", "0"], "--batch-size"), (["--timeout", "0"], "--timeout"),
                       (["--top-p", "2"], "top_p")):
        rc, _, err = _eval(capsys, str(model_dir), *args, "--output-dir", str(tmp_path / "o"))
        assert rc == 2 and f"ktae eval: {name}:" in _one_error_line(err)


# --------------------------------------------------------------------------- generation defaults


def test_generation_defaults_file_round_trip_and_validation(tmp_path):
    assert generation_defaults(tmp_path) == {} and generation_defaults(None) == {}
    assert generation_defaults("Qwen/Qwen2.5-Math-7B") == {}  # a hub id: nothing local
    path = save_generation_defaults(tmp_path, template="compact", max_new_tokens=40)
    assert path == tmp_path / GENERATION_FILE
    assert json.loads(path.read_text()) == {"template": "compact", "max_new_tokens": 40}
    assert generation_defaults(tmp_path) == {"template": "compact", "max_new_tokens": 40}
    assert [p.name for p in tmp_path.iterdir()] == [GENERATION_FILE]  # no temporary left
    path.write_text('{"template": "qwen-math", "future_key": 1}')
    assert generation_defaults(tmp_path) == {"template": "qwen-math"}
    for text, match in (('{"template": "fancy"}', "template: expected one of"),
                        ('{"max_new_tokens": 0}', "max_new_tokens: expected a positive"),
                        ('{"max_new_tokens": true}', "max_new_tokens: expected a positive"),
                        ("[1]", "expected a JSON object"), ("{", "not valid JSON")):
        path.write_text(text)
        with pytest.raises(ValueError, match=f"{path}: {match}"):
            generation_defaults(tmp_path)
    with pytest.raises(ValueError, match="template"):
        save_generation_defaults(tmp_path, template="auto", max_new_tokens=40)
    with pytest.raises(ValueError, match="max_new_tokens"):
        save_generation_defaults(tmp_path, template="compact", max_new_tokens=0)
    with pytest.raises(ValueError, match="directory"):
        save_generation_defaults(tmp_path / "missing", template="compact", max_new_tokens=4)


def test_resolve_generation_precedence(tmp_path):
    fallback = resolve_generation(tmp_path)
    assert (fallback.template, fallback.max_new_tokens) == ("auto", 1024)
    assert fallback.describe() == "template auto, at most 1024 new tokens (default)"
    save_generation_defaults(tmp_path, template="compact", max_new_tokens=40)
    saved = resolve_generation(tmp_path)
    assert (saved.template, saved.max_new_tokens) == ("compact", 40)
    assert saved.describe() == (f"template compact, at most 40 new tokens "
                                f"(from {tmp_path / GENERATION_FILE})")
    mixed = resolve_generation(tmp_path, template="qwen-math")
    assert (mixed.template, mixed.max_new_tokens) == ("qwen-math", 40)
    assert mixed.describe().startswith("template qwen-math (given), at most 40 new tokens (from")


def test_ktae_eval_uses_the_saved_template_and_budget(model_dir, tmp_path, capsys):
    save_generation_defaults(model_dir, template="compact", max_new_tokens=7)
    out = tmp_path / "saved"
    rc, stdout, _ = _eval(capsys, str(model_dir), "--benchmarks", "embedded", "--limit", "3",
                          "--output-dir", str(out))
    assert rc == 0
    assert (f"generation: template compact, at most 7 new tokens "
            f"(from {model_dir / GENERATION_FILE})") in stdout
    rows = [json.loads(x) for x in (out / "samples_embedded.jsonl").read_text().splitlines()]
    assert all(r["prompt"].startswith("Q:") and r["response_tokens"] <= 7 for r in rows)
    out2 = tmp_path / "given"
    rc, stdout, _ = _eval(capsys, str(model_dir), "--benchmarks", "embedded", "--limit", "2",
                          "--template", "qwen-math", "--max-new-tokens", "3",
                          "--output-dir", str(out2))
    assert rc == 0 and "generation: template qwen-math, at most 3 new tokens (given)" in stdout
    rows = [json.loads(x) for x in (out2 / "samples_embedded.jsonl").read_text().splitlines()]
    assert all(r["prompt"].startswith("Compute ") and r["response_tokens"] <= 3 for r in rows)
    config = json.loads((out2 / "results.json").read_text())["config"]
    assert config["template_source"] == config["max_new_tokens_source"] == "given"


def test_evaluate_reads_the_file_of_the_loaded_model(model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    save_generation_defaults(model_dir, template="compact", max_new_tokens=6)
    model = AutoModelForCausalLM.from_pretrained(model_dir)  # name_or_path = model_dir
    tok = AutoTokenizer.from_pretrained(model_dir)
    seen = {}

    def fake_generate(model, tokenizer, prompts, sampling, **kwargs):
        seen["max_new_tokens"], seen["prompt"] = sampling.max_new_tokens, prompts[0]
        return [[Generation("\\boxed{1}", 2)] for _ in prompts]

    monkeypatch.setattr(runner_mod, "generate_hf", fake_generate)
    res = evaluate(model, tok, {"c": [BenchmarkRecord("0", "1+0", "1", "c")]})
    assert seen == {"max_new_tokens": 6, "prompt": "Q:1+0 A:"}
    assert res["config"]["template"] == "compact"
    assert res["config"]["template_source"] == str(model_dir / GENERATION_FILE)
    evaluate(model, tok, {"c": [BenchmarkRecord("0", "1+0", "1", "c")]}, max_new_tokens=9)
    assert seen["max_new_tokens"] == 9  # the caller's value wins


def test_readme_eval_of_the_default_model_uses_its_training_format(tmp_path, capsys):
    """The README's ``ktae eval <model> --benchmarks embedded`` on the shipped model: the
    compact prompt and 40 tokens (the Qwen-Math prompt gave near-zero accuracy)."""
    out = tmp_path / "shipped"
    rc, stdout, _ = _eval(capsys, str(ws.default_model_path(progress=False)), "--benchmarks",
                          "embedded", "--limit", "8", "--output-dir", str(out))
    assert rc == 0 and "template compact, at most 40 new tokens (from" in stdout
    results = json.loads((out / "results.json").read_text())
    m = results["benchmarks"]["embedded"]
    assert results["config"]["template"] == "compact" and m["formatted_rate"] == 1.0
    assert m["accuracy"] >= 0.25 and m["max_response_length"] <= 40


# --------------------------------------------------------------------------- context


@pytest.fixture()
def short_context(tiny):
    _, tok = tiny
    return build_tiny_model(tok, hidden_size=16, num_layers=1, intermediate_size=32,
                            num_heads=2, max_position_embeddings=24), tok


def test_generation_never_runs_past_the_context(short_context, monkeypatch):
    import transformers

    model, tok = short_context
    assert context_length(model) == 24
    calls = []
    real = model.generate

    def spy(**kwargs):
        calls.append((kwargs["input_ids"].shape[1], kwargs["max_new_tokens"]))
        return real(**kwargs)

    monkeypatch.setattr(model, "generate", spy)
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    hf_logger = logging.getLogger("transformers")
    hf_logger.addHandler(handler)
    # transformers warns about a long generation once per process: forget earlier ones
    getattr(transformers.utils.logging.warning_once, "cache_clear", lambda: None)()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            prompts = ["Q:1+2 A:", "Q:11+22+33 A:", "Q:4+4 A:"]
            out = generate_hf(model, tok, prompts, SamplingConfig(max_new_tokens=100),
                              batch_size=2)
    finally:
        hf_logger.removeHandler(handler)
    # one call per budget: prompts 0 and 1 (one batch) have different lengths, so budgets
    assert len(calls) == 3 and all(width + budget <= 24 for width, budget in calls)
    assert all(budget < 100 for _, budget in calls)
    lengths = [len(tok(p)["input_ids"]) for p in prompts]
    for n, gens in zip(lengths, out, strict=True):
        assert 1 <= gens[0].num_tokens <= 24 - n
    ours = [w for w in caught if "does not fit in the model's context of 24" in str(w.message)]
    assert len(ours) == 1  # once per call, not once per batch
    assert not records, [r.getMessage() for r in records]  # no transformers warning


def test_a_prompt_that_fills_the_context_gets_an_empty_response(short_context):
    model, tok = short_context
    long_prompt = "Q:" + "+".join(["1"] * 20) + " A:"
    assert len(tok(long_prompt)["input_ids"]) >= 24
    with pytest.warns(UserWarning, match="generating at most 0 new tokens"):
        out = generate_hf(model, tok, [long_prompt], SamplingConfig(max_new_tokens=5))
    assert out == [[Generation("", 0, (), truncated=True)]]  # cut off by the context
