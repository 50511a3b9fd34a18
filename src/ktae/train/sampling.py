"""One categorical draw per row by the inverse of the cumulative distribution, for sampling.

``transformers`` 5 samples each decoding step's next tokens with
``torch.multinomial(probs, num_samples=1)``. On the CPU, PyTorch draws that as
``argmax(probs / q)`` with ``q`` one exponential variate **per vocabulary entry**: 49,152
logarithms a row, 50 ms for the recipe's 32 rows on one thread, about a sixth of a
decoding step. :func:`categorical` draws from the same distribution with one uniform
variate a row: it finds where ``u`` times the row's total falls in the row's cumulative
sums.

It does so in two levels, so that float32's rounding of a long cumulative sum does not
move small probabilities: the row is cut into blocks of :data:`BLOCK` entries, a block
is drawn from the blocks' sums (cumulated in float64), then an entry within it from the
block's own cumulative sums (float32), computed for the chosen block alone. An entry of
zero probability (top-k, top-p, min-p) is never drawn: the search returns the first entry
whose cumulative sum exceeds the point, and the point stays below the chosen block's
total.

:func:`fast_multinomial` switches it on for a block (the trainer's sampling): within it
``torch.multinomial`` draws a single sample of a 2-D floating-point tensor this way; every
other call (several samples, with replacement, a ``generator``, ``out``) goes to
PyTorch's own. The draws come from the global generator, so a seeded run samples the
same tokens again, but not the tokens PyTorch's own sampler would draw from that seed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

BLOCK = 256
"""Entries per block of the first level."""


def categorical(probs: torch.Tensor) -> torch.Tensor:
    """``[rows, 1]`` int64: one index a row of ``[rows, n]`` non-negative ``probs``, drawn
    with probability proportional to its entry (the rows need not sum to 1; each must
    have a positive sum)."""
    rows, n = probs.shape
    blocks = -(-n // BLOCK)
    padded = probs if n == blocks * BLOCK else torch.nn.functional.pad(
        probs, (0, blocks * BLOCK - n))
    cut = padded.reshape(rows, blocks, BLOCK)
    block_sums = cut.sum(-1).double()  # a reduction, not a scan: a tenth of a cumsum's time
    across = block_sums.cumsum(-1)  # [rows, blocks]
    total = across[:, -1:]
    point = torch.rand(rows, 1, dtype=torch.float64, device=probs.device) * total
    point = torch.minimum(point, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(across, point, right=True).clamp_(max=blocks - 1)  # [rows, 1]
    before = (across.gather(1, block) - block_sums.gather(1, block))
    chosen = cut.gather(1, block[:, :, None].expand(rows, 1, BLOCK))[:, 0].cumsum(-1)
    last = chosen[:, -1:]
    rest = (point - before).clamp_(min=0).to(chosen.dtype)
    rest = torch.minimum(rest, torch.nextafter(last, torch.zeros_like(last)))
    entry = torch.searchsorted(chosen, rest, right=True).clamp_(max=BLOCK - 1)
    return block * BLOCK + entry


_multinomial = torch.multinomial


def _fast(input, num_samples, replacement=False, *, generator=None, out=None):
    if (num_samples == 1 and generator is None and out is None and input.dim() == 2
            and input.is_floating_point() and input.size(1) > 1):
        return categorical(input)
    return _multinomial(input, num_samples, replacement, generator=generator, out=out)


@contextmanager
def fast_multinomial() -> Iterator[None]:
    """Within the block, ``torch.multinomial``'s single draws use :func:`categorical`
    (module docstring); PyTorch's own comes back after."""
    own = torch.multinomial
    torch.multinomial = _fast
    try:
        yield
    finally:
        torch.multinomial = own
