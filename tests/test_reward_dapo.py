"""``--reward dapo``, ``gsm8k`` and ``auto``: the answer-line scorers as verl reads them.

The expected values of the tables are verl's own: ``verl.utils.reward_score.math_dapo.
compute_score`` (``acc`` and ``pred``, ``[INVALID]`` written None here) and
``gsm8k.compute_score`` run on these cases (verl at commit b178a3cd, January 2026).
"""

from __future__ import annotations

import pytest

from ktae.rewards import get_reward, reset_reward_stats, reward_stats
from ktae.rewards.answer_line import ANSWER_CLIP, dapo_check, gsm8k_check
from ktae.rewards.registry import auto_reward_name

DAPO_CASES = [  # response, ground truth, verl's acc, verl's pred
    ("The answer is 5.\nAnswer: 5", "5", True, "5"),
    ("Answer: 4\nwait, let me redo this.\nAnswer: 5", "5", True, "5"),  # the last line wins
    ("Answer: 5\nAnswer: 4", "5", False, "4"),
    ("answer : 5", "5", True, "5"),  # any case, spaces around the colon
    ("ANSWER:5", "5", True, "5"),
    ("Answer: \\boxed{5}", "5", True, "5"),  # a box inside the line is unwrapped
    ("Answer: $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}", True, "\\frac{1}{2}"),
    ("Answer: $\\frac12$", "\\frac{1}{2}", True, "\\frac{1}{2}"),  # shorthand \frac12
    ("The final answer is \\boxed{5}", "5", False, None),  # a box without the line: nothing
    ("", "5", False, None),
    ("Answer: x = 7", "7", True, "7"),  # the part after the last '='
    ("Answer: 1,000", "1000", True, "1000"),  # thousands commas of whole numbers
    ("Answer: 12 degrees", "12", True, "12"),  # units dropped
    ("Answer: \\text{(B)}", "(B)", True, "(B)"),
    ("Answer: 0.5", "\\frac{1}{2}", False, "0.5"),  # strings, not values
    ("Answer: 5.", "5", False, "5."),
    ("Answer: $5$.", "5", True, "5"),
    ("Answer: \\sqrt2", "\\sqrt{2}", True, "\\sqrt{2}"),
    ("Answer: 5\n" + "x" * 400, "5", False, None),  # only the last 300 characters count
    ("x" * 400 + "\nAnswer: 5", "5", True, "5"),
    ("Answer:\n5", "5", True, "5"),  # the spaces after the colon include a newline
    ("Answer: 3, 4", "3,4", True, "34"),
    ("Answer: an integer 6", "6", False, "integer6"),
]

GSM8K_CASES = [("so #### 72", "72", True), ("#### 1,234", "1234", True),
               ("#### 7\n#### 8", "8", True), ("the answer is 72", "72", False),
               ("#### -3", "-3", True), ("#### 72.", "72", False)]


@pytest.mark.parametrize("response, truth, acc, pred", DAPO_CASES)
def test_dapo_check_matches_verl(response, truth, acc, pred):
    assert dapo_check(response[-ANSWER_CLIP:], truth) == (acc, pred)


def test_dapo_reward_through_the_verifier_processes():
    reward = get_reward("dapo")
    assert reward.template == "dapo"
    reset_reward_stats()
    got = reward.score([c[0] for c in DAPO_CASES], [c[1] for c in DAPO_CASES], timeout=10.0,
                       num_workers=2)
    assert [r.correct for r in got] == [c[2] for c in DAPO_CASES]
    assert [r.extracted for r in got] == [c[3] for c in DAPO_CASES]
    assert [r.score for r in got] == [1.0 if c[2] else -1.0 for c in DAPO_CASES]  # verl: +1/-1
    assert [r.formatted for r in got] == [c[3] is not None for c in DAPO_CASES]
    stats = reward_stats()  # every check went to a verifier process
    assert stats["calls"] == stats["symbolic"] == len(DAPO_CASES) and stats["timeouts"] == 0


def test_dapo_reward_keeps_the_hard_time_limit(monkeypatch):
    """A check that misses the deadline counts as wrong and as a timeout."""
    from ktae.rewards import pool

    def slow(self, payload, timeout):
        raise pool.VerifierTimeout("deadline")

    monkeypatch.setattr(pool.VerifierPool, "run", slow)
    reset_reward_stats()
    (res,) = get_reward("dapo").score(["Answer: 5"], ["5"], timeout=0.5)
    assert (res.correct, res.timed_out, res.score) == (False, True, -1.0)
    assert reward_stats()["timeouts"] == 1


@pytest.mark.parametrize("response, truth, acc", GSM8K_CASES)
def test_gsm8k_check_matches_verl(response, truth, acc):
    assert gsm8k_check(response, truth)[0] is acc


def test_auto_dispatches_by_data_source():
    assert auto_reward_name(None) == auto_reward_name("") == "boxed"
    assert auto_reward_name("math_dapo") == auto_reward_name("math") == "dapo"
    assert auto_reward_name("aime2024") == auto_reward_name("aime25") == "dapo"
    assert auto_reward_name("HuggingFaceH4/MATH-500") == "boxed"
    assert auto_reward_name("lighteval/MATH") == "boxed"
    assert auto_reward_name("numina_olympiads") == "boxed"
    assert auto_reward_name("openai/gsm8k") == "gsm8k"
    with pytest.raises(ValueError, match="reward auto: no scorer for data_source 'apps'"):
        auto_reward_name("apps")
    responses = ["\\boxed{5}", "Answer: 5", "\\boxed{5}", "#### 5", "Answer: 5", "\\boxed{5}"]
    sources = [None, "math_dapo", "math_dapo", "openai/gsm8k", "lighteval/MATH", "aime24"]
    got = get_reward("auto").score(responses, ["5"] * 6, data_sources=sources)
    # boxed, dapo, dapo (a box is not an Answer line), gsm8k, boxed, dapo
    assert [r.score for r in got] == [1.0, 1.0, -1.0, 1.0, 0.0, -1.0]
    assert [r.correct for r in got] == [True, True, False, True, False, False]
    assert get_reward("auto").check_source is auto_reward_name
    with pytest.raises(ValueError, match="data_sources: expected 2"):
        get_reward("auto").score(["a", "b"], ["1", "2"], data_sources=["math"])
