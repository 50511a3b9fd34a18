"""ktae.data: every source and schema reaching the same records, field maps, filters and
one-line errors naming the file and row. All files are written here; no network."""

from __future__ import annotations

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ktae.data import Example, load_examples, parse_source, read_source
from ktae.data.sources import Source
from ktae.eval.prompts import DAPO_PREFIX, DAPO_SUFFIX, render_prompt

PROBLEMS = [("What is $3+4$?", "7"), ("Simplify $\\frac{6}{8}$.", "\\frac{3}{4}"),
            ("Solve $2x=10$.", "5"), ("What is $\\sqrt{81}$?", "9"), ("Compute $12-5$.", "7")]
LEVELS = ["Level 1", "Level 3", "Level 4", "Level 5", "Level 2"]


def verl_rows(problems=PROBLEMS, wrap=lambda p: p, source="math_dapo"):
    return [{"data_source": source,
             "prompt": [{"role": "user", "content": wrap(p)}],
             "ability": "MATH",
             "reward_model": {"style": "rule", "ground_truth": a},
             "extra_info": {"index": i, "split": "train"}} for i, (p, a) in enumerate(problems)]


def math_rows(problems=PROBLEMS):
    return [{"problem": p, "level": lvl, "type": "Algebra",
             "solution": f"Working: ... so the result is $\\boxed{{{a}}}$."}
            for (p, a), lvl in zip(problems, LEVELS, strict=True)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def pairs(examples):
    return [(e.problem, e.answer) for e in examples]


def test_every_source_and_schema_reaches_the_same_records(tmp_path, monkeypatch):
    verl = write_parquet(tmp_path / "train.parquet", verl_rows())
    dapo = write_parquet(tmp_path / "dapo.parquet",
                         verl_rows(wrap=lambda p: f"{DAPO_PREFIX}{p}{DAPO_SUFFIX}"))
    math_jsonl = write_jsonl(tmp_path / "math.jsonl", math_rows())
    qa = tmp_path / "qa.json"
    qa.write_text(json.dumps([{"question": p, "answer": a} for p, a in PROBLEMS]))
    mixed = write_jsonl(tmp_path / "mixed.jsonl",  # final_answer as OlympiadBench, numbers
                        [{"prompt": p, "final_answer": [f"${a}$\n"]} for p, a in PROBLEMS[:3]]
                        + [{"problem": p, "ground_truth": int(a)} for p, a in PROBLEMS[3:]])
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(math_rows()).save_to_disk(str(saved))
    saved_dict = tmp_path / "saved_dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(verl_rows()),
                          "test": datasets.Dataset.from_list(verl_rows()[:1])}
                         ).save_to_disk(str(saved_dict))
    hub_calls = []

    def load_dataset(name, config=None, *, split=None, **_):
        hub_calls.append((name, config, split))
        return datasets.Dataset.from_list(math_rows())

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    sources = [f"parquet:{verl}", str(verl), f"jsonl:{math_jsonl}", f"json:{qa}", str(qa),
               f"jsonl:{mixed}", str(saved), f"disk:{saved}", f"{saved_dict}@train",
               str(saved_dict), "hf:EleutherAI/hendrycks_math:algebra@train"]
    for source in sources:
        assert pairs(load_examples(source)) == PROBLEMS, source
    assert hub_calls == [("EleutherAI/hendrycks_math", "algebra", "train")]
    # verl rows keep their chat prompt, data source and index
    first = load_examples(str(verl))[1]
    assert first == Example("1", PROBLEMS[1][0], PROBLEMS[1][1],
                            [{"role": "user", "content": PROBLEMS[1][0]}], "math_dapo")
    # DAPO rows hold the instruction already: the dapo template does not wrap them twice
    dapo_rows = load_examples(str(dapo))
    assert [e.answer for e in dapo_rows] == [a for _, a in PROBLEMS]
    tok = _Tok()
    assert [render_prompt(e.problem, "dapo", tok) for e in dapo_rows] == \
        [render_prompt(p, "dapo", tok) for p, _ in PROBLEMS]
    assert render_prompt(dapo_rows[0].problem, "raw", messages=dapo_rows[0].messages) == \
        f"{DAPO_PREFIX}{PROBLEMS[0][0]}{DAPO_SUFFIX}"


class _Tok:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, *, tokenize, add_generation_prompt):
        assert not tokenize and add_generation_prompt
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<a>"


