"""KTAE's diagnostic table: the statistics behind every key-token (or key-span) value.

Built by :func:`ktae.key_token_table` in either mode (exact or reference); one row per
(group, distinct token), or per (group, distinct span) with ``ngram > 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from ktae.core.ngrams import find_spans

#: The float columns, in display order.
STAT_COLUMNS = ("p_value", "fisher", "info_gain", "tf_correct", "tf_incorrect", "direction",
                "value")


def _count_cell(x: torch.Tensor) -> str:
    """An integer count as is; a soft count (``split="graded"``) to 3 significant digits."""
    return f"{float(x):.3g}" if x.is_floating_point() else str(int(x))


@dataclass(frozen=True)
class KeyTokenTable:
    """Per (group, distinct token or span) statistics of KTAE: one row per pair.

    ``group`` is the dense group index (groups numbered in order of first appearance in
    the batch); ``token`` the token id; ``a, b, c, d`` the 2x2 table (present/absent x
    correct/incorrect); ``p_value`` and ``fisher`` (F), ``info_gain`` (bits),
    ``tf_correct``/``tf_incorrect`` (Eq. 8), ``direction`` (D, Eq. 9) and ``value``
    (the key-token value added to the base advantage). Groups lacking a correct or an
    incorrect response, and ignored tokens, have ``value == 0``. All columns are ``[U]``.

    With ``ngram = N > 1`` each row is a span of N tokens: ``span`` is ``[U, N]`` (the
    token ids of the span, in order) and ``token`` the span's id (spans of the table
    numbered in lexicographic order of their token ids, the same id in every group).
    For unigram tables ``span`` is None and absent from :meth:`to_rows` and :meth:`format`.
    Rows are sorted by group, then token id (or span, lexicographically).
    """

    group: torch.Tensor
    token: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    d: torch.Tensor
    p_value: torch.Tensor
    fisher: torch.Tensor
    info_gain: torch.Tensor
    tf_correct: torch.Tensor
    tf_incorrect: torch.Tensor
    direction: torch.Tensor
    value: torch.Tensor
    span: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.group.numel())

    @property
    def ngram(self) -> int:
        """Tokens per row: 1, or the span length N."""
        return 1 if self.span is None else int(self.span.shape[1])

    def _columns(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def _cell(self, name: str, i: int):
        if name == "span":
            return tuple(self.span[i].tolist())
        return getattr(self, name)[i].item()

    def to_rows(self) -> list[dict]:
        """The table as a list of plain dicts (ints and floats; ``span`` a tuple of ids)."""
        cols = {}
        for name in self._columns():
            values = getattr(self, name).detach().cpu().tolist()
            cols[name] = [tuple(v) for v in values] if name == "span" else values
        return [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]

    def format(self, top: int = 20, decode=None) -> str:
        """A plain-text table of the ``top`` pairs with the largest ``|value|``.

        ``decode``: optional ``token id -> str`` (e.g. ``tokenizer.decode``) for a text
        column (a span's text is the concatenation of its tokens' texts).
        """
        order = torch.argsort(self.value.abs(), descending=True, stable=True)[:top].tolist()
        spans = self.span is not None
        head = ["group", "span" if spans else "token"] + (["text"] if decode else []) + [
            "a", "b", "c", "d", "p", "F", "IG", "TF_T", "TF_F", "D", "value"]
        rows = []
        for i in order:
            ids = self.span[i].tolist() if spans else [int(self.token[i])]
            cells = [str(int(self.group[i])), " ".join(str(t) for t in ids)]
            if decode and spans:
                cells.append(repr("".join(str(decode(int(t))) for t in ids))[:24])
            elif decode:
                cells.append(repr(decode(ids[0]))[:9])
            cells += [_count_cell(getattr(self, k)[i]) for k in "abcd"]
            cells += [f"{float(getattr(self, k)[i]):.3g}" for k in STAT_COLUMNS]
            rows.append(cells)
        width = [9] * len(head)
        if spans:  # the span and text columns grow with N
            for j in range(1, 3 if decode else 2):
                width[j] = max([9] + [len(r[j]) for r in rows])
        lines = ["  ".join(f"{h:>{w}}" for h, w in zip(head, width, strict=True))]
        lines += ["  ".join(f"{c:>{w}}" for c, w in zip(r, width, strict=True)) for r in rows]
        return "\n".join(lines)

    def token_rows(self, group: torch.Tensor, token_ids: torch.Tensor, mask: torch.Tensor,
                   ignore_token_ids: Sequence[int] = ()) -> torch.Tensor:
        """For each token of the batch the table was built from, the row behind its value.

        Args:
            group: ``[B]`` dense group ids (the table's numbering). token_ids, mask:
                ``[B, T]`` as given to :func:`ktae.key_token_table`.
            ignore_token_ids: as given to it (they split spans).

        Returns:
            ``[B, T]`` int64 row indices, -1 on padding. Unigram tables: the row of the
            token. N-gram tables: the row of the covering span of largest ``|value|`` (the
            first one on ties), -1 for a token no span covers.
        """
        B, T = token_ids.shape
        group, token_ids, mask = group.long(), token_ids.long(), mask.bool()
        out = torch.full((B, T), -1, dtype=torch.int64, device=token_ids.device)
        if self.span is None:
            rows = mask.nonzero()
            occ = torch.stack([group[rows[:, 0]], token_ids[mask]], 1)
            keys = torch.stack([self.group, self.token], 1)
        else:
            spans, _ = find_spans(token_ids, mask, self.ngram, tuple(int(i) for i in
                                                                       ignore_token_ids))
            occ = torch.cat([group[spans.row][:, None],
                             spans.token_ids(torch.arange(spans.start.numel()))], 1)
            keys = torch.cat([self.group[:, None], self.span], 1)
        if occ.shape[0] == 0 or len(self) == 0:
            return out
        uniq, inv = torch.unique(torch.cat([keys, occ]), dim=0, return_inverse=True)
        row_of = torch.full((uniq.shape[0],), -1, dtype=torch.int64, device=out.device)
        row_of[inv[: len(self)]] = torch.arange(len(self), device=out.device)
        occ_row = row_of[inv[len(self):]]
        if self.span is None:
            return out.masked_scatter_(mask, occ_row)
        m = spans.tokens.numel()
        by_start = torch.full((m,), -1, dtype=torch.int64, device=out.device)
        by_start[spans.start] = occ_row
        magnitude = torch.where(by_start >= 0, self.value.abs()[by_start.clamp_min(0)].double(),
                                -1.0)
        best = torch.full((m,), -1, dtype=torch.int64, device=out.device)
        best_mag = torch.full((m,), -1.0, dtype=torch.float64, device=out.device)
        for j in reversed(range(self.ngram)):  # earliest-starting span first: it keeps ties
            take = magnitude[: m - j] > best_mag[j:]
            best[j:] = torch.where(take, by_start[: m - j], best[j:])
            best_mag[j:] = torch.where(take, magnitude[: m - j], best_mag[j:])
        return out.masked_scatter_(mask, best)

    def lookup(self, group: int, token: int | None = None, *,
               span: Sequence[int] | None = None) -> dict:
        """The row of one (dense group, token id), or of one (dense group, span).

        "Why did this token get this credit?". Unigram tables take ``token`` (or a
        one-token ``span``); n-gram tables take ``span``, the token ids of the span
        (or ``token``, the span's id in this table).

        Raises:
            KeyError: the token or span does not occur in the group.
            ValueError: neither or both of ``token`` and ``span``; a span of the wrong length.
        """
        if (token is None) == (span is None):
            raise ValueError("lookup: expected exactly one of token and span")
        if span is not None:
            ids = [int(t) for t in span]
            if len(ids) != self.ngram:
                raise ValueError(f"span: expected {self.ngram} token ids, got {len(ids)}")
            if self.span is None:
                hit = (self.group == group) & (self.token == ids[0])
            else:
                want = torch.tensor(ids, dtype=self.span.dtype, device=self.span.device)
                hit = (self.group == group) & (self.span == want).all(dim=1)
            what = f"span {tuple(ids)}"
        else:
            hit = (self.group == group) & (self.token == token)
            what = f"{'span id' if self.span is not None else 'token'} {token}"
        hit = hit.nonzero()
        if hit.numel() == 0:
            raise KeyError(f"{what} does not occur in group {group}")
        i = int(hit[0, 0])
        return {name: self._cell(name, i) for name in self._columns()}
