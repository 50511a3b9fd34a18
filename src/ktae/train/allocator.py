"""Freed memory kept for reuse, so that the update's large tensors skip fresh page faults.

glibc's ``malloc`` serves every block above its mmap threshold (at most 32 MiB by
default) from pages mapped for it alone, and unmaps them when the block is freed. The
update allocates several vocabulary-sized tensors per micro-batch (the recipe's logits,
their float32 copy, log-softmax, softmax, the entropy's product, the logits' gradient:
50 to 100 MB each), so every one of them faults in tens of thousands of fresh, zeroed
pages, and the kernel's time for that is a large part of the log-softmax's cost on the
CPU (studies/step-time/report.md, "Freed memory kept for reuse").

:func:`keep_freed_memory` raises glibc's mmap threshold and its trim threshold to
:data:`KEEP_BYTES`: blocks below it come from the heap, and up to that much freed memory
at the heap's top stays mapped for the next micro-batch. The cost is resident memory: a
process keeps what its peak allocated instead of handing it back between passes.

``ktae train`` calls it once per process (:func:`ktae.train.session.train`);
``KTAE_KEEP_FREED_MEMORY=0`` leaves ``malloc`` as it is. Elsewhere than on glibc (or with
a glibc that refuses the setting) it changes nothing and says so by its return value.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

KEEP_BYTES = 1 << 30
"""1 GiB: above the largest block the recipe's update allocates, and the most freed memory
kept at the heap's top."""
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""``mallopt`` parameters, as glibc's ``malloc.h`` numbers them."""
ENV = "KTAE_KEEP_FREED_MEMORY"


def keep_freed_memory(limit: int = KEEP_BYTES) -> bool:
    """Sets glibc's mmap and trim thresholds to ``limit`` bytes; whether it did.

    False (and nothing changed) where ``$KTAE_KEEP_FREED_MEMORY`` is ``0``, where the C
    library is not glibc, or where glibc refuses the value.

    Raises:
        ValueError: ``limit`` is not a positive integer that fits a C ``int``.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit < 2**31:
        raise ValueError(f"limit: expected a positive number of bytes below 2**31, got {limit!r}")
    if os.environ.get(ENV, "1").strip() == "0":
        return False
    libc = _glibc()
    if libc is None:
        return False
    # the trim threshold first: a refused mmap threshold then leaves a harmless setting
    return bool(libc.mallopt(M_TRIM_THRESHOLD, limit)) and bool(
        libc.mallopt(M_MMAP_THRESHOLD, limit))


def _glibc():
    """The process's C library if it is glibc (it has ``gnu_get_libc_version``), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return libc
