"""The embedded default model: character tokenizer, tiny Llama, cached warm start."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoTokenizer  # noqa: E402

from ktae.models import ALPHABET, SPECIAL_TOKENS, build_char_tokenizer, build_tiny_model  # noqa: E402
from ktae.tasks.embedded import format_prompt, generate, worked_solution  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


TEXTS = [
    "Q:37+45-18 A:37+45=82. 82-18=64. \\boxed{64}",
    "  leading and  double  spaces ",
    "Compute 5+3*4.\nPlease reason step by step, and put your final answer within \\boxed{}.",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_including_spaces(tok, text):
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert len(ids) == len(text) + 1  # one token per character, plus <bos>
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.convert_ids_to_tokens(ids[1:]) == list(text)


def test_vocabulary_and_special_ids(tok):
    assert len(tok) == len(SPECIAL_TOKENS) + len(ALPHABET) == 100
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.padding_side == "left"
    for ch in "0123456789+-*=. QA:\\boxed{}":
        assert tok.convert_tokens_to_ids(ch) != tok.unk_token_id
    # Characters outside the alphabet become <unk>, dropped when skipping specials.
    ids = tok("1é2")["input_ids"]
    assert ids[2] == tok.unk_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "12"


def test_left_padding_batch(tok):
    batch = tok(["Q:1+2 A:", "Q:37+45-18 A:"], padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.shape == (2, 14)
    assert ids[0, :5].tolist() == [tok.pad_token_id] * 5 and mask[0, :5].sum() == 0
    assert ids[0, 5] == tok.bos_token_id and mask[1].all()


def test_reloads_with_autotokenizer_next_to_a_llama_config(tok, tmp_path):
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert again(text)["input_ids"] == tok(text)["input_ids"]
        assert again.decode(again(text)["input_ids"], skip_special_tokens=True) == text
    assert again.padding_side == "left"
    assert (again.pad_token, again.bos_token, again.eos_token) == ("<pad>", "<bos>", "<eos>")


def test_tiny_model_size_ties_and_ids(tok):
    model = build_tiny_model(tok)
    n = sum(p.numel() for p in model.parameters())
    # 4 x (4*128^2 attention + 3*128*384 FFN + 2*128 norms) + 100*128 embedding + 128 norm
    assert n == 4 * (4 * 128 * 128 + 3 * 128 * 384 + 2 * 128) + 100 * 128 + 128 == 865_920
    assert model.lm_head.weight is model.model.embed_tokens.weight
    cfg = model.config
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (1, 2, 0)
    assert cfg.max_position_embeddings == 128 and cfg.model_type == "llama"
    assert model.generation_config.eos_token_id == tok.eos_token_id


def test_tiny_model_deterministic_for_seed(tok):
    state = torch.random.get_rng_state()
    a, b = build_tiny_model(tok, seed=3), build_tiny_model(tok, seed=3)
    c = build_tiny_model(tok, seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)  # global RNG untouched
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_tiny_model_forward_on_task_text(tok):
    torch.set_num_threads(1)
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64)
    p = generate(2)
    texts = [format_prompt(x) + worked_solution(x) for x in p]
    batch = tok(texts, padding=True, return_tensors="pt")
    out = model(**batch, labels=batch["input_ids"])
    assert out.logits.shape == (*batch["input_ids"].shape, len(tok))
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("kwargs, name", [
    ({"hidden_size": 0}, "hidden_size"), ({"num_heads": 3}, "num_heads"),
    ({"num_layers": 1.5}, "num_layers"),
])
def test_tiny_model_rejects_bad_sizes(tok, kwargs, name):
    with pytest.raises(ValueError, match=name):
        build_tiny_model(tok, **kwargs)


# --------------------------------------------------------------------------- warm start

import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from ktae.models import warmstart as ws  # noqa: E402
from ktae.tasks.embedded import Problem, has_carry_or_borrow  # noqa: E402

SMALL = ws.WarmStartRecipe(steps=3, batch_size=8, eval_size=12, hidden_size=32, num_layers=1,
                           intermediate_size=64, warmup_steps=2)


@pytest.fixture
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_lr_schedule():
    f = [ws.lr_factor(s, steps=100, warmup_steps=10, min_lr_ratio=0.1) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0)
    assert f[55] == pytest.approx(0.55, abs=0.01)  # halfway through the cosine
    assert f[-1] == pytest.approx(0.1, abs=1e-3)
    assert all(a >= b for a, b in zip(f[10:], f[11:], strict=False))


def test_sft_batch_masks_prompt_and_padding(tok):
    problems = [Problem("a", "37+45-18", "64", 2), Problem("b", "1+2", "3", 1)]
    ids, mask, labels = ws.sft_batch(tok, problems, random.Random(0), 0.0)
    assert ids.shape == mask.shape == labels.shape and ids.shape[0] == 2
    for i, p in enumerate(problems):
        kept = labels[i][labels[i] != -100].tolist()
        assert kept[-1] == tok.eos_token_id
        assert tok.decode(kept, skip_special_tokens=True) == worked_solution(p)
        row = ids[i][mask[i].bool()].tolist()
        assert tok.decode(row, skip_special_tokens=True) == format_prompt(p) + worked_solution(p)
    assert (ids[1][mask[1] == 0] == tok.pad_token_id).all() and mask[1].sum() < mask[0].sum()


def test_extract_boxed_int_is_strict():
    assert ws.extract_boxed_int("1+2=3. \\boxed{3}") == 3
    assert ws.extract_boxed_int("\\boxed{4} then \\boxed{ 5 }") == 5
    for text in ["\\boxed{7", "7", "\\boxed{7.0}", "\\boxed{}", "\\boxed{x}", ""]:
        assert ws.extract_boxed_int(text) is None


class _ScriptedModel:
    """Stands in for a causal LM: 'generates' a fixed completion per prompt."""

    training = True

    def __init__(self, tok, completions):
        self.tok, self.completions = tok, completions

    def eval(self):
        self.training = False

    def train(self, mode=True):
        self.training = mode

    def parameters(self):  # where generation puts its inputs
        return iter([torch.zeros(1)])

    def generate(self, input_ids, attention_mask, **kw):
        assert kw["do_sample"] is False and (attention_mask[:, -1] == 1).all()  # left padding
        rows = []
        for row, m in zip(input_ids, attention_mask, strict=True):
            prompt = self.tok.decode(row[m.bool()], skip_special_tokens=True)
            text = self.completions[prompt]
            rows.append(row.tolist() + self.tok(text, add_special_tokens=False)["input_ids"])
        width = max(map(len, rows))
        return torch.tensor([r + [self.tok.pad_token_id] * (width - len(r)) for r in rows])


def test_greedy_accuracy_accounting(tok):
    problems = generate(40, split="test")
    # Right on problems without carry/borrow, wrong (or unboxed) on the others.
    completions = {}
    for i, p in enumerate(problems):
        if has_carry_or_borrow(p):
            completions[format_prompt(p)] = f"\\boxed{{{p.answer}" if i % 2 else "oops"
        else:
            completions[format_prompt(p)] = worked_solution(p)
    model = _ScriptedModel(tok, completions)
    res = ws.greedy_accuracy(model, tok, problems, batch_size=16)
    carry = sum(map(has_carry_or_borrow, problems))
    assert res["n"] == 40 and res["n_carry"] == carry and 0 < carry < 40
    assert res["carry_accuracy"] == 0.0 and res["other_accuracy"] == 1.0
    assert res["accuracy"] == pytest.approx((40 - carry) / 40)
    assert res["formatted"] == pytest.approx((40 - carry) / 40)
    assert set(res["level_accuracy"]) <= {"1", "2", "3"}
    assert model.training  # mode restored
    empty = ws.greedy_accuracy(model, tok, [])
    assert empty["accuracy"] is None and empty["n"] == 0


def test_warm_start_deterministic_and_loadable(tmp_path, one_thread):
    from transformers import AutoModelForCausalLM

    a = ws.warm_start(tmp_path / "a", steps=3, seed=5, batch_size=8, recipe=SMALL, progress=False)
    b = ws.warm_start(tmp_path / "b", steps=3, seed=5, batch_size=8, recipe=SMALL, progress=True)
    c = ws.warm_start(tmp_path / "c", steps=3, seed=6, batch_size=8, recipe=SMALL, progress=False)
    assert len(a["losses"]) == 3 and all(map(np_isfinite, a["losses"]))
    assert a["losses"] == b["losses"] and a["losses"] != c["losses"]
    assert a["losses"][-1] < a["losses"][0]  # it learns
    saved = json.loads((tmp_path / "a" / ws.METRICS_FILE).read_text())
    assert saved["recipe"]["seed"] == 5 and saved["eval"]["n"] == 12
    from ktae.eval import generation_defaults

    assert generation_defaults(tmp_path / "a") == {"template": "compact", "max_new_tokens": 40}
    assert 0.0 <= saved["eval"]["accuracy"] <= 1.0
    ma = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    mb = AutoModelForCausalLM.from_pretrained(tmp_path / "b")
    for (na, pa), (_, pb) in zip(ma.state_dict().items(), mb.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), na
    assert AutoTokenizer.from_pretrained(tmp_path / "a")("Q:1+2 A:")["input_ids"][0] == 1


def np_isfinite(x):
    return x == x and abs(x) != float("inf")


def test_warm_start_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="steps"):
        ws.warm_start(tmp_path, steps=-1, recipe=SMALL, progress=False)
    with pytest.raises(ValueError, match="lr"):
        ws.warm_start(tmp_path, steps=1, lr=0.0, recipe=SMALL, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        ws.default_model_path(tmp_path, recipe=ws.WarmStartRecipe(batch_size=0))


def test_default_model_path_builds_once_and_keys_on_recipe(tmp_path, monkeypatch, one_thread):
    calls = []
    real = ws.warm_start

    def counting(*args, **kwargs):
        calls.append(kwargs["seed"])
        return real(*args, **kwargs)

    monkeypatch.setattr(ws, "warm_start", counting)
    monkeypatch.setenv("KTAE_CACHE", str(tmp_path / "env-cache"))
    p1 = ws.default_model_path(recipe=SMALL, progress=False)
    assert p1.parent == tmp_path / "env-cache" and ws.is_complete(p1)
    mtime = (p1 / ws.METRICS_FILE).stat().st_mtime_ns
    assert ws.default_model_path(recipe=SMALL, progress=False) == p1
    assert calls == [0] and (p1 / ws.METRICS_FILE).stat().st_mtime_ns == mtime
    p2 = ws.default_model_path(tmp_path / "env-cache", seed=1, recipe=SMALL, progress=False)
    p3 = ws.default_model_path(tmp_path / "env-cache", steps=2, recipe=SMALL, progress=False)
    assert len({p1, p2, p3}) == 3 and calls == [0, 1, 0]
    assert not [q for q in (tmp_path / "env-cache").iterdir() if q.name.startswith(".tmp-")]


def test_concurrent_builds_train_once(tmp_path, monkeypatch, one_thread):
    calls = []
    real = ws.warm_start

    def slow(*args, **kwargs):
        calls.append(1)
        time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(ws, "warm_start", slow)
    paths = []
    threads = [threading.Thread(
        target=lambda: paths.append(ws.default_model_path(tmp_path, recipe=SMALL,
                                                          progress=False)))
        for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(paths)) == 1 and ws.is_complete(paths[0])


_KILLED_BUILD = """
import json, sys, time
from ktae.models import warmstart as ws
def hang(output_dir, **kw):
    import pathlib
    out = pathlib.Path(output_dir); out.mkdir(parents=True)
    (out / "config.json").write_text("{}")  # a partial build
    print("STARTED", flush=True)
    time.sleep(60)
