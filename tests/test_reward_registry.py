"""The reward registry behind ``ktae train --reward``: names, validation, wiring."""

from __future__ import annotations

import argparse

import pytest

from ktae.rewards import REWARDS, get_reward, math_reward
from ktae.runs.config import TrainConfig
from ktae.train import cli_train
from ktae.train.reward_funcs import make_accuracy_reward, make_reward_funcs

CASES = [("so $\\boxed{\\frac{1}{2}}$", "0.5"), ("\\boxed{7", "7"), ("7", "7"),
         ("\\boxed{3}", "4"), ("\\boxed{07}", "7")]


def test_boxed_is_the_default_and_matches_math_reward():
    assert TrainConfig().reward == "boxed"
    reward = get_reward("boxed")
    got = reward.score([c for c, _ in CASES], [a for _, a in CASES], timeout=5.0)
    assert [r.score for r in got] == [math_reward(c, a).score for c, a in CASES]
    assert [r.score for r in got] == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_unknown_reward_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"reward: expected one of boxed.*got 'nope'"):
        get_reward("nope")
    with pytest.raises(ValueError, match="reward: expected one of"):
        TrainConfig(reward="nope").resolve()


def _parse(argv):
    parser = argparse.ArgumentParser()
    cli_train.add_arguments(parser)
    return parser.parse_args(argv)


def test_reward_flag_and_yaml_key(tmp_path):
    assert cli_train.config_from_args(_parse(["--reward", "boxed"])).reward == "boxed"
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("reward: boxed\n")
    assert cli_train.config_from_args(_parse(["--config", str(yaml_file)])).reward == "boxed"
    yaml_file.write_text("reward: strict\n")
    with pytest.raises(ValueError, match="reward: expected one of"):
        cli_train.config_from_args(_parse(["--config", str(yaml_file)]))


def test_cli_refuses_an_unknown_reward_before_any_model_loads(tmp_path, capsys, monkeypatch):
    import ktae.train.session as session

    monkeypatch.setattr(session, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    rc = cli_train.run(_parse(["--reward", "nope", "-o", str(tmp_path / "run")]))
    assert rc == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reward: expected one of" in err


def test_accuracy_function_uses_the_named_reward():
    accuracy = make_accuracy_reward(reward="boxed", stop_ids=[0])
    ended = [[5, 0]] * len(CASES)  # every response's ids end with its stop id
    assert accuracy(completions=[c for c, _ in CASES], answer=[a for _, a in CASES],
                    completion_ids=ended) == [1.0, 0.0, 0.0, 0.0, 1.0]
    funcs = make_reward_funcs(max_new_tokens=8, overlong_buffer=0, overlong_factor=1.0,
                              reward="boxed")
    assert [f.__name__ for f in funcs] == ["accuracy"]
    # chat-format completions (lists of messages) are scored on the last message
    assert accuracy(completions=[[{"role": "assistant", "content": "\\boxed{2}"}]],
                    answer=["2"], completion_ids=ended[:1]) == [1.0]


def test_every_registered_reward_has_a_summary_and_scores_a_batch():
    for name, reward in REWARDS.items():
        assert reward.name == name and reward.summary
        out = reward.score(["\\boxed{1}"], ["1"], timeout=5.0)
        assert len(out) == 1
