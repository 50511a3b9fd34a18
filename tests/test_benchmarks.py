"""Benchmark loaders on the shipped fixtures (hub code path with a local stand-in), local
files with field maps, the embedded task, and prompt templates. No network."""

from __future__ import annotations

import json

import datasets
import pytest

from ktae.eval.benchmarks import (
    BENCHMARK_NAMES,
    BENCHMARKS,
    BenchmarkRecord,
    answer_text,
    fixture_path,
    gsm8k_answer,
    load_benchmark,
)
from ktae.eval.prompts import QWEN_MATH_INSTRUCTION, build_prompt, resolve_template
from ktae.rewards import math_reward
from ktae.tasks.embedded import format_prompt, generate

EXPECTED = {  # (number of fixture rows, first id, answers)
    "math500": (5, "test/precalculus/807.json",
                ["\\left( 3, \\frac{\\pi}{2} \\right)", "26000", "\\frac{14}{3}", "2, 3", "9"]),
    "aime24": (3, "60", ["204", "699", "001"]),
    "aime25": (3, "0", ["70", "106", "400"]),
    "amc23": (4, "0", ["27", "36", "45", "22.5"]),
    "minerva": (3, "0", ["1.6", "4.5e33", "16000"]),
    "olympiadbench": (3, "1606", ["2", "(6,3),(9,3),(9,5),(54,5)", "5"]),
    "gsm8k": (3, "0", ["72", "10", "10000"]),
}


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in fixture_path(name).read_text().splitlines()]


@pytest.fixture
def fake_hub(monkeypatch):
    """``datasets.load_dataset`` serving the fixtures as real Dataset objects."""
    calls = []

    def load_dataset(path, name=None, *, split=None, **kwargs):
        calls.append((path, name, split))
        bench = next(b for b, s in BENCHMARKS.items() if s.hub_path == path)
        return datasets.Dataset.from_list(_rows(bench))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_every_benchmark_has_a_fixture():
    assert set(EXPECTED) == set(BENCHMARKS)
    assert set(BENCHMARK_NAMES) == set(BENCHMARKS) | {"embedded", "arith"}  # generated, no fixture


@pytest.mark.parametrize("name", list(EXPECTED))
def test_hub_loader_on_fixtures(name, fake_hub):
    n, first_id, answers = EXPECTED[name]
    records = load_benchmark(name)
    spec = BENCHMARKS[name]
    assert fake_hub == [(spec.hub_path, spec.hub_config, spec.split)]
    assert len(records) == n and records[0].id == first_id
    assert [r.answer for r in records] == answers
    assert all(isinstance(r, BenchmarkRecord) and r.source == name and r.problem.strip()
               for r in records)
    # the problem text is the dataset's own column, untouched
    assert records[0].problem == _rows(name)[0][spec.fields["problem"]]
    # every reference answer round-trips through the verifier
    assert all(math_reward(f"\\boxed{{{r.answer}}}", r.answer).correct for r in records)


def test_hub_split_override_and_limit(fake_hub):
    records = load_benchmark("math500", split="validation", limit=2)
    assert len(records) == 2 and fake_hub[0][2] == "validation"


@pytest.mark.parametrize("name", list(EXPECTED))
def test_local_jsonl_matches_hub(name, fake_hub):
    assert load_benchmark(name, path=fixture_path(name)) == load_benchmark(name)


def test_local_directory_parquet_and_json_list(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _rows("gsm8k")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "gsm8k.parquet")
    from_dir = load_benchmark("gsm8k", path=tmp_path)
    assert [r.answer for r in from_dir] == ["72", "10", "10000"]
    (tmp_path / "aime24.json").write_text(json.dumps(_rows("aime24")))
    assert [r.answer for r in load_benchmark("aime24", path=tmp_path / "aime24.json")] == \
        ["204", "699", "001"]
    rows_ob = _rows("olympiadbench")  # list-valued final_answer survives parquet
    pq.write_table(pa.Table.from_pylist(rows_ob), tmp_path / "ob.parquet")
    assert load_benchmark("olympiadbench", path=tmp_path / "ob.parquet")[1].answer == \
        "(6,3),(9,3),(9,5),(54,5)"


