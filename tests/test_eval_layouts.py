"""``ktae eval --data-dir`` on the KTAE / Oat-Zero evaluation suite (a DatasetDict saved
with save_to_disk) and the Qwen2.5-Math ``data/<name>/test.jsonl`` layout, from the
shipped fixtures (problems written for ktae in those layouts' schemas)."""

from __future__ import annotations

import json

import datasets
import pytest
import torch
from test_train_helpers import save_tiny_model

from ktae.cli import main
from ktae.eval.benchmarks import (
    FIXTURE_DIR,
    SAVED_SPLIT_NAMES,
    BenchmarkRecord,
    load_benchmark,
    saved_benchmarks,
)
from ktae.eval.runner import load_records
from ktae.rewards import math_reward

SUITE = FIXTURE_DIR / "ktae_suite"
QWEN = FIXTURE_DIR / "qwen_math"
SUITE_ANSWERS = {  # reported name -> answers (floats and lists of strings with newlines)
    "aime24": ["801", "20", "024"],
    "amc22-23": ["0.875", "81", "720"],
    "math500": ["5\\sqrt{2}", "6", "15"],
    "minerva": ["60", "9", "20"],
    "olympiadbench": ["0, 4", "97", "210"],
}


def test_the_suite_splits_are_named_for_what_they_are():
    assert saved_benchmarks(SUITE) == {SAVED_SPLIT_NAMES[s]: s for s in
                                       ("aime", "amc", "math", "minerva", "olympiad_bench")}
    assert list(saved_benchmarks(SUITE)) == list(SUITE_ANSWERS)
    assert saved_benchmarks(QWEN) is None


@pytest.mark.parametrize("name", list(SUITE_ANSWERS))
def test_suite_split_records(name):
    records = load_benchmark(name, path=SUITE)
    assert [r.answer for r in records] == SUITE_ANSWERS[name]
    assert all(isinstance(r, BenchmarkRecord) and r.source == name and r.problem for r in records)
    assert [r.id for r in records] == ["0", "1", "2"]
    # the split can be named by its own name too
    split = saved_benchmarks(SUITE)[name]
    assert [r.answer for r in load_benchmark(split, path=SUITE)] == SUITE_ANSWERS[name]
    assert all(math_reward(f"\\boxed{{{r.answer}}}", r.answer).correct for r in records)


def test_suite_records_match_the_same_rows_in_the_hub_schema(tmp_path):
    """A split saved alone (a Dataset), a JSONL export and the suite give the same records."""
    ds = datasets.load_from_disk(str(SUITE))["olympiad_bench"]
    ds.save_to_disk(str(tmp_path / "olympiadbench"))
    (tmp_path / "olympiadbench.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in ds.to_list()))
    from_suite = load_benchmark("olympiadbench", path=SUITE)
    assert load_benchmark("olympiadbench", path=tmp_path / "olympiadbench") == from_suite
    assert load_benchmark("olympiadbench", path=tmp_path / "olympiadbench.jsonl") == from_suite
    with pytest.raises(ValueError, match=r"holds no split for 'gsm8k'; it holds aime24 "
                                         r"\(split aime\), amc22-23 \(split amc\)"):
        load_benchmark("gsm8k", path=SUITE)


def test_qwen_math_layout():
    minerva = load_benchmark("minerva", path=QWEN)  # data/minerva_math/test.jsonl
    assert [r.answer for r in minerva] == ["60", "9", "20"]  # the solution's LAST box
    assert [r.id for r in minerva] == ["0", "1", "2"]
    assert [r.answer for r in load_benchmark("aime24", path=QWEN)] == ["801", "20"]
    assert [r.id for r in load_benchmark("aime24", path=QWEN)] == ["60", "61"]
    assert [r.answer for r in load_benchmark("amc23", path=QWEN)] == ["81", "720"]
    # the same problems as the suite's minerva split
    assert [r.problem for r in minerva] == [r.problem for r in load_benchmark("minerva",
                                                                              path=SUITE)]
    records = load_records(["minerva", "aime24", "embedded"], data_dir=QWEN, limit=2)
    assert [len(v) for v in records.values()] == [2, 2, 2]
    with pytest.raises(ValueError, match="path: no gsm8k.jsonl/.json/.parquet or gsm8k/test.jsonl"):
        load_benchmark("gsm8k", path=QWEN)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"), max_position_embeddings=512)


def test_ktae_eval_on_the_saved_suite_reports_every_split(model_dir, tmp_path):
    out = tmp_path / "out"
    assert main(["eval", str(model_dir), "--data-dir", str(SUITE), "--limit", "2",
                 "--max-new-tokens", "4", "--template", "compact", "--no-progress",
                 "--output-dir", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["benchmarks"]) == list(SUITE_ANSWERS)
    assert results["config"]["benchmarks"] == list(SUITE_ANSWERS)
    for name, answers in SUITE_ANSWERS.items():
        rows = [json.loads(x) for x in (out / f"samples_{name}.jsonl").read_text().splitlines()]
        assert [r["answer"] for r in rows] == answers[:2]


def test_ktae_eval_on_the_qwen_layout(model_dir, tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["eval", str(model_dir), "--benchmarks", "minerva,amc23", "--data-dir", str(QWEN),
                 "--max-new-tokens", "4", "--template", "qwen-math-system", "--no-progress",
                 "--output-dir", str(out)]) == 0
    rows = [json.loads(x) for x in (out / "samples_minerva.jsonl").read_text().splitlines()]
    assert [r["answer"] for r in rows] == ["60", "9", "20"]
    assert rows[0]["prompt"].startswith("<|im_start|>system\nPlease reason step by step")
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["template"] == "qwen-math-system"


def test_whole_rows_of_a_local_file(tmp_path):
    """``benchmark_rows(...).dicts()`` (for loaders that parse whole rows, e.g. multiple
    choice) names each row's place; a saved Dataset directory and a DatasetDict split read
    the same."""
    from ktae.eval.benchmarks import benchmark_rows

    rows = [{"question": "Q1", "options": ["a", "b"], "answer": "A"},
            {"question": "Q2", "options": ["c", "d"], "answer": "B"}]
    (tmp_path / "mc.jsonl").write_text("\n\n".join(json.dumps(r) for r in rows) + "\n")
    got = benchmark_rows("mc", path=tmp_path)
    assert got.dicts() == rows
    assert [got.where(i) for i in range(2)] == [f"{tmp_path / 'mc.jsonl'}, line 1",
                                                f"{tmp_path / 'mc.jsonl'}, line 3"]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved" / "mc"))
    got2 = benchmark_rows("mc", path=tmp_path / "saved")
    assert got2.dicts() == rows and got2.where(1).endswith("mc, row 1")
    datasets.DatasetDict({"mc": datasets.Dataset.from_list(rows)}).save_to_disk(
        str(tmp_path / "suite"))
    assert benchmark_rows("mc", path=tmp_path / "suite").dicts() == rows
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "mc.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no records for benchmark 'mc'"):
        benchmark_rows("mc", path=tmp_path / "empty")
