"""Quick held-out evaluation during training: greedy decoding, strict boxed reward.

Deliberately small and self-contained (the full benchmark suite is ``ktae eval``): it
runs every ``eval_every`` steps on the embedded test split, so it must take seconds.
"""

from __future__ import annotations

import torch

from ktae.rewards import batch_math_reward


@torch.no_grad()
def greedy_accuracy(model, tokenizer, rows: list[dict], *, max_new_tokens: int,
                    batch_size: int = 100) -> dict:
    """Greedy pass@1 of ``model`` on ``rows`` (dicts with ``prompt``, ``answer`` and an
    optional bool ``carry``).

    Returns:
        ``{"accuracy", "formatted", "response_length", "n"}`` and, when rows carry the
        ``carry`` flag, ``"accuracy_carry"`` (accuracy on carry/borrow problems).
    """
    if not rows:
        raise ValueError("rows: expected at least one problem")
    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    device = next(model.parameters()).device
    texts, lengths = [], []
    try:
        with torch.random.fork_rng(devices=[]):
            for start in range(0, len(rows), batch_size):
                chunk = rows[start:start + batch_size]
                # special tokens as TRL adds them to training prompts (e.g. a leading BOS)
                enc = tokenizer([r["prompt"] for r in chunk], return_tensors="pt",
                                padding=True).to(device)
                out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                                     pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=tokenizer.eos_token_id, temperature=None,
                                     top_p=None, top_k=None)
                new = out[:, enc["input_ids"].shape[1]:]
                for ids in new:
                    ids = ids.tolist()
                    n = len(ids)
                    if tokenizer.eos_token_id in ids:
                        n = ids.index(tokenizer.eos_token_id) + 1
                    lengths.append(n)
                texts += tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    results = batch_math_reward(texts, [r["answer"] for r in rows], num_workers=1)
    correct = [r.correct for r in results]
    report = {
        "accuracy": sum(correct) / len(rows),
        "formatted": sum(r.formatted for r in results) / len(rows),
        "response_length": sum(lengths) / len(rows),
        "n": len(rows),
    }
    carry = [c for c, r in zip(correct, rows, strict=True) if r.get("carry")]
    if carry:
        report["accuracy_carry"] = sum(carry) / len(carry)
    return report
