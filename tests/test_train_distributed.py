"""Two CPU processes (torchrun, gloo): KTAE stays exact when a group's rows are split
across processes, and dynamic sampling refuses a layout that would split groups."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_train_helpers import read_jsonl, save_tiny_model

import ktae

pytestmark = pytest.mark.slow

# what both scripts start with (formatted with tests, model, out_dir)
PRELUDE = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_train_helpers import contains_digit, tiny_config
from ktae.train.session import train
from ktae.train.trainer import KTAEGRPOTrainer
torch.set_num_threads(1)
"""

SCRIPT = PRELUDE + """
class Dump(KTAEGRPOTrainer):
    def _finish_batch(self, batch, rewards, correct, mode, **kwargs):
        mask = batch["ktae_token_mask"].clone()
        out = super()._finish_batch(batch, rewards, correct, mode, **kwargs)
        rank = self.accelerator.process_index
        torch.save({{"ids": batch["completion_ids"], "mask": mask,
                    "rewards": rewards, "correct": correct, "adv": out["advantages"],
                    "pad": self._tokenizer.pad_token_id, "ignore": self.ignore_token_ids}},
                   f"{out_dir}/rank{{rank}}.pt")
        return out

# 3 prompts x 4 responses = 12 rows, 6 per process: the second group is split
try:
    train(tiny_config({model!r}, {out_dir!r} + "/dapo", algo="dapo", num_prompts=3,
                      max_steps=1), reward_funcs=[contains_digit])
    sys.stdout.write("NOT REFUSED\\n")
except ValueError as err:
    sys.stdout.write(f"REFUSED: {{err}}\\n")  # one write: the two processes share the pipe
train(tiny_config({model!r}, {out_dir!r} + "/grpo", algo="grpo", credit="ktae", num_prompts=3,
                  max_steps=1), trainer_cls=Dump, reward_funcs=[contains_digit])
"""


def free_port() -> int:
    """A TCP port nobody listens on now (so concurrent runs never share a rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
needs_torchrun = pytest.mark.skipif(not os.path.exists(TORCHRUN), reason="torchrun not installed")


def _run_two_processes(tmp_path, name: str, script: str) -> str:
    """Run ``script`` (formatted with tests, model, out_dir = tmp_path) under torchrun with
    2 CPU processes; assert it exits 0 and return its output."""
    model = save_tiny_model(tmp_path / "model")
    path = tmp_path / name
    path.write_text(script.format(tests=str(Path(__file__).parent), model=str(model),
                                  out_dir=str(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([TORCHRUN, "--nproc_per_node", "2", "--master_port", str(free_port()),
                           str(path)], env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    return out


def _pad(t: torch.Tensor, length: int, value) -> torch.Tensor:
    return torch.cat([t, t.new_full((t.shape[0], length - t.shape[1]), value)], dim=1)


@needs_torchrun
def test_two_processes_split_groups(tmp_path):
    out = _run_two_processes(tmp_path, "dist.py", SCRIPT)
    assert out.count("REFUSED: dynamic sampling") == 2, out[-3000:]
    assert "multiple of num_generations=4" in out
    parts = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    T = max(p["ids"].shape[1] for p in parts)
    pad = parts[0]["pad"]
    ids = torch.cat([_pad(p["ids"], T, pad) for p in parts])
    mask = torch.cat([_pad(p["mask"], T, 0) for p in parts]).bool()
    adv = torch.cat([_pad(p["adv"], T, 0.0) for p in parts])
    rewards = torch.cat([p["rewards"] for p in parts])
    correct = torch.cat([p["correct"] for p in parts])
    assert ids.shape[0] == 12
    expected = ktae.compute_advantages("ktae", rewards=rewards, group=torch.arange(12) // 4,
                                       token_ids=ids, mask=mask, correct=correct, base="grpo",
                                       ignore_token_ids=parts[0]["ignore"])
    assert torch.allclose(adv, expected.to(adv.dtype), atol=1e-6)
    # the split group (rows 4..7) really has token-level values when it is mixed
    if correct[4:8].any() and not correct[4:8].all():
        spread = [(a[m].max() - a[m].min()).item() for a, m in zip(adv[4:8], mask[4:8],
                                                                     strict=True)]
        assert max(spread) > 0
    # the main process alone kept the first groups of the global batch (the split one too)
    from ktae.runs.rollouts import read_rollouts

    _, records = read_rollouts(tmp_path / "grpo" / "rollouts.jsonl")
    assert [(r["step"], r["group"]) for r in records] == [(1, 0), (1, 1)]
    for g, rec in enumerate(records):
        for j, row in enumerate(range(4 * g, 4 * g + 4)):
            assert rec["responses"][j] == ids[row][mask[row]].tolist()
            assert rec["advantages"][j] == pytest.approx(adv[row][mask[row]].tolist(), abs=1e-5)
    # only the main process wrote the run directory: one line per step, no temporaries
    run = tmp_path / "grpo"
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1]
    assert [e["step"] for e in read_jsonl(run / "eval.jsonl")] == [0, 1]
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]
    assert (run / "ktae_run.json").is_file() and (run / "README.md").is_file()


GTPO_SCRIPT = PRELUDE + """
class Dump(KTAEGRPOTrainer):
    def _finish_batch(self, batch, rewards, correct, mode, **kwargs):
        mask = batch["ktae_token_mask"].clone()
        entropies = batch["ktae_need_entropies"].clone()
        out = super()._finish_batch(batch, rewards, correct, mode, **kwargs)
        torch.save({{"mask": mask, "entropies": entropies, "rewards": rewards,
                    "correct": correct, "adv": out["advantages"]}},
                   f"{out_dir}/gtpo{{self.accelerator.process_index}}.pt")
        return out

# the second group is split across the two processes; STAPO's loss-mask rescaling gathers
# its counts over both
train(tiny_config({model!r}, {out_dir!r} + "/gtpo", algo="dapo", credit="gtpo+stapo",
                  num_prompts=3, max_steps=1, dynamic_sampling=False,
                  calibration_options={{"prob_threshold": 0.5}}),
      trainer_cls=Dump, reward_funcs=[contains_digit])
"""


@needs_torchrun
def test_two_processes_gtpo_on_split_groups(tmp_path):
    """GTPO's old-policy entropies are gathered with the ids: the advantages equal GTPO
    on the gathered batch."""
    _run_two_processes(tmp_path, "gtpo.py", GTPO_SCRIPT)
    parts = [torch.load(tmp_path / f"gtpo{r}.pt") for r in (0, 1)]
    T = max(p["mask"].shape[1] for p in parts)
    mask = torch.cat([_pad(p["mask"], T, 0) for p in parts]).bool()
    adv = torch.cat([_pad(p["adv"], T, 0.0) for p in parts])
    entropies = torch.cat([_pad(p["entropies"], T, 0.0) for p in parts])
    rewards = torch.cat([p["rewards"] for p in parts])
    correct = torch.cat([p["correct"] for p in parts])
    assert rewards.shape[0] == 12
    expected = ktae.compute_advantages("gtpo", rewards=rewards, group=torch.arange(12) // 4,
                                       mask=mask, entropies=entropies, correct=correct)
    assert torch.allclose(adv, expected.to(adv.dtype), atol=1e-6)
