"""The graders of ``ktae eval --grader``: the KTAE authors' grader against their own
per-response rewards, the TACO rule, and ``--responses`` on the authors' file format.

``data/ktae_authors_grpo_ktae_7b_excerpt.json``: 51 rows of ``eval_result/GRPO+KTAE_7B.json``
in the KTAE authors' repository (github.com/xiaolizh1/KTAE, commit ea9fb77): 4 random
rows of each benchmark, 4 Minerva rows whose answer lists differ, and every row where
ktae's default grader and theirs disagree; each response kept from 300 characters before
its last ``\\boxed`` (the part any grader reads), with the authors' own ``reward``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ktae.cli import main
from ktae.eval.graders import GRADERS, get_grader, numeric_value
from ktae.eval.responses import read_responses
from ktae.rewards.authors_grader import check_response, last_box, mathd_normalize

EXCERPT = Path(__file__).parent / "data" / "ktae_authors_grpo_ktae_7b_excerpt.json"


def _rows():
    return json.loads(EXCERPT.read_text())


def test_authors_grader_agrees_with_their_rewards_row_by_row():
    rows = _rows()
    results = get_grader("ktae-authors").grade([r["model_output"][0] for r in rows],
                                               [r["gt"][0] for r in rows], timeout=10.0)
    theirs = [r["reward"][0] == 1.0 for r in rows]
    ours = [r.correct for r in results]
    assert ours == theirs, [(r["row"], r["gt"][0]) for r, a, b in
                            zip(rows, ours, theirs, strict=True) if a != b]
    # the excerpt holds rows where ktae's own verifier decides otherwise (both ways)
    default = [r.correct for r in get_grader("default").grade(
        [r["model_output"][0] for r in rows], [r["gt"][0] for r in rows])]
    assert sum(a and not b for a, b in zip(theirs, default, strict=True)) >= 5
    assert sum(b and not a for a, b in zip(theirs, default, strict=True)) >= 5


def test_authors_rules_in_process():
    # extraction: the last \boxed, exactly "\boxed{...}"; else not formatted
    assert last_box("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_box("\\boxed 5") is None and check_response("no box", "5") == (False, None)
    assert mathd_normalize("\\text{5 meters}") == mathd_normalize("5")
    assert check_response("\\boxed{0.5}", "\\frac{1}{2}")[0]
    assert check_response("\\boxed{\\dfrac{3}{4}}", "3/4")[0]
    # unreduced fractions: refused by the sympy rule, accepted by math-verify's
    assert check_response("\\boxed{6/8}", "3/4")[0]
    assert not check_response("\\boxed{0.76}", "3/4")[0]
    assert check_response("\\boxed{x^2 - 1}", "(x-1)(x+1)")[0]


MINERVA_LIKE = [(["0.01", "0.02"], ["0.01", "0.02"], "0.03"),
                (["-\\frac{1}{3}", "-1/3"], ["-\\frac{1}{3}", "-1/3"], "\\frac{1}{3}"),
                (["9.6\n", "9.6"], ["9.6"], "9.7")]


@pytest.mark.parametrize("grader", list(GRADERS))
def test_every_grader_accepts_any_listed_answer(grader):
    texts, refs, expect = [], [], []
    for ref, accepted, wrong in MINERVA_LIKE:
        for a in accepted:
            texts.append(f"so the answer is $\\boxed{{{a}}}$")
            refs.append(ref)
            expect.append(True)
        texts.append(f"\\boxed{{{wrong}}}")
        refs.append(ref)
        expect.append(False)
    assert [r.correct for r in GRADERS[grader].grade(texts, refs)] == expect
    with pytest.raises(ValueError, match=r"references\[0\]: .*nested list"):
        GRADERS[grader].grade(["\\boxed{1}"], [["1", ["2", "3"]]])


def test_taco_rule_is_exact_match_or_numerical_equality():
    grade = GRADERS["taco"].grade
    pairs = [("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", True), ("\\boxed{0.5}", "1/2", True),
             ("\\boxed{1,000}", "1000", True), ("\\boxed{10^{-5}}", "1e-5", True),
             ("\\boxed{3\\times 10^{8}}", "3e8", True), ("\\boxed{2500}", "2.5e3", True),
             ("\\boxed{x^2-1}", "(x-1)(x+1)", False),  # no symbolic algebra
             ("\\boxed{0.333}", "\\frac{1}{3}", False), ("7", "7", False)]
    got = [r.correct for r in grade([p[0] for p in pairs], [p[1] for p in pairs])]
    assert got == [p[2] for p in pairs]
    assert numeric_value("-\\frac{3}{4}") == numeric_value("-0.75")
    assert numeric_value("x") is None


def test_responses_file_of_the_authors_is_graded_without_a_model(tmp_path, capsys):
    rows = _rows()
    out = tmp_path / "graded"
    assert main(["eval", "--responses", str(EXCERPT), "--protocol", "ktae",
                 "-o", str(out), "--no-progress"]) == 0
    stdout = capsys.readouterr().out
    assert "grader ktae-authors" in stdout and "olympiad_bench" in stdout
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["grader"] == "ktae-authors"
    for name, acc in results["results"].items():
        theirs = [r["reward"][0] for r in rows if r["task_name"] == name]
        assert acc == pytest.approx(sum(theirs) / len(theirs)), name
    # the default grader scores the same file differently, and says so
    assert main(["eval", "--responses", str(EXCERPT), "-o", str(tmp_path / "d")]) == 0
    other = json.loads((tmp_path / "d" / "results.json").read_text())
    assert other["config"]["grader"] == "default"
    assert other["results"]["minerva"] != results["results"]["minerva"]


def test_responses_reads_ktae_samples_and_generic_records(tmp_path, capsys):
    samples = tmp_path / "samples_toy.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in (
        {"index": 0, "id": "a", "sample": 0, "prompt": "p", "completion": "\\boxed{7}",
         "answer": "7", "response_tokens": 5, "truncated": False},
        {"index": 0, "id": "a", "sample": 1, "prompt": "p", "completion": "\\boxed{8}",
         "answer": "7", "response_tokens": 9, "truncated": True},
        {"index": 1, "id": "b", "sample": 0, "prompt": "q", "completion": "\\boxed{0.02}",
         "answer": ["0.01", "0.02"], "response_tokens": 4, "truncated": False},
        {"index": 1, "id": "b", "sample": 1, "prompt": "q", "completion": "none",
         "answer": ["0.01", "0.02"], "response_tokens": 3, "truncated": False})))
    problems = read_responses(samples)
    assert list(problems) == ["toy"] and [len(p.responses) for p in problems["toy"]] == [2, 2]
    out = tmp_path / "o"
    assert main(["eval", "--responses", str(samples), "-o", str(out)]) == 0
    m = json.loads((out / "results.json").read_text())["benchmarks"]["toy"]
    assert (m["n"], m["k"], m["accuracy"], m["max_response_length"]) == (2, 2, 0.5, 9)
    assert m["truncation_rate"] == 0.25 and m["formatted_rate"] == 0.75
    # maj@k: a tie of 7 (right) and 8 on the first problem, the listed 0.02 alone on the second
    assert m["maj_at_k"] == pytest.approx((0.5 + 1.0) / 2)
    assert (out / "samples_toy.jsonl").is_file()
    records = tmp_path / "mine.jsonl"
    records.write_text(json.dumps({"benchmark": "b1", "answer": "1e-5",
                                   "response": ["\\boxed{10^{-5}}", "\\boxed{2}"]}) + "\n")
    assert main(["eval", "--responses", str(records), "--grader", "taco",
                 "-o", str(tmp_path / "t")]) == 0
    res = json.loads((tmp_path / "t" / "results.json").read_text())
    assert res["results"] == {"b1": 0.5} and res["config"]["grader"] == "taco"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"benchmark": "b1", "answer": "1"}) + "\n")
    capsys.readouterr()
    assert main(["eval", "--responses", str(bad), "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl, line 1: expected a response" in err
    assert main(["eval", "--grader", "taco", "-o", str(tmp_path / "y")]) == 2
    assert "MODEL" in capsys.readouterr().err
