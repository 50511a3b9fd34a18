"""The run settings credit methods declare (``ktae.core.registry.Alias``): each is a
``TrainConfig`` field, a ``ktae train`` flag and a config key made from the method's record
alone; run directories written before keep loading; no module but the declaring one names
a setting; a new setting declared in a record reaches the method with no other change."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from ktae.core.methods import declared_aliases, setting_aliases
from ktae.runs.config import TrainConfig, resume_changes
from ktae.runs.credit import credit_settings, parse_arm
from ktae.train import cli_train
from ktae.train.flags import TRAIN_FLAGS

SRC = Path(__file__).resolve().parents[1] / "src" / "ktae"

# a run directory's config.yaml as ktae train wrote it when these settings were fields
# written out in TrainConfig (the method settings among the others, after overlong_factor)
OLD_CONFIG = """\
model: null
task: embedded
task_fields: {}
task_filters: {}
eval_task: null
template: null
reward: boxed
algo: dapo
credit: ktae+taco
seed: 0
output_dir: runs/old
resume: false
max_steps: 2
num_prompts: 4
num_generations: 4
max_new_tokens: 8
temperature: 1.0
learning_rate: 3.0e-05
lr_scheduler: constant
warmup_steps: 0
warmup_ratio: 0.0
beta: 0.0
clip_low: 0.2
clip_high: 0.28
loss_type: dapo
advantage_base: grpo
dynamic_sampling: true
max_generation_rounds: 3
overlong_buffer: 1
overlong_factor: 1.0
ktae_h1: null
ktae_h2: 2.0
ktae_h3: null
ktae_mode: exact
ktae_ngram: 2
ktae_ngram_reduce: maxabs
taco_alpha: null
taco_lambda: 0.5
estimator_options: {}
calibration_options: {}
eval_every: 0
eval_size: 8
save_every: 0
save_total_limit: 2
train_size: 64
torch_threads: 1
logprob_head: auto
bf16: false
progress: false
lora_r: 0
lora_alpha: null
lora_dropout: 0.0
lora_target_modules:
- all-linear
trl: {}
rollout_every: 10
rollout_groups: 4
no_signal_steps: 5
"""


def test_an_old_run_config_loads_and_names_the_same_method(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(OLD_CONFIG)
    cfg = TrainConfig.from_file(path).resolve()
    assert (cfg.ktae_h2, cfg.ktae_ngram, cfg.ktae_ngram_reduce, cfg.taco_lambda) == (
        2.0, 2, "maxabs", 0.5)
    s = credit_settings(cfg)
    assert s.estimator_options == {"base": "grpo", "mode": "exact", "h2": 2.0, "ngram": 2,
                                   "ngram_reduce": "maxabs"}
    assert s.calibration_options == {"lam": 0.5}
    # saved again, it reads back the same; a resume with the same flags changes nothing
    cfg.save(tmp_path / "again.yaml")
    assert TrainConfig.from_file(tmp_path / "again.yaml").resolve() == cfg
    parser = argparse.ArgumentParser()
    cli_train.add_arguments(parser)
    new = cli_train.config_from_args(parser.parse_args(
        ["--config", str(path), "--ktae-h2", "2", "--taco-lambda", "0.5"]))
    assert resume_changes(cfg, new) == ({}, {})


def test_every_declared_setting_is_a_field_a_flag_and_a_key():
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    flags = {f.dest: f.name for f in TRAIN_FLAGS}
    for alias in declared_aliases():
        assert fields[alias.name].default == alias.default
        assert flags[alias.name] == "--" + alias.name.replace("_", "-")
        assert fields[alias.name].metadata["doc"] == alias.doc
    names = [a.name for a in declared_aliases()]
    assert {"ktae_h1", "ktae_mode", "ktae_ngram", "taco_alpha", "taco_lambda"} <= set(names)
    assert "advantage_base" not in names  # a setting of every run that KTAE reads as base


def _names_in_code(path: Path) -> set[str]:
    """The identifiers and string constants of ``path``, docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            out.add(node.value)
        elif isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            out.add(node.arg)
    return out


# the simulator has settings of its own (ktae simulate --ktae-ngram: SimConfig)
NOT_THE_TRAINERS = ("sim",)


def test_only_the_declaring_module_names_a_setting():
    owners = {}
    for record, alias in setting_aliases():
        if alias.declared:
            owners[alias.name] = Path(sys.modules[record.fn.__module__].__file__).resolve()
    for path in sorted(SRC.rglob("*.py")):
        if path.relative_to(SRC).parts[0] in NOT_THE_TRAINERS:
            continue
        named = {n for n in _names_in_code(path) & set(owners) if owners[n] != path}
        # ktae_options holds KTAE's settings for the estimator registered in ktae.py
        if path.name == "ktae_options.py":
            named -= {n for n in named if n.startswith("ktae_")}
        assert not named, f"{path.relative_to(SRC)} names {sorted(named)}"


def test_a_setting_declared_in_a_record_reaches_its_method():
    """What a built-in method with one setting of its own adds: the record's alias, nothing
    else (here a copy of ``spo-mask`` declaring ``--spo-threshold``)."""
    code = """
import argparse
from ktae.core.calibration import CALIBRATIONS
from ktae.core.registry import Alias
spo = CALIBRATIONS.record("spo-mask")
CALIBRATIONS.register("spo-copy", needs=spo.needs, aliases=(
    Alias("spo_threshold", "prob_threshold", float | None, None, help="SPO threshold"),
))(spo.fn)
from ktae.runs.credit import credit_settings, parse_arm
from ktae.train import cli_train
parser = argparse.ArgumentParser()
cli_train.add_arguments(parser)
assert "--spo-threshold" in parser.format_help()
cfg = cli_train.config_from_args(parser.parse_args(
    ["--credit", "grpo+spo-copy", "--spo-threshold", "0.3", "-o", "x"]))
assert cfg.spo_threshold == 0.3
assert credit_settings(cfg).calibration_options == {"prob_threshold": 0.3}
assert parse_arm("spo-copy@threshold=0.4").overrides == {"spo_threshold": 0.4}
try:
    cli_train.config_from_args(parser.parse_args(["--spo-threshold", "0.3", "-o", "x"]))
except ValueError as err:
    assert str(err).startswith("spo_threshold: credit 'ktae' has no calibration"), err
else:
    raise AssertionError("accepted a setting its credit does not take")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("entry, overrides", [
    ("ktae@ngram=3@mode=exact", {"ktae_ngram": 3, "ktae_mode": "exact"}),
    ("taco@lambda=0.5@alpha=0.1", {"taco_lambda": 0.5, "taco_alpha": 0.1}),
    ("ktae+taco-hard@alpha=0.1", {"calibration_options": {"alpha": 0.1}}),
])
def test_entries_name_the_settings_of_their_own_parts(entry, overrides):
    assert parse_arm(entry).overrides == overrides
