"""The verl plugin with users' rules, without verl: a rule loaded from ``KTAE_PLUGINS``
(or the ``ktae.plugins`` entry points) in every process is one of the plugin's
estimators, with its own options, the verifier's ``acc`` as ``batch.correct``, and
one-line refusals."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ktae
from ktae import plugins
from ktae.integrations.verl import estimators as est
from ktae.integrations.verl.fields import V1_SOURCE, ResponseFields, providing_responses
from ktae.integrations.verl.options import check_config, estimator_settings, plugin_estimators

RULE = textwrap.dedent('''
    import ktae

    @ktae.register_estimator("signed-length", needs=("mask",))
    def signed_length(batch, *, scale: float = 1.0):
        """scale * (+1 right, -1 wrong) on every real token."""
        sign = 2.0 * batch.correct.double() - 1.0
        return scale * sign[:, None] * batch.mask.double()
''')


#: every test registers its rules afresh (conftest.py)
pytestmark = pytest.mark.usefixtures("clean_registries")


@pytest.fixture
def rule_file(tmp_path):
    path = tmp_path / "signed_length.py"
    path.write_text(RULE)
    return path


def _call(name, config, *, acc):
    responses = torch.tensor([[3, 4, 5], [3, 6, 0], [7, 8, 0], [7, 0, 0]])
    mask = (responses != 0).float()
    rewards = torch.zeros(4, 3)
    rewards[:, 0] = torch.tensor([0.5, 0.5, 0.2, 0.0])  # shaped: every right answer > 0
    fields = ResponseFields(responses, {"acc": acc} if acc is not None else {},
                            source=V1_SOURCE)
    with providing_responses(fields):
        adv, _ = est.make_estimator(name)(token_level_rewards=rewards, response_mask=mask,
                                          index=["a", "a", "b", "b"], config=config)
    return adv, mask


def test_env_var_loads_rules_in_a_fresh_process(rule_file):
    """What a Ray worker does on ``import verl``: the plugin loads KTAE_PLUGINS first."""
    code = ("from ktae.integrations.verl.options import load_user_rules, plugin_estimators; "
            "load_user_rules(); print(plugin_estimators()['signed-length'])")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env={**os.environ, plugins.ENV_VAR: str(rule_file)})
    assert out.stdout.strip() == "('scale', 'reward_threshold', 'correct_key')"


def test_env_var_names_a_failing_plugin(tmp_path):
    with pytest.raises(plugins.PluginError, match=r"^KTAE_PLUGINS: --plugin .*nope\.py: no such"):
        plugins.load_from_env({plugins.ENV_VAR: str(tmp_path / "nope.py")})


def test_a_user_rule_reads_the_verifiers_accuracy_and_its_options(rule_file):
    assert plugins.load_from_env({plugins.ENV_VAR: str(rule_file)}) == [str(rule_file)]
    assert "signed-length" in plugin_estimators()
    assert "ktae" in plugin_estimators() and "grpo" not in plugin_estimators()
    config = {"adv_estimator": "signed-length", "signed-length": {"scale": 2.0}}
    adv, mask = _call("signed-length", config, acc=[True, False, True, False])
    expected = 2.0 * torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None] * mask
    torch.testing.assert_close(adv, expected)
    # without the field: reward > reward_threshold
    adv, _ = _call("signed-length", {"signed-length": {"reward_threshold": 0.3}}, acc=None)
    torch.testing.assert_close(adv, torch.tensor([1.0, 1.0, -1.0, -1.0])[:, None] * mask)


def test_config_check_takes_the_rules_options_and_refuses_others(rule_file):
    plugins.load_plugin(str(rule_file))
    checked = check_config({"algorithm": {"adv_estimator": "signed-length",
                                          "signed-length": {"scale": 0.5}}})
    assert checked.estimator.options == {"scale": 0.5}
    with pytest.raises(ValueError, match=r"^algorithm.signed-length.scal: unknown option; "
                                         r"expected one of scale, reward_threshold, correct_key"):
        estimator_settings("signed-length", {"signed-length": {"scal": 1}})


def test_a_rule_reading_logprobs_is_refused_at_start_up():
    @ktae.register_estimator("by-logprob", needs=("logprobs",))
    def by_logprob(batch):
        return batch.logprobs

    with pytest.raises(ValueError, match="by-logprob: the rule reads the sampling policy's "
                                         "log-probs"):
        check_config({"algorithm": {"adv_estimator": "by-logprob"}})


def test_prefix_value_is_a_plugin_estimator_with_the_verifiers_accuracy():
    """``algorithm.adv_estimator=prefix-value``: its options from ``algorithm.prefix-value``,
    ``acc`` as the verdict (the shaped reward would call row 2 wrong), ``base`` from verl's
    Dr.GRPO switch."""
    assert "prefix-value" in plugin_estimators()
    config = {"adv_estimator": "prefix-value", "prefix-value": {"total": "add", "weight": 0.5}}
    acc = [True, False, False, True]
    adv, mask = _call("prefix-value", config, acc=acc)
    responses = torch.tensor([[3, 4, 5], [3, 6, 0], [7, 8, 0], [7, 0, 0]])
    want = ktae.compute_advantages("prefix-value", rewards=torch.tensor([0.5, 0.5, 0.2, 0.0]),
                                   group=["a", "a", "b", "b"], token_ids=responses, mask=mask,
                                   correct=torch.tensor(acc), total="add", weight=0.5)
    torch.testing.assert_close(adv, want.to(adv.dtype))
    settings = estimator_settings("prefix-value", {"norm_adv_by_std_in_grpo": False,
                                                   "prefix-value": {}})
    assert settings.options == {"base": "drgrpo"} and settings.correct_key == "acc"
    check_config({"algorithm": config})
    with pytest.raises(ValueError, match=r"^algorithm.prefix-value.units: unknown option"):
        estimator_settings("prefix-value", {"prefix-value": {"units": "span"}})
    with pytest.raises(ValueError, match=r"^algorithm.prefix-value: word_starts: required"):
        check_config({"algorithm": {"adv_estimator": "prefix-value",
                                    "prefix-value": {"unit": "word"}}})
