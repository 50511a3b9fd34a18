"""One sort of the batch -> the 2x2 table and term counts of every (group, token).

This is the hot path of KTAE. The released runtime loops in Python over groups and
distinct tokens; here every real token of the batch gets one int64 key

    key = (group * V + token) << S  |  incorrect << s  |  rank of its response in the group

and a single ``torch.sort`` of the keys puts the occurrences of each (group, token) next
to each other, subdivided by class (correct first) and response. Three passes of
``torch.unique_consecutive`` over ever shorter arrays (the runs of responses, of
(pair, class), of pairs) then give ``a``/``b`` (responses containing the token, by class)
and the occurrence counts by class.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_KEY_BITS = 62


@dataclass(frozen=True)
class TokenCounts:
    """Counts per (group, distinct token) present with mask = 1. U = number of pairs.

    The counted units may also be spans of n tokens (:func:`count_units`): read "span"
    for "token" below, and "spans" for "tokens" in the lengths.

    Attributes:
        group: ``[U]`` dense group id. token: ``[U]`` token id (or span id).
        a, b: ``[U]`` correct / incorrect responses containing the token.
        count_correct, count_incorrect: ``[U]`` occurrences in each class's responses.
        run_length: ``[U]`` occurrences of the pair (runs of the sorted keys, in order).
        order: ``[M]`` for the k-th real token in sorted order, its index among the real
            tokens in row-major order (``token_ids[mask]``); None when counted without a
            sort (:mod:`ktae.core.scatter_counts`).
        group_n_correct, group_n_incorrect: ``[P]`` class sizes of each group; the
            properties ``n_correct``/``n_incorrect`` give them per pair (c = n_correct - a).
        group_len_correct, group_len_incorrect: ``[P]`` tokens in each class's responses
            (L_T, L_F); per pair as ``len_correct``/``len_incorrect``.
        pair: ``[M]`` the pair of each real token (row-major order), when counted without
            a sort; else None (``order`` and ``run_length`` map them).
    """

    group: torch.Tensor
    token: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    count_correct: torch.Tensor
    count_incorrect: torch.Tensor
    run_length: torch.Tensor
    order: torch.Tensor | None
    group_n_correct: torch.Tensor
    group_n_incorrect: torch.Tensor
    group_len_correct: torch.Tensor
    group_len_incorrect: torch.Tensor
    pair: torch.Tensor | None = None

    @property
    def n_correct(self) -> torch.Tensor:
        return self.group_n_correct.index_select(0, self.group)

    @property
    def n_incorrect(self) -> torch.Tensor:
        return self.group_n_incorrect.index_select(0, self.group)

    @property
    def len_correct(self) -> torch.Tensor:
        return self.group_len_correct.index_select(0, self.group)

    @property
    def len_incorrect(self) -> torch.Tensor:
        return self.group_len_incorrect.index_select(0, self.group)

    def spread_at(self, per_pair: torch.Tensor, positions: torch.Tensor, size: int
                  ) -> torch.Tensor:
        """``[U] -> [size]``: unit k's pair value at ``positions[k]``, 0 elsewhere (one
        scatter, where :meth:`spread` then a scatter of its result would take two)."""
        out = torch.zeros(size, dtype=per_pair.dtype, device=per_pair.device)
        if self.pair is not None:
            return out.index_copy_(0, positions, per_pair.index_select(0, self.pair))
        at = positions.index_select(0, self.order)
        return out.index_copy_(0, at, per_pair.repeat_interleave(self.run_length))

    def spread(self, per_pair: torch.Tensor) -> torch.Tensor:
        """``[U] -> [M]``: each real token (row-major order) gets its pair's value."""
        if self.pair is not None:
            return per_pair.index_select(0, self.pair)
        sorted_vals = per_pair.repeat_interleave(self.run_length)
        return torch.empty_like(sorted_vals).index_copy_(0, self.order, sorted_vals)


