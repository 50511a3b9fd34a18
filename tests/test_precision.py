"""``ktae train --bf16``: the CPU's bfloat16 flags, the refusal without them, and what a
bfloat16 run stores and computes in (products bfloat16, trained weights float32)."""

from __future__ import annotations

import pytest
import torch
from test_train_helpers import contains_digit, read_jsonl, tiny_config

from ktae.train import precision
from ktae.train.precision import check_bf16, cpu_bf16_flag, stored_dtype
from ktae.train.session import train
from ktae.train.trainer import KTAEGRPOTrainer

X86 = """processor	: 0
vendor_id	: GenuineIntel
flags		: fpu vme sse sse2 avx avx2 avx512f avx512bw {extra}
bogomips	: 4000.00
"""


@pytest.mark.parametrize(("text", "expected"), [
    (X86.format(extra="avx512_bf16"), "avx512_bf16"),
    (X86.format(extra="avx512_bf16 amx_tile amx_bf16"), "amx_bf16"),
    (X86.format(extra="avx512_vnni"), None),
    ("processor : 0\nFeatures : fp asimd evtstrm aes sha2 bf16 i8mm\n", "bf16"),
    ("processor : 0\nFeatures : fp asimd evtstrm aes\n", None),
    ("", None),
], ids=["avx512", "amx", "x86-none", "arm", "arm-none", "empty"])
def test_cpu_flags(text, expected):
    assert cpu_bf16_flag(text) == expected


def test_refused_without_native_bfloat16():
    with pytest.raises(ValueError, match=r"^bf16: this CPU has no bfloat16 instructions"):
        check_bf16("cpu", flag=None)
    assert "avx512_bf16" in check_bf16("cpu", flag="avx512_bf16")


def test_stored_dtype_keeps_trained_weights_float32():
    assert stored_dtype(True, lora=True) == torch.bfloat16  # the frozen base
    assert stored_dtype(True, lora=False) == torch.float32  # every weight trains
    assert stored_dtype(False, lora=True) == torch.float32


def test_cli_refuses_bf16_in_one_line(monkeypatch, capsys, tmp_path):
    from ktae.cli import main

    monkeypatch.setattr(precision, "native_bf16", lambda: None)
    code = main(["train", "--bf16", "--max-steps", "1", "-o", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("ktae train: bf16: ")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize(("flag", "limit", "allowed"), [
    ("avx512_bf16", None, True),
    ("avx512_bf16", "", True),
    ("avx512_bf16", "ALL", True),
    ("avx512_bf16", "default", True),
    ("avx512_bf16", "AVX2", False),
    ("avx512_bf16", "avx512_core_vnni", False),
    ("avx512_bf16", "AVX512_CORE_BF16", True),
    ("avx512_bf16", "AVX512_CORE_AMX", True),
    ("amx_bf16", "AVX512_CORE_BF16", False),
    ("amx_bf16", "AVX512_CORE_AMX", True),
    ("amx_bf16", "AVX10_1_512_AMX", True),
    ("amx_bf16", "AVX512_CORE_FP16", False),
    ("bf16", "AVX2", True),  # Arm's feature: oneDNN's x86 limit says nothing of it
])
def test_isa_limit_excludes_the_flags_below_it(flag, limit, allowed):
    assert precision.isa_allows(flag, limit) is allowed


def test_isa_limit_unknown_name_is_one_line():
    with pytest.raises(ValueError, match=r"^ONEDNN_MAX_CPU_ISA: expected one of SSE41, .*"
                                         r"got 'AVX3'$"):
        precision.isa_allows("avx512_bf16", "AVX3")


@pytest.mark.parametrize(("env", "expected"), [
    ({}, "avx512_bf16"),
    ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, None),
    ({"DNNL_MAX_CPU_ISA": "AVX2"}, None),  # oneDNN's older name
    ({"ONEDNN_MAX_CPU_ISA": "ALL", "DNNL_MAX_CPU_ISA": "AVX2"}, "avx512_bf16"),  # ONEDNN_ first
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "avx512_bf16"),
], ids=["unset", "onednn", "dnnl", "onednn-first", "at-the-flag"])
def test_native_bf16_honours_the_isa_limit(monkeypatch, env, expected):
    monkeypatch.setattr(precision, "cpu_bf16", lambda: ("avx512_bf16",))
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert precision.native_bf16() == expected


@pytest.mark.parametrize(("limit", "expected"), [
    (None, "amx_bf16"),
    ("AVX512_CORE_AMX", "amx_bf16"),
    ("AVX512_CORE_BF16", "avx512_bf16"),  # AMX excluded, avx512_bf16 still in use
    ("AVX512_CORE", None),
])
def test_native_bf16_is_the_best_flag_the_limit_leaves(monkeypatch, limit, expected):
    text = X86.format(extra="avx512_bf16 amx_tile amx_bf16")
    assert precision.cpu_bf16_flags(text) == ("amx_bf16", "avx512_bf16")
    monkeypatch.setattr(precision, "cpu_bf16", lambda: precision.cpu_bf16_flags(text))
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    if limit:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", limit)
    assert precision.native_bf16() == expected


