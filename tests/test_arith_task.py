"""The arith task: splits, difficulty, prompts, its reward, and its place in train and eval."""

from __future__ import annotations

import pytest

from ktae.rewards.answer_line import last_number, number_check
from ktae.tasks import arith


@pytest.mark.parametrize("difficulty", [0, 1, 2, 3])
def test_answers_are_exact_and_non_negative(difficulty):
    def value(kind, ops):
        if kind == "add":
            return ops[0] + ops[1]
        if kind == "sub":
            return ops[0] - ops[1]
        if kind == "mul":
            return ops[0] * ops[1]
        return ops[0] + ops[1] - ops[2]

    for p in arith.generate(300, split="train", seed=3, difficulty=difficulty):
        ops = p.operands
        want = value(p.kind, ops)
        assert p.answer == str(want) and want >= 0
        assert all(str(x) in p.question for x in ops)
        assert arith.split_of(p.kind, p.operands) == "train"


def test_difficulty_sets_ranges_and_kinds():
    for difficulty, level in arith.LEVELS.items():
        problems = arith.generate(200, split="train", seed=0, difficulty=difficulty)
        kinds = {p.kind for p in problems}
        assert kinds == {k for k, w in zip(arith.KINDS, level.mix, strict=True) if w > 0}
        for p in problems:
            lo, hi = level.factor if p.kind == "mul" else level.first
            assert lo <= p.operands[0] <= hi or p.kind == "sub"
    assert max(int(p.answer) for p in arith.generate(200, split="train", difficulty=3)) > \
        max(int(p.answer) for p in arith.generate(200, split="train", difficulty=1))


def test_splits_never_share_arithmetic():
    sets = {s: {(p.kind, p.operands) for p in arith.generate(400, split=s, seed=s == "train")}
            for s in arith.SPLITS}
    assert not sets["train"] & sets["test"]
    assert not sets["train"] & sets["eval"]
    assert not sets["test"] & sets["eval"]
    # the same sum in other words is the same problem: the split follows the numbers
    assert arith.split_of("add", (12, 5)) == arith.split_of("add", (12, 5))


def test_generation_is_seeded_and_distinct_until_exhausted():
    a = arith.generate(50, seed=1)
    assert a == arith.generate(50, seed=1) and a != arith.generate(50, seed=2)
    assert len({(p.kind, p.operands) for p in a}) == 50
    # level 1 holds a few hundred train problems: past that, repeats are allowed
    many = arith.generate(1000, split="train", seed=0, difficulty=1)
    assert len(many) == 1000 and len({(p.kind, p.operands) for p in many}) < 1000


@pytest.mark.parametrize("bad, message", [
    (dict(n=-1), "n: expected"), (dict(n=2, split="dev"), "split: expected"),
    (dict(n=2, difficulty=4), "difficulty: expected"),
    (dict(n=2, difficulty=True), "difficulty: expected")])
def test_bad_arguments(bad, message):
    with pytest.raises(ValueError, match=message):
        arith.generate(**bad)


def test_task_names():
    assert arith.parse_task_name("arith") == arith.DEFAULT_DIFFICULTY
    assert arith.parse_task_name("arith@difficulty=3") == 3
    assert arith.parse_task_name("arith@difficulty=0") == 0
    assert arith.parse_task_name("embedded") is None
    for bad in ("arith@difficulty=4", "arith@level=2", "arith@difficulty=x"):
        with pytest.raises(ValueError, match="task: arith takes difficulty"):
            arith.parse_task_name(bad)


@pytest.mark.parametrize("text, number", [
    ("The answer is 16.", "16"), ("#### 1,234", "1234"), ("1 234 apples", "1234"),
    ("so -7", "-7"), ("2.50 dollars", "2.5"), ("x2 and the 3rd", None), ("none", None),
    ("13 + 3 = 16 apples, then 5", "5"), ("007", "7"), ("-0", "0"), ("It is 3.", "3")])
def test_last_number(text, number):
    assert last_number(text) == number


def test_number_reward_reads_the_last_number():
    from ktae.rewards.registry import get_reward

    results = get_reward("number").score(
        ["Tom has 12 + 5 = 17 apples. The answer is 17.", "12 + 5 = 17. So 18", "no idea"],
        ["17", "17", "17"])
    assert [(r.correct, r.formatted, r.extracted, r.score) for r in results] == [
        (True, True, "17", 1.0), (False, True, "18", 0.0), (False, False, None, 0.0)]
    assert number_check("1,000", "1000") == (True, "1000")


def test_train_reads_arith_as_chat_rows_with_a_fixed_held_out_set():
    from ktae.train.data import read_task

    a = read_task("arith", train_size=30, eval_size=10, seed=0)
    b = read_task("arith@difficulty=2", train_size=30, eval_size=10, seed=1)
    assert a.eval == b.eval and a.train != b.train  # held-out fixed, training per seed
    row = a.train[0]
    assert row.messages == [{"role": "user", "content": f"{row.problem} {arith.INSTRUCTION}"}]
    train = {r.problem for r in a.train} | {r.problem for r in b.train}
    assert not train & {r.problem for r in a.eval}
    with pytest.raises(ValueError, match="arith task takes no"):
        read_task("arith", train_size=5, eval_size=2, seed=0, eval_task="jsonl:x.jsonl")


def test_config_accepts_arith_and_refuses_bad_names():
    from ktae.runs.config import TrainConfig

    TrainConfig(task="arith@difficulty=1", reward="number").resolve()
    with pytest.raises(ValueError, match="task: arith takes"):
        TrainConfig(task="arith@difficulty=9").resolve()
    with pytest.raises(ValueError, match="eval_task: the arith held-out split goes with"):
        TrainConfig(task="jsonl:x.jsonl", eval_task="arith").resolve()


def test_eval_benchmark_is_the_eval_split_graded_by_the_last_number():
    from ktae.eval.benchmarks import load_benchmark
    from ktae.eval.prompts import build_prompt
    from ktae.eval.runner import verify_responses

    records = load_benchmark("arith", limit=20)
    assert len(records) == 20 and all(r.source == "arith" for r in records)
    ids = {(p.kind, p.operands) for p in arith.generate(20, split="eval", seed=arith.EVAL_SEED)}
    assert all(arith.split_of(*k) == "eval" for k in ids)
    assert build_prompt(records[0], "raw") == f"{records[0].problem} {arith.INSTRUCTION}"
    r = verify_responses("arith", [f"It is {records[0].answer}.", "It is -1."],
                         [records[0].answer, records[0].answer], timeout=5.0)
    assert [x.correct for x in r] == [True, False]
