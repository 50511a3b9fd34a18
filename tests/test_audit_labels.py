"""Local-error labels of embedded-task responses (ktae.tasks.label_response)."""

from __future__ import annotations

import random

import pytest

from ktae.tasks import (
    generate,
    label_response,
    level_of,
    question_of,
    solution_steps,
    token_labels,
    worked_solution,
)


def wrong_spans(labels: str) -> list[tuple[int, int]]:
    """Maximal runs of 'w' as (start, end)."""
    out, start = [], None
    for k, c in enumerate(labels + "."):
        if c == "w" and start is None:
            start = k
        elif c != "w" and start is not None:
            out.append((start, k))
            start = None
    return out


def wrong_texts(text: str, question: str | None = None) -> list[str]:
    return [text[s:e] for s, e in wrong_spans(label_response(text, question))]


def test_correct_solution_is_all_right_in_its_equations():
    text = "37+45=82. 82-18=64. \\boxed{64}"
    labels = label_response(text, "37+45-18")
    assert len(labels) == len(text)
    assert labels == "rrrrrrrr.." "rrrrrrrr.." "......." "rr."


def test_forgotten_carry_blames_that_result_only():
    # 37+45 forgets the carry (72); 72-18=54 is right from the carried-over 72
    text = "37+45=72. 72-18=54. \\boxed{54}"
    labels = label_response(text, "37+45-18")
    assert wrong_spans(labels) == [(6, 8)]
    assert labels[10:18] == "rrrrrrrr"  # the later step computed correctly from 72
    assert labels[-3:-1] == "rr"  # the box copies the last result


def test_forgotten_borrow():
    assert wrong_texts("82-18=74. \\boxed{74}", "82-18") == ["74"]
    assert wrong_texts("9+76=85. 85-46=49. \\boxed{49}", "9+76-46") == ["49"]


def test_wrong_product():
    text = "8*5=45. 45-8=37. \\boxed{37}"
    labels = label_response(text, "8*5-8")
    assert wrong_spans(labels) == [(4, 6)]
    assert "w" not in labels[8:]


def test_wrong_copy_into_the_box():
    text = "37+45=82. 82-18=64. \\boxed{46}"
    labels = label_response(text, "37+45-18")
    assert wrong_spans(labels) == [(len(text) - 3, len(text) - 1)]
    # a box with no equation before it is checked against the question's answer
    assert wrong_texts("\\boxed{9}", "5+3") == ["9"]
    assert "w" not in label_response("\\boxed{8}", "5+3")
    assert label_response("\\boxed{9}") == "." * 9  # nothing to check it against


def test_cancelling_slips_are_both_wrong_in_a_right_answer():
    # forgotten carry (72 for 82), then a wrong borrow (+10) that brings back 64
    text = "37+45=72. 72-18=64. \\boxed{64}"
    assert wrong_texts(text, "37+45-18") == ["72", "64"]


def test_miscopied_operand_needs_the_question():
    text = "37+45=82. 28-18=10. \\boxed{10}"
    assert wrong_texts(text, "37+45-18") == ["28"]
    assert wrong_texts(text) == []  # without the question operands are not checked
    # an operand that is an earlier (even wrong) written result is not a miscopy
    assert wrong_texts("37+45=72. 72-18=54.", "37+45-18") == ["72"]


@pytest.mark.parametrize("text", [
    "37+=82. 45-18= \\boxed{}",     # missing operand and result, no box number
    "3+4=7+1=8",                     # a chain is no equation
    "12+3=",                         # no result
    "abc \\boxed{x} 5 + 3 = 9",      # spaces inside: no equation
    "",
])
def test_malformed_text_has_no_equation(text):
    labels = label_response(text, "5+3")
    assert set(labels) <= {"."} and len(labels) == len(text)


def test_malformed_text_around_a_valid_equation():
    text = "Q:5+3 5+3=9<eos>"
    labels = label_response(text, "5+3")
    assert labels == "......" "rrrrw" "....."


def test_negative_results_and_bad_arguments():
    assert wrong_texts("5-8=-2.", "5-8") == ["-2"]
    assert "w" not in label_response("5-8=-3.", "5-8")
    with pytest.raises(ValueError, match="text"):
        label_response(None)
    with pytest.raises(ValueError, match="question"):
        label_response("1+1=2", "1+")


def test_worked_solutions_with_carry_noise_blame_exactly_the_slipped_steps():
    problems = generate(300, split="train", seed=3)
    slipped_seen = 0
    for p in problems:
        rng = random.Random(p.question)
        text = worked_solution(p, carry_noise=1, rng=rng)
        steps = solution_steps(p, carry_noise=1, rng=random.Random(p.question))
        expected, pos = [], 0
        for s in steps:
            start = pos + len(f"{s.x}{s.op}{s.y}=")
            if s.slipped:
                expected.append((start, start + len(str(s.written))))
            pos += len(s.text()) + 1
        assert wrong_spans(label_response(text, p.question)) == expected, text
        # without noise nothing is wrong
        assert "w" not in label_response(worked_solution(p), p.question)
        slipped_seen += len(expected)
    assert slipped_seen > 50  # the check above did see slips


def test_token_labels_from_pieces():
    labels = label_response("5+3=9. \\boxed{9}", "5+3")
    pieces = ["5+", "3=", "9.", " \\boxed{", "9", "}"]
    assert token_labels(labels, pieces) == ["r", "r", "w", ".", "r", "."]
    assert token_labels(labels, ["5+3=9. \\boxed{9}", ""]) == ["w", "."]
    with pytest.raises(ValueError, match="pieces"):
        token_labels(labels, ["5+3"])


def test_question_and_level_of_a_prompt():
    assert question_of("Q:37+45-18 A:") == "37+45-18"
    assert question_of("Compute 8*5-8.\nPlease reason step by step") == "8*5-8"
    assert question_of("What is 2+2?") is None
    assert question_of("Q:2+ A:") is None
    assert [level_of(q) for q in ("5+3", "5+3-1", "8*5-8", "3+2*4")] == [1, 2, 3, 3]
