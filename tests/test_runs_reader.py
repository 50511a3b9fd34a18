"""Reading a run directory through ``ktae.runs.reader`` (what explain and audit read)."""

from __future__ import annotations

import json

import pytest

from ktae.runs.config import TrainConfig
from ktae.runs.reader import (
    read_run_rollouts,
    recorded_credit_name,
    recorded_method,
    run_config,
)
from ktae.runs.rollouts import ROLLOUTS_FILE

HEADER = {"kind": "header", "format": "ktae-rollouts", "version": 1, "estimator": "ktae",
          "estimator_options": {"h1": 2.0}, "calibration": "taco",
          "calibration_options": {"alpha": 0.05}, "ignore_token_ids": [0, 2],
          "num_generations": 2}


def test_run_config_reads_the_saved_settings(tmp_path):
    assert run_config(tmp_path) is None
    TrainConfig(credit="grpo", ktae_h1=None, seed=7).save(tmp_path / "config.yaml")
    cfg = run_config(tmp_path)
    assert (cfg.credit, cfg.seed) == ("grpo", 7)


def test_the_recorded_credit_comes_from_the_header():
    method = recorded_method(HEADER, ignore_token_ids=[0, 2])
    assert (method.estimator, method.calibration) == ("ktae", "taco")
    assert method.estimator_options == {"h1": 2.0}
    assert method.calibration_options == {"alpha": 0.05}
    assert method.ignore_token_ids == (0, 2)
    assert recorded_credit_name(HEADER) == "ktae+taco"
    assert recorded_credit_name({**HEADER, "calibration": None}) == "ktae"
    assert recorded_method({"estimator": "grpo"}).calibration is None


def test_rollouts_of_a_run(tmp_path):
    with pytest.raises(ValueError, match=f"INPUT: .* holds no {ROLLOUTS_FILE}"):
        read_run_rollouts(tmp_path)
    path = tmp_path / ROLLOUTS_FILE
    path.write_text(json.dumps(HEADER) + "\n")
    with pytest.raises(ValueError, match="holds no recorded groups yet"):
        read_run_rollouts(tmp_path)
    group = {"kind": "group", "step": 1, "group": 0, "prompt": "Q:1+1 A:",
             "responses": [[5, 6], [5]], "rewards": [1.0, 0.0], "correct": [True, False],
             "advantages": [[0.5, 0.5], [-0.5]]}
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(group) + "\n")
    header, records = read_run_rollouts(tmp_path)
    assert header["estimator"] == "ktae" and len(records) == 1
    assert records[0]["responses"] == [[5, 6], [5]]
