"""KTAE's and prefix-value's passes over a chunk as compiled loops (numba), where it is
installed.

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
differs (group, then first occurrence).

Prefix-value (:mod:`ktae.core.prefix_value`) takes two loops over a chunk's rows:
:func:`prefix_class_rows` builds a trie of each group's responses, in a hash table keyed
by the exact (parent class, token) pair, so that no collision can merge two classes (the
torch path hashes whole prefixes and checks its classes afterwards), and counts each
class's responses and correct ones; :func:`write_prefix_rows` (``unit="token"``) then
writes each row's advantages with the operations of
:func:`ktae.core.prefix_value._credit_rows`, in the same order, so again the same bits.

The loops release the GIL: the chunks run on the task threads of
:mod:`ktae.core.chunk_pool`. numba compiles them on first use and caches the machine code
beside this file (``cache=True``).
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

    return tuple(njit(fn) for fn in (_scan, _count, _write, _count_spans, _write_spans,
                                     _prefix_classes, _prefix_write))


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


def _prefix_classes(ids, mask, rows, order, start, gid, correct, cls, count, right,
                    slot_prev, slot_token, slot_stamp, slot_rep, shift, epoch):
    # a trie of each group's responses in an open-addressing table of (parent class,
    # token) -> class slots; a slot stamped with an earlier group's epoch is free, so the
    # table is not cleared between groups (``order``: the rows in group order)
    hmask = slot_stamp.shape[0] - 1
    for k in range(cls.shape[0]):
        count[k] = 0
        right[k] = 0
    g_prev = np.int64(-1)
    for o in range(order.shape[0]):
        i = order[o]
        r = rows[i]
        g = np.int64(gid[i])
        if g != g_prev:
            epoch += 1
            g_prev = g
        ok = 1 if correct[i] else 0
        parent = -1 - g  # the group's root: the empty prefix
        k = start[i]
        for j in range(ids.shape[1]):
            if not mask[r, j]:
                continue
            tok = np.int64(ids[r, j])
            if tok < 0:
                return -1
            h = np.int64(((np.uint64(parent) * np.uint64(0x9E3779B97F4A7C15))
                          ^ (np.uint64(tok) * np.uint64(0xC2B2AE3D27D4EB4F))) >> shift)
            while True:
                if slot_stamp[h] != epoch:  # a new class, named by this token
                    slot_stamp[h] = epoch
                    slot_prev[h] = parent
                    slot_token[h] = tok
                    slot_rep[h] = k
                    rep = k
                    break
                if slot_prev[h] == parent and slot_token[h] == tok:
                    rep = slot_rep[h]
                    break
                h = (h + 1) & hmask
            cls[k] = rep
            count[rep] += 1
            right[rep] += ok
            parent = rep
            k += 1
    return epoch


def _prefix_write(out, mask, rows, start, length, cls, count, right, n_g, c_g, seq, chosen,
                  weight, keep_total):
    # prefix_value._credit_rows for unit="token", each operation in the same order
    zero = out.dtype.type(0)
    for i in range(rows.shape[0]):
        r = rows[i]
        s = start[i]
        n = length[i]
        keep = seq[i]
        scale = 0.0
        if n > 0:
            end = cls[s + n - 1]
            num = right[end] * n_g[i] - c_g[i] * count[end]
            if chosen[i] and num != 0:
                d_total = np.float64(num) / np.float64(count[end] * n_g[i])
                if keep_total:
                    scale = weight * seq[i] * np.float64(n) / d_total
                    keep = (1.0 - weight) * seq[i]
                else:
                    scale = weight * seq[i] / d_total
        root = np.float64(c_g[i]) / np.float64(max(n_g[i], 1))
        before = root
        k = s
        for j in range(out.shape[1]):
            if mask[r, j]:
                c = cls[k]
                v = np.float64(right[c]) / np.float64(count[c])
                out[r, j] = keep + scale * (v - before)
                before = v
                k += 1
            else:
                out[r, j] = zero


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
    scan, _, _, count_spans, *_ = _kernels()
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



@torch.no_grad()
def prefix_class_rows(token_ids: torch.Tensor, mask: torch.Tensor, rows: np.ndarray,
                      start: np.ndarray, gid: np.ndarray, correct: np.ndarray, n: int,
                      group_tokens: int):
    """The prefix classes of :func:`ktae.core.prefix_value.prefix_classes` in one pass: a
    trie of each group's responses, in a hash table keyed by exact (parent class, token)
    pairs, so no collision can merge two classes.

    Args:
        token_ids, mask: the batch's ``[B, T]`` ids and bool mask (:func:`usable`).
        rows: ``[R]`` int64 the batch rows read. start: ``[R]`` int64 the index of each
            row's first real token among the real tokens read (each row's real tokens get
            the next ones). gid: ``[R]`` int64 each row's group, dense. correct: ``[R]``
            bool. n: the real tokens of the rows.
        group_tokens: the most real tokens of one group among the rows (sizes the table).

    Returns:
        ``(cls, count, right)`` ``[N]`` int64: each real token's class, named by the index
        of its first token (rows of a group in the order of ``rows``), and each class's
        responses and correct responses at that index (0 at indices that name no class).
        Views of this thread's work arrays: read them before the thread's next call.

    Raises:
        ValueError: a negative token id where mask is 1.
    """
    loop = _kernels()[5]
    bits = max(4, (2 * group_tokens - 1).bit_length())  # at most half full
    cls, count = _work("prefix_cls", n, np.int64), _work("prefix_count", n, np.int64)
    right = _work("prefix_right", n, np.int64)
    stamp = _local.__dict__.get("prefix_stamp")
    if stamp is None or stamp.shape[0] < 1 << bits:
        # fresh stamps below every epoch: each slot starts free
        stamp = _local.prefix_stamp = np.full(1 << bits, -1, np.int64)
    order = np.argsort(gid, kind="stable")
    epoch = loop(token_ids.numpy(), mask.numpy(), rows, order, start, gid, correct, cls[:n],
                 count[:n], right[:n], _work("prefix_parent", 1 << bits, np.int64),
                 _work("prefix_token", 1 << bits, np.int64), stamp[: 1 << bits],
                 _work("prefix_rep", 1 << bits, np.int64), np.uint64(64 - bits),
                 _local.__dict__.get("prefix_epoch", 0))
    if epoch < 0:
        raise ValueError("token_ids: expected non-negative ids on real tokens")
    _local.prefix_epoch = epoch
    return cls[:n], count[:n], right[:n]


def write_prefix_rows(out: torch.Tensor, mask: torch.Tensor, rows: np.ndarray,
                      start: np.ndarray, length: np.ndarray, classes, n_g: np.ndarray,
                      c_g: np.ndarray, seq: np.ndarray, chosen: np.ndarray, weight: float,
                      keep_total: bool) -> None:
    """Write the rows ``rows`` of the ``[B, T]`` output ``out`` (float32 or float64) with
    the prefix-value advantages of ``unit="token"``: the operations of
    :func:`ktae.core.prefix_value._credit_rows` in the same order, from ``classes`` (what
    :func:`prefix_class_rows` returned for the same rows and ``start``), each row's
    ``length``, its group's responses ``n_g`` and correct ones ``c_g``, its base advantage
    ``seq`` (float64) and whether it is ``chosen``; 0 on padding."""
    write = _kernels()[6]
    write(out.numpy(), mask.numpy(), rows, start, length, *classes, n_g, c_g, seq, chosen,
          float(weight), bool(keep_total))
