"""Reward shaping terms (pure torch).

DAPO's overlong reward shaping (docs/method.md §11; DAPO paper Eq. 13, "soft overlong
punishment"): responses that run into the last ``cache_length`` tokens of the length
budget get a linearly growing penalty, and truncated ones the full penalty.
"""

from __future__ import annotations

import math

import torch

from ktae.core.checks import as_tensor


def overlong_penalty(lengths, *, max_length: int, cache_length: int = 512,
                     factor: float = 1.0) -> torch.Tensor:
    """Soft overlong penalty to add to each response's reward (docs/method.md §11).

    With ``L_max = max_length`` and ``L_c = cache_length``::

        R(y) = 0                              if |y| <= L_max - L_c
             = ((L_max - L_c) - |y|) / L_c    if L_max - L_c < |y| <= L_max
             = -1                             if |y| > L_max

    times ``factor``.

    Args:
        lengths: ``[B]`` response lengths in tokens (non-negative integers; tensor, array
            or list).
        max_length: ``L_max`` > 0, the response length budget.
        cache_length: ``L_c`` in [0, max_length]. ``0`` is the hard limit: no penalty up to
            ``L_max``, -1 beyond.
        factor: penalty scale >= 0 (DAPO uses 1.0).

    Returns:
        ``[B]`` float32 penalties in ``[-factor, 0]``, on the device of ``lengths``.
    """
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= 0:
        raise ValueError(f"max_length: expected a positive integer, got {max_length!r}")
    if isinstance(cache_length, bool) or not isinstance(cache_length, int) \
            or not 0 <= cache_length <= max_length:
        raise ValueError(f"cache_length: expected an integer in [0, max_length={max_length}], "
                         f"got {cache_length!r}")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
            or not math.isfinite(factor) or factor < 0:
        raise ValueError(f"factor: expected a finite number >= 0, got {factor!r}")
    y = as_tensor(lengths, "lengths")
    if y.dim() != 1:
        raise ValueError(f"lengths: expected 1-D, got shape {tuple(y.shape)}")
    if y.dtype == torch.bool or y.is_complex():
        raise ValueError(f"lengths: expected integer lengths, got dtype {y.dtype}")
    if y.is_floating_point():
        if y.numel() and (not torch.isfinite(y).all() or (y != y.round()).any()):
            raise ValueError("lengths: expected whole numbers of tokens")
    if y.numel() and (y < 0).any():
        raise ValueError("lengths: expected non-negative lengths")
    y = y.to(torch.float64)
    start = float(max_length - cache_length)
    if cache_length == 0:
        soft = torch.zeros_like(y)
    else:
        soft = (start - y) / cache_length
    out = torch.where(y <= start, torch.zeros_like(y), soft)
    out = torch.where(y > max_length, torch.full_like(y, -1.0), out)
    return (out * factor).to(torch.float32)
