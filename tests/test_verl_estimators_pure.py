"""The verl plugin's estimator module without verl: ``make_estimator`` in verl's calling
convention, fed through the plugin's context variable as the trainer wrappers feed it.

:mod:`ktae.integrations.verl.estimators` imports no verl at module level, so the main suite
checks here what tests/verl_plugin checks through verl's own trainer functions: the
advantages equal :func:`ktae.compute_advantages` on the same batch, correctness comes from
the reward's ``acc`` (not the shaped reward), options reach the estimator, and every
refusal names its cause.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

import ktae
from ktae.integrations.verl import estimators as est
from ktae.integrations.verl.fields import (
    LEGACY_SOURCE,
    V1_SOURCE,
    ResponseFields,
    providing_responses,
)


def test_the_module_imports_without_verl():
    code = ("import sys, ktae.integrations.verl.estimators; "
            "assert 'verl' not in sys.modules, sorted(m for m in sys.modules if 'verl' in m)")
    subprocess.run([sys.executable, "-c", code], check=True)


def _batch(seed: int = 0, B: int = 8, T: int = 6, V: int = 9):
    g = torch.Generator().manual_seed(seed)
    responses = torch.randint(3, V, (B, T), generator=g)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float32)
    acc = [bool(i % 2) for i in range(B)]
    # the shaped reward: accuracy plus an overlong penalty that can pull a right answer <= 0
    shaped = torch.tensor([float(a) - 0.6 * (i % 4 == 1) - 1.2 * (i % 4 == 3)
                           for i, a in enumerate(acc)])
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), lengths - 1] = shaped  # on the last real token, as verl
    index = [f"uid{i // 4}" for i in range(B)]
    return responses, mask, rewards, index, acc


def _group(index):
    names = {u: i for i, u in enumerate(dict.fromkeys(index))}
    return torch.tensor([names[u] for u in index])


def _call(name, config, *, acc=True, entropies=None, keys=None, lengths=None, seed=0):
    responses, mask, rewards, index, accs = _batch(seed)
    extra = {"acc": accs} if acc else {}
    fields = ResponseFields(responses, extra, entropies=entropies, source=V1_SOURCE, keys=keys,
                            lengths=lengths)
    with providing_responses(fields):
        return est.make_estimator(name)(token_level_rewards=rewards, response_mask=mask,
                                        index=index, config=config)


def test_ktae_equals_compute_advantages_with_the_verifiers_accuracy():
    responses, mask, rewards, index, acc = _batch()
    adv, returns = _call("ktae", {"norm_adv_by_std_in_grpo": True})
    expected = ktae.compute_advantages("ktae", rewards=rewards.sum(-1), group=_group(index),
                                       token_ids=responses, mask=mask, base="grpo",
                                       correct=torch.tensor(acc))
    torch.testing.assert_close(adv, expected.to(adv.dtype))
    assert returns is adv and adv.shape == mask.shape and adv.dtype == rewards.dtype
    # the shaped reward would have called some right answers wrong: not what was used
    by_reward = ktae.compute_advantages("ktae", rewards=rewards.sum(-1), group=_group(index),
                                        token_ids=responses, mask=mask, base="grpo",
                                        reward_threshold=0.0)
    assert not torch.allclose(adv, by_reward.to(adv.dtype))


@pytest.mark.parametrize("options", [dict(h1=0.5, h2=2.0, h3=0.0), dict(top=0.5),
                                     dict(ngram=2, ngram_reduce="maxabs")])
def test_options_reach_ktae(options):
    responses, mask, rewards, index, acc = _batch(1)
    adv, _ = _call("ktae", {"ktae": dict(options)}, seed=1)
    expected = ktae.compute_advantages("ktae", rewards=rewards.sum(-1), group=_group(index),
                                       token_ids=responses, mask=mask, base="grpo",
                                       correct=torch.tensor(acc), **options)
    torch.testing.assert_close(adv, expected.to(adv.dtype))
    plain, _ = _call("ktae", {}, seed=1)
    assert not torch.allclose(adv, plain)


def test_drgrpo_switch_of_verl_picks_the_base():
    responses, mask, rewards, index, acc = _batch()
    adv, _ = _call("ktae", {"norm_adv_by_std_in_grpo": False})
    expected = ktae.compute_advantages("ktae", rewards=rewards.sum(-1), group=_group(index),
                                       token_ids=responses, mask=mask, base="drgrpo",
                                       correct=torch.tensor(acc))
    torch.testing.assert_close(adv, expected.to(adv.dtype))


def test_without_accuracy_the_reward_threshold_decides_and_warns_once(caplog):
    est._warned_fallback.clear()
    responses, mask, rewards, index, _ = _batch()
    with caplog.at_level(logging.WARNING, logger=est.__name__):
        adv, _ = _call("ktae", {"ktae": {"reward_threshold": 0.25}}, acc=False)
        _call("ktae", {"ktae": {"reward_threshold": 0.25}}, acc=False)
    expected = ktae.compute_advantages("ktae", rewards=rewards.sum(-1), group=_group(index),
                                       token_ids=responses, mask=mask, base="grpo",
                                       reward_threshold=0.25)
    torch.testing.assert_close(adv, expected.to(adv.dtype))
    warnings = [r for r in caplog.records if "reports no 'acc'" in r.getMessage()]
    assert len(warnings) == 1 and "> 0.25" in warnings[0].getMessage()


def test_reference_mode_reads_no_accuracy():
    responses, mask, rewards, index, _ = _batch()
    adv, _ = _call("ktae", {"ktae": {"mode": "reference"}})
    expected = ktae.compute_advantages("ktae", rewards=rewards.sum(-1), group=_group(index),
                                       token_ids=responses, mask=mask, base="grpo",
                                       mode="reference")
    torch.testing.assert_close(adv, expected.to(adv.dtype))


def test_correctness_reads_numbers_and_booleans_above_the_threshold():
    settings = est.estimator_settings("ktae", {"ktae": {"reward_threshold": 0.5}})
    fields = ResponseFields(None, {"acc": [True, 0.75, 0.5, 0, 1]})
    assert est.correctness(fields, settings, 5).tolist() == [True, True, False, False, True]
    assert est.correctness(fields, est.estimator_settings("ktae", {"ktae": {
        "correct_key": None}}), 5) is None


@pytest.mark.parametrize("values, message", [
    ([1, 0], "expected 3 values, got 2"),
    ([1, None, 0], "missing for 1 of 3 responses"),
    (["yes", 1, 0], "expected numbers or booleans"),
])
def test_bad_accuracy_values_are_refused(values, message):
    settings = est.estimator_settings("ktae", {})
    with pytest.raises(ValueError, match=message):
        est.correctness(ResponseFields(None, {"acc": values}), settings, 3)


def test_refuses_without_the_response_ids():
    _, mask, rewards, index, _ = _batch()
    fn = est.make_estimator("ktae")
    with pytest.raises(RuntimeError, match="no ktae wrapper was active"):
        fn(token_level_rewards=rewards, response_mask=mask, index=index, config={})
    with providing_responses(ResponseFields(None, source="somewhere.else")):
        with pytest.raises(RuntimeError, match=r"somewhere\.else"):
            fn(token_level_rewards=rewards, response_mask=mask, index=index, config={})


def test_refuses_mismatched_ids_and_a_missing_index():
    responses, mask, rewards, index, _ = _batch()
    fn = est.make_estimator("ktae")
    with providing_responses(ResponseFields(responses[:, :-1], source=LEGACY_SOURCE)):
        with pytest.raises(ValueError, match="does not match response_mask"):
            fn(token_level_rewards=rewards, response_mask=mask, index=index, config={})
    with providing_responses(ResponseFields(responses, source=LEGACY_SOURCE)):
        with pytest.raises(ValueError, match="needs verl's uid"):
            fn(token_level_rewards=rewards, response_mask=mask, index=None, config={})


def test_gtpo_reads_the_rollout_entropies_and_names_why_they_are_missing():
    if "gtpo" not in ktae.ADVANTAGE_ESTIMATORS:
        pytest.skip("no gtpo estimator")
    responses, mask, rewards, index, acc = _batch()
    entropies = torch.rand(mask.shape, generator=torch.Generator().manual_seed(3))
    adv, _ = _call("gtpo", {}, entropies=entropies)
    expected = ktae.compute_advantages("gtpo", rewards=rewards.sum(-1), group=_group(index),
                                       token_ids=responses, mask=mask, entropies=entropies,
                                       correct=torch.tensor(acc))
    torch.testing.assert_close(adv, expected.to(adv.dtype))
    with pytest.raises(ValueError, match="needs the rollout policy's per-token entropies"):
        _call("gtpo", {})
    legacy = ResponseFields(responses, {"acc": acc}, source=LEGACY_SOURCE)
    message = est.missing_entropies_message("gtpo", legacy, {})
    assert "trainer.use_v1=true" in message


def test_single_turn_keys_change_nothing():
    keys = [f"uid{i // 4}_s{i}_0" for i in range(8)]
    with_keys, _ = _call("ktae", {}, keys=keys)
    without, _ = _call("ktae", {})
    torch.testing.assert_close(with_keys, without)


def test_made_functions_are_marked_and_named():
    fn = est.make_estimator("ktae")
    assert getattr(fn, est.PLUGIN_MARK) is True
    assert fn.__name__ == "compute_ktae_advantage" and "ktae" in fn.__doc__
    with pytest.raises(ValueError, match="not an estimator of the ktae plugin"):
        est.estimator_settings("grpo", {})
