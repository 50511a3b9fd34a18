"""A ``ktae --plugin`` rule: prefix-value credit summed over words of the shipped model's
tokenizer (``unit="word"``, a word starting at each token whose text begins with
whitespace), for the credit study's audit:

    ktae --plugin studies/credit-study/prefix_value_words.py audit --model default \
        --credit grpo,prefix-value,prefix-value-words --prompts 100 --prompt-set 3

The trainer, the audit and verl pass no word starts to estimators (they carry token ids
only), so the built-in ``prefix-value`` offers ``unit="word"`` through the Python API; this
plugin supplies the starts from a tokenizer (``KTAE_WORDS_TOKENIZER``, default the shipped
model's).
"""

from __future__ import annotations

import os

import torch

import ktae


def _word_start_ids() -> torch.Tensor:
    """``[V]`` bool: whether each token id's text begins with whitespace."""
    from transformers import AutoTokenizer

    path = os.environ.get("KTAE_WORDS_TOKENIZER")
    if path is None:
        from ktae.models.warmstart import default_model_path

        path = str(default_model_path())
    tok = AutoTokenizer.from_pretrained(path)
    texts = tok.convert_ids_to_tokens(list(range(len(tok))))
    return torch.tensor([bool(t) and (t[0].isspace() or t[0] in "\u0120\u2581") for t in texts])


_STARTS: list[torch.Tensor] = []


@ktae.register_estimator("prefix-value-words")
def prefix_value_words(batch: ktae.RuleBatch, *, apply: str = "wrong", weight: float = 1.0,
                       total: str = "keep") -> torch.Tensor:
    if not _STARTS:
        _STARTS.append(_word_start_ids())
    table = _STARTS[0]
    ids = batch.token_ids.clamp(0, len(table) - 1)
    starts = table.to(ids.device)[ids] & batch.mask
    return ktae.compute_advantages("prefix-value", rewards=batch.rewards, group=batch.group,
                                   token_ids=batch.token_ids, mask=batch.mask,
                                   correct=batch.correct, unit="word", word_starts=starts,
                                   apply=apply, weight=weight, total=total)
