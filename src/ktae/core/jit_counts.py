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

    @njit
    def scan(ids, mask, rows):
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

    @njit
    def count(ids, mask, rows, gid, correct, bound, pid, inverse, token, pair_group, state):
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

    @njit
    def write(out, mask, rows, base, value, inverse):
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

    return scan, count, write


def compiled() -> bool:
    """Whether the loops are compiled in this process (numba's first call compiles them,
    or loads them from its cache)."""
    return _compile.cache_info().currsize > 0


def usable(token_ids: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether a batch's ids and mask can be read by the loops: numba installed, CPU
    tensors, integer ids and a bool mask."""
    return (AVAILABLE and token_ids.device.type == "cpu" and mask.device.type == "cpu"
            and mask.dtype == torch.bool and not token_ids.is_floating_point()
            and token_ids.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8))


_local = threading.local()


def _scratch(bound: int, m: int):
    """This thread's work arrays of :func:`count_rows`, for ``m`` tokens and ids below
    ``bound``: kept from one chunk to the next (a thread runs one chunk at a time, and the
    arrays returned by ``count_rows`` are read before its next chunk), so that a chunk does
    not fault in fresh pages for them; grown when a chunk needs more."""
    have = getattr(_local, "arrays", None)
    if have is None or have[0].shape[0] < bound or have[1].shape[0] < m:
        bound = max(bound, have[0].shape[0] if have else 0)
        m = max(m, have[1].shape[0] if have else 0)
        _local.arrays = (np.empty(bound, np.int32), np.empty(m, np.int32),
                         np.empty(m, np.int64), np.empty(m, np.int64),
                         np.empty((m, 5), np.int32))
    return _local.arrays


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
    scan, count, _ = _kernels()
    ids, flags = token_ids.numpy(), mask.numpy()
    m, lo, hi = scan(ids, flags, rows)
    if m and lo < 0:
        raise ValueError("token_ids: expected non-negative ids where mask is 1")
    bound = int(hi) + 1
    if not m or not is_dense(bound, m):
        return None
    pid, inverse, token, group, state = _scratch(bound, m)
    u, counts = count(ids, flags, rows, gid, correct, bound, pid, inverse, token, group,
                      state)
    return (torch.from_numpy(inverse[:m]), torch.from_numpy(group[:u]),
            torch.from_numpy(token[:u]), *torch.from_numpy(counts))


def write_rows(out: torch.Tensor, mask: torch.Tensor, rows: np.ndarray, base: torch.Tensor,
               value: torch.Tensor, inverse: torch.Tensor) -> None:
    """Write the rows ``rows`` of the ``[B, T]`` output ``out``: ``base[i] +
    value[inverse[k]]`` at the k-th real token read (rows in the order of
    :func:`count_rows`), 0 on padding. ``base`` ``[R]`` and ``value`` ``[U]`` have
    ``out``'s dtype."""
    _, _, write = _kernels()
    write(out.numpy(), mask.numpy(), rows, base.numpy(), value.numpy(), inverse.numpy())