def test_cli_refuses_bf16_under_the_isa_limit(monkeypatch, capsys, tmp_path):
    """A CPU with avx512_bf16 whose oneDNN is limited to AVX2 would emulate the products:
    ``--bf16`` is refused as on a CPU without the flag."""
    from ktae.cli import main

    monkeypatch.setattr(precision, "cpu_bf16", lambda: ("avx512_bf16",))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    code = main(["train", "--bf16", "--max-steps", "1", "-o", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("ktae train: bf16: this CPU has no bfloat16 instructions")


class HeadDtypes(KTAEGRPOTrainer):
    """Records the LM head's output dtype in every pass, with gradients or without."""

    seen: list

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        head = self.model.get_output_embeddings()
        head.register_forward_hook(
            lambda module, inputs, out: self.seen.append((torch.is_grad_enabled(), out.dtype)))


@pytest.mark.parametrize("lora_r", [4, 0], ids=["lora", "full"])
def test_bf16_run_multiplies_in_bfloat16_and_trains_float32(tiny_model, tmp_path, monkeypatch,
                                                            lora_r):
    monkeypatch.setattr(precision, "native_bf16", lambda: "avx512_bf16")  # any CPU
    seen: list = []
    cls = type("H", (HeadDtypes,), {"seen": seen})
    cfg = tiny_config(tiny_model, tmp_path / "run", max_steps=1, bf16=True, lora_r=lora_r,
                      learning_rate=1e-2)
    summary = train(cfg, trainer_cls=cls, reward_funcs=[contains_digit])
    assert summary["steps"] == 1 and "bfloat16" in summary["precision"]
    generation = [dtype for grad, dtype in seen if not grad]
    update = [dtype for grad, dtype in seen if grad]
    assert generation and update
    assert set(generation) == set(update) == {torch.bfloat16}  # held-out eval included
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert torch.isfinite(torch.tensor(metrics[0]["loss"]))
    from safetensors.torch import load_file

    final = tmp_path / "run" / "final"
    saved = load_file(final / ("adapter_model.safetensors" if lora_r else "model.safetensors"))
    assert saved and {t.dtype for t in saved.values()} == {torch.float32}


@pytest.mark.parametrize("lora_r", [0, 4], ids=["full", "lora"])
def test_bf16_model_attends_in_float32(tiny_model, monkeypatch, lora_r):
    """A ``--bf16`` model on the CPU runs attention through ``float32_attention``: the
    kernel gets float32 queries, keys and values under autocast, hands bfloat16 back, and
    gives what transformers' own ``sdpa`` gives on float32 inputs; a float32 run keeps
    ``sdpa``."""
    from transformers.integrations import sdpa_attention

    from ktae.runs.config import TrainConfig
    from ktae.train.session import load_model

    model, _, _ = load_model(TrainConfig(model=str(tiny_model), bf16=True, lora_r=lora_r))
    assert model.config._attn_implementation == precision.FLOAT32_ATTENTION
    assert load_model(TrainConfig(model=str(tiny_model)))[0].config._attn_implementation == "sdpa"
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recorded(q, k, v, *args, **kwargs):
        seen.append((q.dtype, k.dtype, v.dtype))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded)
    ids = torch.randint(3, 20, (2, 9))
    padded = torch.ones_like(ids)
    padded[0, :4] = 0  # left padding: the mask must reach the kernel
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        ours = model(input_ids=ids, attention_mask=padded).logits.float()
    assert seen and set(seen) == {(torch.float32,) * 3}
    model.set_attn_implementation("sdpa")
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        own = model(input_ids=ids, attention_mask=padded).logits.float()
    # the padded row's real positions as bfloat16 sdpa has them, within bfloat16's
    # rounding (unmasked padding moves them by far more)
    torch.testing.assert_close(ours[0, 4:], own[0, 4:], rtol=0.05, atol=0.05)
    model.set_attn_implementation(precision.FLOAT32_ATTENTION)
    layer = model.model.layers[0].self_attn
    q, k, v = (torch.randn(2, h, 9, layer.head_dim, dtype=torch.bfloat16)
               for h in (model.config.num_attention_heads,
                         model.config.num_key_value_heads, model.config.num_key_value_heads))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = precision.float32_attention(layer, q, k, v, None, scaling=layer.scaling,
                                             is_causal=True)
    own, _ = sdpa_attention.sdpa_attention_forward(layer, q.float(), k.float(), v.float(),
                                                   None, scaling=layer.scaling, is_causal=True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, own.bfloat16(), rtol=0, atol=0)


@pytest.mark.parametrize("causal_mask", [True, False], ids=["mask", "no-mask"])
def test_float32_attention_reads_grouped_heads_as_transformers_repeats_them(monkeypatch,
                                                                            causal_mask):
    """Several queries over shared key-value heads: the kernel gets the 2 key-value heads
    with ``enable_gqa`` (no repeat), and the output and the gradients of the queries, keys
    and values are transformers' own (which repeats them under a mask) within float32
    rounding; one query goes transformers' way."""
    from types import SimpleNamespace

    from transformers.integrations import sdpa_attention

    layer = SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    gen = torch.Generator().manual_seed(0)
    shapes = ((3, 4, 7, 8), (3, 2, 7, 8), (3, 2, 7, 8))
    inputs = [torch.randn(s, generator=gen).requires_grad_() for s in shapes]
    mask = torch.ones(3, 1, 7, 7, dtype=torch.bool).tril() if causal_mask else None
    if mask is not None:
        mask[0, :, :, :3] = False  # a left-padded row
        mask[0, :, :3, 0] = True  # its padded queries see one key, as transformers' mask does
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recorded(q, k, v, *args, **kwargs):
        seen.append((k.size(1), kwargs.get("enable_gqa", False)))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded)
    ours, _ = precision.float32_attention(layer, *inputs, mask, scaling=0.3)
    assert seen == [(2, True)]
    grads = torch.autograd.grad(ours.square().sum(), inputs)
    own, _ = sdpa_attention.sdpa_attention_forward(layer, *inputs, mask, scaling=0.3)
    assert seen[1] == ((4, False) if causal_mask else (2, True))  # transformers repeats
    want = torch.autograd.grad(own.square().sum(), inputs)
    torch.testing.assert_close(ours, own, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    seen.clear()
    one = [t[:, :, -1:] if i == 0 else t for i, t in enumerate(inputs)]
    precision.float32_attention(layer, *one, None if mask is None else mask[:, :, -1:],
                                scaling=0.3)
    assert seen == []  # one query: decoding_attention's two products, no kernel


@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
@pytest.mark.parametrize("groups", [1, 3])
def test_decoding_attention_is_transformers_sdpa_for_one_query(mask_kind, groups):
    """One query a row over a cache of keys (a decoding step): decoding_attention's output
    and gradients are transformers' ``sdpa`` path's (the groups folded into the query)
    within float32 rounding, under a boolean mask, an additive one, or none, with the
    default scale or a given one; float32_attention takes it for bfloat16 inputs."""
    from types import SimpleNamespace

    from transformers.integrations import sdpa_attention

    gen = torch.Generator().manual_seed(1)
    rows, kv_heads, keys, dim = 4, 2, 11, 8
    inputs = [torch.randn(s, generator=gen).requires_grad_()
              for s in ((rows, kv_heads * groups, 1, dim), (rows, kv_heads, keys, dim),
                        (rows, kv_heads, keys, dim))]
    seen = torch.ones(rows, 1, 1, keys, dtype=torch.bool)
    seen[0, :, :, :5] = False  # a left-padded row
    seen[2, :, :, :2] = False
    mask = {"bool": seen, "none": None,
            "additive": torch.zeros(rows, 1, 1, keys).masked_fill(~seen, torch.finfo(
                torch.float32).min)}[mask_kind]
    layer = SimpleNamespace(num_key_value_groups=groups, is_causal=True, training=False)
    for scaling in (None, 0.3):
        ours = precision.decoding_attention(*inputs, mask, scaling)
        own, _ = sdpa_attention.sdpa_attention_forward(layer, *inputs, mask, scaling=scaling)
        assert ours.shape == own.shape == (rows, 1, kv_heads * groups, dim)
        torch.testing.assert_close(ours, own, rtol=1e-6, atol=1e-6)
        weights = torch.randn(ours.shape, generator=gen)
        for a, b in zip(torch.autograd.grad((ours * weights).sum(), inputs),
                        torch.autograd.grad((own * weights).sum(), inputs), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    half = [t.detach().bfloat16() for t in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = precision.float32_attention(layer, *half, mask, scaling=0.3)
    want = precision.decoding_attention(*(t.float() for t in half), mask, 0.3)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, want.bfloat16(), rtol=0, atol=0)


def test_decoding_attention_leaves_other_masks_to_transformers(monkeypatch):
    """A mask per head, or over more keys than given, and dropout take transformers'
    path (the flash kernel), not decoding_attention's."""
    from types import SimpleNamespace

    layer = SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    q, k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for mask, kwargs in ((torch.ones(2, 4, 1, 6, dtype=torch.bool), {}),
                         (torch.ones(2, 1, 1, 7, dtype=torch.bool)[..., :6].expand(2, 1, 1, 6)
                          .clone(), {"dropout": 0.1}),
                         (None, {"output_attentions": True})):
        calls.clear()
        precision.float32_attention(layer, q, k, v, mask, **kwargs)
        assert calls == [1]
