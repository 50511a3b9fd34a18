"""``algorithm.ktae.split`` in the verl plugin's options (the options module needs no verl):
parsed, checked at start-up and forwarded; graded takes no correctness."""

from __future__ import annotations

import pytest

from ktae.integrations.verl.options import (
    _check_estimator_values,
    block_options,
    estimator_settings,
)

KTAE_OPTIONS = block_options("ktae")


@pytest.mark.parametrize("block", [{"split": "graded"}, {"split": "graded", "ngram": 2},
                                   {"split": "graded", "correct_key": None}])
def test_graded_split_is_forwarded_without_correctness(block):
    assert "split" in KTAE_OPTIONS
    settings = estimator_settings("ktae", {"ktae": block})
    assert settings.options["split"] == "graded" and settings.correct_key is None
    assert "correct_key" not in settings.options
    _check_estimator_values(settings)


def test_threshold_split_keeps_the_accuracy_field():
    settings = estimator_settings("ktae", {"ktae": {"split": "threshold"}})
    assert settings.correct_key == "acc"
    _check_estimator_values(settings)


@pytest.mark.parametrize("block, message", [
    ({"split": "graded", "correct_key": "acc"}, r"algorithm\.ktae\.correct_key: split=graded"),
    ({"split": "graded", "reward_threshold": 0.5},
     r"algorithm\.ktae\.reward_threshold: split=graded"),
])
def test_graded_split_refuses_correctness_settings(block, message):
    with pytest.raises(ValueError, match=message):
        estimator_settings("ktae", {"ktae": block})


def test_bad_split_fails_the_startup_check_naming_the_option():
    settings = estimator_settings("ktae", {"ktae": {"split": "soft"}})
    with pytest.raises(ValueError, match="algorithm.ktae: split: expected 'threshold' or 'graded'"):
        _check_estimator_values(settings)
    reference = estimator_settings("ktae", {"ktae": {"split": "graded", "mode": "reference"}})
    with pytest.raises(ValueError, match="algorithm.ktae: split: the reference mode"):
        _check_estimator_values(reference)


def test_every_ktae_option_is_an_algorithm_ktae_key():
    """A new option of the estimator must reach verl's ``algorithm.ktae`` block too."""
    import inspect

    from ktae.core.ktae import ktae_advantages

    own = {k for k, p in inspect.signature(ktae_advantages).parameters.items()
           if p.kind is p.KEYWORD_ONLY and k != "correct"}  # correct: from correct_key
    assert own <= set(KTAE_OPTIONS), own - set(KTAE_OPTIONS)


def test_apply_is_forwarded_and_checked_at_start_up():
    settings = estimator_settings("ktae", {"ktae": {"apply": "wrong", "ngram": 3}})
    assert settings.options["apply"] == "wrong" and settings.correct_key == "acc"
    _check_estimator_values(settings)
    bad = estimator_settings("ktae", {"ktae": {"apply": "some"}})
    with pytest.raises(ValueError, match="algorithm.ktae: apply: expected one of all, wrong, right"):
        _check_estimator_values(bad)