def test_templates_render_as_documented():
    from ktae.eval.prompts import KTAE_TRAIN_INSTRUCTION, QWEN_MATH_INSTRUCTION

    tok = _Tok()
    p = "What is $1+1$?"
    assert render_prompt(p, "ktae-train", tok) == f"<user>{p} {KTAE_TRAIN_INSTRUCTION}</user><a>"
    assert render_prompt(p, "qwen-math-system") == (
        f"<|im_start|>system\n{QWEN_MATH_INSTRUCTION}<|im_end|>\n<|im_start|>user\n{p}"
        "<|im_end|>\n<|im_start|>assistant\n")
    assert render_prompt(p, "dapo", tok) == f"<user>{DAPO_PREFIX}{p}{DAPO_SUFFIX}</user><a>"
    assert render_prompt(p, "raw") == p
    assert render_prompt(p, "chat", tok) == f"<user>{p}\n{QWEN_MATH_INSTRUCTION}</user><a>"
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": p}]
    assert render_prompt(p, "chat", tok, messages=messages) == f"<system>S</system><user>{p}</user><a>"
    assert render_prompt(p, "raw", messages=messages) == f"S\n\n{p}"
    with pytest.raises(ValueError, match="tokenizer"):
        render_prompt(p, "ktae-train")


def test_source_strings():
    assert parse_source("hf:a/b") == Source("hf", "a/b")
    assert parse_source("hf:a/b:main@test") == Source("hf", "a/b", "main", "test")
    assert parse_source("hf:a/b@validation") == Source("hf", "a/b", None, "validation")
    assert parse_source("jsonl:x.txt") == Source("jsonl", "x.txt")
    assert parse_source("data/x.parquet") == Source("parquet", "data/x.parquet")
    assert parse_source("disk:suite@math") == Source("disk", "suite", None, "math")
    for bad, match in [("", "expected a data source"), ("jsonl:", "after 'jsonl:'"),
                       ("hf:", "after 'hf:'"), ("train.csv", "expected jsonl:PATH"),
                       ("hf::cfg", "hf:NAME")]:
        with pytest.raises(ValueError, match=f"task: .*{match}"):
            parse_source(bad)


def test_field_maps(tmp_path):
    rows = [{"uid": f"u{i}", "query": p, "gt": {"value": a}, "src": "math"}
            for i, (p, a) in enumerate(PROBLEMS)]
    path = write_parquet(tmp_path / "custom.parquet", rows)
    got = load_examples(str(path), fields={"problem": "query", "answer": "gt.value",
                                           "id": "uid", "data_source": "src"})
    assert pairs(got) == PROBLEMS
    assert [e.id for e in got] == [f"u{i}" for i in range(5)]
    assert {e.data_source for e in got} == {"math"}
    # a field map wins over a detected column: the solution's box instead of an answer column
    math = [dict(r, answer="wrong") for r in math_rows()]
    path2 = write_jsonl(tmp_path / "m.jsonl", math)
    assert {e.answer for e in load_examples(str(path2))} == {"wrong"}
    assert pairs(load_examples(str(path2), fields={"answer": "solution"})) != PROBLEMS
    from ktae.data import boxed_answer

    assert [boxed_answer(r["solution"]) for r in math] == [a for _, a in PROBLEMS]
    with pytest.raises(ValueError, match=r"field_map: problem='nope': .*custom.parquet has no "
                                         r"such column; columns are \['uid'"):
        load_examples(str(path), fields={"problem": "nope"})
    with pytest.raises(ValueError, match="unknown field"):
        load_examples(str(path), fields={"question": "query"})
    with pytest.raises(ValueError, match="has no such column"):
        load_examples(str(path), fields={"problem": "query", "answer": "gt.missing"})


def test_filters(tmp_path):
    path = write_jsonl(tmp_path / "math.jsonl", math_rows())
    hard = load_examples(str(path), filters={"level": ["Level 3", "Level 4", "Level 5"]})
    assert pairs(hard) == PROBLEMS[1:4]
    assert pairs(load_examples(str(path), filters={"level": ["Level 3", "Level 4", "Level 5"],
                                                   "type": ["Algebra"]})) == PROBLEMS[1:4]
    # numbers compare as text
    nums = write_parquet(tmp_path / "n.parquet",
                         [{"question": p, "answer": a, "level": i} for i, (p, a) in
                          enumerate(PROBLEMS)])
    assert pairs(load_examples(str(nums), filters={"level": ["0", "4"]})) == \
        [PROBLEMS[0], PROBLEMS[4]]
    with pytest.raises(ValueError, match=r"filter level=Level 9: no row of .*math.jsonl is left "
                                         r"\(of 5\); level takes 'Level 1', 'Level 2'"):
        load_examples(str(path), filters={"level": ["Level 9"]})
    with pytest.raises(ValueError, match="filter subject=...: .*has no column 'subject'"):
        load_examples(str(path), filters={"subject": ["Algebra"]})
    with pytest.raises(ValueError, match="filters: expected"):
        load_examples(str(path), filters={"level": []})


