"""Scored response groups: one prompt and its sampled responses (token ids), with rewards
and what a model or a run adds per token (:class:`GroupInput`), and groups read from a JSONL
file (:func:`load_jsonl`).

JSONL input: one group per line, ``{"prompt": str, "responses": [str, ...]}`` with
``"rewards": [float, ...]`` (one per response) or ``"answer"`` (a reference answer, each
response scored by :func:`ktae.rewards.math_reward`); optional ``"correct"``
(booleans) and ``"id"``. ``"question"``/``"problem"`` are accepted for ``"prompt"``.
Optional ``"wrong"`` (per response, ``[start, end)`` character spans that are locally
wrong) and ``"checked"`` (spans judged at all; default every character) give labels that
``ktae explain`` outlines and ``ktae audit`` scores credit against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ktae.rewards import math_reward
from ktae.viz.labels import span_labels


@dataclass
class GroupInput:
    """One prompt and its sampled responses (token ids), as read from a source.

    ``correct`` defaults to ``reward > 0``. ``logprobs``/``entropies`` (per token) feed a
    calibration. ``old_entropies``: the rollout policy's per-token entropies, for an
    estimator that reads them (GTPO); when absent, ``entropies`` stand in for them (a
    model scoring its own samples is the rollout policy). ``trained``, ``weights``,
    ``flagged``, ``loss_mask``: what a training
    run recorded (the estimator's advantages and the calibration applied to them); a
    row may be None where nothing was recorded.
    """

    prompt: str
    responses: list[list[int]]
    rewards: list[float]
    correct: list[bool] | None = None
    label: str = ""
    answer: str | None = None
    logprobs: list | None = None
    entropies: list | None = None
    old_entropies: list | None = None
    input_grad_importance: list | None = None
    """Per response (or None): the model's input-gradient importance of each token, for
    an estimator that reads it (``oar-g``; :func:`ktae.groups.scoring.score_groups`)."""
    teacher_logprobs: list | None = None
    """Per response (or None): the policy's log-probs of each token after a privileged
    context, for an estimator that reads them (``sdpo``; :func:`ktae.groups.teacher.
    teacher_groups`)."""
    token_grad_proxy: list | None = None
    """Per response (or None): a ``[len, H]`` tensor, DelTA's token-gradient proxy of each
    token, for an estimator that reads it (``delta``; :func:`ktae.groups.grad_proxy.
    grad_proxy_groups`)."""
    trained: list | None = None
    weights: list | None = None
    flagged: list | None = None
    loss_mask: list | None = None
    labels: list | None = None
    """Per response (or None): local-error labels of each character of its decoded text
    (``"w"`` locally wrong, ``"r"`` right, ``"."`` not judged;
    :func:`ktae.tasks.label_response`), outlined on the page."""


def ignore_ids(tokenizer) -> tuple[int, ...]:
    """Pad and EOS ids: no key-token value, as in training."""
    ids = {getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)}
    return tuple(sorted(int(i) for i in ids if i is not None))


def _strings(value, what: str, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: expected {what} as a list of strings")
    return value


def _span_labels(rec: dict, responses: list[str], where: str) -> list[str] | None:
    """Character labels from the optional ``wrong``/``checked`` spans of a record."""
    if "wrong" not in rec:
        return None

    wrong, checked = rec["wrong"], rec.get("checked")
    if not isinstance(wrong, list) or len(wrong) != len(responses):
        raise ValueError(f"{where}: expected 'wrong' as {len(responses)} lists of [start, end] "
                         "character spans (one list per response; [] when none is wrong)")
    if checked is not None and (not isinstance(checked, list) or len(checked) != len(responses)):
        raise ValueError(f"{where}: expected 'checked' as {len(responses)} lists of spans")
    return [span_labels(text, wrong[i], None if checked is None else checked[i],
                        f"{where} response {i}") for i, text in enumerate(responses)]


def load_jsonl(path: Path, *, tokenizer) -> list[tuple[str, GroupInput]]:
    """Groups of text responses, tokenised with ``tokenizer`` (see the module docstring)."""

    groups = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"INPUT: {path} line {n}"
        try:
            rec = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{where}: not JSON ({err})") from err
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        prompt = next((rec[k] for k in ("prompt", "question", "problem") if k in rec), None)
        if not isinstance(prompt, str):
            raise ValueError(f"{where}: expected a 'prompt' string")
        if "responses" not in rec:
            raise ValueError(f"{where}: no 'responses' (a list of response texts to explain)")
        responses = _strings(rec["responses"], "'responses'", where)
        if len(responses) < 2:
            raise ValueError(f"{where}: a group needs at least 2 responses to compare, "
                             f"got {len(responses)}")
        correct = rec.get("correct")
        if "rewards" in rec:
            rewards = rec["rewards"]
            if not isinstance(rewards, list) or len(rewards) != len(responses) or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in rewards):
                raise ValueError(f"{where}: expected 'rewards' as {len(responses)} numbers "
                                 "(one per response)")
            rewards = [float(x) for x in rewards]
        elif "answer" in rec:
            results = [math_reward(text, rec["answer"]) for text in responses]
            rewards = [r.score for r in results]
            correct = correct if correct is not None else [r.correct for r in results]
        else:
            raise ValueError(f"{where}: expected 'rewards' (one per response) or a reference "
                             "'answer' to score the responses")
        if correct is not None and (not isinstance(correct, list) or len(correct) != len(responses)):
            raise ValueError(f"{where}: expected 'correct' as {len(responses)} booleans")
        ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in responses]
        key = str(rec.get("id", len(groups)))
        labels = _span_labels(rec, responses, where)
        groups.append((key, GroupInput(labels=labels,
            prompt=prompt, responses=ids, rewards=rewards,
            correct=[bool(c) for c in correct] if correct is not None else None,
            label=f"{key} (line {n})" if "id" in rec else f"line {n}",
            answer=None if rec.get("answer") is None else str(rec["answer"]))))
    if not groups:
        raise ValueError(f"INPUT: {path} holds no groups")
    return groups