def test_custom_schema_with_field_map(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps({"uid": f"u{i}", "q": f"What is {i}+1?", "a": i + 1})
                              for i in range(4)))
    recs = load_benchmark("mine", path=path, field_map={"id": "uid", "problem": "q",
                                                        "answer": "a"}, limit=3)
    assert recs == [BenchmarkRecord(f"u{i}", f"What is {i}+1?", str(i + 1), "mine")
                    for i in range(3)]
    # common column names are guessed; ids default to the row number
    path2 = tmp_path / "guess.jsonl"
    path2.write_text(json.dumps({"question": "1+1?", "final_answer": ["$2$"]}))
    assert load_benchmark("guess", path=path2) == [BenchmarkRecord("0", "1+1?", "2", "guess")]
    # a field map overrides a known benchmark's schema
    path3 = tmp_path / "m.jsonl"
    path3.write_text(json.dumps({"id": 1, "prompt": "p", "gt": "3"}))
    assert load_benchmark("math500", path=path3, field_map={"problem": "prompt", "answer": "gt"}
                          )[0] == BenchmarkRecord("1", "p", "3", "math500")


def test_loader_errors(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"q": "x"}))
    with pytest.raises(ValueError, match="field_map"):
        load_benchmark("bad", path=path)
    with pytest.raises(ValueError, match="field_map"):
        load_benchmark("bad", path=path, field_map={"problem": "q", "answer": "nope"})
    with pytest.raises(ValueError, match="field_map"):
        load_benchmark("bad", path=path, field_map={"question": "q"})
    with pytest.raises(ValueError, match="name"):
        load_benchmark("nonexistent")
    with pytest.raises(ValueError, match="limit"):
        load_benchmark("embedded", limit=0)
    with pytest.raises(ValueError, match="path"):
        load_benchmark("math500", path=tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="path"):
        load_benchmark("math500", path=tmp_path)  # directory without math500.*
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(ValueError, match="path"):
        load_benchmark("x", path=tmp_path / "x.csv")
    with pytest.raises(ValueError, match="name"):
        fixture_path("embedded")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=f"{empty}: no records for benchmark 'empty'"):
        load_benchmark("empty", path=empty)


def test_answer_parsers():
    assert answer_text(27.0) == "27" and answer_text(22.5) == "22.5" and answer_text(7) == "7"
    # a list reference is a tuple of accepted alternatives (any of them is right)
    assert answer_text(["$1$", "$2$"]) == ("1", "2") and answer_text("  $$x$$ ") == "x"
    assert gsm8k_answer("so 3 + 4 = 7\n#### 1,234") == "1234"
    with pytest.raises(ValueError, match="answer"):
        gsm8k_answer("no marker")
    with pytest.raises(ValueError, match="answer"):
        answer_text(None)


def test_embedded_benchmark():
    recs = load_benchmark("embedded")
    problems = generate(200, split="test", seed=0)
    assert len(recs) == 200
    assert [(r.id, r.problem, r.answer) for r in recs] == \
        [(p.id, p.question, p.answer) for p in problems]
    assert {r.source for r in recs} == {"embedded"}
    assert len(load_benchmark("embedded", limit=7)) == 7
    train = {p.question for p in generate(500, split="train", seed=0)}
    assert not train & {r.problem for r in recs}


class _Tok:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, *, tokenize, add_generation_prompt):
        assert not tokenize and add_generation_prompt
        return f"<user>{messages[0]['content']}</user><assistant>"


def test_prompt_templates():
    rec = BenchmarkRecord("1", "What is $2+2$?", "4", "math500")
    emb = load_benchmark("embedded", limit=1)[0]
    assert build_prompt(rec, "compact") == "Q:What is $2+2$? A:"
    assert build_prompt(rec, "qwen-math") == "What is $2+2$?\n" + QWEN_MATH_INSTRUCTION
    assert build_prompt(emb, "compact") == format_prompt(emb.problem, "compact")
    assert build_prompt(emb, "qwen-math") == format_prompt(emb.problem, "qwen-math")
    assert build_prompt(rec, "chat", _Tok()) == \
        f"<user>What is $2+2$?\n{QWEN_MATH_INSTRUCTION}</user><assistant>"
    assert resolve_template("auto", _Tok()) == "chat"
    assert resolve_template("auto", object()) == "qwen-math"
    with pytest.raises(ValueError, match="template"):
        resolve_template("chat", object())
    with pytest.raises(ValueError, match="template"):
        resolve_template("fancy", _Tok())
