"""MMLU-Pro and GPQA-Diamond (ktae.eval.choice): loaders in the hub schema, the option
shuffle, the letter verifier, and scoring through evaluate()."""

from __future__ import annotations

import json
import re

import pytest

from ktae.eval import choice
from ktae.eval import runner as runner_mod
from ktae.eval.choice import (
    CHOICE_BENCHMARKS,
    boxed_letter,
    fixture_path,
    gpqa_order,
    letter_reward,
    load_choice_benchmark,
)
from ktae.eval.runner import evaluate, load_records
from ktae.models import build_char_tokenizer, build_tiny_model
from ktae.models.generate import Generation


def _rows(name):
    return [json.loads(line) for line in fixture_path(name).read_text().splitlines()]


@pytest.mark.parametrize("completion, correct, formatted", [
    ("so the answer is \\boxed{C}", True, True),  # right
    ("\\boxed{A}", False, True),  # wrong
    ("the answer is C", False, False),  # unboxed
    ("\\boxed{AC}", False, False),  # two letters
    ("\\boxed{A, C}", False, False),
    ("\\boxed{c}", True, True),  # lower case
    ("\\boxed{\\text{C}}", True, True),  # \text{}
    ("\\boxed{ \\text{ c } }", True, True),
    ("\\boxed{(C)}", False, False),  # nothing else accepted
    ("\\boxed{C. coulomb}", False, False),
    ("\\boxed{coulomb}", False, False),
    ("\\boxed{\\textbf{C}}", False, False),
    ("\\boxed{C} then \\boxed{A}", False, True),  # the final box counts
    ("\\boxed{A} then \\boxed{C", False, False),  # an unclosed final box is no answer
])
def test_letter_verifier(completion, correct, formatted):
    r = letter_reward(completion, "C")
    assert (r.correct, r.formatted, r.score) == (correct, formatted, float(correct))
    assert r.timed_out is False
    if formatted:
        assert r.extracted == boxed_letter(completion) and r.extracted.isupper()
    else:  # the raw box content (None without a closed box)
        from ktae.rewards import extract_boxed

        assert r.extracted == extract_boxed(completion)


def test_letter_verifier_rejects_a_bad_reference():
    assert letter_reward("\\boxed{b}", "b").correct  # the reference is case-tolerant too
    for bad in ("", "AB", "1", None):
        with pytest.raises(ValueError, match="answer"):
            letter_reward("\\boxed{A}", bad)


def test_mmlu_pro_fixture_records():
    rows = _rows("mmlu_pro")
    recs = load_choice_benchmark("mmlu_pro", path=fixture_path("mmlu_pro"))
    assert [r.id for r in recs] == [str(row["question_id"]) for row in rows]
    for rec, row in zip(recs, rows, strict=True):
        assert rec.answer == row["answer"] == "ABCDEFGHIJ"[row["answer_index"]]
        assert rec.source == "mmlu_pro" and rec.problem.startswith(row["question"])
        right = row["options"][row["answer_index"]]
        assert f"({rec.answer}) {right}\n" in rec.problem  # options in the dataset's order
        assert rec.problem.endswith(choice.CHOICE_INSTRUCTION)
    assert "(J) joule" in recs[0].problem  # ten options, A..J


def test_gpqa_options_are_shuffled_with_a_fixed_recorded_seed():
    rows = _rows("gpqa_diamond")
    recs = load_choice_benchmark("gpqa_diamond", path=fixture_path("gpqa_diamond"))
    assert [r.id for r in recs] == [row["Record ID"] for row in rows]
    assert len({r.answer for r in recs}) > 1  # the correct answer is not always "A"
    for rec, row in zip(recs, rows, strict=True):
        order = gpqa_order(row["Record ID"], choice.GPQA_SHUFFLE_SEED)
        assert sorted(order) == [0, 1, 2, 3] and rec.answer == "ABCD"[order.index(0)]
        assert f"({rec.answer}) {row['Correct Answer']}\n" in rec.problem
        for j in (1, 2, 3):
            assert row[f"Incorrect Answer {j}"] in rec.problem
    # the same order on every load, whatever else is loaded; another seed, another order
    again = load_choice_benchmark("gpqa_diamond", path=fixture_path("gpqa_diamond"), limit=1)
    assert again == recs[:1]
    other = [gpqa_order(f"rec{i}", 1) for i in range(20)]
    assert other != [gpqa_order(f"rec{i}", 0) for i in range(20)]
    assert gpqa_order("recX", 0) == gpqa_order("recX", 0)


