"""Spans of n consecutive tokens for KTAE over n-grams: exact ids, vectorised.

A *span* of length ``n`` starts at a real token of a response when the ``n`` positions
from there are consecutive columns of that row, all real (mask 1) and none an ignored id:
spans never cross padding, masked-out tokens or ignored tokens. The statistics of KTAE
(docs/method.md §3) are then computed per (group, distinct span) exactly as per (group, distinct
token), with the spans as the counted units (:func:`ktae.core.token_counts.count_units`):
a response contains a span when those ``n`` tokens occur consecutively in it; ``L_T``
and ``L_F`` count the spans of each class's responses.

Span ids are exact (no hashing, so two different spans never share an id): the key of a
span is built token by token as ``key * V + next token`` (``V``: the vocabulary bound),
the span's lexicographic code, while that fits in 62 bits; when the next step would not,
the keys are first replaced by their dense rank (one ``torch.unique``: the rank of each
(prefix, next token) pair among those present). Both steps keep lexicographic order.
With a 152k vocabulary, trigrams need no ranking and 4-grams one.

A token's value is a reduction of the values of the spans covering it
(:func:`reduce_to_tokens`); a token covered by no span gets 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ktae.core.token_counts import real_positions, real_token_ids, unique_small_keys

_KEY_LIMIT = 1 << 62

#: ``ngram_reduce="maxabs"``: span values whose magnitudes differ by less than this
#: relative amount are ties (as scipy's Fisher test treats nearly equal probabilities),
#: so that mirrored tables, equal in exact arithmetic, break ties by position, not by
#: the last bit of their rounding.
MAXABS_RTOL = 1e-9


@dataclass(frozen=True)
class Spans:
    """The spans of a batch. S spans, M real tokens (row-major order), B responses.

    Attributes:
        n: span length.
        start: ``[S]`` index of each span's first token among the real tokens.
        row: ``[S]`` the response of each span (non-decreasing).
        row_len: ``[B]`` spans per response.
        tokens: ``[M]`` the real tokens' ids.
    """

    n: int
    start: torch.Tensor
    row: torch.Tensor
    row_len: torch.Tensor
    tokens: torch.Tensor

    def token_ids(self, which: torch.Tensor) -> torch.Tensor:
        """``[K, n]`` token ids of the spans ``which`` (``[K]`` span indices)."""
        pos = self.start[which][:, None] + torch.arange(self.n, device=self.start.device)
        return self.tokens[pos]


def find_spans(token_ids: torch.Tensor, mask: torch.Tensor, n: int,
               ignore_token_ids: tuple[int, ...] = (), *, flat: torch.Tensor | None = None,
               row: torch.Tensor | None = None, dense: bool = True
               ) -> tuple[Spans, torch.Tensor]:
    """Every span of ``n >= 2`` tokens of a validated ``[B, T]`` batch, and their ``[S]``
    exact ids (non-negative int64: equal ids exactly when the spans are equal).
    ``flat``, ``row``: the row-major positions and the rows of the real tokens, when the
    caller has them (:func:`ktae.core.token_counts.real_positions`). ``dense=False``: the
    codes of the token ids as they are where they fit in 62 bits (trigrams of a 152k
    vocabulary: 52 bits), for callers that only compare ids (saves the dense token ids)."""
    B, T = token_ids.shape
    device = token_ids.device
    if flat is None or row is None:
        flat, row, _ = real_positions(mask)
    tokens = real_token_ids(token_ids, flat)
    m = tokens.numel()
    if m < n:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return Spans(n, empty, empty, torch.zeros(B, dtype=torch.int64, device=device),
                     tokens), empty.clone()
    head = flat[: m - n + 1]
    # n real tokens in consecutive columns of one row: the last is n - 1 positions on.
    ok = (flat[n - 1:] - head == n - 1) & (row[n - 1:] == row[: m - n + 1])
    if ignore_token_ids:
        ids = torch.tensor(ignore_token_ids, dtype=torch.int64, device=device)
        hits = torch.zeros(m + 1, dtype=torch.int64, device=device)
        torch.cumsum(torch.isin(tokens, ids), 0, out=hits[1:])
        ok &= hits[n:] == hits[: m - n + 1]
    start = ok.nonzero().squeeze(1)
    span_row = row.index_select(0, start)
    row_len = torch.bincount(span_row, minlength=B)
    return Spans(n, start, span_row, row_len, tokens), _span_keys(tokens, start, n, dense)


def _span_keys(tokens: torch.Tensor, start: torch.Tensor, n: int, dense: bool = True
               ) -> torch.Tensor:
    """Exact ids of the spans starting at ``start``: lexicographic codes, ranked if too big."""
    # Dense token ids first (a presence bitmap for real vocabularies: no sort), so that
    # codes grow by the number of distinct tokens per step, not by the vocabulary size.
    vocab = int(tokens.max()) + 1 if tokens.numel() else 1
    if dense or vocab ** n > _KEY_LIMIT:
        uniq, tokens = unique_small_keys(tokens, vocab)
        vocab = max(1, uniq.numel())
    m = tokens.numel()
    if vocab ** n <= _KEY_LIMIT:  # codes of every position by shifted slices, one gather
        code = tokens[: m - n + 1].clone()
        for j in range(1, n):
            code.mul_(vocab).add_(tokens[j: m - n + 1 + j])
        return code.index_select(0, start)
    key = tokens.index_select(0, start)
    bound = vocab  # keys lie in [0, bound)
    for j in range(1, n):  # a loop over the span length only
        if bound * vocab > _KEY_LIMIT:
            uniq, key = torch.unique(key, return_inverse=True)
            bound = uniq.numel()
        key = key.mul_(vocab).add_(tokens.index_select(0, start + j))
        bound *= vocab
    return key


def reduce_to_tokens(span_values: torch.Tensor, spans: Spans, reduce: str) -> torch.Tensor:
    """``[S]`` span values -> ``[M]`` token values (real tokens, row-major order).

    ``reduce="maxabs"``: the covering span value of largest magnitude, sign kept (ties,
    magnitudes within a relative :data:`MAXABS_RTOL`, go to the span that starts first:
    spans are visited from the earliest start and a later one wins only when larger by
    more than that); ``"mean"``: the mean of the covering spans' values.
    Tokens covered by no span get 0.
    """
    m = spans.tokens.numel()
    by_start = torch.zeros(m, dtype=span_values.dtype, device=span_values.device)
    return reduce_from_starts(by_start.index_copy_(0, spans.start, span_values), spans, reduce)


def reduce_from_starts(by_start: torch.Tensor, spans: Spans, reduce: str) -> torch.Tensor:
    """:func:`reduce_to_tokens` from ``by_start`` ``[M]``: at each real token, the value of
    the span starting there (0 where none starts); consumed."""
    m = spans.tokens.numel()
    out = torch.zeros_like(by_start)
    if spans.start.numel() == 0:
        return out
    # A span starting at s covers tokens s .. s + n - 1, all in its row, so token p's
    # covering spans start at p - j (j < n): shifted slices, no gathers.
    if reduce == "mean":
        starts = torch.zeros_like(out).index_fill_(0, spans.start, 1.0)
        covering = torch.zeros_like(out)
        for j in range(spans.n):
            out[j:] += by_start[: m - j]
            covering[j:] += starts[: m - j]
        return out.div_(covering.clamp_min(1))
    if reduce != "maxabs":
        raise ValueError(f"ngram_reduce: expected 'maxabs' or 'mean', got {reduce!r}")
    for j in reversed(range(spans.n)):  # the earliest-starting span first: it keeps ties
        candidate, current = by_start[: m - j], out[j:]
        larger = candidate.abs() > current.abs().mul_(1.0 + MAXABS_RTOL)
        current.copy_(torch.where(larger, candidate, current))
    return out
