"""DAPO dynamic sampling (docs/method.md §11): keep only groups that carry a learning signal.

A group whose responses are all correct or all incorrect has zero advantage under every
group baseline (and zero KTAE key-token values), so it only dilutes the batch. Dynamic
sampling drops such groups and refills the batch with groups from extra generation rounds
on fresh prompts, up to a bounded number of rounds. When the bound is hit the batch is
topped up with the dropped groups (earliest round first) so its size stays fixed; the
number of rounds and the informative fraction are logged.

Pure tensor helpers; the trainer (``trainer.py``) runs the generation rounds.
"""

from __future__ import annotations

import torch

# key -> (padding side) for the per-row tensors of a TRL generation batch
_PAD_SIDE = {
    "prompt_ids": "left",
    "prompt_mask": "left",
    "completion_ids": "right",
    "completion_mask": "right",
    "old_per_token_logps": "right",
    "ref_per_token_logps": "right",
    "sampling_per_token_logps": "right",
    "importance_sampling_ratio": "right",
    "tool_mask": "right",
}
NEED_PREFIX = "ktae_need_"
"""Batch keys of the needs the trainer computes at rollout time (:func:`need_key`), each a
``[b, T]`` per-token value, right-padded like the completions."""
MERGEABLE_KEYS = frozenset(_PAD_SIDE)
"""TRL's keys of a generation batch that :func:`merge_rows` knows how to concatenate
(besides the needs': :func:`mergeable`)."""


def need_key(name: str) -> str:
    """The batch key of need ``name``'s value (:class:`ktae.core.needs.Need`)."""
    return NEED_PREFIX + name


def mergeable(key: str) -> bool:
    """Whether :func:`merge_rows` concatenates batch key ``key``."""
    return key in _PAD_SIDE or key.startswith(NEED_PREFIX)


def informative_groups(correct: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Which groups hold both a correct and an incorrect response.

    Args:
        correct: ``[b]`` bool, rows in contiguous blocks of ``num_generations`` per prompt.
        num_generations: G.

    Returns:
        ``[b // G]`` bool.
    """
    if correct.dim() != 1 or correct.numel() % num_generations:
        raise ValueError(f"correct: expected a 1-D tensor whose length is a multiple of "
                         f"num_generations={num_generations}, got shape {tuple(correct.shape)}")
    c = correct.bool().view(-1, num_generations)
    return c.any(dim=1) & ~c.all(dim=1)


def select_groups(informative: list[torch.Tensor], need: int) -> list[tuple[int, int]]:
    """Pick ``need`` groups as ``(round, group)`` pairs from the rounds generated so far.

    Informative groups come first, in generation order; if there are fewer than
    ``need``, the rest is filled with uninformative groups, earliest round first.

    Raises:
        ValueError: when all rounds together hold fewer than ``need`` groups.
    """
    total = sum(int(x.numel()) for x in informative)
    if need < 1 or need > total:
        raise ValueError(f"need: expected 1..{total} groups, got {need}")
    good = [(r, int(g)) for r, x in enumerate(informative) for g in torch.nonzero(x).flatten()]
    bad = [(r, int(g)) for r, x in enumerate(informative) for g in torch.nonzero(~x).flatten()]
    return (good + bad)[:need]


def _pad_to(t: torch.Tensor, length: int, value, side: str) -> torch.Tensor:
    extra = length - t.shape[1]
    if extra == 0:
        return t
    filler = t.new_full((t.shape[0], extra, *t.shape[2:]), value)
    return torch.cat([filler, t] if side == "left" else [t, filler], dim=1)


def merge_rows(batches: list[dict], rows: list[torch.Tensor], pad_values: dict,
               extra: dict[str, str] | None = None) -> dict:
    """Concatenate the chosen rows of several generation batches into one.

    Args:
        batches: TRL generation batches (dicts of ``[b_r, T_r]`` tensors).
        rows: for each batch, the ``[k_r]`` row indices to keep.
        pad_values: key -> padding value (e.g. the pad token id for ``*_ids``); keys
            absent here pad with 0.
        extra: more per-row keys to merge, key -> padding side (``"left"``/``"right"``).

    Returns:
        A dict with the :func:`mergeable` keys (and ``extra``) present in the first batch,
        each ``[sum k_r, max T_r]``: prompts left-padded, completions
        right-padded.
    """
    sides = {**_PAD_SIDE, **(extra or {})}
    sides.update({k: "right" for k in batches[0] if k.startswith(NEED_PREFIX)})
    keys = [k for k in batches[0] if k in sides]
    out = {}
    for key in keys:
        parts = [b[key][idx] for b, idx in zip(batches, rows, strict=True)]
        if parts[0].dim() == 1:
            out[key] = torch.cat(parts)
            continue
        length = max(p.shape[1] for p in parts)
        value = pad_values.get(key, 0)
        out[key] = torch.cat([_pad_to(p, length, value, sides[key]) for p in parts])
    return out
