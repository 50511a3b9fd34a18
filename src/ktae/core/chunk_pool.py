"""Per-step CPU work without per-operation barriers: one-thread callers, coarse tasks.

KTAE's pass over a batch splits it into chunks of whole groups (statistics never cross
groups). A chunk's pass is a few dozen tensor operations over its tokens, and the other
per-step rules (calibrations, GTPO) are a few dozen passes over ``[B, T]``. Run with
torch's intra-op threads, every one of those operations is a parallel region that ends
only when all threads are done with it. On an idle machine that costs little; on a machine
where other processes compete for the cores (a training driver next to data loaders,
reward workers, generation), a descheduled thread makes every region wait for its next
time slice. Measured on a 2-core machine with one or two busy processes (paper-scale batch,
56 chunks, about 2,000 parallel regions), KTAE ran 4x to 22x slower than one sort of its
keys, and slower than on one thread; TACO's calibration, STAPO's and GTPO's slowed by
similar factors (``benchmarks/bench_contention.py``).

So the public entry points run with one intra-op thread in the calling thread
(:func:`one_thread_caller`), and work that splits into independent chunks runs as tasks on
a small pool of threads (as many as the caller's own thread count), each with one intra-op
thread (:func:`run_tasks`). Nothing waits for another thread inside a task: a core taken by
another process just runs fewer chunks, and the only wait is for the last chunk of the
batch. Torch releases the GIL inside its kernels, so the threads run in parallel. Which
thread runs a chunk cannot change its values, so results do not depend on the thread
count.

How the one-thread setting is made: with torch's OpenMP backend (its CPU builds on Linux,
macOS and Windows), ``torch.set_num_threads`` sets the calling thread's own OpenMP thread
count and a process-wide default that threads read when they first use torch. A caller's
setting is restored when the entry point returns, so it never changes from the caller's
point of view; threads that first use torch while a call runs start with one thread. Other
backends, and a caller already on one thread, run everything in the calling thread as it
is; accelerator tensors are not spread over CPU threads.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = 0
_caller = threading.local()  # .threads: the caller's thread count inside one_thread_caller


@cache
def _openmp_backend() -> bool:
    return "OpenMP" in torch.__config__.parallel_info()


def _get_pool(size: int) -> ThreadPoolExecutor:
    """The process's task pool of ``size`` threads (a new one when the caller's thread
    count changed, and after a fork, whose child inherits the pool but not its threads)."""
    global _pool, _pool_size, _pool_pid
    with _lock:
        if _pool is None or _pool_size != size or _pool_pid != os.getpid():
            if _pool is not None and _pool_pid == os.getpid():
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="ktae-task")
            _pool_size, _pool_pid = size, os.getpid()
        return _pool


def _one_thread(fn: Callable[[T], R], item: T) -> R:
    if torch.get_num_threads() != 1:  # this pool thread's own setting
        torch.set_num_threads(1)
    return fn(item)


def spreads_over_threads(device: torch.device) -> bool:
    """Whether work on ``device`` in this thread would use more than one CPU thread."""
    threads = getattr(_caller, "threads", None) or torch.get_num_threads()
    return device.type == "cpu" and threads > 1 and _openmp_backend()


def one_thread_caller(fn: Callable[..., R]) -> Callable[..., R]:
    """Run ``fn`` with one intra-op thread in the calling thread, keeping the caller's
    thread count for :func:`run_tasks` inside it (and restoring it on return)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        threads = torch.get_num_threads()
        if getattr(_caller, "threads", None) is not None or threads == 1 or not _openmp_backend():
            return fn(*args, **kwargs)
        _caller.threads = threads
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            _caller.threads = None
            torch.set_num_threads(threads)

    return call


def run_tasks(fn: Callable[[T], R], items: Iterable[T], *, device: torch.device) -> list[R]:
    """``[fn(x) for x in items]``, each call with one torch thread, in parallel on CPU.

    Args:
        fn: a function of one item; calls must be independent (they may run at once and in
            any order; writes to disjoint parts of one tensor are fine).
        items: the work items.
        device: where the tensors live; only CPU work is spread over threads.

    Returns:
        The results in the order of ``items``. The first exception raised by a call is
        raised here, after every call has finished.
    """
    items = list(items)
    own = torch.get_num_threads()
    threads = getattr(_caller, "threads", None) or own
    if device.type != "cpu" or threads == 1 or not _openmp_backend() or not items:
        return [fn(x) for x in items]
    pool = _get_pool(threads)
    try:
        futures = [pool.submit(_one_thread, fn, x) for x in items]
        errors = [f.exception() for f in futures]
    finally:
        torch.set_num_threads(own)  # the process-wide default the pool threads changed
    for e in errors:
        if e is not None:
            raise e
    return [f.result() for f in futures]


