"""The one rule for bfloat16 work in the tests: at the recipe's shapes only on a CPU that
multiplies bfloat16 natively, as ktae itself decides it for ``--bf16``
(:func:`ktae.train.precision.native_bf16`: the CPU's ``avx512_bf16``/``amx_bf16`` flags
under oneDNN's ISA limit ``ONEDNN_MAX_CPU_ISA``, or Arm's BF16).

Elsewhere PyTorch emulates every bfloat16 product in float32 arithmetic, far slower than
float32 itself (``python benchmarks/bf16_path.py`` times both), and a test's bfloat16
work runs at small shapes, in float32 where what it checks is not the dtype, or skips
with :data:`needs_native_bf16`'s reason.
"""

from __future__ import annotations

import pytest

from ktae.train.precision import native_bf16

NATIVE_BF16 = native_bf16()
"""This CPU's flag for native bfloat16 products under the ISA limit, or None."""

needs_native_bf16 = pytest.mark.skipif(
    NATIVE_BF16 is None,
    reason="bfloat16 products at the recipe's shapes: this CPU has no native bfloat16 "
           "(avx512_bf16 or amx_bf16 within ONEDNN_MAX_CPU_ISA, or Arm BF16), and "
           "emulated products take minutes here")
"""Marks a test whose bfloat16 work cannot shrink: it runs only with native products."""
