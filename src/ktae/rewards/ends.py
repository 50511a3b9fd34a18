"""An answer must end to count: a response cut at the token budget is wrong.

A response that hit ``max_new_tokens`` without its end-of-sequence token was stopped by
the budget, not by the model. Whatever number, box or answer line it holds at that point
is a guess read out of unfinished text: "the answer is 3" cut where the model was writing
36 reads as 3. Every reader of a final answer in ktae (the rewards of ``ktae train``, its
held-out evaluation, ``ktae eval``, the audit's right answer) therefore counts a cut-off
response as wrong, by the one rule here:

* ``"wrong"`` (the default): a cut-off response is incorrect and gets its reward's wrong
  score (0, or -1 for ``dapo``), whatever its text holds; :attr:`RewardResult.cut_off`
  says so, and ``extracted`` / ``formatted`` still report what was read.
* ``"read"``: a cut-off response is scored from its text like any other (the rule before
  ends were required; for reproducing results recorded under it).

The option is ``--cut-off-answers wrong|read`` of ``ktae train``, ``ktae eval`` and
``ktae audit``. An empty response (a prompt that filled the context) is cut off when its
generator says so; it holds no answer either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ktae.rewards.verify import RewardResult

CUT_OFF_RULES = ("wrong", "read")
"""How a response cut at the token budget is scored (see the module docstring)."""
DEFAULT_CUT_OFF = "wrong"


def check_cut_off_rule(rule, name: str = "cut_off_answers") -> str:
    """``rule`` if it is one of :data:`CUT_OFF_RULES`.

    Raises:
        ValueError: another value (the message names ``name`` and the choices).
    """
    if rule not in CUT_OFF_RULES:
        raise ValueError(f"{name}: expected one of {', '.join(CUT_OFF_RULES)}, got {rule!r}")
    return rule


def require_end(results: Sequence[RewardResult], truncated: Sequence[bool], *,
                rule: str = DEFAULT_CUT_OFF, wrong_score: float | Sequence[float] = 0.0
                ) -> list[RewardResult]:
    """``results`` with every response flagged in ``truncated`` scored wrong (rule
    ``"wrong"``), or unchanged (rule ``"read"``).

    Args:
        results: one :class:`RewardResult` per response, as read from its text.
        truncated: one flag per response: it hit the token budget without ending.
        rule: ``"wrong"`` or ``"read"`` (:data:`CUT_OFF_RULES`).
        wrong_score: the score of a wrong response (a float, or one per response: ``auto``
            mixes rewards whose wrong scores differ).

    Returns:
        New results: a cut-off one has ``correct=False``, ``score=wrong_score`` and
        ``cut_off=True``; its ``formatted`` and ``extracted`` are kept.

    Raises:
        ValueError: lengths that differ, or an unknown rule.
    """
    check_cut_off_rule(rule, "rule")
    results, truncated = list(results), [bool(t) for t in truncated]
    if len(truncated) != len(results):
        raise ValueError(f"truncated: expected {len(results)} flags (one per response), got "
                         f"{len(truncated)}")
    wrong = ([float(wrong_score)] * len(results) if isinstance(wrong_score, (int, float))
             else [float(w) for w in wrong_score])
    if len(wrong) != len(results):
        raise ValueError(f"wrong_score: expected {len(results)} scores (one per response), got "
                         f"{len(wrong)}")
    if rule == "read":
        return results
    return [dataclasses.replace(r, correct=False, score=w, cut_off=True) if cut else r
            for r, cut, w in zip(results, truncated, wrong, strict=True)]


def counts_as_right(correct: bool, truncated: bool, rule: str = DEFAULT_CUT_OFF) -> bool:
    """One response's correctness under ``rule``: a right answer in a response cut at the
    budget is wrong under ``"wrong"``."""
    return bool(correct) and not (rule == "wrong" and bool(truncated))


def cut_at_budget(ids: Sequence[int], stop_ids) -> bool:
    """Whether a response, given by its token ids, was cut at the budget: it is not empty
    and its last id is none of ``stop_ids`` (EOS, pad, end of turn). TRL hands a reward
    function each response's ids up to and including its first stop token, so a response
    that ended holds its stop as its last id (the rule of
    :func:`ktae.train.batch_metrics.truncated_rows`)."""
    return len(ids) > 0 and int(ids[-1]) not in stop_ids
