"""Kill/resume: a run killed with SIGKILL and resumed ends with the same metrics as an
uninterrupted run with the same seed; half-written checkpoints are never picked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train_helpers import DETERMINISTIC_KEYS, read_jsonl, save_tiny_model

from ktae.train.rundir import COMPLETE_MARKER, latest_complete_checkpoint

pytestmark = pytest.mark.slow

SCRIPT = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_train_helpers import contains_digit, tiny_config
from ktae.train.session import train
torch.set_num_threads(1)
cfg = tiny_config({model!r}, {out!r}, max_steps=8, save_every=2, eval_every=4, algo="dapo",
                  credit="ktae", resume={resume})
train(cfg, reward_funcs=[contains_digit])
"""


def _script(tmp_path: Path, model: Path, out: Path, resume: bool) -> list[str]:
    path = tmp_path / f"run_{out.name}_{int(resume)}.py"
    path.write_text(SCRIPT.format(tests=str(Path(__file__).parent), model=str(model),
                                  out=str(out), resume=resume))
    return [sys.executable, str(path)]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def test_kill_and_resume_matches_uninterrupted(tmp_path):
    model = save_tiny_model(tmp_path / "model")
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_script(tmp_path, model, full, False), check=True, env=_env(), timeout=300)

    proc = subprocess.Popen(_script(tmp_path, model, killed, False), env=_env())
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if latest_complete_checkpoint(killed) is not None:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = latest_complete_checkpoint(killed)
    assert done is not None and done.name != "checkpoint-8"
    # a checkpoint cut short by a kill (no marker) must be ignored on resume
    partial = killed / "checkpoint-7"
    partial.mkdir(exist_ok=True)
    (partial / "model.safetensors").write_bytes(b"truncated")
    assert latest_complete_checkpoint(killed) == done

    subprocess.run(_script(tmp_path, model, killed, True), check=True, env=_env(), timeout=300)
    a, b = read_jsonl(full / "metrics.jsonl"), read_jsonl(killed / "metrics.jsonl")
    assert [m["step"] for m in b] == list(range(1, 9))
    for ma, mb in zip(a, b, strict=True):
        for key in DETERMINISTIC_KEYS:
            if key in ma:
                assert mb[key] == pytest.approx(ma[key], rel=1e-5, abs=1e-6), (ma["step"], key)
    ea, eb = read_jsonl(full / "eval.jsonl"), read_jsonl(killed / "eval.jsonl")
    assert [e["step"] for e in eb] == [e["step"] for e in ea] == [0, 4, 8]
    assert [e["accuracy"] for e in eb] == [e["accuracy"] for e in ea]
    assert (killed / "checkpoint-8" / COMPLETE_MARKER).exists()
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["resumed_from"] == str(done)
