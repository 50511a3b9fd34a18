"""A real ``ktae train`` process killed with SIGKILL, then resumed with ``--resume``, ends as
the uninterrupted run: the same metrics.jsonl (every key but timing), evaluations,
rollouts, checkpoints and final weights.

The kill is deterministic: the run kills itself (SIGKILL, no clean-up) at a point drawn by
a seeded generator: after a step's metrics line (between checkpoints), in the middle of
writing a checkpoint, right after a checkpoint is complete, during the final evaluation,
while saving the final model, or before the run is marked finished. The trials follow
each other: each resumes the run the previous one killed (so a resume is killed too), and
what the run wrote so far must agree with the uninterrupted run. A foreign
``checkpoint-1/`` (no ktae marker) put into the run directory must survive checkpoint
rotation.
"""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest
from test_train_helpers import read_jsonl
from test_train_resume import ForkedRuns
from test_train_resume_epochs import TIMING_KEYS, assert_same_run

from ktae.checkpoints import COMPLETE_MARKER
from ktae.runs.rundir import RUN_MARKER

pytestmark = pytest.mark.slow

MAX_STEPS = 6

# Runs ``ktae train`` (the CLI entry point) with a cheap reward the tiny random model can
# earn, and SIGKILLs itself at the point named by KTAE_TEST_KILL = [where, step].
SCRIPT = r'''
import json, os, signal, sys
sys.path.insert(0, {tests!r})
import torch
from test_train_helpers import contains_digit

import ktae.train.callbacks as callbacks
import ktae.train.reward_funcs as reward_funcs
import ktae.train.session as session
import ktae.train.trainer as trainer
from transformers import Trainer

reward_funcs.make_reward_funcs = lambda **kw: [contains_digit]
where, at = json.loads(os.environ.get("KTAE_TEST_KILL", '["none", 0]'))


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def wrap(owner, name, before=None, after=None):
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        if before is not None and before(*args, **kwargs):
            die()
        out = original(*args, **kwargs)
        if after is not None and after(*args, **kwargs):
            die()
        return out
    setattr(owner, name, wrapped)


if where == "logged":  # the step's metrics line written, its checkpoint not yet
    wrap(callbacks.MetricsCallback, "on_log",
         after=lambda self, args, state, *a, **k: state.global_step == at)
elif where == "saving":  # model and optimizer written, RNG state and marker not
    wrap(Trainer, "_save_rng_state", before=lambda self, *a, **k: self.state.global_step == at)
elif where == "saved":  # checkpoint complete, older ones not yet rotated
    wrap(trainer, "mark_checkpoint_complete", after=lambda folder, step: step == at)
elif where == "final_eval":
    wrap(callbacks.EvalCallback, "evaluate", before=lambda self, model, step: step == at)
elif where == "final_save":  # final weights written, tokenizer and settings not
    wrap(session, "save_generation_defaults", before=lambda *a, **k: True)
elif where == "finishing":  # everything written but the finished mark
    wrap(session, "mark_run_finished", before=lambda *a, **k: True)

torch.set_num_threads(1)
from ktae.cli import main
sys.exit(main(["train", *sys.argv[1:]]))
'''

# (where, steps it may happen at)
KILL_POINTS = [("logged", (1, 3, 5)), ("saving", (2, 4)), ("saved", (2, 4)),
               ("final_eval", (MAX_STEPS,)), ("final_save", (MAX_STEPS,)),
               ("finishing", (MAX_STEPS,))]


def _args(model: Path, out: Path) -> list[str]:
    return ["--model", str(model), "--output-dir", str(out), "--algo", "dapo",
            "--max-steps", str(MAX_STEPS), "--save-every", "2", "--eval-every", "3",
            "--num-prompts", "2", "--num-generations", "4", "--max-new-tokens", "8",
            "--train-size", "8", "--eval-size", "4", "--rollout-every", "1", "--no-progress"]


@pytest.fixture
def forked_runs(tmp_path):
    """Forks each ``ktae train`` process from one that imported the trainer once."""
    runs = ForkedRuns(tmp_path)
    yield runs
    runs.close()


def _ktae_train(runs: ForkedRuns, script: Path, model: Path, out: Path, *extra, kill=None):
    """``ktae train`` in a process of its own (forked by ``runs``), killed at ``kill``."""
    env = {} if kill is None else {"KTAE_TEST_KILL": json.dumps(kill)}
    return runs.run(script, *_args(model, out), *extra, env=env)


def _prefix_of(full: Path, out: Path) -> None:
    """``out``'s metrics lines are the first lines of ``full``'s (timing aside)."""
    def lines(run):
        return [{k: v for k, v in m.items() if k not in TIMING_KEYS}
                for m in read_jsonl(run / "metrics.jsonl")]

    a, b = lines(full), lines(out)
    assert b == a[:len(b)]


def test_sigkill_at_random_points_then_resume(tiny_model, tmp_path, capsys, forked_runs):
    script = tmp_path / "ktae_train.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent)))
    full, out = tmp_path / "full", tmp_path / "killed"
    done = _ktae_train(forked_runs, script, tiny_model, full)
    assert done.returncode == 0, done.stderr
    # one kill point of each kind at a drawn step, in the order a run reaches them: each
    # trial resumes the run the previous one killed, and is itself killed further on
    rng = random.Random(20261201)
    order = [where for where, _ in KILL_POINTS]
    trials = sorted(((where, rng.choice(steps)) for where, steps in KILL_POINTS),
                    key=lambda k: (k[1], order.index(k[0])))
    assert len(trials) >= 5
    foreign = out / "checkpoint-1"
    for i, kill in enumerate(trials):
        killed = _ktae_train(forked_runs, script, tiny_model, out,
                             *(["--resume"] if i else []), kill=list(kill))
        assert killed.returncode == -signal.SIGKILL, (kill, killed.stderr)
        _prefix_of(full, out)
        if i == 0:  # a directory ktae did not write, where rotation looks
            foreign.mkdir()
            (foreign / "weights.bin").write_bytes(b"not ktae's")
    resumed = _ktae_train(forked_runs, script, tiny_model, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(full, out)
    assert (foreign / "weights.bin").read_bytes() == b"not ktae's"
    ours = sorted(p.name for p in out.glob("checkpoint-*") if (p / COMPLETE_MARKER).exists())
    assert ours == sorted(p.name for p in full.glob("checkpoint-*"))
    assert json.loads((out / "summary.json").read_text())["steps"] == MAX_STEPS
    segments = json.loads((out / RUN_MARKER).read_text())["segments"]
    assert len(segments) == len(trials) + 1
    # a finished run is not trained further
    from test_train_helpers import contains_digit

    import ktae.train.reward_funcs as reward_funcs
    from ktae.cli import main

    before = (out / "metrics.jsonl").read_text()
    reward_funcs_make = reward_funcs.make_reward_funcs
    reward_funcs.make_reward_funcs = lambda **kw: [contains_digit]
    try:
        code = main(["train", *_args(tiny_model, out), "--resume"])
    finally:
        reward_funcs.make_reward_funcs = reward_funcs_make
    assert code == 0
    assert capsys.readouterr().err.splitlines() == [
        f"ktae train: --resume: {out} is complete ({MAX_STEPS} steps); nothing to do"]
    assert (out / "metrics.jsonl").read_text() == before
    assert not (out / f"checkpoint-{MAX_STEPS + 1}").exists()