def group_chunks(gid: torch.Tensor, num_groups: int, row_len: torch.Tensor, max_tokens: int,
                  keep: torch.Tensor | None = None):
    """Split the groups (those of ``keep`` when given) into consecutive ranges of about
    ``max_tokens`` real tokens.

    Yields ``(rows, first_group, num_groups_in_chunk)``, ``rows`` a slice when every
    chunk's rows are contiguous in the batch (groups stored one after the other), else an
    index tensor. Key-token statistics never cross groups, so chunks are independent; they
    bound the memory of the sort and its companions (and shorter sorts are cheaper per
    element), and are the tasks of :func:`run_tasks`. A handful of chunks
    per batch: this is not a loop over groups.
    """
    dev = gid.device
    if keep is not None:
        row_len = row_len * keep.index_select(0, gid)
    per_group = torch.zeros(num_groups, dtype=torch.int64, device=dev).index_add_(0, gid, row_len)
    before = torch.cumsum(per_group, 0) - per_group
    chunk_of_group = before // max(1, max_tokens)
    if keep is not None:
        chunk_of_group = torch.where(keep, chunk_of_group, -1)  # -1: in no chunk
    chunk_of_row = chunk_of_group[gid]
    ids = torch.unique(chunk_of_group)
    ids = ids[ids >= 0]
    group_ids = torch.arange(num_groups, device=dev)
    in_chunk = chunk_of_group >= 0
    first = torch.full((int(chunk_of_group.max()) + 1 if ids.numel() else 0,), num_groups,
                       dtype=torch.int64, device=dev)
    last = torch.full_like(first, -1)
    first.scatter_reduce_(0, chunk_of_group[in_chunk], group_ids[in_chunk], reduce="amin")
    last.scatter_reduce_(0, chunk_of_group[in_chunk], group_ids[in_chunk], reduce="amax")
    spans = [(int(first[i]), int(last[i]) + 1) for i in ids.tolist()]
    if keep is None and bool((chunk_of_row[1:] >= chunk_of_row[:-1]).all()):  # slices
        bounds = torch.searchsorted(chunk_of_row, ids, right=True)
        start = 0
        for (g0, g1), end in zip(spans, bounds.tolist(), strict=True):
            yield slice(start, end), g0, g1 - g0
            start = end
        return
    order = torch.argsort(chunk_of_row, stable=True)
    sorted_chunks = chunk_of_row[order]
    starts = torch.searchsorted(sorted_chunks, ids).tolist()
    ends = torch.searchsorted(sorted_chunks, ids, right=True).tolist()
    for (g0, g1), a, b in zip(spans, starts, ends, strict=True):
        yield order[a:b], g0, g1 - g0


#: :func:`outside_rows_tasks`: elements per task.
BASE_BLOCK = 1 << 20


def outside_rows_tasks(out: torch.Tensor, mask: torch.Tensor, gid: torch.Tensor,
                       keep: torch.Tensor | None, seq: torch.Tensor) -> list[Callable[[], None]]:
    """Tasks for :func:`run_tasks` that write the rows of a ``[B, T]`` output that no chunk
    of groups writes (the groups outside ``keep``), in blocks of rows: ``seq`` on their
    real tokens, 0 on padding. A block whose ``seq`` is all 0 (every row of a group whose
    rewards are equal, as binary rewards of a one-class group are) is only zeroed. With
    the chunks zeroing their own rows (:func:`zero_rows`) just before they write them,
    every element is written once, by the tasks, with no serial fill of the output."""
    if keep is None:
        return []
    rows = (~keep.index_select(0, gid)).nonzero().squeeze(1)
    width = max(1, mask.shape[1])
    step = max(1, BASE_BLOCK // width) if mask.device.type == "cpu" else max(1, rows.numel())
    zero = torch.zeros((), dtype=out.dtype, device=out.device)

    def block(r: torch.Tensor) -> None:
        base = seq.index_select(0, r).to(out.dtype)
        if not bool(base.any()):
            out.index_fill_(0, r, 0)
            return
        out.index_copy_(0, r, torch.where(mask.index_select(0, r), base[:, None], zero))

    return [functools.partial(block, rows[i:i + step]) for i in range(0, rows.numel(), step)]


def new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A call's ``[B, T]`` output, uninitialised: its tasks write every element (the
    chunks' rows, :func:`zero_rows`, and the others, :func:`outside_rows_tasks`)."""
    return torch.empty(shape, dtype=dtype, device=device)


def zero_rows(out: torch.Tensor, rows: slice | torch.Tensor) -> None:
    """Zero the rows ``rows`` of ``out``: a chunk's, just before it writes their real
    tokens (the pages are then in cache, and each task zeroes its own share)."""
    if isinstance(rows, slice):
        out[rows].zero_()
    else:
        out.index_fill_(0, rows, 0)
