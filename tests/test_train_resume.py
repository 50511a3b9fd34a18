"""Kill/resume: a run killed with SIGKILL and resumed ends with the same metrics as an
uninterrupted run with the same seed; half-written checkpoints are never picked.

The run kills itself right after its checkpoint at step 4 is complete, so the test does
not race the run (see test_train_resume_kill.py for kills at other points)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_train_helpers import DETERMINISTIC_KEYS, read_jsonl, save_tiny_model

from ktae.checkpoints import COMPLETE_MARKER, latest_complete_checkpoint
from ktae.train.step_timing import TIMING_RECORD_KEYS

pytestmark = pytest.mark.slow

SCRIPT = """
import os, signal, sys, torch
sys.path.insert(0, {tests!r})
from transformers import TrainerCallback
from test_train_helpers import contains_digit, tiny_config
from ktae.train.session import train


class KillAfterSave(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        if state.global_step == {kill_at}:
            os.kill(os.getpid(), signal.SIGKILL)


torch.set_num_threads(1)
cfg = tiny_config({model!r}, {out!r}, max_steps=8, save_every=2, eval_every=4, algo="dapo",
                  credit="ktae", resume={resume})
train(cfg, reward_funcs=[contains_digit], extra_callbacks=[KillAfterSave()])
"""
KILL_AT = 4
TIMING_KEYS = TIMING_RECORD_KEYS


def _script(tmp_path: Path, model: Path, out: Path, resume: bool, kill: bool = False
            ) -> list[str]:
    path = tmp_path / f"run_{out.name}_{int(resume)}.py"
    path.write_text(SCRIPT.format(tests=str(Path(__file__).parent), model=str(model),
                                  out=str(out), resume=resume,
                                  kill_at=KILL_AT if kill else -1))
    return [sys.executable, str(path)]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def test_kill_and_resume_matches_uninterrupted(tmp_path):
    model = save_tiny_model(tmp_path / "model")
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_script(tmp_path, model, full, False), check=True, env=_env(), timeout=300)

    proc = subprocess.run(_script(tmp_path, model, killed, False, kill=True), env=_env(),
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL
    done = latest_complete_checkpoint(killed)
    assert done is not None and done.name == f"checkpoint-{KILL_AT}"
    # a checkpoint cut short by a kill (no marker) must be ignored on resume
    partial = killed / "checkpoint-7"
    partial.mkdir(exist_ok=True)
    (partial / "model.safetensors").write_bytes(b"truncated")
    assert latest_complete_checkpoint(killed) == done

    subprocess.run(_script(tmp_path, model, killed, True), check=True, env=_env(), timeout=300)
    a, b = read_jsonl(full / "metrics.jsonl"), read_jsonl(killed / "metrics.jsonl")
    assert [m["step"] for m in b] == list(range(1, 9))
    for ma, mb in zip(a, b, strict=True):
        # every key the uninterrupted run logs (timing aside) is in the resumed run, equal
        assert set(ma) - set(TIMING_KEYS) == set(mb) - set(TIMING_KEYS), ma["step"]
        # and these must be logged at all (flagged_token_rate: calibrations only)
        missing = [k for k in DETERMINISTIC_KEYS if k != "flagged_token_rate" and k not in ma]
        assert not missing, (ma["step"], missing)
        for key in set(ma) - set(TIMING_KEYS):
            assert mb[key] == ma[key], (ma["step"], key)
    ea, eb = read_jsonl(full / "eval.jsonl"), read_jsonl(killed / "eval.jsonl")
    assert [e["step"] for e in eb] == [e["step"] for e in ea] == [0, 4, 8]
    assert [e["accuracy"] for e in eb] == [e["accuracy"] for e in ea]
    assert (killed / "checkpoint-8" / COMPLETE_MARKER).exists()
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["resumed_from"] == str(done)
