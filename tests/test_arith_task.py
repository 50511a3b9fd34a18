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


def _orders(kind, ops):
    """Every way a problem can write the computation ``(kind, ops)``."""
    if kind in ("add", "mul"):
        return {ops, ops[::-1]}
    if kind == "two-step":
        return {ops, (ops[1], ops[0], ops[2])}
    return {ops}


@pytest.mark.parametrize("difficulty", [0, 1, 2, 3])
def test_no_held_out_computation_is_trained_in_any_order(difficulty):
    # the whole universe of the level, not a sample: every computation it can draw, in
    # every order it can be written, lands in the split of its canonical form
    level = arith.LEVELS[difficulty]
    splits = {}
    for kind, weight in zip(arith.KINDS, level.mix, strict=True):
        if weight == 0:
            continue
        for split in arith.SPLITS:
            for ops in arith.computations(difficulty, kind, split):
                for written in _orders(kind, ops):
                    assert splits.setdefault((kind, written), split) == split
                    assert arith.split_of(kind, written) == split
    # and what generate writes: no test or eval problem is a training problem reordered
    train = {(p.kind, w) for seed in range(3)
             for p in arith.generate(500, split="train", seed=seed, difficulty=difficulty)
             for w in _orders(p.kind, p.operands)}
    for split in ("test", "eval"):
        held = arith.generate(100, split=split, seed=7, difficulty=difficulty, repeats=True)
        assert not {(p.kind, p.operands) for p in held} & train
    # the commuted twin shares the split; sub does not commute
    assert arith.split_of("mul", (4, 7)) == arith.split_of("mul", (7, 4))
    assert arith.split_of("add", (6, 14)) == arith.split_of("add", (14, 6))
    assert arith.split_of("two-step", (3, 9, 2)) == arith.split_of("two-step", (9, 3, 2))
    assert arith.canonical("sub", (9, 3)) == (9, 3)


def test_splits_never_share_a_computation_across_levels():
    # a computation two levels can both draw is in one split for both
    seen = {}
    for difficulty in arith.LEVELS:
        for kind in ("add", "sub", "mul"):
            for split in arith.SPLITS:
                for ops in arith.computations(difficulty, kind, split):
                    assert seen.setdefault((kind, ops), split) == split


def test_recipe_held_out_set_is_200_distinct_computations():
    held = arith.generate(200, split="test", seed=arith.TEST_SEED, difficulty=0)
    assert len({(p.kind, arith.canonical(p.kind, p.operands)) for p in held}) == 200
    evals = arith.generate(200, split="eval", seed=arith.EVAL_SEED, difficulty=0)
    assert len({(p.kind, arith.canonical(p.kind, p.operands)) for p in evals}) == 200
    total = {s: sum(len(arith.computations(0, k, s)) for k in ("add", "sub", "mul"))
             for s in arith.SPLITS}
    assert total["test"] >= 200 and total["eval"] >= 200
    with pytest.raises(ValueError, match=f"n: the test split of level 0 holds {total['test']}"):
        arith.generate(total["test"] + 1, split="test", difficulty=0)
    # the whole split, each computation once
    whole = arith.generate(total["test"], split="test", difficulty=0)
    assert len({(p.kind, arith.canonical(p.kind, p.operands)) for p in whole}) == total["test"]


def test_operands_are_written_in_orders_the_level_allows():
    level = arith.LEVELS[0]
    problems = arith.generate(1000, split="train", seed=5, difficulty=0)
    for p in problems:
        if p.kind in ("add", "sub"):
            a, b = p.operands
            if p.kind == "add":
                assert level.first[0] <= a <= level.first[1]
                assert level.second[0] <= b <= level.second[1]
            assert a >= b or p.kind == "add"
    # both orders of a product are written
    muls = {p.operands for p in problems if p.kind == "mul" and p.operands[0] != p.operands[1]}
    assert any(o[::-1] in muls for o in muls)


def test_generation_is_seeded_and_distinct_until_exhausted():
    a = arith.generate(50, seed=1)
    assert a == arith.generate(50, seed=1) and a != arith.generate(50, seed=2)
    assert len({(p.kind, p.operands) for p in a}) == 50
    # level 1 holds a few dozen train computations: every one appears before any repeats
    n_train = sum(len(arith.computations(1, k, "train")) for k in ("add", "sub", "mul"))
    many = arith.generate(1000, split="train", seed=0, difficulty=1)
    keys = [(p.kind, arith.canonical(p.kind, p.operands)) for p in many]
    assert len(many) == 1000 and len(set(keys)) == n_train == len(set(keys[:n_train]))
    # held-out splits repeat only when asked to
    assert len(arith.generate(300, split="eval", difficulty=1, repeats=True)) == 300
    with pytest.raises(ValueError, match="n: the eval split of level 1 holds"):
        arith.generate(300, split="eval", difficulty=1)


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
