"""KTAE's pass over a chunk of single tokens as compiled loops (numba), where it is installed.

The torch path counts a chunk in a dozen or so passes, each a gather or a scatter over the
chunk's tokens (:mod:`ktae.core.scatter_counts`), and then spreads the values and writes
the output in as many again. Each pass costs little per token, but together they cost
about half a sort of the batch's keys, more on CPUs without AVX-512
(``benchmarks/bench_advantages.py``). Compiled, the same work is three loops over the
chunk's rows, in the rows' own memory:

1. :func:`count_rows` reads each row's real tokens once, in group order. A (group, token)
   pair gets its dense id the first time its group shows the token (a stamp table over
   the chunk's id range holds each id's last group and pair), and the pair's responses
   and occurrences by class are counted as the token is read (a response counts once per
   pair: each pair keeps the last row that counted it). The ids are scanned first for
   their range; ids too sparse for a table over it (:func:`ktae.core.scatter_counts.
   is_dense`) are left to the torch path.
2. The values per pair are computed in torch from those counts, as on every path
   (:mod:`ktae.core.ktae`).
3. :func:`write_rows` writes each of the chunk's rows of the output once: the row's base
   advantage plus its pair's value on a real token, 0 on padding.

The counts are integers and every value is computed by the same torch code from them, so
each token's value is the same bits as on the other paths; only the order of the pairs
differs (group, then first occurrence). The loops release the GIL: the chunks run on the
task threads of :mod:`ktae.core.chunk_pool` as before. numba compiles them on first use
and caches the machine code beside this file (``cache=True``).
"""

from __future__ import annotations

import functools
import importlib.util
import threading

import numpy as np
import torch

from ktae.core.scatter_counts import is_dense

#: Whether numba is installed (``pip install "ktae[fast]"``); checked without importing it.
AVAILABLE = importlib.util.find_spec("numba") is not None


_compile_lock = threading.Lock()


def _kernels():
    """The compiled loops (numba is imported here, on first use, not with ktae; one
    thread compiles them while the others wait)."""
    with _compile_lock:
        return _compile()


@functools.cache
def _compile():
    import numba

    def njit(fn):
        try:
            return numba.njit(cache=True, nogil=True)(fn)
        except RuntimeError:  # no writable cache location: compile in each process
            return numba.njit(nogil=True)(fn)

    return tuple(njit(fn) for fn in (_scan, _count, _write, _count_spans, _write_spans))


# -- the loops (plain Python and NumPy: numba compiles them, :func:`_compile`) ----------

def _scan(ids, mask, rows):
    n = 0
    lo = np.int64(0)
    hi = np.int64(-1)
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(ids.shape[1]):
            if mask[r, j]:
                t = np.int64(ids[r, j])
                if n == 0 or t < lo:
                    lo = t
                if t > hi:
                    hi = t
                n += 1
    return n, lo, hi

def _count(ids, mask, rows, gid, correct, bound, pid, inverse, token, pair_group, state):
    # each id's latest pair: a pair numbered before its group's first is another
    # group's, so the table is not cleared between groups (rows in group order)
    pid[:bound] = -1
    u = 0
    k = 0
    first = 0  # the current group's first pair
    g_prev = -1
    for i in range(rows.shape[0]):
        r = rows[i]
        g = gid[i]
        if g != g_prev:
            first = u
            g_prev = g
        cls = 0 if correct[i] else 1
        for j in range(ids.shape[1]):
            if mask[r, j]:
                t = np.int64(ids[r, j])
                p = pid[t]
                if p < first:
                    p = u
                    pid[t] = p
                    token[p] = t
                    pair_group[p] = g
                    state[p, 0] = -1
                    state[p, 1:] = 0
                    u += 1
                inverse[k] = p
                k += 1
                if state[p, 0] != i:
                    state[p, 0] = i
                    state[p, 1 + cls] += 1
                state[p, 3 + cls] += 1
    counts = np.empty((4, u), np.int64)  # a, b, occurrences in each class: contiguous
    for q in range(u):
        for f in range(4):
            counts[f, q] = state[q, 1 + f]
    return u, counts

def _write(out, mask, rows, base, value, inverse):
    k = 0
    zero = out.dtype.type(0)
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(out.shape[1]):
            if mask[r, j]:
                out[r, j] = value[inverse[k]] + base[i]
                k += 1
            else:
                out[r, j] = zero

