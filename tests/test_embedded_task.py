"""The embedded arithmetic task: determinism, splits, answers, levels, noisy solutions."""

from __future__ import annotations

import ast
import operator
import random
import re
from collections import Counter

import pytest

from ktae.tasks.embedded import (
    TEMPLATES,
    Problem,
    answer_for,
    format_prompt,
    generate,
    has_carry_or_borrow,
    solution_steps,
    split_of,
    worked_solution,
)

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def reference_value(question: str) -> int:
    """Independent evaluator: Python's own parser, restricted to integer + - *."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise AssertionError(f"unexpected node {node!r}")
    return ev(ast.parse(question, mode="eval"))


def intermediate_values(question: str) -> list[int]:
    """Every prefix value of the left-to-right evaluation, product first."""
    nums = [int(x) for x in re.findall(r"\d+", question)]
    ops = re.findall(r"[+\-*]", question)
    if "*" in ops:
        return [reference_value(question)]
    vals, acc = [], nums[0]
    for op, v in zip(ops, nums[1:], strict=True):
        acc = acc + v if op == "+" else acc - v
        vals.append(acc)
    return vals


@pytest.fixture(scope="module")
def train():
    return generate(3000, split="train", seed=0)


@pytest.fixture(scope="module")
def test_split():
    return generate(1500, split="test", seed=0)


def test_deterministic_for_split_and_seed(train):
    assert generate(3000, split="train", seed=0) == train
    other = generate(200, split="train", seed=1)
    assert [p.question for p in other] != [p.question for p in train[:200]]
    assert generate(0) == []


def test_splits_never_overlap(train, test_split):
    more_train = generate(2000, split="train", seed=7)
    more_test = generate(500, split="test", seed=3)
    train_q = {p.question for p in train} | {p.question for p in more_train}
    test_q = {p.question for p in test_split} | {p.question for p in more_test}
    assert not train_q & test_q
    assert all(split_of(q) == "train" for q in train_q)
    assert all(split_of(q) == "test" for q in test_q)
    # About one question in ten is test.
    rng = random.Random(0)
    qs = {f"{rng.randrange(100)}+{rng.randrange(100)}-{rng.randrange(10)}" for _ in range(5000)}
    frac = sum(split_of(q) == "test" for q in qs) / len(qs)
    assert 0.07 < frac < 0.13


def test_no_duplicates_and_unique_ids(train, test_split):
    for ps in (train, test_split):
        assert len({p.question for p in ps}) == len(ps)
        assert len({p.id for p in ps}) == len(ps)


def test_exhausted_level_allows_repeats_instead_of_looping():
    # Level 1 has about 1.5k distinct test questions: 2500 must still come back.
    ps = generate(2500, split="test", levels=(1,))
    assert len(ps) == 2500
    assert 1000 < len({p.question for p in ps}) < 2500


def test_iid_stream_allows_duplicates():
    ps = generate(3000, seed=0, levels=(1,), unique=False)
    assert len({p.question for p in ps}) < len(ps)


def test_answers_correct_and_never_negative(train, test_split):
    for p in train + test_split:
        assert int(p.answer) == reference_value(p.question)
        assert answer_for(p.question) == p.answer
        assert all(v >= 0 for v in intermediate_values(p.question))
        assert p.answer == str(int(p.answer)) and int(p.answer) >= 0


def test_levels_shapes_and_mix(train):
    counts = Counter(p.level for p in train)
    for level, expected in zip((1, 2, 3), (0.3, 0.4, 0.3), strict=True):
        assert abs(counts[level] / len(train) - expected) < 0.04
    for p in train:
        ops = re.findall(r"[+\-*]", p.question)
        if p.level == 1:
            assert len(ops) == 1 and ops[0] in "+-"
        elif p.level == 2:
            assert len(ops) == 2 and "*" not in ops
        else:
            assert len(ops) == 2 and ops.count("*") == 1
            a, b = re.search(r"(\d+)\*(\d+)", p.question).groups()
            assert len(a) == 1 and len(b) == 1
        nums = re.findall(r"\d+", p.question)
        assert all(len(n) <= 2 for n in nums)
    stream = generate(3000, levels=(1, 2), unique=False)  # i.i.d. operands
    one_digit = [len(n) == 1 for p in stream for n in re.findall(r"\d+", p.question)]
    # P(one digit) = 0.5 + 0.5 * 10/100 = 0.55 (slightly more: non-negativity rejects)
    assert abs(sum(one_digit) / len(one_digit) - 0.55) < 0.04
    only_3 = generate(100, levels=(3,))
    assert {p.level for p in only_3} == {3}
    mostly_1 = Counter(p.level for p in generate(1000, levels=(1, 2), mix=(0.9, 0.1)))
    assert mostly_1[1] > 800


@pytest.mark.parametrize("kwargs, name", [
    ({"n": -1}, "n"), ({"n": 2.0}, "n"), ({"n": 3, "split": "dev"}, "split"),
    ({"n": 3, "levels": (4,)}, "levels"), ({"n": 3, "levels": ()}, "levels"),
    ({"n": 3, "mix": (1.0, -1.0, 1.0)}, "mix"), ({"n": 3, "mix": (1.0, 1.0)}, "mix"),
    ({"n": 3, "seed": "a"}, "seed"),
])
def test_generate_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        generate(**kwargs)


def test_worked_solution_format():
    p = Problem("x", "37+45-18", "64", 2)
    assert worked_solution(p) == "37+45=82. 82-18=64. \\boxed{64}"
    assert worked_solution(Problem("x", "3*4+5", "17", 3)) == "3*4=12. 12+5=17. \\boxed{17}"
    assert worked_solution(Problem("x", "5+3*4", "17", 3)) == "3*4=12. 5+12=17. \\boxed{17}"
    assert worked_solution(Problem("x", "20-3*4", "8", 3)) == "3*4=12. 20-12=8. \\boxed{8}"
    assert worked_solution(Problem("x", "9-4", "5", 1)) == "9-4=5. \\boxed{5}"


def test_clean_solutions_are_consistent(train):
    for p in train:
        steps = solution_steps(p)
        assert not any(s.slipped for s in steps)
        assert steps[-1].written == int(p.answer)
        for s in steps:
            assert s.written == reference_value(f"{s.x}{s.op}{s.y}")


def test_carry_noise_slips_exactly_as_documented(train):
    slipped_any = 0
    for p in train:
        text = worked_solution(p, carry_noise=0.6, rng=random.Random(p.id))
        steps = solution_steps(p, carry_noise=0.6, rng=random.Random(p.id))
        assert text == " ".join(s.text() for s in steps) + f" \\boxed{{{steps[-1].written}}}"
        assert not re.search(r"(^|[=.\s*+-])-\d", text)  # no negative number anywhere
        assert all(v >= 0 for s in steps for v in (s.x, s.y, s.written))
        prev = None
        for s in steps:
            true = reference_value(f"{s.x}{s.op}{s.y}")
            if s.slipped:
                assert s.written == true + (-10 if s.op == "+" else 10)
                assert (s.op == "+" and s.x % 10 + s.y % 10 >= 10) or \
                       (s.op == "-" and s.x % 10 < s.y % 10)
            else:
                assert s.written == true
            if prev is not None and s.op != "*":
                assert prev.written in (s.x, s.y)  # later steps use the written value
            prev = s
        wrong = steps[-1].written != int(p.answer)
        assert wrong == any(s.slipped for s in steps)
        slipped_any += wrong
        if not has_carry_or_borrow(p):
            assert not wrong
    carry = sum(has_carry_or_borrow(p) for p in train)
    # With p = 0.6 per eligible step, most carry/borrow problems end wrong.
    assert 0.45 * carry < slipped_any < 0.85 * carry


def test_carry_noise_extremes_and_defaults():
    p = Problem("x", "37+45-18", "64", 2)
    # 37+45 carries (-> 72); then 72-18 borrows, but a second slip would cancel the first
    # and restore the right answer, so it is skipped.
    assert worked_solution(p, carry_noise=1.0) == "37+45=72. 72-18=54. \\boxed{54}"
    # A slip that would make a later value negative is skipped: 15+5=10 then 10-12 < 0.
    q = Problem("x", "15+5-12", "8", 2)
    # (the borrow of 20-12 may still slip).
    assert worked_solution(q, carry_noise=1.0) == "15+5=20. 20-12=18. \\boxed{18}"
    # rng=None is deterministic (seeded from the question).
    r = Problem("x", "48+37+29", "114", 2)
    assert len({worked_solution(r, carry_noise=0.5) for _ in range(5)}) == 1
    assert worked_solution(r, carry_noise=0.0) == "48+37=85. 85+29=114. \\boxed{114}"
    with pytest.raises(ValueError, match="carry_noise"):
        worked_solution(p, carry_noise=1.5)
    with pytest.raises(ValueError, match="problem"):
        worked_solution("37+45")
    with pytest.raises(ValueError, match="problem"):
        worked_solution(Problem("x", "3-5", "-2", 1))


def test_has_carry_or_borrow():
    assert has_carry_or_borrow(Problem("x", "37+45", "82", 1))
    assert has_carry_or_borrow(Problem("x", "82-18", "64", 1))
    assert not has_carry_or_borrow(Problem("x", "32+45", "77", 1))
    assert not has_carry_or_borrow(Problem("x", "3*4+5", "17", 3))  # 12+5: no carry
    assert has_carry_or_borrow("3*4+9")  # 12+9 carries
    assert has_carry_or_borrow("30-3*4")  # 30-12 borrows


def test_answer_for_is_safe_and_correct():
    assert answer_for("5+3*4") == "17"
    assert answer_for("3*4-5") == "7"
    assert answer_for("1-2-3") == "-4"
    assert answer_for("2*3*4+1") == "25"
    assert answer_for("7") == "7"
    for bad in ["", "1+", "+1", "1//2", "__import__('os')", "1 + 2", "1+-2", 5]:
        with pytest.raises(ValueError, match="question"):
            answer_for(bad)


def test_prompts():
    p = Problem("x", "37+45-18", "64", 2)
    assert format_prompt(p) == "Q:37+45-18 A:"
    assert format_prompt(p, "compact") == format_prompt("37+45-18")
    assert format_prompt(p, "qwen-math") == (
        "Compute 37+45-18.\nPlease reason step by step, and put your final answer "
        "within \\boxed{}.")
    assert TEMPLATES == ("compact", "qwen-math")
    with pytest.raises(ValueError, match="template"):
        format_prompt(p, "chatml")
    with pytest.raises(ValueError, match="problem"):
        format_prompt("")