def count_tokens(token_ids: torch.Tensor, mask: torch.Tensor, gid: torch.Tensor,
                 num_groups: int, correct: torch.Tensor) -> TokenCounts:
    """Build :class:`TokenCounts` for a validated batch in one vectorised pass.

    Args:
        token_ids: ``[B, T]`` integer ids (non-negative where mask). mask: ``[B, T]`` bool.
        gid: ``[B]`` dense group ids. correct: ``[B]`` bool.

    Raises:
        ValueError: a negative token id where mask is 1.
    """
    flat, row, row_len = real_positions(mask)
    return count_units(real_token_ids(token_ids, flat), row, row_len, gid, num_groups, correct)


#: :func:`row_lengths`: times a word of eight 0/1 bytes, its top byte is their sum.
_BYTE_SUM = 0x0101010101010101
#: :func:`row_lengths`: words per block of rows (a 1 MiB buffer, reused).
_ROW_LENGTH_BLOCK = 1 << 17


def row_lengths(mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64 real tokens per row of a ``[B, T]`` bool mask.

    On CPU a bool tensor stores one byte 0 or 1 per flag, so the mask is read as int64
    words of 8 flags, each word's flags are summed by one multiplication (the sums are at
    most 8: no carry between bytes) and the rows by a sum of ``T / 8`` words, where
    ``mask.sum(1)`` widens every flag first (``benchmarks/bench_counting.py`` times both).
    Other layouts and devices take ``mask.sum(1)``.
    """
    B, T = mask.shape
    if (mask.device.type == "cpu" and T and T % 8 == 0 and mask.stride(1) == 1
            and mask.stride(0) == T and mask.storage_offset() % 8 == 0):
        words = mask.view(torch.int64)  # [B, T / 8]
        out = torch.empty(B, dtype=torch.int64)
        step = max(1, _ROW_LENGTH_BLOCK // words.shape[1])
        buf = torch.empty(min(B, step), words.shape[1], dtype=torch.int64)
        for r in range(0, B, step):  # a reused buffer: no page of a [B, T / 8] temporary
            part = buf[: min(step, B - r)]
            torch.mul(words[r:r + step], _BYTE_SUM, out=part)
            torch.sum(part.bitwise_right_shift_(56), 1, out=out[r:r + step])
        return out
    return mask.sum(1, dtype=torch.int32).long()


def real_positions(mask: torch.Tensor, row_len: torch.Tensor | None = None):
    """``(flat, row, row_len)`` of the real tokens of a ``[B, T]`` mask, in row-major order:
    ``[M]`` positions in the flattened batch, ``[M]`` rows, ``[B]`` tokens per row (given, or
    counted here)."""
    # nonzero + index_select beats boolean indexing; rows by repetition beat a division.
    if row_len is None:
        row_len = row_lengths(mask)
    flat = mask.reshape(-1).nonzero().squeeze(1)
    row = torch.repeat_interleave(torch.arange(mask.shape[0], device=mask.device), row_len,
                                  output_size=flat.numel())
    return flat, row, row_len


def real_token_ids(token_ids: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """``[M]`` int64 ids at the row-major positions ``flat``; refuses negative ids."""
    tok = token_ids.reshape(-1).index_select(0, flat).long()
    if tok.numel() and tok.min() < 0:
        raise ValueError("token_ids: expected non-negative ids where mask is 1")
    return tok


def count_units(unit: torch.Tensor, row: torch.Tensor, row_len: torch.Tensor,
                gid: torch.Tensor, num_groups: int, correct: torch.Tensor) -> TokenCounts:
    """:class:`TokenCounts` of counted units: tokens, or spans of n tokens (n-grams).

    Args:
        unit: ``[M]`` non-negative int64 ids (equal ids = the same token or span);
            consumed: the caller must not use it afterwards (shifted in place).
        row: ``[M]`` the response of each unit (units in row-major order).
        row_len: ``[B]`` units per response (the class lengths L_T, L_F sum them).
        gid: ``[B]`` dense group ids. correct: ``[B]`` bool.

    ``TokenCounts.token`` then holds the unit ids and ``order``/``spread`` index units.
    """
    device = unit.device
    sizes, rank = _ranks_in_groups(gid, num_groups)
    g_max = int(sizes.max().item())

    vocab = int(unit.max()) + 1 if unit.numel() else 1
    tok = unit
    s = max(1, (g_max - 1).bit_length())  # bits for the rank
    shift = s + 1  # plus one bit for "incorrect"
    remap = None
    if (num_groups * vocab).bit_length() + shift > _KEY_BITS:  # huge ids: rank them first
        remap, tok = torch.unique(tok, return_inverse=True)
        vocab = remap.numel()
    row_key = ((gid * vocab) << shift) | ((~correct).long() << s) | rank
    key = row_key.index_select(0, row)
    key += tok.bitwise_left_shift_(shift)
    del tok, unit
    key, order = torch.sort(key)

    # Runs of the sorted keys, each found by one pass of unique_consecutive: responses
    # (pair, class, rank), then (pair, class), then pairs. In a pair's run the correct
    # occurrences come first (class bit 0).
    resp_key, tokens_per_resp = torch.unique_consecutive(key, return_counts=True)
    del key
    cls, resp_per_cls = torch.unique_consecutive(resp_key >> s, return_counts=True)
    del resp_key
    cs = torch.zeros(tokens_per_resp.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(tokens_per_resp, 0, out=cs[1:])
    cls_end = torch.cumsum(resp_per_cls, 0)
    tokens_per_cls = cs.index_select(0, cls_end) - cs.index_select(0, cls_end - resp_per_cls)
    pk, cls_per_pair = torch.unique_consecutive(cls >> 1, return_counts=True)
    first = torch.cumsum(cls_per_pair, 0) - cls_per_pair  # the pair's first (pair, class)
    first_correct = (cls.index_select(0, first) & 1) == 0
    both = cls_per_pair == 2
    second = torch.where(both, first + 1, first)
    zero = torch.zeros_like(pk)
    resp_first, resp_second = resp_per_cls.index_select(0, first), resp_per_cls.index_select(0, second)
    tok_first, tok_second = tokens_per_cls.index_select(0, first), tokens_per_cls.index_select(0, second)
    a = torch.where(first_correct, resp_first, zero)
    b = torch.where(both | ~first_correct, resp_second, zero)
    count_correct = torch.where(first_correct, tok_first, zero)
    run_length = tok_first + torch.where(both, tok_second, zero)
    group = pk // vocab
    token = pk - group * vocab
    if remap is not None:
        token = remap[token]

    return TokenCounts(group=group, token=token, a=a, b=b, count_correct=count_correct,
                       count_incorrect=run_length - count_correct, run_length=run_length,
                       order=order, **_group_totals(gid, num_groups, sizes, correct, row_len))


def _ranks_in_groups(gid: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[P]`` group sizes and ``[B]`` the rank of each response within its group."""
    B = gid.shape[0]
    sizes = torch.bincount(gid, minlength=num_groups)
    order_rows = torch.argsort(gid, stable=True)
    starts_g = torch.cumsum(sizes, 0) - sizes
    rank = torch.empty(B, dtype=torch.int64, device=gid.device)
    rank[order_rows] = torch.arange(B, device=gid.device) - starts_g[gid[order_rows]]
    return sizes, rank


def _group_totals(gid, num_groups, sizes, correct, row_len) -> dict:
    n_c = torch.zeros(num_groups, dtype=torch.int64, device=gid.device).index_add_(
        0, gid, correct.long())
    len_c = torch.zeros_like(n_c).index_add_(0, gid, row_len * correct)
    len_all = torch.zeros_like(n_c).index_add_(0, gid, row_len)
    return dict(group_n_correct=n_c, group_n_incorrect=sizes - n_c,
                group_len_correct=len_c, group_len_incorrect=len_all - len_c)


def unique_small_keys(key: torch.Tensor, keyspace: int, limit: int = 1 << 24):
    """``torch.unique(key, return_inverse=True)`` for keys in ``[0, keyspace)``.

    Statistics that depend only on a 2x2 table are evaluated once per distinct table;
    table keys live in a small space, where a presence bitmap beats a sort.
    """
    if keyspace > limit:
        return torch.unique(key, return_inverse=True)
    present = torch.zeros(keyspace, dtype=torch.bool, device=key.device)
    present.index_fill_(0, key, True)
    uniq = present.nonzero().squeeze(1)
    lookup = torch.cumsum(present, 0) - 1
    return uniq, lookup.index_select(0, key)