def _count_spans(ids, mask, rows, gid, correct, n, vocab, ignored, table, shift, span_at,
                token, pair_group, state, row_spans):
    # the spans' codes (their n ids in base ``vocab``) in an open-addressing table of
    # (code, pair) slots;
    # a slot whose pair is numbered before the group's first is free for the group,
    # so the table is not cleared between groups (rows in group order)
    hmask = table.shape[0] - 1
    top = np.int64(1)
    for _ in range(n - 1):
        top *= vocab  # the weight of a span's first id in its code
    table[:, 1] = -1
    u = 0
    k = 0
    first = 0
    g_prev = -1
    for i in range(rows.shape[0]):
        r = rows[i]
        g = gid[i]
        if g != g_prev:
            first = u
            g_prev = g
        cls = 0 if correct[i] else 1
        run = 0  # consecutive real, not ignored tokens ending here
        code = np.int64(0)
        spans = 0
        for j in range(ids.shape[1]):
            if not mask[r, j]:
                run = 0
                code = 0
                continue
            t = np.int64(ids[r, j])
            span_at[k] = -1
            k += 1
            skip = False
            for q in range(ignored.shape[0]):
                if ignored[q] == t:
                    skip = True
            if skip:
                run = 0
                code = 0
                continue
            if run >= n:
                code -= np.int64(ids[r, j - n]) * top
            code = code * vocab + t
            run += 1
            if run < n:
                continue
            h = np.int64((np.uint64(code) * np.uint64(0x9E3779B97F4A7C15)) >> shift)
            while True:
                p = table[h, 1]
                if p < first:  # free for this group: a new pair
                    p = u
                    table[h, 1] = p
                    table[h, 0] = code
                    token[p] = code
                    pair_group[p] = g
                    state[p, 0] = -1
                    state[p, 1:] = 0
                    u += 1
                    break
                if table[h, 0] == code:
                    break
                h = (h + 1) & hmask
            span_at[k - n] = p
            spans += 1
            if state[p, 0] != i:
                state[p, 0] = i
                state[p, 1 + cls] += 1
            state[p, 3 + cls] += 1
        row_spans[i] = spans
    counts = np.empty((4, u), np.int64)
    for q in range(u):
        for f in range(4):
            counts[f, q] = state[q, 1 + f]
    return u, k, counts

def _write_spans(out, mask, rows, base, value, span_at, n, mean, tie):
    # each real token's spans start 0 .. n - 1 real tokens before it, in its row; the
    # same operations in the same order as ktae.core.ngrams.reduce_from_starts
    k = 0
    zero = out.dtype.type(0)
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(out.shape[1]):
            if not mask[r, j]:
                out[r, j] = zero
                continue
            acc = value.dtype.type(0)
            if mean:
                covering = value.dtype.type(0)
                for q in range(n):
                    if k - q >= 0:
                        p = span_at[k - q]
                        acc += value[p] if p >= 0 else value.dtype.type(0)
                        covering += 1 if p >= 0 else 0
                acc /= max(covering, value.dtype.type(1))
            else:
                for q in range(n - 1, -1, -1):  # the earliest span first: it keeps ties
                    if k - q >= 0:
                        p = span_at[k - q]
                        c = value[p] if p >= 0 else value.dtype.type(0)
                        if abs(c) > abs(acc) * tie:
                            acc = c
            out[r, j] = out.dtype.type(acc) + base[i]
            k += 1