ws.warm_start = hang
ws.default_model_path(sys.argv[1], recipe=ws.WarmStartRecipe(**json.loads(sys.argv[2])),
                      progress=False)
"""


def test_killed_build_leaves_nothing_valid_and_is_cleaned(tmp_path, one_thread):
    small = {k: getattr(SMALL, k) for k in ("steps", "batch_size", "eval_size", "hidden_size",
                                            "num_layers", "intermediate_size", "warmup_steps")}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_BUILD, str(tmp_path), json.dumps(small)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "STARTED"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    leftovers = [q for q in tmp_path.iterdir() if q.name.startswith(".tmp-")]
    final = tmp_path / f"embedded-{SMALL.key()}"
    assert len(leftovers) == 1 and (leftovers[0] / "config.json").exists()
    assert not final.exists()
    # A half-written entry under the final name (not made by this code) is not trusted.
    final.mkdir()
    (final / "config.json").write_text("{}")
    assert not ws.is_complete(final)
    # A dead build of another recipe is cleaned too; a live one (this process) is kept.
    other_dead = tmp_path / f".tmp-embedded-0123456789ab-{proc.pid}-deadbeef"
    other_live = tmp_path / ".tmp-embedded-0123456789ab-1-cafe0000"  # pid 1 is alive
    other_dead.mkdir()
    other_live.mkdir()
    path = ws.default_model_path(tmp_path, recipe=SMALL, progress=False)
    assert path == final and ws.is_complete(path)
    assert [q for q in tmp_path.iterdir() if q.name.startswith(".tmp-")] == [other_live]


def test_default_recipe_resolves_to_the_shipped_model(tmp_path, monkeypatch):
    """The default recipe's model ships with the package: no build, and it matches the recipe
    (a changed recipe changes the key, and this test then asks for a re-shipped model)."""
    monkeypatch.setattr(ws, "warm_start", lambda *a, **k: pytest.fail("must not train"))
    path = ws.default_model_path(tmp_path, progress=False)
    assert path.parent == ws.SHIPPED_DIR and ws.is_complete(path)
    meta = json.loads((path / ws.METRICS_FILE).read_text())
    from ktae.eval import generation_defaults

    assert generation_defaults(path) == {"template": ws.TEMPLATE,
                                         "max_new_tokens": ws.MAX_NEW_TOKENS}
    assert meta["recipe"] == dataclasses.asdict(ws.WarmStartRecipe())
    assert meta["recipe_key"] == ws.WarmStartRecipe().key()
    assert 0.40 <= meta["eval"]["accuracy"] <= 0.65  # well below its ceiling, room for RL
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert sum(p.numel() for p in model.parameters()) == 865_920
    assert tok.decode(tok("Q:1+2 A:", add_special_tokens=False)["input_ids"]) == "Q:1+2 A:"


def test_rebuild_trains_even_when_shipped(tmp_path, monkeypatch):
    calls = []

    def fake(out, **kwargs):
        calls.append(kwargs["steps"])
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "config.json").write_text("{}")
        (Path(out) / ws.METRICS_FILE).write_text("{}")

    monkeypatch.setattr(ws, "warm_start", fake)
    path = ws.default_model_path(tmp_path, progress=False, rebuild=True)
    assert calls == [ws.WarmStartRecipe().steps] and path.parent == tmp_path


def test_cache_entries_built_before_the_generation_file_get_it(tmp_path, monkeypatch):
    from ktae.eval import GENERATION_FILE, generation_defaults

    def fake(out, **kwargs):  # an entry as older versions wrote it: no generation file
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "config.json").write_text("{}")
        (Path(out) / ws.METRICS_FILE).write_text("{}")

    monkeypatch.setattr(ws, "warm_start", fake)
    path = ws.default_model_path(tmp_path, seed=3, progress=False)
    assert not (path / GENERATION_FILE).exists()
    assert ws.default_model_path(tmp_path, seed=3, progress=False) == path
    assert generation_defaults(path) == {"template": "compact", "max_new_tokens": 40}
