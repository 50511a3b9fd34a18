"""LoRA layers' forward pass as one product accumulated into the frozen layer's (log-prob passes).

peft's ``lora.Linear.forward`` (peft 0.21 and 0.22) adds a plain LoRA adapter to its frozen layer
as ``result + lora_B(lora_A(dropout(x))) * scaling``: three tensors the size of the
layer's output (``B``'s product, its scaled copy, the sum) and, in the backward pass, a
fourth (the gradient of the scaling). :func:`fused_lora_forward` computes the same

    y = x W^T (+ b) + scaling * (x A^T) B^T

with the second product accumulated into the first in place (``addmm_``, ``alpha =
scaling``): one output-sized tensor, none in the backward pass. The values differ from
peft's by float rounding only (``scaling`` is applied to the product instead of after
it; ``tests/test_lora_update.py`` compares losses and adapter gradients).

:func:`fused_lora` switches it on for a block (:func:`ktae.train.logprob_head.full_logps`),
module by module, only where the layer is peft's plain case: one active adapter, no DoRA
or other variant, no dropout, no adapter bias, not merged, adapters enabled, an
``nn.Linear`` base layer, the input in the adapter's and the layer's dtype; under
autocast (``--bf16``) every factor is cast to autocast's dtype first, as autocast would
cast them for peft's products (its casts do not reach an in-place product); every other
layer keeps peft's forward.
The log-prob head's passes, with gradients or without (old policy, reference), run it,
so that the old and the current log-probabilities come from the same arithmetic.
Sampling on the CPU (:func:`lora_for_sampling`) runs it for a bfloat16 base, and for a
float32 base :func:`merged_lora`: the frozen layer alone with ``W + scaling B A``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

KNOWN_PEFT = ("0.17", "0.18", "0.19", "0.20", "0.21", "0.22")
"""peft minor versions whose ``lora.Linear.forward`` :func:`fused_lora_forward` replicates."""


HALF = (torch.bfloat16, torch.float16)
"""The dtypes autocast runs a linear layer's products in, on the CPU and on GPUs."""


def _lora_linear_class():
    """peft's ``lora.Linear`` when peft is a known version, else None (with one warning)."""
    try:
        import peft
        from peft.tuners.lora import Linear
    except ImportError:
        return None
    if ".".join(peft.__version__.split(".")[:2]) not in KNOWN_PEFT:
        warnings.warn(f"peft {peft.__version__}: the update's LoRA layers run peft's own "
                      f"forward (fused forward checked against peft {', '.join(KNOWN_PEFT)})",
                      stacklevel=3)
        return None
    return Linear


def plain_adapter(module) -> str | None:
    """The name of ``module``'s one active plain LoRA adapter (module docstring), or None
    when its forward must stay peft's."""
    active = list(module.active_adapters)
    if module.disable_adapters or module.merged or len(active) != 1:
        return None
    name = active[0]
    if (name not in module.lora_A or name in getattr(module, "lora_variant", {})
            or not isinstance(module.lora_dropout[name], nn.Identity)
            or module.lora_B[name].bias is not None
            or type(module.base_layer) is not nn.Linear):
        return None
    return name