def usable(token_ids: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether a batch's ids and mask can be read by the loops: numba installed, CPU
    tensors, integer ids and a bool mask."""
    return (AVAILABLE and token_ids.device.type == "cpu" and mask.device.type == "cpu"
            and mask.dtype == torch.bool and not token_ids.is_floating_point()
            and token_ids.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8))


_local = threading.local()


def _work(name: str, size: int, dtype, width: int = 0) -> np.ndarray:
    """This thread's work array ``name`` of at least ``size`` entries (rows of ``width``
    when given): kept from one chunk to the next (a thread runs one chunk at a time, and
    what a count returns is read before the thread's next chunk), so that a chunk does not
    fault in fresh pages for it; grown when a chunk needs more."""
    arrays = _local.__dict__.setdefault("arrays", {})
    have = arrays.get(name)
    if have is None or have.shape[0] < size:
        have = arrays[name] = np.empty((size, width) if width else size, dtype)
    return have


@torch.no_grad()
def count_rows(token_ids: torch.Tensor, mask: torch.Tensor, rows: np.ndarray,
               gid: np.ndarray, correct: np.ndarray):
    """Counts per (group, token) of the rows ``rows`` of a batch, read in that order.

    Args:
        token_ids, mask: the batch's ``[B, T]`` ids and bool mask (:func:`usable`).
        rows: ``[R]`` int64 batch rows, each group's rows one after the other.
        gid: ``[R]`` int64 each row's group, dense in ``[0, P)``. correct: ``[R]`` bool.

    Returns:
        None when the ids are too sparse for a table over their range (the caller takes
        the torch path), else ``(inverse [M] int32, group, token, a, b, count_correct,
        count_incorrect)`` (each ``[U]``): the pair of each real token in the order read,
        and each pair's group, token id, responses containing it and occurrences by class.
        ``inverse``, ``group`` and ``token`` are views of this thread's work arrays: read
        them before the thread's next call.

    Raises:
        ValueError: a negative token id where mask is 1.
    """
    scan, count, *_ = _kernels()
    ids, flags = token_ids.numpy(), mask.numpy()
    m, lo, hi = scan(ids, flags, rows)
    if m and lo < 0:
        raise ValueError("token_ids: expected non-negative ids where mask is 1")
    bound = int(hi) + 1
    if not m or not is_dense(bound, m):
        return None
    pid, inverse = _work("pid", bound, np.int32), _work("inverse", m, np.int32)
    token, group = _work("token", m, np.int64), _work("group", m, np.int64)
    u, counts = count(ids, flags, rows, gid, correct, bound, pid, inverse, token, group,
                      _work("state", m, np.int32, 5))
    return (torch.from_numpy(inverse[:m]), torch.from_numpy(group[:u]),
            torch.from_numpy(token[:u]), *torch.from_numpy(counts))


def write_rows(out: torch.Tensor, mask: torch.Tensor, rows: np.ndarray, base: torch.Tensor,
               value: torch.Tensor, inverse: torch.Tensor) -> None:
    """Write the rows ``rows`` of the ``[B, T]`` output ``out``: ``base[i] +
    value[inverse[k]]`` at the k-th real token read (rows in the order of
    :func:`count_rows`), 0 on padding. ``base`` ``[R]`` and ``value`` ``[U]`` have
    ``out``'s dtype."""
    write = _kernels()[2]
    write(out.numpy(), mask.numpy(), rows, base.detach().numpy(), value.detach().numpy(),
          inverse.numpy())


#: Codes of spans up to this bound (their ``n`` ids in base ``vocab``); beyond, the torch
#: path ranks them (:mod:`ktae.core.ngrams`).
_CODE_LIMIT = 1 << 62


@torch.no_grad()
def count_span_rows(token_ids: torch.Tensor, mask: torch.Tensor, rows: np.ndarray,
                    gid: np.ndarray, correct: np.ndarray, n: int, ignored: np.ndarray,
                    group_tokens: int):
    """Counts per (group, span of ``n`` tokens) of the rows ``rows`` of a batch, read in
    that order: :func:`count_rows` for the spans of :func:`ktae.core.ngrams.find_spans`
    (``n`` real tokens in consecutive columns of a row, none of them in ``ignored``).

    Args:
        token_ids, mask, rows, gid, correct: as :func:`count_rows`.
        n: the span length (>= 2). ignored: int64 ids no span contains.
        group_tokens: the most real tokens of one group among the rows (sizes the table).

    Returns:
        None when the spans' codes would pass 62 bits (the caller takes the torch path) or
        there is no real token, else ``(span_at [M] int32, row_spans [R] int64, group,
        token, a, b, count_correct, count_incorrect)``: the pair of the span starting at
        each real token read (-1 where none starts), the spans of each row, and per pair
        its group, its code and its counts. The first three are views of this thread's
        work arrays: read them before the thread's next call.

    Raises:
        ValueError: a negative token id where mask is 1.
    """
    scan, _, _, count_spans, _ = _kernels()
    ids, flags = token_ids.numpy(), mask.numpy()
    m, lo, hi = scan(ids, flags, rows)
    if m and lo < 0:
        raise ValueError("token_ids: expected non-negative ids where mask is 1")
    vocab = int(hi) + 1
    if not m or vocab ** n > _CODE_LIMIT:
        return None
    bits = max(4, (2 * group_tokens - 1).bit_length())  # at most half full
    span_at, token = _work("span_at", m, np.int32), _work("token", m, np.int64)
    group, row_spans = _work("group", m, np.int64), _work("row_spans", rows.shape[0], np.int64)
    table = _work("table", 1 << bits, np.int64, 2)[: 1 << bits]
    u, read, counts = count_spans(ids, flags, rows, gid, correct, n, vocab, ignored, table,
                                  np.uint64(64 - bits), span_at, token, group,
                                  _work("state", m, np.int32, 5), row_spans)
    return (torch.from_numpy(span_at[:read]), torch.from_numpy(row_spans[: rows.shape[0]]),
            torch.from_numpy(group[:u]), torch.from_numpy(token[:u]),
            *torch.from_numpy(counts))


def write_span_rows(out: torch.Tensor, mask: torch.Tensor, rows: np.ndarray,
                    base: torch.Tensor, value: torch.Tensor, span_at: torch.Tensor, n: int,
                    reduce: str, tie: float) -> None:
    """Write the rows ``rows`` of the ``[B, T]`` output ``out``: at each real token the
    values of the spans covering it reduced as :func:`ktae.core.ngrams.reduce_from_starts`
    does (``reduce`` "mean" or "maxabs", ``tie``: 1 + its relative tolerance), in
    ``value``'s dtype, then in ``out``'s dtype plus ``base[i]``; 0 on padding."""
    write_spans = _kernels()[4]
    write_spans(out.numpy(), mask.numpy(), rows, base.detach().numpy(), value.detach().numpy(),
                span_at.numpy(), n, reduce == "mean", tie)