#: Recorded GPQA option orders (record id, seed) -> order, computed once by this version's
#: gpqa_order and written here literally: results.json files from any version must keep
#: meaning the same letters, so a change of the shuffle's key or generator fails here.
GPQA_RECORDED_ORDERS = {
    ("recGpqaFix03", 0): [0, 2, 3, 1],
    ("recGpqaFix11", 0): [1, 3, 0, 2],
    ("recGpqaFix01", 0): [2, 0, 1, 3],
    ("rec06pnAkLOr2t2mp", 0): [2, 3, 0, 1],
    ("recZ1Wk4ZzD4VV0Ly", 0): [1, 3, 2, 0],
    ("0", 0): [2, 3, 1, 0],  # a row without a Record ID is keyed by its index
    ("197", 0): [1, 2, 3, 0],
    ("recGpqaFix03", 1): [0, 3, 1, 2],
    ("recGpqaFix01", 1): [1, 3, 2, 0],
    ("rec06pnAkLOr2t2mp", 12345): [2, 3, 1, 0],
}


@pytest.mark.parametrize("key", list(GPQA_RECORDED_ORDERS),
                         ids=[f"{r}-seed{s}" for r, s in GPQA_RECORDED_ORDERS])
def test_gpqa_orders_are_stable_across_versions(key):
    record_id, seed = key
    assert gpqa_order(record_id, seed) == GPQA_RECORDED_ORDERS[key]


def test_gpqa_fixture_letters_are_pinned():
    recs = load_choice_benchmark("gpqa_diamond", path=fixture_path("gpqa_diamond"))
    assert choice.GPQA_SHUFFLE_SEED == 0
    assert [(r.id, r.answer) for r in recs] == [
        ("recGpqaFix03", "A"), ("recGpqaFix11", "C"), ("recGpqaFix01", "B")]


def test_the_shuffle_seed_and_record_ids_reach_the_records(tmp_path):
    """``load_choice_benchmark(seed=...)`` shuffles with that seed (the option recorded as
    ``config.gpqa_shuffle_seed``); a row without a Record ID is keyed by its index."""
    rows = _rows("gpqa_diamond")
    for seed in (0, 1, 12345):
        recs = load_choice_benchmark("gpqa_diamond", path=fixture_path("gpqa_diamond"),
                                     seed=seed)
        assert [r.answer for r in recs] == [
            "ABCD"[gpqa_order(row["Record ID"], seed).index(0)] for row in rows]
        assert {r.source for r in recs} == {"gpqa_diamond"}
    assert [r.answer for r in load_choice_benchmark(
        "gpqa_diamond", path=fixture_path("gpqa_diamond"), seed=1)] != \
        [r.answer for r in load_choice_benchmark("gpqa_diamond",
                                                 path=fixture_path("gpqa_diamond"))]
    anonymous = [{k: v for k, v in row.items() if k != "Record ID"} for row in rows]
    path = tmp_path / "gpqa_diamond.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in anonymous))
    recs = load_choice_benchmark("gpqa_diamond", path=path)
    assert [r.id for r in recs] == ["0", "1", "2"]
    assert [r.answer for r in recs] == ["ABCD"[gpqa_order(str(i)).index(0)] for i in range(3)]
    mmlu = [{k: v for k, v in row.items() if k != "question_id"} for row in _rows("mmlu_pro")]
    path = tmp_path / "mmlu_pro.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in mmlu))
    recs = load_choice_benchmark("mmlu_pro", path=path)
    assert [r.id for r in recs] == [str(i) for i in range(len(mmlu))]
    assert {r.source for r in recs} == {"mmlu_pro"}


@pytest.mark.parametrize("name", list(CHOICE_BENCHMARKS))
def test_a_chosen_hub_split_is_the_one_asked_for(name, monkeypatch):
    import datasets

    asked = []

    def fake_load_dataset(path, config, split):
        asked.append(split)
        return datasets.Dataset.from_list(_rows(name))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    load_choice_benchmark(name, split="validation")
    assert asked == ["validation"]