@pytest.mark.parametrize("write, match", [
    (lambda p: write_jsonl(p, [{"problem": "x", "solution": "no box here"}]),
     r"x\.jsonl, line 1: solution: no answer column and the solution has no complete \\boxed"),
    (lambda p: write_jsonl(p, [{"problem": "x", "answer": "1"}, {"problem": "y", "answer": None}]),
     r"x\.jsonl, line 2: answer: expected a string, number or list, got null"),
    (lambda p: write_jsonl(p, [{"text": "x", "answer": "1"}]),
     r"x\.jsonl has no column for 'problem'"),
    (lambda p: write_jsonl(p, [{"problem": "x"}]),
     r"x\.jsonl has no column for 'answer' .*and no 'solution'"),
    (lambda p: p.write_text('{"problem": "x", "answer": 1}\n{"problem": \n'),
     r"x\.jsonl, line 2: invalid JSON"),
    (lambda p: write_jsonl(p, [{"prompt": [{"role": "user", "content": "   "}], "answer": "1"}]),
     r"x\.jsonl, line 1: the chat prompt has no non-empty user message"),
    (lambda p: write_jsonl(p, [{"prompt": [{"content": "hi"}], "answer": "1"}]),
     r"x\.jsonl, line 1: expected chat messages with string 'role' and 'content'"),
    (lambda p: write_jsonl(p, [{"problem": "x", "answer": "1", "data_source": 3}]),
     r"x\.jsonl, line 1: data_source: expected a string"),
])
def test_malformed_json_rows_are_one_line_errors(tmp_path, write, match):
    path = tmp_path / "x.jsonl"
    write(path)
    with pytest.raises(ValueError, match=match) as info:
        load_examples(str(path))
    assert "\n" not in str(info.value)


def test_malformed_parquet_and_saved_directories(tmp_path):
    fake = tmp_path / "fake.parquet"
    fake.write_text("problem,answer\n1+1,2\n")
    with pytest.raises(ValueError, match=r"fake\.parquet: not a Parquet file") as info:
        load_examples(str(fake))
    assert "\n" not in str(info.value)
    rows = verl_rows()
    rows[3]["reward_model"]["ground_truth"] = ""
    bad = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(ValueError, match=r"bad\.parquet, row 3: answer: expected a non-empty"):
        load_examples(str(bad))
    with pytest.raises(ValueError, match=r"nothing\.parquet: no such file"):
        load_examples(str(tmp_path / "nothing.parquet"))
    empty_dir = tmp_path / "notsaved"
    empty_dir.mkdir()
    with pytest.raises(ValueError, match="notsaved: not a dataset saved with save_to_disk"):
        load_examples(str(empty_dir))
    saved = tmp_path / "dd"
    datasets.DatasetDict({"a": datasets.Dataset.from_list(math_rows()),
                          "b": datasets.Dataset.from_list(math_rows())}).save_to_disk(str(saved))
    with pytest.raises(ValueError, match=r"dd: a DatasetDict with splits \['a', 'b'\]; choose"):
        load_examples(str(saved))
    with pytest.raises(ValueError, match=r"dd: no split 'c'; splits are \['a', 'b'\]"):
        load_examples(f"{saved}@c")
    assert len(load_examples(f"{saved}@b")) == 5


def test_hub_errors_are_one_line(monkeypatch):
    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'x/y' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match=r"hf:x/y@train: cannot be loaded \(Couldn't reach") as e:
        load_examples("hf:x/y")
    assert "\n" not in str(e.value)


def test_parquet_reads_only_the_columns_it_needs(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "t.parquet", verl_rows())
    rows = read_source(str(path))
    read = []
    original = pq.ParquetFile.iter_batches

    def spy(self, *a, columns=None, **kw):
        read.append(tuple(columns))
        return original(self, *a, columns=columns, **kw)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    examples = load_examples(rows)
    assert len(examples) == 5
    assert "ability" not in {c for cols in read for c in cols}  # never converted
    assert len(read) == len(set(read))  # each column read once


