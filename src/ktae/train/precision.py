"""bfloat16 training (``--bf16``): where the hardware has it, and which weights it stores.

A CPU multiplies bfloat16 matrices at twice its float32 rate only when it has the
instructions for them: ``avx512_bf16`` or ``amx_bf16`` on x86, the BF16 extension on Arm.
Elsewhere PyTorch emulates bfloat16 products in float32 arithmetic, slower than float32
itself. :func:`native_bf16` reads the CPU's flags, and honours oneDNN's ISA limit
(``ONEDNN_MAX_CPU_ISA``, or its older name ``DNNL_MAX_CPU_ISA``): PyTorch multiplies
bfloat16 matrices on x86 through oneDNN, which under a limit below the flag's instruction
set leaves those instructions unused. :func:`check_bf16` refuses ``--bf16`` on a CPU
without them, in one line, instead of training slower in silence.

Mixed precision, as ``ktae train --bf16`` runs it:

* **the products in bfloat16**: TRL's ``bf16=True`` makes accelerate run the model's
  forward passes, generation's included, under ``torch.autocast`` (on the CPU too);
* **the weights that train stay float32**, and so do their gradients and AdamW's state:
  a LoRA run's adapters (peft keeps them in float32 over a bfloat16 model), a full
  fine-tuning run's every weight (autocast casts each to bfloat16 for its product);
* **the frozen weights are stored in bfloat16** (a LoRA run's base model,
  :func:`stored_dtype`): autocast would cast them anew at every forward pass and every
  decoding step, since it caches only the casts of weights that train;
* **the log-probabilities in float32**: the log-prob head casts the logits before its
  ``log_softmax`` (:mod:`ktae.train.logprob_head`);
* **attention in float32** on the CPU (:func:`attention_in_float32`): PyTorch's CPU
  kernel for ``scaled_dot_product_attention`` runs its backward pass in bfloat16 at half
  its float32 speed, so the queries, keys and values are cast up for it and its output
  cast back (more exact, and faster).

A LoRA run's saved adapters are float32; merging them into a bfloat16 base would round
most of each update away (an adapter's delta is far below a weight's last bfloat16 bit),
so the saved run is the float32 adapter over the base model's own file. studies/step-time/report.md
measures the speed and the drift from float32.
"""

from __future__ import annotations

import os
import platform
import subprocess
from functools import cache

import torch

X86_FLAGS = ("amx_bf16", "avx512_bf16")
"""x86 CPU flags (``/proc/cpuinfo``) under which bfloat16 products run natively."""

ARM_FEATURE = "bf16"
"""The Arm feature (``/proc/cpuinfo`` ``Features``) of the BF16 extension."""

ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
               "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16",
               "AVX10_1_512_AMX", "AVX512_CORE_AMX", "AVX10_1_512_AMX_FP16",
               "AVX512_CORE_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2")
"""oneDNN's x86 values of ``ONEDNN_MAX_CPU_ISA``, lowest first (oneDNN 3's
``dnnl_cpu_isa_t``; ``AVX10_1_512`` is also spelled ``AVX512_CORE_FP16``, and so on).
``ALL`` and ``DEFAULT`` set no limit."""

FLAG_ISA = {"avx512_bf16": "AVX512_CORE_BF16", "amx_bf16": "AVX10_1_512_AMX"}
"""The lowest oneDNN ISA whose kernels use each x86 flag of :data:`X86_FLAGS`."""


def isa_allows(flag: str, limit: str | None) -> bool:
    """Whether oneDNN under ``ONEDNN_MAX_CPU_ISA=limit`` (None or empty: unset) uses the
    instructions of ``flag``. Flags other than x86's are not limited by it.

    Raises:
        ValueError: ``limit`` is not one of oneDNN's x86 ISA names, ``ALL`` or ``DEFAULT``.
    """
    name = (limit or "").strip().upper()
    if flag not in FLAG_ISA or name in ("", "ALL", "DEFAULT"):
        return True
    if name not in ONEDNN_ISAS:
        raise ValueError(f"ONEDNN_MAX_CPU_ISA: expected one of {', '.join(ONEDNN_ISAS)}, ALL "
                         f"or DEFAULT, got {limit!r}")
    return ONEDNN_ISAS.index(name) >= ONEDNN_ISAS.index(FLAG_ISA[flag])


def isa_limit() -> str | None:
    """The oneDNN ISA limit of this process's environment (``ONEDNN_MAX_CPU_ISA``, else
    ``DNNL_MAX_CPU_ISA``, oneDNN's own order of precedence), or None."""
    return os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or None