@pytest.mark.parametrize("name", list(CHOICE_BENCHMARKS))
def test_hub_path_reads_the_same_records_as_the_fixture(name, monkeypatch):
    """The hub loader on a Dataset built from the fixture rows (the hub's schema) gives
    the records the local file gives; it asks for the documented dataset and split."""
    import datasets

    asked = []

    def fake_load_dataset(path, config, split):
        asked.append((path, config, split))
        return datasets.Dataset.from_list(_rows(name))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    spec = CHOICE_BENCHMARKS[name]
    assert load_choice_benchmark(name) == load_choice_benchmark(name, path=fixture_path(name))
    assert asked == [(spec.hub_path, spec.hub_config, spec.split)]
    assert (spec.hub_path, spec.hub_config, spec.split) == {
        "mmlu_pro": ("TIGER-Lab/MMLU-Pro", None, "test"),
        "gpqa_diamond": ("Idavidrein/gpqa", "gpqa_diamond", "train")}[name]


def test_parquet_and_directory_in_the_hub_schema(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name in CHOICE_BENCHMARKS:
        pq.write_table(pa.Table.from_pylist(_rows(name)), tmp_path / f"{name}.parquet")
    got = load_records(list(CHOICE_BENCHMARKS), data_dir=tmp_path)
    assert got == load_records(list(CHOICE_BENCHMARKS), fixtures=True)


def test_saved_datasets_in_the_hub_schema(tmp_path):
    """Choice benchmarks read every local layout the math benchmarks do (ktae.data): a
    DatasetDict saved with save_to_disk whose splits are named for them, a saved Dataset
    per benchmark, and the ``<name>/test.jsonl`` layout."""
    import datasets

    expected = load_records(list(CHOICE_BENCHMARKS), fixtures=True)
    splits = {name: datasets.Dataset.from_list(_rows(name)) for name in CHOICE_BENCHMARKS}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "suite"))
    assert load_records(list(CHOICE_BENCHMARKS), data_dir=tmp_path / "suite") == expected
    for name, ds in splits.items():
        ds.save_to_disk(str(tmp_path / "each" / name))
        (tmp_path / "qwen" / name).mkdir(parents=True)
        (tmp_path / "qwen" / name / "test.jsonl").write_text(fixture_path(name).read_text())
    assert load_records(list(CHOICE_BENCHMARKS), data_dir=tmp_path / "each") == expected
    assert load_records(list(CHOICE_BENCHMARKS), data_dir=tmp_path / "qwen") == expected
    assert load_choice_benchmark("gpqa_diamond", path=tmp_path / "suite", limit=2) == \
        expected["gpqa_diamond"][:2]


def test_bad_rows_name_the_file_and_line(tmp_path):
    row = _rows("mmlu_pro")[0]
    path = tmp_path / "mmlu_pro.jsonl"
    for change, message in (({"answer": "Z"}, "answer: expected a letter among A..J"),
                            ({"answer_index": 0}, "disagree"),
                            ({"options": ["only one"]}, "options"),
                            ({"question": ""}, "question")):
        path.write_text(json.dumps({**row, **change}) + "\n")
        with pytest.raises(ValueError, match=message) as e:
            load_choice_benchmark("mmlu_pro", path=path)
        assert str(e.value).startswith(f"{path}, line 1:")
    gpqa = tmp_path / "gpqa_diamond.jsonl"
    gpqa.write_text(json.dumps({k: v for k, v in _rows("gpqa_diamond")[0].items()
                                if k != "Incorrect Answer 2"}) + "\n")
    with pytest.raises(ValueError, match="no column 'Incorrect Answer 2'"):
        load_choice_benchmark("gpqa_diamond", path=gpqa)
    with pytest.raises(ValueError, match="name"):
        load_choice_benchmark("mmlu")


