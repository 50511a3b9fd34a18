"""Argument validation shared by every public function: errors name the argument."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def as_tensor(x, name: str, *, device: torch.device | None = None) -> torch.Tensor:
    """Turn ``x`` (tensor, array, list) into a tensor without copying tensors.

    Refuses, naming ``name``: meta tensors (no data), strings and other non-numeric values.
    """
    if isinstance(x, torch.Tensor):
        check_has_data(x, name)
        return x if device is None else x.to(device)
    try:
        arr = np.asarray(x)
    except Exception as e:  # noqa: BLE001 - numpy raises many kinds (ragged lists, ...)
        raise ValueError(f"{name}: expected a tensor or array, got {type(x).__name__}") from e
    if arr.dtype == object:
        raise ValueError(f"{name}: expected a numeric tensor or array, got objects")
    if arr.dtype.kind not in "biufc":
        what = "strings" if arr.dtype.kind in "US" else f"dtype {arr.dtype}"
        raise ValueError(f"{name}: expected numbers, got {what}")
    try:
        return torch.as_tensor(arr, device=device)
    except (TypeError, RuntimeError) as e:
        raise ValueError(f"{name}: cannot be made a tensor ({e})") from e


def check_has_data(x: torch.Tensor, name: str) -> None:
    """Refuse a meta tensor (shape only, no values), naming ``name``."""
    if x.is_meta:
        raise ValueError(f"{name}: expected a tensor with data, got a meta tensor "
                         "(materialise it on a real device first)")


def check_float(x: torch.Tensor, name: str, *, ndim: int | Sequence[int]) -> torch.Tensor:
    """Require a finite floating (or integer, converted) tensor of the given rank."""
    ndims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if x.dim() not in ndims:
        raise ValueError(f"{name}: expected {' or '.join(f'{n}-D' for n in ndims)}, "
                         f"got shape {tuple(x.shape)}")
    if x.dtype == torch.bool or x.is_complex():
        raise ValueError(f"{name}: expected a real-valued tensor, got dtype {x.dtype}")
    if not x.is_floating_point():
        x = x.to(torch.float32)
    if x.numel() and not torch.isfinite(x).all():
        raise ValueError(f"{name}: contains NaN or inf")
    return x


def check_mask(mask: torch.Tensor, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Require a 0/1 (or bool) mask of exactly ``shape``; return it as bool."""
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point() and mask.numel() and not torch.isfinite(mask).all():
        raise ValueError(f"{name}: expected values 0 or 1, got NaN/inf")
    if mask.numel() and not ((mask == 0) | (mask == 1)).all():
        raise ValueError(f"{name}: expected values 0 or 1 only")
    return mask != 0