def test_a_large_parquet_becomes_python_strings_once(tmp_path):
    """Python memory allocated while loading a verl-schema parquet: one copy of the problem
    text plus a per-row overhead (message list and dict, Example, id, data source: about
    600 bytes measured). The bound, 1.25 x text + 800 bytes/row, fails if the text were
    converted twice (a second copy alone is 1 x text). Arrow buffers are not traced."""
    import sys
    import tracemalloc

    n, chars = 5000, 4000
    problems = [f"{i}:" + "y" * chars for i in range(n)]
    path = write_parquet(tmp_path / "big.parquet", verl_rows([(p, str(i)) for i, p in
                                                              enumerate(problems)]))
    text = sum(sys.getsizeof(p) for p in problems)
    del problems
    tracemalloc.start()
    try:
        examples = load_examples(f"parquet:{path}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(examples) == n and examples[-1].answer == str(n - 1)
    assert peak < 1.25 * text + 800 * n, (peak / 2**20, text / 2**20)


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "disk"])
def test_filtered_rows_keep_their_places_and_only_they_are_read(tmp_path, monkeypatch, kind):
    """A filter (and a limit) keep rows by position; errors still name the source row, and
    a Parquet column is converted for the kept rows only, batch by batch."""
    from ktae.data import sources

    monkeypatch.setattr(sources, "PARQUET_BATCH_ROWS", 2)  # several batches
    rows = [dict(r) for r in math_rows() * 2]
    for i, r in enumerate(rows):
        r["problem"] = f"{i}: {r['problem']}"
    rows[7]["solution"] = "no box"
    if kind == "parquet":
        source = str(write_parquet(tmp_path / "m.parquet", rows))
        place = "row 7"
    elif kind == "jsonl":
        source = str(write_jsonl(tmp_path / "m.jsonl", rows))
        place = "line 8"
    else:
        datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
        source, place = str(tmp_path / "saved"), "row 7"
    got = load_examples(source, filters={"level": ["Level 3", "Level 5"]}, limit=3)
    assert [e.problem.split(":")[0] for e in got] == ["1", "3", "6"]
    assert [e.answer for e in got] == [PROBLEMS[1][1], PROBLEMS[3][1], PROBLEMS[1][1]]
    with pytest.raises(ValueError, match=f"{place}: solution: no answer column"):
        load_examples(source, filters={"level": ["Level 4"]})  # rows 2 and 7 of the source
    converted = []
    original = sources.Rows.column

    def spy(self, name):
        values = original(self, name)
        converted.append((name, len(values)))
        return values

    monkeypatch.setattr(sources.Rows, "column", spy)
    load_examples(source, filters={"level": ["Level 3"]})
    assert ("problem", 2) in converted and ("level", 10) in converted


def test_benchmark_records_under_the_new_templates():
    from ktae.eval.benchmarks import BenchmarkRecord
    from ktae.eval.prompts import build_prompt, qwen_math_system_prompt

    emb = BenchmarkRecord("e0", "37+45", "82", "embedded")
    rec = BenchmarkRecord("1", "What is $2+2$?", "4", "math500")
    assert build_prompt(emb, "qwen-math-system") == qwen_math_system_prompt("Compute 37+45.")
    assert build_prompt(rec, "qwen-math-system") == qwen_math_system_prompt("What is $2+2$?")
    assert build_prompt(rec, "raw") == "What is $2+2$?"
    assert build_prompt(rec, "dapo", _Tok()) == f"<user>{DAPO_PREFIX}What is $2+2$?{DAPO_SUFFIX}</user><a>"
    with pytest.raises(ValueError, match="template"):
        build_prompt(rec, "auto")


def test_reader_details_are_one_line_errors_or_read(tmp_path):
    """Duplicate columns and keys are refused (they were resolved silently, first column or
    last key); a byte-order mark is read; a missing answer key and a directory are named
    as such."""
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["p"]), pa.array(["1"]), pa.array(["2"])],
                                        names=["problem", "answer", "answer"]), dup)
    with pytest.raises(ValueError, match=r"^\S*dup.parquet: column 'answer' appears twice"):
        load_examples(str(dup))
    lines = tmp_path / "dup.jsonl"
    lines.write_text('{"problem": "p", "answer": "1"}\n{"problem": "q", "answer": "1", '
                     '"answer": "2"}\n')
    with pytest.raises(ValueError, match=r"dup.jsonl, line 2: key 'answer' appears twice"):
        load_examples(str(lines))
    listed = tmp_path / "dup.json"
    listed.write_text('[{"problem": "p", "answer": "1", "answer": "2"}]')
    with pytest.raises(ValueError, match=r"dup.json: key 'answer' appears twice"):
        load_examples(str(listed))
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"problem": "p", "answer": "7"}).encode()
                    + b"\n")
    assert load_examples(str(bom)) == [Example("0", "p", "7")]
    missing = tmp_path / "missing.jsonl"
    write_jsonl(missing, [{"problem": "p", "answer": "1"}, {"problem": "q"}])
    with pytest.raises(ValueError, match=r"missing.jsonl, line 2: answer: the row has no key "
                                         r"'answer'"):
        load_examples(str(missing))
    null = tmp_path / "null.jsonl"
    write_jsonl(null, [{"problem": "p", "answer": "1"}, {"problem": "q", "answer": None}])
    with pytest.raises(ValueError, match=r"null.jsonl, line 2: .*got null"):
        load_examples(str(null))
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    for source in (f"jsonl:{folder}", f"parquet:{folder}", f"json:{folder}"):
        with pytest.raises(ValueError, match=r"is a directory"):
            load_examples(source)
