"""KTAE's graded split reaches the trainer: ``--estimator-option split=graded`` (checked
before any model loads) and a training step whose advantages are graded KTAE on the
summed rewards, without the verifier's ``correct``."""

from __future__ import annotations

import argparse

import pytest
import torch
from test_train_helpers import Recorder, read_jsonl, tiny_config

import ktae
from ktae.core.methods import passes_correct
from ktae.runs.credit import credit_settings
from ktae.train import cli_train
from ktae.train.session import train


def _parse(argv):
    parser = argparse.ArgumentParser()
    cli_train.add_arguments(parser)
    return parser.parse_args(argv)


def test_split_option_passes_through_the_option_routing():
    cfg = cli_train.config_from_args(_parse(["--credit", "ktae", "--estimator-option",
                                             "split=graded", "--reward", "digits"]))
    settings = credit_settings(cfg)
    assert settings.estimator == "ktae" and settings.estimator_options["split"] == "graded"
    assert not passes_correct("ktae", settings.estimator_options)
    assert passes_correct("ktae", {}) and passes_correct("gtpo", {"split": "graded"})
    assert not passes_correct("grpo", {})


def test_bad_split_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import ktae.train.session as session

    monkeypatch.setattr(session, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    rc = cli_train.run(_parse(["--credit", "ktae", "--estimator-option", "split=soft",
                               "-o", str(tmp_path / "run")]))
    assert rc == 2
    err = capsys.readouterr().err
    assert "split: expected 'threshold' or 'graded'" in err and err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.parametrize("ngram", [1, 2])
def test_graded_split_trains_on_the_graded_reward(tmp_path, ngram):
    from ktae.models.warmstart import default_model_path

    seen: list = []
    cls = type("R", (Recorder,), {"seen": seen})
    cfg = tiny_config(default_model_path(), tmp_path / "run", algo="grpo", credit="ktae",
                      reward="digits", max_steps=1, num_prompts=4, max_new_tokens=24,
                      temperature=1.5, estimator_options={"split": "graded", "ngram": ngram})
    summary = train(cfg, trainer_cls=cls)
    assert summary["steps"] == 1
    assert torch.isfinite(torch.tensor(read_jsonl(tmp_path / "run" / "metrics.jsonl")[0]["loss"]))
    rec = seen[0]
    partial = (rec["rewards"] > 0) & (rec["rewards"] < 1)
    assert partial.any(), rec["rewards"]  # the seeded run holds near misses
    group = torch.arange(rec["rewards"].numel()) // cfg.num_generations
    expected = ktae.compute_advantages("ktae", rewards=rec["rewards"], group=group,
                                       token_ids=rec["ids"], mask=rec["token_mask"].bool(),
                                       ignore_token_ids=rec["ignore"], split="graded",
                                       ngram=ngram)
    torch.testing.assert_close(rec["adv"], expected * rec["loss_mask"])