def cpu_bf16_flags(cpuinfo: str) -> tuple[str, ...]:
    """Every flag of ``cpuinfo`` (the text of Linux's ``/proc/cpuinfo``) under which the
    CPU multiplies bfloat16 natively, in the order of :data:`X86_FLAGS` then
    :data:`ARM_FEATURE`."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return tuple(f for f in (*X86_FLAGS, ARM_FEATURE) if f in flags)


def cpu_bf16_flag(cpuinfo: str) -> str | None:
    """The first of :func:`cpu_bf16_flags`, or None."""
    return next(iter(cpu_bf16_flags(cpuinfo)), None)


def native_bf16() -> str | None:
    """The flag under which this machine's CPU multiplies bfloat16 natively, or None
    (Linux: ``/proc/cpuinfo``; macOS: the ``hw.optional.arm.FEAT_BF16`` sysctl): the first
    of the CPU's flags (:func:`cpu_bf16`) whose instructions oneDNN's ISA limit
    (:func:`isa_limit`) leaves in use (``amx_bf16`` under ``AVX512_CORE_BF16``: the CPU's
    ``avx512_bf16``).

    Raises:
        ValueError: ``ONEDNN_MAX_CPU_ISA`` names no ISA oneDNN knows (:func:`isa_allows`).
    """
    limit = isa_limit()
    return next((f for f in cpu_bf16() if isa_allows(f, limit)), None)


@cache
def cpu_bf16() -> tuple[str, ...]:
    """The CPU's own flags for native bfloat16 products, whatever the ISA limit
    (:func:`native_bf16`), as :func:`cpu_bf16_flags` orders them; empty without any."""
    system = platform.system()
    if system == "Linux":
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                return cpu_bf16_flags(f.read())
        except OSError:
            return ()
    if system == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"],
                                 capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return ()
        return ("FEAT_BF16",) if out.strip() == "1" else ()
    return ()


def check_bf16(device: torch.device | str, *, flag: str | None | bool = False) -> str:
    """The hardware support ``--bf16`` runs on, as a few words for the run's header.

    ``flag``: the CPU's flag as :func:`native_bf16` gives it (default: read it).

    Raises:
        ValueError: ``device`` is a CPU without native bfloat16 products, or a GPU without
            bfloat16 (one line naming ``bf16``).
    """
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_bf16_supported():
            raise ValueError("bf16: this GPU has no bfloat16 support; train without --bf16")
        return f"bfloat16 on {torch.cuda.get_device_name(device)}"
    if device.type != "cpu":
        return f"bfloat16 on {device.type}"
    flag = native_bf16() if flag is False else flag
    if flag is None:
        raise ValueError("bf16: this CPU has no bfloat16 instructions (avx512_bf16, amx_bf16 "
                         "or Arm BF16): its bfloat16 products would be emulated, slower than "
                         "float32; train without --bf16")
    return f"bfloat16 products on the CPU ({flag}), float32 weights that train"


def stored_dtype(bf16: bool, lora: bool) -> torch.dtype:
    """The dtype the model's weights are loaded in: bfloat16 where ``bf16`` and they are
    frozen (``lora``: every weight but the adapters'), else float32 (module docstring)."""
    return torch.bfloat16 if bf16 and lora else torch.float32


FLOAT32_ATTENTION = "ktae_sdpa_float32"
"""The name under which :func:`float32_attention` is registered with transformers."""


def float32_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' ``sdpa`` attention with its inputs cast to float32 and its output
    back to theirs, outside autocast (module docstring).

    Where several query heads share a key-value head and more than one query comes in (a
    prefill, the update), the kernel reads the shared keys and values itself
    (:func:`grouped_sdpa`); transformers would repeat them to every query head first
    when a mask is present, a copy forward and a sum backward. A single query (a decoding
    step) is two small matrix products and a softmax (:func:`decoding_attention`)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dtype = query.dtype
    with torch.autocast(query.device.type, enabled=False):
        query, key, value = query.float(), key.float(), value.float()
        if _decoding_applies(query, key, attention_mask, kwargs):
            out, weights = decoding_attention(query, key, value, attention_mask,
                                              kwargs.get("scaling")), None
        elif _grouped_applies(module, query, kwargs):
            out, weights = grouped_sdpa(module, query, key, value, attention_mask, **kwargs), None
        else:
            out, weights = sdpa_attention_forward(module, query, key, value, attention_mask,
                                                  **kwargs)
    return out.to(dtype), weights


def _grouped_applies(module, query: torch.Tensor, kwargs: dict) -> bool:
    # one query: transformers folds the groups into the query itself (pack_gqa); the
    # arguments below take transformers' own path
    return (getattr(module, "num_key_value_groups", 1) > 1 and query.size(2) > 1
            and kwargs.get("softcap") is None and kwargs.get("position_bias") is None
            and not kwargs.get("output_attentions", False))


def _decoding_applies(query: torch.Tensor, key: torch.Tensor,
                      attention_mask: torch.Tensor | None, kwargs: dict) -> bool:
    # one query, every query head on one key-value head's group, a mask shared by the heads
    # over exactly the keys given; anything else (dropout, softcap, a position bias,
    # attention weights asked for) takes transformers' path
    return (query.size(2) == 1 and query.size(1) % key.size(1) == 0
            and not kwargs.get("dropout") and kwargs.get("softcap") is None
            and kwargs.get("position_bias") is None
            and not kwargs.get("output_attentions", False)
            and (attention_mask is None
                 or (attention_mask.dim() == 4 and attention_mask.size(1) == 1
                     and attention_mask.size(2) == 1
                     and attention_mask.size(-1) == key.size(2))))


def decoding_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None,
                       scaling: float | None = None) -> torch.Tensor:
    """``[batch, 1, heads, dim]``: the attention of one query per row, ``query``
    ``[batch, heads, 1, dim]``, over ``key`` and ``value`` ``[batch, kv_heads, keys, dim]``
    (``heads`` a multiple of ``kv_heads``, consecutive query heads sharing one), under
    ``attention_mask`` ``[batch or 1, 1, 1, keys]`` (True or 0 where a key is seen) or None.

    The query heads of each key-value head are stacked as rows (transformers' ``pack_gqa``)
    and the attention is ``softmax(q K^T scale + mask) V`` as two batched products: at a
    decoding step's shapes (a few rows over about a hundred keys) PyTorch's CPU flash
    kernel spends more on its tiling than on the arithmetic
    (benchmarks/bench_attention_kernel.py ``--decoding`` times both). The same values
    within float rounding (the scale is applied to the query, before its products).
    """
    batch, heads, _, dim = query.shape
    kv_heads = key.size(1)
    scale = dim ** -0.5 if scaling is None else scaling
    packed = query.reshape(batch, kv_heads, heads // kv_heads, dim) * scale
    scores = torch.matmul(packed, key.transpose(-1, -2))  # [batch, kv_heads, groups, keys]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill_(attention_mask.logical_not(), float("-inf"))
        else:
            scores = scores.add_(attention_mask)
    out = torch.matmul(torch.softmax(scores, dim=-1), value)  # [batch, kv_heads, groups, dim]
    return out.reshape(batch, 1, heads, dim)


def grouped_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0,
                 scaling: float | None = None, is_causal: bool | None = None,
                 **kwargs) -> torch.Tensor:
    """``[batch, queries, heads, dim]``: transformers 5's ``sdpa_attention_forward``
    (``integrations/sdpa_attention.py``) for ``query`` ``[batch, heads, queries, dim]``
    over ``key`` and ``value`` of fewer heads, with ``enable_gqa`` where it repeats them
    (``repeat_kv``) under a mask; the same values (benchmarks/bench_attention_kernel.py
    times both)."""
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = attention_mask is None and is_causal  # more than one query: its own rule
    if is_causal and key.size(2) > query.size(2):  # as transformers: flash needs them equal
        key, value = key[:, :, :query.size(2)], value[:, :, :query.size(2)]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=is_causal, enable_gqa=True)
    return out.transpose(1, 2).contiguous()


def attention_in_float32(model) -> bool:
    """Switch ``model`` (on the CPU, running transformers' ``sdpa`` attention) to
    :func:`float32_attention`; whether it did. Other attention kernels and devices keep
    their own."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    config = getattr(model, "config", None)
    if (config is None or getattr(config, "_attn_implementation", None) != "sdpa"
            or next(model.parameters()).device.type != "cpu"
            or not hasattr(model, "set_attn_implementation")):
        return False
    AttentionInterface.register(FLOAT32_ATTENTION, float32_attention)
    # the masks sdpa's: transformers builds none for a name it does not know, and padding
    # would then go unmasked
    AttentionMaskInterface.register(FLOAT32_ATTENTION, sdpa_mask)
    model.set_attn_implementation(FLOAT32_ATTENTION)
    return True
