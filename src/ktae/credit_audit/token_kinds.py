"""Where a method's credit goes, by kind of token: the share of its negative and of its
positive credit on labelled wrong results, other numbers, words, punctuation and spaces,
and end-of-turn (special) tokens.

A token's kind, from the text it decodes to (:func:`kind_codes`): ``w`` a labelled wrong
token (on the arith task: a digit of a false claim's result), else ``e`` a special token
(end of turn, EOS, padding), else ``n`` a token holding a digit, else ``a`` a token
holding a letter, else ``p`` (punctuation, spaces, line breaks). The shares are ratios of
sums over the responses blame is measured on (wrong answers of mixed groups holding both
wrong and right tokens): ``sum of max(-A_t, 0) over tokens of kind k / sum over all their
tokens``, and the same for ``max(A_t, 0)``; the share of the tokens of each kind is what
a constant credit (GRPO) gives.
"""

from __future__ import annotations

import torch

KINDS = {"w": "wrong result", "n": "other number", "a": "word",
         "p": "punctuation/space", "e": "end of turn"}
"""Code -> name of each kind, in the order they are reported."""
_INDEX = {c: k for k, c in enumerate(KINDS)}


def kind_codes(tokenizer, responses, labels: list[str]) -> list[str]:
    """Per response (token ids), one code of :data:`KINDS` per token; ``labels`` are the
    responses' audit labels (``w`` marks a wrong token). Each distinct token id is decoded
    once."""
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    cache: dict[int, str] = {}

    def code(i: int) -> str:
        if i not in cache:
            text = tokenizer.decode([i])
            cache[i] = ("e" if i in special else "n" if any(c.isdigit() for c in text)
                        else "a" if any(c.isalpha() for c in text) else "p")
        return cache[i]

    return ["".join("w" if lab == "w" else code(int(i)) for i, lab in zip(ids, row, strict=True))
            for ids, row in zip(responses, labels, strict=True)]


def kind_tensor(rows: list[str], T: int) -> torch.Tensor:
    """``[B, T]`` int64 index into :data:`KINDS` (``len(KINDS)`` on padding)."""
    out = torch.full((len(rows), T), len(KINDS), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            out[i, :len(row)] = torch.tensor([_INDEX[c] for c in row], dtype=torch.long)
    return out


def mass_by_kind(credit: torch.Tensor, kinds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``([B, K], [B, K])`` float64: per response, the sum of ``max(-A, 0)`` and of
    ``max(A, 0)`` over its tokens of each kind (K = ``len(KINDS)``; padding dropped)."""
    A = credit.double()
    K = len(KINDS)
    out = []
    for part in ((-A).clamp_min(0.0), A.clamp_min(0.0)):
        sums = torch.zeros(A.shape[0], K + 1, dtype=torch.float64).scatter_add_(1, kinds, part)
        out.append(sums[:, :K])
    return out[0], out[1]


def summarise_kinds(negative, positive, tokens, keep) -> dict:
    """``{"responses", "tokens": {kind: share}, "negative": {kind: share}, "positive":
    {kind: share}, "negative_mass", "positive_mass"}`` over the responses ``keep`` (numpy
    ``[B]`` bool) from ``[B, K]`` arrays of the negative and positive credit and the token
    counts per kind (shares None where nothing is there)."""
    import numpy as np

    def shares(x):
        total = float(x[keep].sum())
        return {name: (float(v) / total if total > 0 else None)
                for name, v in zip(KINDS.values(), x[keep].sum(0), strict=True)}, total

    neg, neg_total = shares(np.asarray(negative))
    pos, pos_total = shares(np.asarray(positive))
    tok, _ = shares(np.asarray(tokens))
    return {"responses": int(np.count_nonzero(keep)), "tokens": tok, "negative": neg,
            "positive": pos, "negative_mass": neg_total, "positive_mass": pos_total}
