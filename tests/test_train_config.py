"""TrainConfig presets, validation, YAML and CLI precedence; credit parsing."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from ktae.runs.config import TrainConfig
from ktae.runs.credit import credit_settings
from ktae.train.cli_train import add_arguments, config_from_args


def test_algo_presets():
    dapo = TrainConfig().resolve()
    assert (dapo.algo, dapo.loss_type, dapo.clip_low, dapo.clip_high) == ("dapo", "dapo", 0.2, 0.28)
    assert dapo.dynamic_sampling is True and dapo.overlong_buffer == 8
    assert dapo.credit == "ktae" and dapo.beta == 0.0 and dapo.bf16 is False
    grpo = TrainConfig(algo="grpo").resolve()
    assert (grpo.loss_type, grpo.clip_high, grpo.dynamic_sampling, grpo.overlong_buffer) == \
        ("grpo", 0.2, False, 0)
    dr = TrainConfig(algo="drgrpo").resolve()
    assert (dr.loss_type, dr.advantage_base) == ("dr_grpo", "drgrpo")
    # explicit values win over presets
    assert TrainConfig(algo="dapo", clip_high=0.24, dynamic_sampling=False).resolve() \
        .clip_high == 0.24
    assert TrainConfig(seed=3, credit="ktae+taco").resolve().output_dir == \
        "runs/dapo-ktae-taco-seed3"


@pytest.mark.parametrize("field,value,match", [
    ("algo", "ppo", "algo"), ("loss_type", "sum", "loss_type"), ("num_generations", 1,
                                                                  "num_generations"),
    ("max_steps", 0, "max_steps"), ("learning_rate", 0.0, "learning_rate"),
    ("taco_lambda", 1.5, "taco_lambda"), ("overlong_buffer", 40, "overlong_buffer"),
    ("task", "gsm8k", "task"), ("ktae_mode", "fast", "ktae_mode"), ("eval_every", -1,
                                                                     "eval_every"),
    ("task", "jsonl:", "task"), ("template", "chatml", "template"), ("lora_r", -1, "lora_r"),
])
def test_validation_names_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{field: value}).resolve()


def test_yaml_round_trip_and_unknown_fields(tmp_path):
    cfg = TrainConfig(algo="grpo", credit="taco", taco_alpha=0.05).resolve()
    cfg.save(tmp_path / "c.yaml")
    assert TrainConfig.from_file(tmp_path / "c.yaml").resolve() == cfg
    (tmp_path / "bad.yaml").write_text("algo: grpo\nepsilon: 0.2\n")
    with pytest.raises(ValueError, match="epsilon"):
        TrainConfig.from_file(tmp_path / "bad.yaml")
    with pytest.raises(ValueError, match="not found"):
        TrainConfig.from_file(tmp_path / "missing.yaml")


def test_cli_flags_override_config_file(tmp_path):
    (tmp_path / "c.yaml").write_text("algo: grpo\nmax_steps: 7\nlearning_rate: 1.0e-4\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--config", str(tmp_path / "c.yaml"), "--max-steps", "3",
                              "--credit", "none", "--no-dynamic-sampling"])
    cfg = config_from_args(args)
    assert (cfg.algo, cfg.max_steps, cfg.learning_rate, cfg.credit) == ("grpo", 3, 1e-4, "none")
    assert cfg.dynamic_sampling is False
    assert config_from_args(parser.parse_args([])) == TrainConfig().resolve()
    with pytest.raises(ValueError, match="magic"):
        config_from_args(parser.parse_args(["--credit", "magic"]))
    # -o is --output-dir, as in ktae explain and ktae simulate
    assert config_from_args(parser.parse_args(["-o", "somewhere"])).output_dir == "somewhere"


def test_credit_settings():
    c = credit_settings(TrainConfig(credit="none").resolve())
    assert (c.estimator, c.calibration, c.dynamic_sampling) == ("grpo", None, True)
    c = credit_settings(TrainConfig(algo="drgrpo", credit="ktae", ktae_h2=2.0).resolve())
    assert c.estimator == "ktae" and c.estimator_options["base"] == "drgrpo"
    assert c.estimator_options["h2"] == 2.0
    c = credit_settings(TrainConfig(credit="taco", taco_alpha=0.05).resolve())
    assert (c.estimator, c.calibration) == ("grpo", "taco")
    assert c.calibration_options == {"alpha": 0.05}  # unset fields: the method's defaults
    c = credit_settings(TrainConfig(credit="ktae+taco-hard").resolve())
    assert (c.estimator, c.calibration) == ("ktae", "taco-hard")
    assert c.calibration_options == {}
    assert credit_settings(TrainConfig(credit="rloo").resolve()).estimator == "rloo"
    for bad in ("magic", "ktae+rloo", "taco+stapo", "+"):
        with pytest.raises(ValueError, match="credit"):
            credit_settings(TrainConfig(credit=bad).resolve())


@pytest.mark.parametrize("path", sorted(Path(__file__).parents[1].glob("configs/*.yaml")))
def test_example_configs_load(path):
    cfg = TrainConfig.from_file(path).resolve()
    credit_settings(cfg)


def test_train_refuses_an_existing_run_without_resume(tmp_path, capsys):
    from ktae.cli import main

    (tmp_path / "ktae_run.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text("")
    assert main(["train", "--output-dir", str(tmp_path)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["train", "--credit", "magic", "--output-dir", str(tmp_path / "x")]) == 2
    assert "magic" in capsys.readouterr().err


# -- types, namespaces and option routing ------------------------------------------------

@pytest.mark.parametrize("text, match", [
    ("learning_rate: fast\n", "learning_rate: expected a number"),
    ("task: 5\n", None),  # a number is a fine string; the task check then refuses it
    ("estimator_options: [1, 2]\n", "estimator_options: expected a mapping"),
    ("dynamic_sampling: 'no'\n", "dynamic_sampling: expected true/false or null"),
    ("max_steps: true\n", "max_steps: expected an integer"),
    ("num_generations: 2.5\n", "num_generations: expected an integer"),
    ("ktae_h1: abc\n", "ktae_h1: expected a number or null"),
    ("algo: [grpo]\n", "algo: expected a string"),
    ("credit_options: {top: 0.5}\n", "estimator_options .* calibration_options"),
    ("max_stpes: 3\n", "did you mean 'max_steps'"),
    ("algo: grpo\n  bad: [\n", "invalid YAML at line"),
    ("- 1\n- 2\n", "expected a mapping of field names"),
])
def test_config_file_types_are_checked(tmp_path, text, match):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    if match is None:
        with pytest.raises(ValueError, match="task: expected"):
            TrainConfig.from_file(path).resolve()
        return
    with pytest.raises(ValueError, match=match) as info:
        TrainConfig.from_file(path).resolve()
    assert "\n" not in str(info.value)


def test_yaml_scientific_notation_without_dot_is_a_number(tmp_path):
    (tmp_path / "c.yaml").write_text("learning_rate: 3e-5\nclip_high: 1\n")
    cfg = TrainConfig.from_file(tmp_path / "c.yaml").resolve()
    assert cfg.learning_rate == 3e-5 and isinstance(cfg.clip_high, float)


def test_non_utf8_config_is_refused(tmp_path):
    (tmp_path / "c.yaml").write_bytes(b"algo: \xff\xfe\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        TrainConfig.from_file(tmp_path / "c.yaml")


def test_python_construction_is_checked_too():
    with pytest.raises(ValueError, match="max_steps: expected an integer"):
        TrainConfig(max_steps=True)
    with pytest.raises(ValueError, match="bf16: expected true/false"):
        TrainConfig(bf16="yes")


@pytest.mark.parametrize("overrides, match", [
    (dict(credit="taco-hard", taco_lambda=0.5), "taco_lambda: calibration 'taco-hard' takes no"),
    (dict(credit="ktae", taco_alpha=0.05), "taco_alpha: credit 'ktae' has no calibration"),
    (dict(credit="none", ktae_h1=2.0), "ktae_h1: only used by the 'ktae' estimator"),
    (dict(credit="ktae", estimator_options={"h_1": 1.0}), "estimator_options .*h_1"),
    (dict(credit="ktae", ktae_h1=1.0, estimator_options={"h1": 2.0}), "given twice"),
    (dict(credit="ktae", estimator_options={"correct": [True]}), "set by the trainer"),
    (dict(credit="ktae+forking-tokens", calibration_options={"top_fractoin": 0.3}),
     "calibration_options .*top_fractoin"),
    (dict(credit="ktae+forking-tokens", calibration_options={"top_fraction": 3.0}),
     "calibration_options .*top_fraction"),
    (dict(credit="grpo", calibration_options={"alpha": 0.1}), "calibration_options: credit"),
])
def test_credit_options_are_routed_and_checked(overrides, match):
    with pytest.raises(ValueError, match=match):
        credit_settings(TrainConfig(**overrides).resolve())


def test_ktae_and_calibration_options_have_their_own_namespaces():
    c = credit_settings(TrainConfig(credit="ktae+forking-tokens",
                                    estimator_options={"top": 0.5},
                                    calibration_options={"top_fraction": 0.3}).resolve())
    assert c.estimator_options["top"] == 0.5 and "top_fraction" not in c.estimator_options
    assert c.calibration_options == {"top_fraction": 0.3}
    c = credit_settings(TrainConfig(credit="taco-hard", taco_alpha=0.05).resolve())
    assert c.calibration_options == {"alpha": 0.05}
    c = credit_settings(TrainConfig(credit="ktae", ktae_mode="reference").resolve())
    assert c.estimator_options["mode"] == "reference"


def test_cli_pairs_and_lora_flags(tmp_path):
    (tmp_path / "c.yaml").write_text("trl:\n  logging_steps: 3\n  top_k: 5\n"
                                     "calibration_options:\n  top_fraction: 0.5\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([
        "--config", str(tmp_path / "c.yaml"), "--credit", "ktae+forking-tokens",
        "--trl", "logging_steps=2", "--trl", "gradient_checkpointing=true",
        "--estimator-option", "top=0.5", "--calibration-option", "top_fraction=0.25",
        "--lora-r", "4", "--lora-target-modules", "q_proj,v_proj"])
    cfg = config_from_args(args)
    assert cfg.trl == {"logging_steps": 2, "top_k": 5, "gradient_checkpointing": True}
    assert cfg.estimator_options == {"top": 0.5}
    assert cfg.calibration_options == {"top_fraction": 0.25}
    assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_target_modules) == (4, 8.0, ["q_proj", "v_proj"])


def test_warmup_under_the_constant_schedule_resolves_to_constant_with_warmup():
    assert TrainConfig(warmup_steps=10).resolve().lr_scheduler == "constant_with_warmup"
    assert TrainConfig().resolve().lr_scheduler == "constant"
    assert TrainConfig(warmup_steps=10, lr_scheduler="cosine").resolve().lr_scheduler == "cosine"


def test_resume_changes_split_refused_and_allowed_settings():
    from ktae.runs.config import resume_changes

    run = TrainConfig(max_steps=30).resolve()
    refused, allowed = resume_changes(run, TrainConfig(
        max_steps=40, learning_rate=0.01, seed=1, eval_every=5, torch_threads=2,
        output_dir="elsewhere", resume=True).resolve())
    assert refused == {"seed": (0, 1), "learning_rate": (3e-5, 0.01)}
    assert allowed == {"max_steps": (30, 40), "eval_every": (50, 5), "torch_threads": (1, 2)}
    # a schedule whose past learning rates depend on max_steps: more steps change the run
    cosine = TrainConfig(max_steps=30, lr_scheduler="cosine").resolve()
    refused, allowed = resume_changes(cosine, dataclasses.replace(cosine, max_steps=40))
    assert refused == {"max_steps": (30, 40)} and allowed == {}
    # a warm-up given as a share of max_steps: more steps stretch the warm-up already run
    ratio = TrainConfig(max_steps=30, warmup_ratio=0.1).resolve()
    refused, allowed = resume_changes(ratio, dataclasses.replace(ratio, max_steps=40))
    assert refused == {"max_steps": (30, 40)} and allowed == {}
    assert resume_changes(run, dataclasses.replace(run, resume=True)) == ({}, {})


def test_warmup_ratio_is_a_share_and_excludes_warmup_steps():
    assert TrainConfig(warmup_ratio=0.1).resolve().lr_scheduler == "constant_with_warmup"
    assert TrainConfig(warmup_ratio=0.1, lr_scheduler="cosine").resolve().lr_scheduler == \
        "cosine"
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"warmup_ratio: expected a share in \[0, 1\)"):
            TrainConfig(warmup_ratio=bad).resolve()
    with pytest.raises(ValueError, match="warmup_ratio: give warmup_steps=5 or warmup_ratio=0.1"):
        TrainConfig(warmup_ratio=0.1, warmup_steps=5).resolve()
