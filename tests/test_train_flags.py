"""The ``ktae train`` flags come from the metadata of ``TrainConfig``'s fields."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from ktae.runs.config import TrainConfig
from ktae.runs.fields import flag
from ktae.train.cli_train import add_arguments, config_from_args
from ktae.train.flags import TRAIN_FLAGS, VALUE_FLAGS, flag_names
from ktae.train.session import describe_changes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_every_field_declares_its_flag_once():
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    assert [f.dest for f in TRAIN_FLAGS] == fields
    names = [f.name for f in TRAIN_FLAGS]
    assert len(set(names)) == len(names)
    by_dest = {f.dest: f for f in TRAIN_FLAGS}
    assert (by_dest["learning_rate"].name, by_dest["learning_rate"].type) == ("--lr", float)
    assert (by_dest["torch_threads"].name, by_dest["torch_threads"].type) == ("--threads", int)
    assert by_dest["clip_high"].type is float and by_dest["model"].type is str
    assert by_dest["output_dir"].short == "-o"
    assert {f.dest for f in VALUE_FLAGS} < set(fields)


def test_the_parser_takes_its_flags_and_help_from_the_fields():
    parser = _parser()
    actions = {s: a for a in parser._actions for s in a.option_strings}
    for f in TRAIN_FLAGS:
        action = actions[f.name]
        assert action.help.startswith(f.help), f.name
        dest = f"{f.dest}_pairs" if f.kind == "pairs" else f.dest
        assert action.dest == dest, f.name
    assert actions["--no-dynamic-sampling"].dest == "dynamic_sampling"
    assert actions["-o"] is actions["--output-dir"]


def test_each_kind_of_flag_sets_its_field():
    args = _parser().parse_args([
        "--lr", "0.01", "--threads", "2", "--resume", "--no-progress", "--bf16",
        "--no-dynamic-sampling", "--lora-target-modules", "q_proj, v_proj",
        "--estimator-option", "top=0.5", "--calibration-option", "lam=0.5",
        "--credit", "ktae+taco", "-o", "somewhere"])
    cfg = config_from_args(args)
    assert (cfg.learning_rate, cfg.torch_threads, cfg.output_dir) == (0.01, 2, "somewhere")
    assert (cfg.resume, cfg.progress, cfg.bf16, cfg.dynamic_sampling) == (True, False, True, False)
    assert cfg.lora_target_modules == ["q_proj", "v_proj"]
    assert cfg.estimator_options == {"top": 0.5}
    assert cfg.calibration_options == {"lam": 0.5}
    defaults = config_from_args(_parser().parse_args([]))
    assert (defaults.resume, defaults.progress, defaults.bf16) == (False, True, False)


def test_resume_messages_name_the_flags():
    assert flag_names()["learning_rate"] == "lr"
    assert describe_changes({"learning_rate": (3e-05, 0.01), "progress": (True, False)}) == \
        "lr 3e-05 -> 0.01, progress True -> False"


def test_flag_metadata_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="kind: expected one of"):
        flag("help", kind="toggle")
