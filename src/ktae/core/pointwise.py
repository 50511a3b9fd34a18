"""Transcendental functions whose result for an element does not depend on its neighbours.

Torch's CPU kernels evaluate ``exp``, ``log2``, ``asin``, ``lgamma`` and ``sigmoid`` over
an array with vector instructions in blocks of a few elements, and the last, incomplete
block with the scalar C library function; the two can differ in the last bit. Which
elements fall in that tail depends on the array's length, so the value of one table or one
token would depend on which other tables or tokens share its chunk of the batch (or a
thread's share of it). These wrappers evaluate a CPU array as a whole number of blocks
(64 elements covers every vector width torch uses): the leading whole blocks in place, the
last few elements padded to one block, so that every element takes the vector path, and
KTAE's values do not depend on chunking or thread count. No copy of the array is made.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_BLOCK = 64


def _blockwise(fn: Callable[..., torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    if x.device.type != "cpu":
        return fn(x)
    flat = x.reshape(-1).contiguous()
    n = flat.numel()
    whole = n - n % _BLOCK
    if whole == n:
        return fn(flat).reshape(x.shape)
    out = torch.empty_like(flat)
    if whole:
        fn(flat[:whole], out=out[:whole])
    tail = flat.new_zeros(_BLOCK)
    tail[: n - whole] = flat[whole:]
    out[whole:] = fn(tail)[: n - whole]
    return out.reshape(x.shape)


def exp(x: torch.Tensor) -> torch.Tensor:
    return _blockwise(torch.exp, x)


def log2(x: torch.Tensor) -> torch.Tensor:
    return _blockwise(torch.log2, x)


def asin(x: torch.Tensor) -> torch.Tensor:
    return _blockwise(torch.asin, x)


def lgamma(x: torch.Tensor) -> torch.Tensor:
    return _blockwise(torch.lgamma, x)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return _blockwise(torch.sigmoid, x)
