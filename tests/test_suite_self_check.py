"""scripts/suite_self_check.py: every accepted alternative of a reference, boxed, graded
against its own row under each grader."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXCERPT = ROOT / "tests" / "data" / "ktae_authors_grpo_ktae_7b_excerpt.json"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("suite_self_check",
                                                  ROOT / "scripts" / "suite_self_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def test_the_authors_references_verify_against_themselves_under_every_grader(script, capsys):
    # 51 rows of the authors' released GRPO+KTAE 7B outputs; Minerva's list answers
    # give 47 alternatives for its 32 rows
    refs = script.load_references(EXCERPT)
    assert {name: len(rows) for name, rows in refs.items()} == \
        {"aime": 4, "amc": 4, "math": 5, "minerva": 32, "olympiad_bench": 6}
    assert sum(len(r.alternatives) for r in refs["minerva"]) == 47
    assert script.main([str(EXCERPT)]) == 0
    out = capsys.readouterr().out
    assert "| benchmark | rows | alternatives | default | ktae-authors | taco |" in out
    assert "| minerva | 32 | 47 | 32 | 32 | 32 |" in out
    assert "| all | 51 | 66 | 51 | 51 | 51 |" in out
    assert "no failures" in out


def test_a_saved_suite_is_read_as_ktae_eval_reads_it(script):
    from ktae.eval.benchmarks import FIXTURE_DIR

    refs = script.load_references(FIXTURE_DIR / "ktae_suite")  # a saved DatasetDict
    assert list(refs) == ["aime24", "amc22-23", "math500", "minerva", "olympiadbench"]
    report = script.self_check(refs, ["taco"])
    assert all(row["pass"]["taco"] == row["rows"] for row in report["benchmarks"].values())


def test_a_reference_that_cannot_be_boxed_is_listed(script, tmp_path, capsys):
    rows = tmp_path / "refs.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in (
        {"benchmark": "b", "answer": "\\frac{1}{2"},   # unbalanced: no box is read back
        {"benchmark": "b", "answer": ["0.01\n", "1/100", "0.01"]},
        {"answer": 7.0})))                              # benchmark: the file's stem
    refs = script.load_references(rows)
    assert [r.alternatives for r in refs["b"]] == [("\\frac{1}{2",), ("0.01", "1/100")]
    assert refs["refs"][0].alternatives == ("7",)
    report = script.self_check(refs, ["taco"])
    assert report["benchmarks"]["b"] == {"rows": 2, "alternatives": 3, "pass": {"taco": 1}}
    assert report["benchmarks"]["refs"]["pass"] == {"taco": 1}
    assert report["failures"] == [{"benchmark": "b", "id": "0", "grader": "taco",
                                   "alternative": "\\frac{1}{2", "extracted": None}]
    out_json = tmp_path / "check.json"
    assert script.main([str(rows), "--graders", "taco", "--json", str(out_json)]) == 0
    assert "| b | 0 | taco | `\\frac{1}{2` | `None` |" in capsys.readouterr().out
    assert json.loads(out_json.read_text())["failures"] == report["failures"]


def test_errors_are_one_line(script, tmp_path, capsys):
    assert script.main([str(tmp_path / "missing.jsonl")]) == 2
    assert script.main([str(EXCERPT), "--graders", "nope"]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"benchmark": "b", "answer": [1, [2, 3]]}) + "\n")
    assert script.main([str(bad)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(e.startswith("suite_self_check: ") for e in err)
    assert "line 1" in err[2]
