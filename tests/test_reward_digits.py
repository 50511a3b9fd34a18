"""The graded ``digits`` reward of the embedded task (ktae.rewards.graded)."""

from __future__ import annotations

import argparse

import pytest

from ktae.rewards import get_reward, math_reward
from ktae.rewards.graded import PARTIAL_CREDIT, digit_credit, score_digits
from ktae.tasks.embedded import generate, worked_solution
from ktae.train import cli_train
from ktae.train.reward_funcs import make_accuracy_reward


@pytest.mark.parametrize("extracted, reference, credit", [
    ("82", "82", 1.0), ("72", "82", 0.5), ("81", "82", 0.5), ("28", "82", 0.0),
    ("182", "82", 2 / 3), ("2", "82", 0.5), ("252", "262", 2 / 3), ("-5", "5", 0.0),
    ("-15", "-25", 0.5), (" 8 2", "82", 1.0), ("8.5", "82", 0.0), ("x", "82", 0.0),
    (None, "82", 0.0), ("0", "-0", 1.0), ("82", "\\frac{1}{2}", 0.0),
])
def test_digit_credit(extracted, reference, credit):
    assert digit_credit(extracted, reference) == pytest.approx(credit)


def test_scores_partial_credit_only_for_wrong_answers():
    completions = ["37+45=72. \\boxed{72}", "37+45=82. \\boxed{82}", "no box 82",
                   "\\boxed{82.0}", "\\boxed{182}"]
    got = score_digits(completions, ["82"] * 5)
    assert [r.score for r in got] == pytest.approx([0.2, 1.0, 0.0, 1.0, 0.4 * 2 / 3])
    assert [r.correct for r in got] == [math_reward(c, "82").correct for c in completions]


def test_score_above_half_is_exactly_the_strict_check():
    """The trainer's correctness rule (score > 0.5) stays the boxed check, on the embedded
    task's slips (forgotten carries) and correct solutions alike."""
    problems = generate(60, seed=3)
    completions = [worked_solution(p, carry_noise=0.7) for p in problems]
    answers = [p.answer for p in problems]
    got = score_digits(completions, answers)
    strict = [math_reward(c, a).correct for c, a in zip(completions, answers, strict=True)]
    assert [r.score > 0.5 for r in got] == strict == [r.correct for r in got]
    wrong = [r.score for r in got if not r.correct]
    assert wrong and all(0 < s <= PARTIAL_CREDIT for s in wrong)  # slips keep some digits
    assert len(set(wrong)) > 1  # graded, not a constant


def test_selectable_as_train_reward():
    parser = argparse.ArgumentParser()
    cli_train.add_arguments(parser)
    cfg = cli_train.config_from_args(parser.parse_args(["--reward", "digits"]))
    assert cfg.reward == "digits" and get_reward("digits").score is score_digits
    accuracy = make_accuracy_reward(reward="digits", stop_ids=[0])
    assert accuracy(completions=["\\boxed{72}", "\\boxed{82}"], answer=["82", "82"],
                    completion_ids=[[5, 0], [5, 0]]) == pytest.approx([0.2, 1.0])
