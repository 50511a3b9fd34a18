"""DAPO overlong reward shaping (docs/method.md §11)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ktae.core.shaping import overlong_penalty
from ktae.rewards import overlong_penalty as reexported


def reference_penalty(length: int, max_length: int, cache: int, factor: float) -> float:
    start = max_length - cache
    if length <= start:
        return 0.0
    if length <= max_length:
        return factor * (start - length) / cache
    return -factor


def test_values_match_the_piecewise_definition():
    lengths = [0, 100, 3584, 3585, 3840, 4095, 4096, 4097, 10_000]
    got = overlong_penalty(lengths, max_length=4096, cache_length=512)
    want = [reference_penalty(n, 4096, 512, 1.0) for n in lengths]
    assert got.dtype == torch.float32 and got.shape == (9,)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32))
    assert got[3].item() == pytest.approx(-1 / 512)
    assert got[4].item() == pytest.approx(-0.5)
    assert got[6].item() == pytest.approx(-1.0)  # exactly L_max: end of the soft zone
    assert got[7].item() == -1.0


@pytest.mark.parametrize("max_length, cache, factor", [(10, 4, 1.0), (10, 10, 0.5),
                                                      (7, 1, 2.0), (10, 0, 1.0)])
def test_matches_reference_everywhere(max_length, cache, factor):
    lengths = torch.arange(0, 2 * max_length + 2)
    got = overlong_penalty(lengths, max_length=max_length, cache_length=cache, factor=factor)
    want = [reference_penalty(int(n), max_length, cache, factor) if cache else
            (0.0 if n <= max_length else -factor) for n in lengths]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32))
    assert (got <= 0).all() and (got >= -factor).all()
    # monotone non-increasing in length
    assert (got[1:] <= got[:-1]).all()


def test_inputs_and_reexport():
    assert reexported is overlong_penalty
    a = overlong_penalty(np.array([5, 9]), max_length=10, cache_length=4)
    b = overlong_penalty(torch.tensor([5.0, 9.0]), max_length=10, cache_length=4)
    torch.testing.assert_close(a, b)
    assert overlong_penalty([], max_length=10, cache_length=4).shape == (0,)
    assert overlong_penalty([3], max_length=10, cache_length=4, factor=0.0).item() == 0.0


@pytest.mark.parametrize("kwargs, name", [
    ({"max_length": 0}, "max_length"), ({"max_length": 10.5}, "max_length"),
    ({"max_length": 10, "cache_length": 11}, "cache_length"),
    ({"max_length": 10, "cache_length": -1}, "cache_length"),
    ({"max_length": 10, "cache_length": 4, "factor": -1.0}, "factor"),
    ({"max_length": 10, "cache_length": 4, "factor": float("inf")}, "factor"),
])
def test_argument_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        overlong_penalty([1, 2], **kwargs)


@pytest.mark.parametrize("lengths", [[-1, 2], [1.5], [[1, 2]], [True, False]])
def test_bad_lengths(lengths):
    with pytest.raises(ValueError, match="lengths"):
        overlong_penalty(torch.tensor(lengths) if lengths == [True, False] else lengths,
                         max_length=10, cache_length=4)
