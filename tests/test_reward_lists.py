"""List references ("any of these"), scientific notation, and the data readers' answers.

The KTAE authors' evaluation suite's ``minerva`` split stores ``answer`` as a list of
accepted alternatives (``['0.01', '0.02']``, ``['-\\frac{1}{3}', '-1/3']``, one answer with
and without a trailing newline); verl parquet and JSON files may do the same in
``reward_model.ground_truth``.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ktae.data import load_examples
from ktae.eval.benchmarks import load_benchmark
from ktae.rewards import REWARDS, answers_equivalent, math_reward

MINERVA_LIKE = [
    (["0.01", "0.02"], "0.03"),
    (["-\\frac{1}{3}", "-1/3"], "\\frac{1}{3}"),
    (["9.6\n", "9.6"], "96"),
    (["2.88 \\times 10^{-19}\n"], "5.11 \\times 10^{-19}"),
]


@pytest.mark.parametrize("reward", ["boxed", "digits", "auto"])
def test_each_listed_answer_boxed_alone_is_correct(reward):
    texts, refs, want = [], [], []
    for ref, wrong in MINERVA_LIKE:
        for alt in ref:
            texts.append(f"The answer is $\\boxed{{{alt.strip()}}}$.")
            refs.append(ref)
            want.append(True)
        texts.append(f"The answer is $\\boxed{{{wrong}}}$.")
        refs.append(ref)
        want.append(False)
    got = REWARDS[reward].score(texts, refs)
    assert [r.correct for r in got] == want


@pytest.mark.parametrize("reward,line", [("dapo", "Answer: {}"), ("gsm8k", "#### {}")])
def test_answer_line_rewards_take_lists_too(reward, line):
    refs = ["0.01", "0.02"]
    got = REWARDS[reward].score([line.format("0.02"), line.format("0.01"), line.format("0.03")],
                                [refs] * 3)
    assert [r.correct for r in got] == [True, True, False]
    right, wrong = (1.0, -1.0) if reward == "dapo" else (1.0, 0.0)
    assert [r.score for r in got] == [right, right, wrong]


def test_a_nested_list_is_an_error():
    with pytest.raises(ValueError, match=r"nested list at entry 1"):
        math_reward("\\boxed{1}", [1, [2, 3]])
    with pytest.raises(ValueError, match=r"references\[1\]"):
        REWARDS["boxed"].score(["\\boxed{1}", "\\boxed{2}"], ["1", [2, [3]]])
    with pytest.raises(ValueError, match="empty list"):
        math_reward("\\boxed{1}", [])


@pytest.mark.parametrize("answer,reference,equal", [
    ("10^{-5}", "1e-5", True), ("0.00001", "1e-5", True), ("1\\times10^{-5}", "1e-5", True),
    ("3\\times 10^{8}", "3e8", True), ("3 \\cdot 10^8", "3e8", True), ("2500", "2.5e3", True),
    ("2.5E3", "2500", True), ("10^{11}", "1e11", True),
    ("10^{-4}", "1e-5", False), ("3\\times10^{9}", "3e8", False), ("2501", "2.5e3", False),
    # math-verify rounds to 6 decimals: tiny numbers with a unit are compared exactly
    ("5.11\\times10^{-19}\\,\\text{J}", "2.88\\times10^{-19}", False),
    ("2.88\\times10^{-19}\\,\\text{J}", "2.88\\times10^{-19}", True),
    ("3x", "3", False),
    # an E-notation reference reaches math-verify as a number, not as 1*e - 5
    ("\\frac{1}{100000}", "1e-5", True), ("\\frac{3}{2}\\cdot10^{3}", "1.5e3", True),
    ("\\frac{1}{10000}", "1e-5", False),
])
def test_scientific_notation_is_a_number(answer, reference, equal):
    assert answers_equivalent(answer, reference) == (equal, False)


def test_data_readers_keep_alternatives(tmp_path):
    jsonl = tmp_path / "minerva.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in (
        {"question": "q0", "answer": ["0.01", "0.02"]},
        {"question": "q1", "answer": ["9.6\n", "9.6"]},  # the same answer twice: one text
        {"question": "q2", "answer": ["7"]})))
    recs = load_benchmark("minerva", path=jsonl)
    assert [r.answer for r in recs] == [("0.01", "0.02"), "9.6", "7"]
    parquet = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"prompt": [{"role": "user", "content": "p"}], "data_source": "x",
         "reward_model": {"style": "rule", "ground_truth": ["-\\frac{1}{3}", "-1/3"]}}]), parquet)
    (ex,) = load_examples(str(parquet))
    assert ex.answer == ("-\\frac{1}{3}", "-1/3")
    assert math_reward("\\boxed{-1/3}", ex.answer).correct
    nested = tmp_path / "nested.jsonl"
    nested.write_text(json.dumps({"question": "q", "answer": "1"}) + "\n"
                      + json.dumps({"question": "q", "answer": [1, [2, 3]]}) + "\n")
    with pytest.raises(ValueError, match=r"nested.jsonl, line 2: answer: .*list inside a list"):
        load_examples(str(nested))


def test_training_rows_with_alternatives_share_one_type(tmp_path):
    from ktae.data import Example
    from ktae.train.data import TaskRows, format_task

    rows = TaskRows([Example("0", "p", ("1", "2")), Example("1", "q", "3")],
                    [Example("2", "r", "4")], embedded=False)
    train, evaluation = format_task(rows, "qwen-math")
    assert [r["answer"] for r in train] == [["1", "2"], ["3"]]
    assert [r["answer"] for r in evaluation] == ["4"]
    import datasets

    datasets.Dataset.from_list(train)  # one Arrow type for the column
    got = REWARDS["boxed"].score(["\\boxed{2}", "\\boxed{3}"], [r["answer"] for r in train])
    assert [r.correct for r in got] == [True, True]
