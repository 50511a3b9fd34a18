"""``plan_run``: what a run directory allows before anything loads (fresh, resumed,
finished, or in the way), on directories written as ``ktae train`` writes them, without
training."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ktae.runs.config import TrainConfig
from ktae.runs.rundir import (
    claim_checkpoint,
    mark_checkpoint_complete,
    mark_run_finished,
    prepare_output_dir,
)
from ktae.train.session import describe_changes, plan_run


def _cfg(out: Path, **overrides) -> TrainConfig:
    base = dict(output_dir=str(out), max_steps=4, save_every=2, num_prompts=2,
                num_generations=2, max_new_tokens=4, train_size=8, eval_size=2, resume=True)
    base.update(overrides)
    return TrainConfig(**base).resolve()


def _run(cfg: TrainConfig, *, checkpoints=(), finished: bool = False) -> None:
    """A run directory of ``cfg`` with complete checkpoints at ``checkpoints``."""
    out = Path(cfg.output_dir)
    prepare_output_dir(out, resume=True, write=True)
    dataclasses.replace(cfg, resume=False).save(out / "config.yaml")
    for step in checkpoints:
        ckpt = out / f"checkpoint-{step}"
        claim_checkpoint(ckpt)
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        mark_checkpoint_complete(ckpt, step)
    if finished:
        mark_run_finished(out, cfg.max_steps)


def test_a_fresh_directory_is_planned_without_being_written(tmp_path):
    plan = plan_run(_cfg(tmp_path / "run", resume=False))
    assert (plan.checkpoint, plan.complete, plan.changes) == (None, False, {})
    assert not (tmp_path / "run").exists()  # planning writes nothing


def test_a_resume_continues_from_the_last_complete_checkpoint(tmp_path):
    cfg = _cfg(tmp_path / "run")
    _run(cfg, checkpoints=(2,))
    plan = plan_run(dataclasses.replace(cfg, eval_every=3))
    assert plan.checkpoint == tmp_path / "run" / "checkpoint-2"
    assert plan.complete is False
    assert plan.changes == {"eval_every": (cfg.eval_every, 3)}  # allowed, and reported
    # a run with its settings saved but no checkpoint starts from step 0
    _run(_cfg(tmp_path / "early"))
    early = plan_run(_cfg(tmp_path / "early"))
    assert (early.checkpoint, early.complete) == (None, False)


def test_a_run_without_saved_settings_resumes_from_its_checkpoint(tmp_path):
    """A run directory whose config.yaml is gone (written by hand, or an older run) is
    resumed from its last complete checkpoint with nothing to compare."""
    cfg = _cfg(tmp_path / "run")
    _run(cfg, checkpoints=(2,))
    (tmp_path / "run" / "config.yaml").unlink()
    plan = plan_run(cfg)
    assert plan.checkpoint == tmp_path / "run" / "checkpoint-2"
    assert (plan.complete, plan.changes) == (False, {})


def test_finished_means_marked_finished_and_checkpointed_at_max_steps(tmp_path):
    cfg = _cfg(tmp_path / "done")
    _run(cfg, checkpoints=(2, 4), finished=True)
    assert plan_run(cfg).complete is True
    # finished at 4, but the last checkpoint is 2: not complete (it was removed)
    half = _cfg(tmp_path / "half")
    _run(half, checkpoints=(2,), finished=True)
    assert plan_run(half).complete is False
    # one step, finished, no checkpoint: not complete
    one = _cfg(tmp_path / "one", max_steps=1, save_every=0)
    _run(one, finished=True)
    assert plan_run(one).complete is False
    # checkpointed at max_steps but never marked finished (killed during the final save)
    cut = _cfg(tmp_path / "cut")
    _run(cut, checkpoints=(4,))
    assert plan_run(cut).complete is False


def test_resume_below_the_trained_steps_is_refused(tmp_path):
    cfg = _cfg(tmp_path / "run", max_steps=6)
    _run(cfg, checkpoints=(4,))
    with pytest.raises(ValueError) as err:
        plan_run(dataclasses.replace(cfg, max_steps=2))
    assert str(err.value) == "--resume: max_steps 2 is below the 4 steps the run has trained"


@pytest.mark.parametrize("save_every, max_steps, step, refused", [
    (2, 6, 4, True),    # a step the run will save
    (2, 6, 3, False),   # not one it saves
    (4, 6, 6, True),    # the final step is always saved
    (2, 5, 4, True),    # the last multiple before an odd final step
    (1, 3, 4, False),   # past max_steps
    (0, 3, 3, True),    # save_every 0: only the final step
    (0, 3, 2, False),
])
def test_a_foreign_checkpoint_where_the_run_will_save_is_refused(tmp_path, save_every,
                                                                   max_steps, step, refused):
    out = tmp_path / "run"
    cfg = _cfg(out, save_every=save_every, max_steps=max_steps, resume=False)
    prepare_output_dir(out, resume=True, write=True)  # a run directory of ours
    foreign = out / f"checkpoint-{step}"
    foreign.mkdir()
    (foreign / "weights.bin").write_text("not ours")
    if not refused:
        plan_run(cfg)
        return
    with pytest.raises(ValueError) as err:
        plan_run(cfg)
    assert str(err.value) == (f"output_dir: {foreign} was not written by ktae, and the run "
                              "would write its checkpoint there; move it out of the run "
                              "directory")


def test_changes_are_named_by_their_flags():
    assert describe_changes({"learning_rate": (3e-05, 0.01), "seed": (0, 1)}) == (
        "lr 3e-05 -> 0.01, seed 0 -> 1")
    assert describe_changes({"not_a_flag": (1, 2)}) == "not_a_flag 1 -> 2"
