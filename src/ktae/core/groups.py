"""Group ids: any labels in, dense integer ids out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ktae.core.checks import check_has_data


def group_index(group, batch_size: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Map group labels to dense ids ``0..P-1`` (in order of first appearance).

    Args:
        group: ``[B]`` integer tensor/array, or any sequence of hashable ids (verl passes
            string uids). Groups may be uneven in size and need not be contiguous.
        batch_size: B, the number of responses.
        device: where the returned ids live.

    Returns:
        ``(ids, P)``: int64 tensor ``[B]`` on ``device`` and the number of groups.
    """
    if isinstance(group, torch.Tensor):
        check_has_data(group, "group")
        if group.dim() != 1 or group.shape[0] != batch_size:
            raise ValueError(f"group: expected shape ({batch_size},), got {tuple(group.shape)}")
        if group.is_floating_point() or group.is_complex() or group.dtype == torch.bool:
            raise ValueError(f"group: expected integer ids, got dtype {group.dtype}")
        _, inverse = torch.unique(group.to(device), return_inverse=True)
        return _first_appearance_order(inverse), _count(inverse)
    if isinstance(group, np.ndarray) and group.dtype.kind in "iu":
        return group_index(torch.from_numpy(np.ascontiguousarray(group)), batch_size, device)
    if not isinstance(group, (Sequence, np.ndarray)) or isinstance(group, (str, bytes)):
        raise ValueError(f"group: expected a tensor, array or sequence of ids, "
                         f"got {type(group).__name__}")
    if len(group) != batch_size:
        raise ValueError(f"group: expected {batch_size} ids, got {len(group)}")
    lookup: dict = {}
    try:
        ids = [lookup.setdefault(g, len(lookup)) for g in group]
    except TypeError as e:
        raise ValueError("group: ids must be hashable") from e
    return torch.tensor(ids, dtype=torch.long, device=device), len(lookup)


def _count(inverse: torch.Tensor) -> int:
    return int(inverse.max().item()) + 1 if inverse.numel() else 0


def _first_appearance_order(inverse: torch.Tensor) -> torch.Tensor:
    """Relabel sorted-unique ids so that groups are numbered by first appearance."""
    n = _count(inverse)
    if n == 0:
        return inverse.long()
    pos = torch.arange(inverse.numel(), device=inverse.device)
    first = torch.full((n,), inverse.numel(), dtype=torch.long, device=inverse.device)
    first.scatter_reduce_(0, inverse, pos, reduce="amin")
    rank = torch.empty_like(first)
    rank[torch.argsort(first)] = torch.arange(n, device=inverse.device)
    return rank[inverse]

