"""Where credit goes on real text: shares of the credit mass by kind of token.

Each token id of SmolLM2-135M-Instruct's vocabulary falls in one class (:func:`token_classes`),
by its decoded text, stripped of spaces:

* ``number``: digits only (``"4"``, ``" 12"``);
* ``word``: letters only (``" apples"``, ``"The"``);
* ``end``: the end-of-turn token (the tokenizer's EOS, ``<|im_end|>``);
* ``rest``: everything else (spaces, punctuation, mixed text, other special tokens).

:func:`credit_mass` reads runs' ``rollouts.jsonl`` (:mod:`ktae.runs.rollouts`) and pools,
over every recorded group, the positive and the negative credit each class receives. The
credit of a token is what the loss reads: the estimator's advantage, times the
calibration's weight where one is recorded, times the loss mask where one is recorded.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np

CLASSES = ("number", "word", "end", "rest")
MODEL = "smollm2-135m"
_DIGITS = re.compile(r"[0-9]+")


def token_class(text: str, *, is_end: bool = False) -> str:
    """The class of one token by its decoded text (see the module's docstring)."""
    if is_end:
        return "end"
    s = text.strip()
    if _DIGITS.fullmatch(s):
        return "number"
    if s.isalpha():
        return "word"
    return "rest"


def token_classes(tokenizer) -> np.ndarray:
    """``[len(tokenizer)]`` int8: each id's index in :data:`CLASSES`, decoded once."""
    n = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(n)])
    end = tokenizer.eos_token_id
    return np.array([CLASSES.index(token_class(t, is_end=i == end))
                     for i, t in enumerate(texts)], dtype=np.int8)


@functools.cache
def model_classes(model: str = MODEL) -> np.ndarray:
    """:func:`token_classes` of ``model``'s tokenizer (prepared on this machine)."""
    from transformers import AutoTokenizer

    from ktae.eval.model_path import resolve_model_path

    return token_classes(AutoTokenizer.from_pretrained(resolve_model_path(model)))


def loss_credit(record: dict, row: int) -> np.ndarray:
    """The per-token credit the loss reads for one response of a recorded group."""
    credit = np.asarray(record["advantages"][row], dtype=float)
    for key in ("weights", "loss_mask"):
        values = record.get(key)
        if values is not None and values[row] is not None:
            credit = credit * np.asarray(values[row], dtype=float)
    return credit


def _masses(paths: list[Path], classes: np.ndarray) -> tuple[np.ndarray, int]:
    """``[3, classes]``: positive credit, negative credit (as a positive number) and the
    token count per class; and the number of groups read."""
    from ktae.runs.rollouts import read_rollouts

    out = np.zeros((3, len(CLASSES)))
    groups = 0
    for path in paths:
        _, records = read_rollouts(path)
        ids, credit = [], []
        for rec in records:
            groups += 1
            for row, response in enumerate(rec["responses"]):
                c = loss_credit(rec, row)
                if len(c) != len(response):
                    raise ValueError(f"{path}: step {rec['step']} group {rec['group']} row "
                                     f"{row}: {len(response)} tokens, {len(c)} advantages")
                ids.append(np.asarray(response, dtype=np.int64))
                credit.append(c)
        if not ids:
            continue
        ids_all, credit_all = np.concatenate(ids), np.concatenate(credit)
        if ids_all.size and (ids_all.min() < 0 or ids_all.max() >= len(classes)):
            raise ValueError(f"{path}: token ids outside the vocabulary of {len(classes)}")
        cls = classes[ids_all]
        n = len(CLASSES)
        out[0] += np.bincount(cls, weights=np.clip(credit_all, 0, None), minlength=n)
        out[1] += np.bincount(cls, weights=np.clip(-credit_all, 0, None), minlength=n)
        out[2] += np.bincount(cls, minlength=n)
    return out, groups


def _shares(row: np.ndarray) -> dict:
    total = row.sum()
    return {c: (float(v / total) if total > 0 else None) for c, v in zip(CLASSES, row, strict=True)}


def credit_mass(paths: list[Path], classes: np.ndarray | None = None) -> dict:
    """Pooled over the rollout files ``paths`` (one per run): each class's share of the
    positive credit, of the negative credit and of the tokens, the totals, and the same
    shares per run (``runs``).

    Returns ``{"positive": {class: share}, "negative": ..., "tokens": ..., "totals":
    {"positive", "negative", "tokens", "groups"}, "runs": [{"positive", "negative",
    "tokens"}, ...]}``; a share is None when its total is 0.
    """
    classes = model_classes() if classes is None else classes
    runs, pooled, groups = [], np.zeros((3, len(CLASSES))), 0
    for path in paths:
        m, g = _masses([path], classes)
        pooled += m
        groups += g
        runs.append({key: _shares(m[i]) for i, key in enumerate(("positive", "negative", "tokens"))})
    out = {key: _shares(pooled[i]) for i, key in enumerate(("positive", "negative", "tokens"))}
    out["totals"] = {"positive": float(pooled[0].sum()), "negative": float(pooled[1].sum()),
                     "tokens": int(pooled[2].sum()), "groups": groups}
    out["runs"] = runs
    return out
