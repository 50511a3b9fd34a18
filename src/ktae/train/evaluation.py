"""Quick held-out evaluation during training: greedy decoding, the run's reward.

Deliberately small and self-contained (the full benchmark suite is ``ktae eval``): it
runs every ``eval_every`` steps on the embedded test split, so it must take seconds.
"""

from __future__ import annotations

import torch

from ktae.models.generate import SamplingConfig, generate_hf
from ktae.rewards.ends import DEFAULT_CUT_OFF
from ktae.rewards.registry import DEFAULT_REWARD, score_responses


@torch.no_grad()
def greedy_accuracy(model, tokenizer, rows: list[dict], *, max_new_tokens: int,
                    batch_size: int = 100, reward: str = DEFAULT_REWARD,
                    cut_off: str = DEFAULT_CUT_OFF) -> dict:
    """Greedy pass@1 of ``model`` on ``rows`` (dicts with ``prompt``, ``answer`` and
    optional ``data_source`` and bool ``carry``), judged correct by the reward ``reward``
    (:mod:`ktae.rewards.registry`); a response cut at ``max_new_tokens`` is wrong unless
    ``cut_off="read"`` (:mod:`ktae.rewards.ends`).

    Returns:
        ``{"accuracy", "formatted", "response_length", "truncated", "n", "problems"}`` and,
        when rows carry the ``carry`` flag, ``"accuracy_carry"`` (accuracy on carry/borrow
        problems). ``problems`` holds one record per row, in order: ``correct``,
        ``tokens`` (the response's length), ``truncated`` (it ran out of budget without
        an end-of-sequence token), the ``extracted`` answer and the ``response`` text, so
        that an analysis can resample problems and split them by kind or by truncation.
    """
    if not rows:
        raise ValueError("rows: expected at least one problem")
    prompts = [r["prompt"] for r in rows]
    # special tokens as TRL adds them to training prompts (e.g. a leading BOS)
    gens = generate_hf(model, tokenizer, prompts,
                       SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens),
                       batch_size=batch_size)
    texts = [g[0].text for g in gens]
    lengths = [g[0].num_tokens for g in gens]
    sources = [r["data_source"] for r in rows] if "data_source" in rows[0] else None
    results = score_responses(reward, texts, [r["answer"] for r in rows],
                              truncated=[g[0].truncated for g in gens], cut_off=cut_off,
                              num_workers=1, data_sources=sources)
    correct = [r.correct for r in results]
    report = {
        "accuracy": sum(correct) / len(rows),
        "formatted": sum(r.formatted for r in results) / len(rows),
        "response_length": sum(lengths) / len(rows),
        "truncated": sum(g[0].truncated for g in gens) / len(rows),
        "n": len(rows),
        "problems": [{"correct": bool(r.correct), "tokens": int(n), "truncated": bool(g[0].truncated),
                      "extracted": r.extracted, "response": t}
                     for r, n, g, t in zip(results, lengths, gens, texts, strict=True)],
    }
    carry = [c for c, r in zip(correct, rows, strict=True) if r.get("carry")]
    if carry:
        report["accuracy_carry"] = sum(carry) / len(carry)
    return report
