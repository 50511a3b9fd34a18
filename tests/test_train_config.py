"""TrainConfig presets, validation, YAML and CLI precedence; credit parsing."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ktae.train.cli_train import add_arguments, config_from_args
from ktae.train.config import TrainConfig
from ktae.train.credit import credit_settings


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


def test_credit_settings():
    c = credit_settings(TrainConfig(credit="none").resolve())
    assert (c.estimator, c.calibration, c.dynamic_sampling) == ("grpo", None, True)
    c = credit_settings(TrainConfig(algo="drgrpo", credit="ktae", ktae_h2=2.0).resolve())
    assert c.estimator == "ktae" and c.estimator_options["base"] == "drgrpo"
    assert c.estimator_options["h2"] == 2.0
    c = credit_settings(TrainConfig(credit="taco", taco_alpha=0.05).resolve())
    assert (c.estimator, c.calibration) == ("grpo", "taco")
    assert c.calibration_options == {"alpha": 0.05, "lam": 0.9}
    c = credit_settings(TrainConfig(credit="ktae+taco-hard").resolve())
    assert (c.estimator, c.calibration) == ("ktae", "taco-hard")
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

    (tmp_path / "metrics.jsonl").write_text("")
    assert main(["train", "--output-dir", str(tmp_path)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["train", "--credit", "magic", "--output-dir", str(tmp_path / "x")]) == 2
    assert "magic" in capsys.readouterr().err