def fused_lora_forward(module, name: str, x: torch.Tensor,
                       dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x W^T + b + scaling (x A^T) B^T`` of peft LoRA layer ``module``'s adapter ``name``.

    Shapes: ``x`` ``[..., in]`` -> ``[..., out]``; ``A`` is ``[r, in]``, ``B`` ``[out, r]``.
    ``dtype``: every factor cast to it first, as autocast casts a linear layer's (the
    in-place product is out of autocast's reach); None: as they are.
    """
    base = module.base_layer
    weight, bias = base.weight, base.bias
    a, b = module.lora_A[name].weight, module.lora_B[name].weight
    if dtype is not None:
        x, weight, a, b = (t.to(dtype) for t in (x, weight, a, b))
        bias = bias.to(dtype) if bias is not None else None
    return _adapted(x, weight, bias, a, b.t(), module.scaling[name])


def _adapted(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             a: torch.Tensor, b_t: torch.Tensor, scaling: float) -> torch.Tensor:
    """``x W^T + b + scaling (x A^T) B^T`` with the factors as given, all of ``x``'s dtype
    (``b_t`` is ``B^T``, ``[r, out]``): the frozen product, then the adapter's added into
    it in place. ``x`` ``[..., in]`` -> ``[..., out]``."""
    flat = x.reshape(-1, x.shape[-1])
    out = nn.functional.linear(flat, weight, bias)
    out.addmm_(nn.functional.linear(flat, a), b_t, alpha=scaling)
    return out.view(*x.shape[:-1], out.shape[-1])


@contextmanager
def fused_lora(model, *, frozen: bool = False) -> Iterator[int]:
    """Within the block, every plain LoRA layer of ``model`` (module docstring) runs
    :func:`fused_lora_forward`; yields how many do. peft's forward comes back after.

    ``frozen``: the adapters and the layers do not change within the block (sampling,
    no gradient): each layer's adapter is looked up once, and its factors are cast to
    autocast's dtype once per dtype (:func:`_frozen_forward_of`), not at every call: a
    decoding step calls each layer with a few rows, and the lookup and the casts cost
    more than the adapter's products."""
    linear = _lora_linear_class()
    patched = []
    if linear is not None:
        for module in model.modules():
            if isinstance(module, linear) and (name := plain_adapter(module)) is not None:
                patched.append(module)
                module.forward = (_frozen_forward_of(module, name) if frozen
                                  else _forward_of(module))
    try:
        yield len(patched)
    finally:
        for module in patched:
            del module.forward  # the instance attribute: the class's forward again


@contextmanager
def merged_lora(model) -> Iterator[int]:
    """Within the block, every plain LoRA layer of ``model`` (module docstring) runs as
    its frozen layer alone with the merged weight ``W + scaling B A`` (computed in
    float32, stored in ``W``'s dtype), instead of the frozen product plus two small
    adapter products; yields how many do. For sampling on the CPU, under no gradients:
    a decoding step's adapter products are tiny (a few rows, rank ``r``) and run far
    below the large products' rate. Each layer's own weight comes back after.

    The merged map differs from the adapted one by the rounding of ``W + scaling B A``
    to ``W``'s dtype: float32's, or for a bfloat16 base (``--bf16``) bfloat16's, which is
    also the size of that base's own rounding (studies/step-time/report.md measures the log-probs).
    Extra memory: one copy of the adapted layers' weights while the block runs.
    """
    linear = _lora_linear_class()
    swapped = []
    try:
        with torch.no_grad():
            for module in model.modules() if linear is not None else ():
                if not isinstance(module, linear) or (name := plain_adapter(module)) is None:
                    continue
                weight = module.base_layer.weight
                a, b = module.lora_A[name].weight, module.lora_B[name].weight
                merged = torch.addmm(weight.float(), b.float(), a.float(),
                                     alpha=module.scaling[name]).to(weight.dtype)
                swapped.append((module, weight.data))
                weight.data = merged
                module._disable_adapters = True  # peft's forward: the base layer alone
        yield len(swapped)
    finally:
        for module, own in swapped:
            module.base_layer.weight.data = own
            module._disable_adapters = False


def _forward_of(module):
    peft_forward = type(module).forward

    def forward(x, *args, **kwargs):
        name = plain_adapter(module)
        if args or kwargs or name is None:
            return peft_forward(module, x, *args, **kwargs)
        device = x.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            if not x.is_floating_point() or dtype not in HALF:
                return peft_forward(module, x, *args, **kwargs)
            return fused_lora_forward(module, name, x, dtype)
        if (x.dtype != module.lora_A[name].weight.dtype
                or x.dtype != module.base_layer.weight.dtype):
            return peft_forward(module, x, *args, **kwargs)
        return fused_lora_forward(module, name, x)

    return forward


def _frozen_forward_of(module, name: str):
    """:func:`_forward_of` for a block in which ``module`` and its adapter ``name`` do not
    change: the adapter looked up once, the factors cast once per autocast dtype.

    Outside autocast, a half-precision input over a base layer of its own dtype runs the
    adapter in that dtype too, as autocast would: transformers' ``generate`` calls the
    inner model's forward for its decoding steps, outside the autocast with which
    accelerate wraps only the outer model's (the trainer's prefill), so a bfloat16 base
    would otherwise decode through peft's forward with its adapters in float32, cast to
    and back at every layer of every step."""
    general = _forward_of(module)
    base = module.base_layer
    weight, bias = base.weight, base.bias
    a, b = module.lora_A[name].weight, module.lora_B[name].weight
    scaling = module.scaling[name]
    cast: dict[torch.dtype, tuple] = {}

    def factors(dtype: torch.dtype) -> tuple:
        if dtype not in cast:
            with torch.no_grad():
                cast[dtype] = (weight.to(dtype), None if bias is None else bias.to(dtype),
                               a.to(dtype), b.to(dtype).t())
        return cast[dtype]

    def forward(x, *args, **kwargs):
        if args or kwargs or not x.is_floating_point():
            return general(x, *args, **kwargs)
        device = x.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            if dtype not in HALF:
                return general(x)
        elif x.dtype == weight.dtype and (x.dtype == a.dtype or x.dtype in HALF):
            dtype = x.dtype
        else:
            return general(x)
        return _adapted(x.to(dtype), *factors(dtype), scaling)

    return forward


@contextmanager
def lora_for_sampling(model) -> Iterator[str]:
    """The LoRA layers' forward for the trainer's sampling on the CPU; yields which:

    * ``"merged"`` (:func:`merged_lora`) when the frozen base is float32: the merged
      weight's rounding is float32's, and the adapters' small products go;
    * ``"fused"`` (:func:`fused_lora`) when it is bfloat16 (``--bf16``): a bfloat16
      merged weight would round the adapters' small delta as coarsely as the base itself
      (studies/step-time/report.md), so the samples come from the update's own arithmetic instead;
    * ``"peft"`` elsewhere (no plain LoRA layer, a GPU): peft's forward, unchanged.
    """
    linear = _lora_linear_class()
    layer = None if linear is None else next(
        (m for m in model.modules() if isinstance(m, linear) and plain_adapter(m) is not None),
        None)
    if layer is None or layer.base_layer.weight.device.type != "cpu":
        yield "peft"
    elif layer.base_layer.weight.dtype == torch.float32:
        with merged_lora(model):
            yield "merged"
    else:
        with fused_lora(model, frozen=True):
            yield "fused"