def test_option_counts_limits_and_row_places(tmp_path):
    """MMLU-Pro takes 2 to 26 non-empty string options; GPQA's missing or empty columns and
    MMLU-Pro's answer name the file and line; ``limit`` is a positive integer."""
    import string

    row = {k: v for k, v in _rows("mmlu_pro")[0].items() if k != "answer_index"}
    path = tmp_path / "mmlu_pro.jsonl"
    for n, ok in ((1, False), (2, True), (26, True), (27, False)):
        options = [f"option {i}" for i in range(n)]
        path.write_text(json.dumps({**row, "options": options, "answer": "B"}) + "\n")
        if ok:
            rec = load_choice_benchmark("mmlu_pro", path=path)[0]
            assert f"({string.ascii_uppercase[n - 1]}) option {n - 1}" in rec.problem
        else:
            with pytest.raises(ValueError, match="options: expected a list of 2 to 26"):
                load_choice_benchmark("mmlu_pro", path=path)
    for options in (["a", ""], ["a", 3], ["a", None]):
        path.write_text(json.dumps({**row, "options": options, "answer": "A"}) + "\n")
        with pytest.raises(ValueError, match="options"):
            load_choice_benchmark("mmlu_pro", path=path)
    path.write_text(json.dumps({**row, "answer": ""}) + "\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}, line 1: answer"):
        load_choice_benchmark("mmlu_pro", path=path)
    gpqa = tmp_path / "gpqa_diamond.jsonl"
    for column in ("Question", "Correct Answer", "Incorrect Answer 3"):
        gpqa.write_text(json.dumps({**_rows("gpqa_diamond")[0], column: " "}) + "\n")
        with pytest.raises(ValueError, match=rf"^{re.escape(str(gpqa))}, line 1: {column}"):
            load_choice_benchmark("gpqa_diamond", path=gpqa)
    for limit in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="limit: expected a positive integer"):
            load_choice_benchmark("gpqa_diamond", path=fixture_path("gpqa_diamond"),
                                  limit=limit)
    for name in ("mmlu", "gsm8k"):  # gsm8k has a fixture, but is no choice benchmark
        with pytest.raises(ValueError, match=f"name: no fixture for '{name}'; expected one of "
                                             r"\('mmlu_pro', 'gpqa_diamond'\)"):
            fixture_path(name)
    with pytest.raises(ValueError, match="completion: expected a string, got int"):
        letter_reward(3, "A")


def test_evaluate_scores_choice_benchmarks_by_letter(monkeypatch):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, intermediate_size=32,
                             num_heads=2, max_position_embeddings=1024)  # GPQA's prompts
    records = load_records(["gpqa_diamond"], fixtures=True)
    letters = [r.answer for r in records["gpqa_diamond"]]

    def fake_generate(model, tokenizer, prompts, sampling, **kwargs):
        # problem 0: right, right (lower case), wrong; problem 1: the option's text;
        # problem 2: right but unboxed, wrong twice (same letter)
        wrong = "A" if letters[2] != "A" else "B"
        return [[Generation(f"\\boxed{{{letters[0]}}}", 2),
                 Generation(f"\\boxed{{{letters[0].lower()}}}", 2),
                 Generation("\\boxed{Z}", 2)],
                [Generation("\\boxed{sp3}", 2)] * 3,
                [Generation(f"it is {letters[2]}", 2), Generation(f"\\boxed{{{wrong}}}", 2),
                 Generation(f"\\boxed{{\\text{{{wrong}}}}}", 2)]]

    monkeypatch.setattr(runner_mod, "generate_hf", fake_generate)
    res = evaluate(model, tok, records, k=3, temperature=0.7, template="qwen-math-system")
    m = res["benchmarks"]["gpqa_diamond"]
    assert m["accuracy"] == pytest.approx(2 / 9)
    assert m["formatted_rate"] == pytest.approx(5 / 9)
    assert m["maj_at_k"] == pytest.approx(1 / 3)  # problem 0 only; problem 2's wrong letter wins
    assert m["pass_at_k"] == pytest.approx(1 / 3)
    assert res["config"]["gpqa_shuffle_seed"] == choice.GPQA_SHUFFLE_SEED
    prompt = res["samples"]["gpqa_diamond"][0]["prompt"]
    assert prompt.startswith("<|im_start|>system\nPlease reason step by step")
    assert "(A) " in prompt and choice.CHOICE_INSTRUCTION in prompt
