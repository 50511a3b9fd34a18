"""KTAE over n-grams in the trainer: config fields, flags, credit options, and compare arms
(``--credit none,ktae@ngram=2``) that reach ``ktae.compute_advantages``."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from test_train_helpers import save_tiny_model

import ktae
from ktae.cli import main
from ktae.core import estimators
from ktae.runs.config import TrainConfig
from ktae.runs.credit import credit_settings
from ktae.train import cli_train
from ktae.train.cli_compare import parse_arm, parse_arms


def test_config_fields_reach_the_estimator_options():
    cfg = TrainConfig(ktae_ngram=3, ktae_ngram_reduce="maxabs").resolve()
    opts = credit_settings(cfg).estimator_options
    assert opts["ngram"] == 3 and opts["ngram_reduce"] == "maxabs"
    default = credit_settings(TrainConfig().resolve()).estimator_options
    assert "ngram" not in default and "ngram_reduce" not in default  # the estimator default


@pytest.mark.parametrize("change, match", [
    (dict(ktae_ngram=0), "ktae_ngram: expected a positive integer"),
    (dict(ktae_ngram=True), "ktae_ngram: expected an integer"),
    (dict(ktae_ngram="3"), "ktae_ngram: expected an integer"),
    (dict(ktae_ngram=2, ktae_mode="reference"), "ktae_ngram: the reference mode"),
    (dict(ktae_ngram_reduce="max"), "ktae_ngram_reduce: expected 'mean' or 'maxabs'"),
])
def test_config_validation(change, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**change).resolve()


def test_train_flags():
    parser = argparse.ArgumentParser()
    cli_train.add_arguments(parser)
    cfg = cli_train.config_from_args(parser.parse_args(
        ["--ktae-ngram", "4", "--ktae-ngram-reduce", "maxabs", "--output-dir", "x"]))
    assert (cfg.ktae_ngram, cfg.ktae_ngram_reduce) == (4, "maxabs")


def test_train_credit_takes_settings_as_compare_does(tmp_path):
    parser = argparse.ArgumentParser()
    cli_train.add_arguments(parser)
    cfg = cli_train.config_from_args(parser.parse_args(["--credit", "ktae@ngram=3"]))
    assert (cfg.credit, cfg.ktae_ngram) == ("ktae", 3)
    assert cfg.output_dir == "runs/dapo-ktae-ngram=3-seed0"
    assert credit_settings(cfg).estimator_options["ngram"] == 3
    # an option that is no train setting goes to its part; a config file's credit too
    config = tmp_path / "c.yaml"
    config.write_text("credit: grpo+spo-mask@prob_threshold=0.5\n")
    cfg = cli_train.config_from_args(parser.parse_args(["--config", str(config), "-o", "x"]))
    assert (cfg.credit, cfg.calibration_options, cfg.output_dir) == (
        "grpo+spo-mask", {"prob_threshold": 0.5}, "x")
    assert credit_settings(cfg).calibration == "spo-mask"


@pytest.mark.parametrize("argv, match", [
    (["--credit", "ktae@ngram=3", "--ktae-ngram", "2"], "ktae_ngram is set in 'ktae@ngram=3' "
                                                        "and as ktae_ngram = 2"),
    (["--credit", "spo-mask@prob_threshold=0.5", "--calibration-option", "prob_threshold=0.3"],
     "'prob_threshold' is set in 'spo-mask@prob_threshold=0.5' and in calibration_options"),
    (["--credit", "ktae@foo=1"], "'foo' in 'ktae@foo=1' is not an option of estimator 'ktae'"),
])
def test_train_credit_settings_refuse_conflicts(argv, match):
    parser = argparse.ArgumentParser()
    cli_train.add_arguments(parser)
    with pytest.raises(ValueError, match=match):
        cli_train.config_from_args(parser.parse_args(argv))


def test_compare_arms_parse():
    assert parse_arm("none") == parse_arm(" none ")
    arm = parse_arm("ktae@ngram=3")
    assert (arm.credit, arm.overrides, arm.dirname) == ("ktae", {"ktae_ngram": 3}, "ktae-ngram=3")
    arm = parse_arm("ktae+taco@lambda=0.5@ktae_ngram=2@learning_rate=1e-4")
    assert arm.credit == "ktae+taco"
    assert arm.overrides == {"taco_lambda": 0.5, "ktae_ngram": 2, "learning_rate": 1e-4}
    assert arm.dirname == "ktae-taco-lambda=0.5-ktae_ngram=2-learning_rate=1e-4"
    assert [a.label for a in parse_arms("none,ktae,ktae@ngram=3")] == [
        "none", "ktae", "ktae@ngram=3"]


@pytest.mark.parametrize("spec, match", [
    ("ktae@foo=1", "'foo' in 'ktae@foo=1' is not an option of estimator 'ktae'.* or a setting"),
    ("ktae@ngram", "expected KEY=VALUE"),
    ("ktae@ngram=", "expected KEY=VALUE"),
    ("ktae@ngram=x", "ngram='x' in 'ktae@ngram=x': expected int"),
    ("ktae@seed=3", "'seed' in 'ktae@seed=3' is not an option .* or a setting"),
    ("@ngram=2", "expected a name before '@'"),
    ("ktae@ngram=2@ktae_ngram=3", "ktae_ngram set twice"),
    ("ktae,ktae", "would share the run directory ktae-seed"),
    ("", "expected a comma-separated list"),
])
def test_compare_arms_refuse_bad_entries(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_arms(spec)


def test_compare_refuses_bad_arms_before_training(tmp_path, capsys):
    assert main(["compare", "--credit", "none,ktae@ngram=0", "--output-dir", str(tmp_path)]) == 2
    assert "ktae_ngram: expected a positive integer" in capsys.readouterr().err
    assert main(["compare", "--credit", "ktae@bogus=1", "--output-dir", str(tmp_path)]) == 2
    assert "'bogus'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_compare_arm_reaches_the_estimator(tmp_path, monkeypatch, capsys):
    torch.set_num_threads(1)
    model = save_tiny_model(tmp_path / "model")
    seen = []
    real = ktae.compute_advantages

    def spy(name, **kw):
        seen.append((name, kw.get("ngram")))
        return real(name, **kw)

    monkeypatch.setattr(estimators, "compute_advantages", spy)  # the trainer reads it there
    root = tmp_path / "cmp"
    argv = ["compare", "--model", str(model), "--credit", "ktae,ktae@ngram=2", "--seeds", "1",
            "--max-steps", "1", "--num-prompts", "2", "--num-generations", "4",
            "--max-new-tokens", "6", "--train-size", "32", "--eval-size", "4",
            "--output-dir", str(root), "--no-progress"]
    assert main(argv) == 0
    assert ("ktae", None) in seen and ("ktae", 2) in seen  # ngram=1: the default, not passed
    rows = [ln for ln in (root / "comparison.md").read_text().splitlines()
            if ln.startswith("| ktae")]
    assert [r.split("|")[1].strip() for r in rows] == ["ktae", "ktae@ngram=2"]
    assert sorted(json.loads((root / "comparison.json").read_text())) == ["ktae", "ktae@ngram=2"]
    assert (root / "ktae-ngram=2-seed0" / "summary.json").exists()
    assert "ktae_ngram: 2" in (root / "ktae-ngram=2-seed0" / "config.yaml").read_text()
    capsys.readouterr()


def test_verl_plugin_forwards_span_options():
    """``+algorithm.ktae.ngram=3`` reaches ``compute_advantages`` (the options module needs
    no verl); a bad value fails the start-up check, naming the option."""
    from ktae.integrations.verl.options import _check_estimator_values, estimator_settings

    settings = estimator_settings("ktae", {"ktae": {"ngram": 3, "ngram_reduce": "maxabs"}})
    assert settings.options["ngram"] == 3 and settings.options["ngram_reduce"] == "maxabs"
    _check_estimator_values(settings)
    bad = estimator_settings("ktae", {"ktae": {"ngram": 0}})
    with pytest.raises(ValueError, match="algorithm.ktae: ngram: expected a positive integer"):
        _check_estimator_values(bad)


def test_simulator_forwards_span_length(tmp_path, capsys):
    """``ktae simulate --ktae-ngram N``: KTAE over spans of N consecutive steps, the
    library's call on the simulator's batch; recorded in the run's config."""
    from ktae.sim.credit import CreditBatch, base_advantages

    gen = torch.Generator().manual_seed(0)
    G, H, A = 4, 6, 3
    actions = torch.randint(0, A, (2 * G, H), generator=gen)
    mask = torch.ones(2 * G, H, dtype=torch.bool)
    batch = CreditBatch(step_rewards=(actions < 1).float(), mask=mask,
                        group=torch.arange(2).repeat_interleave(G),
                        horizon=torch.full((2 * G,), H),
                        token_ids=torch.arange(H) * A + actions,
                        logprobs=torch.zeros(2 * G, H), entropies=torch.ones(2 * G, H),
                        run_slices=((0, G), (G, 2 * G)))
    direct = ktae.compute_advantages("ktae", rewards=batch.returns, group=batch.group,
                                     token_ids=batch.token_ids, mask=mask, ngram=3,
                                     correct=batch.above_group_mean())
    torch.testing.assert_close(base_advantages("ktae", batch, ktae_ngram=3), direct)
    assert not torch.equal(direct, base_advantages("ktae", batch))
    out = tmp_path / "sim"
    assert main(["simulate", "--actions", "16", "--steps", "6", "--seeds", "1", "--eval-every",
                 "3", "--horizon", "4", "--n-opt", "1", "--group-size", "4", "--threads", "1",
                 "--methods", "ktae", "--ktae-ngram", "2", "--no-progress", "-o", str(out)]) == 0
    assert json.loads((out / "curves.json").read_text())["config"]["ktae_ngram"] == 2
    assert main(["simulate", "--ktae-ngram", "0", "-o", str(tmp_path / "x")]) == 2
    assert "ktae_ngram: expected a positive integer" in capsys.readouterr().err
