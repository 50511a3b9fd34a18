"""Exact resume on two CPU processes (torchrun, gloo): a run stopped after its checkpoint in
the middle of its second epoch and resumed is the uninterrupted run. On several processes
the loader that skips the resumed epoch's first batches hides the sampler from
transformers' ``set_epoch``, so this is where the epoch's order could go wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_train_distributed import _run_two_processes, needs_torchrun
from test_train_resume_epochs import assert_same_run

pytestmark = pytest.mark.slow

SCRIPT = """
import sys, torch
sys.path.insert(0, {tests!r})
from transformers import TrainerCallback
from test_train_helpers import contains_digit, tiny_config
from ktae.train.session import train
torch.set_num_threads(1)


class Stop(Exception):
    pass


class StopAfterSave(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 6:
            raise Stop


# 8 problems, 2 a step: 4 steps an epoch; step 6 is in the middle of the second
settings = dict(max_steps=7, save_every=2, eval_every=3, train_size=8, num_prompts=2,
                rollout_every=1, algo="dapo", credit="ktae")
run = {run!r}
out = {out_dir!r} + ("/full" if run == "full" else "/stopped")
try:
    train(tiny_config({model!r}, out, resume=run == "resume", **settings),
          reward_funcs=[contains_digit],
          extra_callbacks=[StopAfterSave()] if run == "stop" else [])
except Stop:
    pass
finally:
    # both processes stop at the same save; leave together and close the process group, so
    # that neither exits while the other's gloo threads still hold its connection (a process
    # that does aborts with "terminate called without an active exception")
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
"""


@needs_torchrun
def test_two_processes_resume_in_the_second_epoch(tmp_path):
    # one process group a torchrun: the stopped run ends its processes, as a kill would
    for run in ("full", "stop", "resume"):
        _run_two_processes(tmp_path, f"{run}.py", SCRIPT.replace("{run!r}", repr(run)))
    assert_same_run(Path(tmp_path) / "full", Path(tmp_path) / "stopped")
