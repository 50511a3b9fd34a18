"""``ktae.core.methods``: one home for naming, parsing and computing a credit method,
read the same way by ``ktae train``, ``ktae compare``, ``ktae explain`` and ``ktae audit``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import ktae
from ktae.core import methods
from ktae.core.methods import Method, parse_method
from ktae.credit_audit.run import parse_methods
from ktae.explain.sources import credit_spec
from ktae.groups.credit import credit_values
from ktae.groups.input import GroupInput
from ktae.runs.config import TrainConfig
from ktae.runs.credit import credit_settings
from ktae.train.cli_compare import parse_arm

#: every test registers its rules afresh (conftest.py)
pytestmark = pytest.mark.usefixtures("clean_registries")


def groups(*, scored: bool = True, correct=None) -> list[GroupInput]:
    """Two groups of three responses; per-token log-probs and entropies when ``scored``."""
    rows = [([[5, 6, 7], [5, 8], [5, 6, 9, 9]], [1.0, 0.0, 1.0]),
            ([[3, 4], [3, 4, 4], [2]], [0.0, 1.0, 0.0])]
    out = []
    for i, (responses, rewards) in enumerate(rows):
        g = GroupInput(prompt=f"p{i}", responses=responses, rewards=rewards,
                       correct=None if correct is None else correct[i])
        if scored:
            g.logprobs = [[-0.1 * (j + 1) - 0.05 * k for k in range(len(r))]
                          for j, r in enumerate(responses)]
            g.entropies = [[0.3 + 0.2 * ((j + k) % 3) for k in range(len(r))]
                           for j, r in enumerate(responses)]
        out.append(g)
    return out


# --------------------------------------------------------------------------- parsing


def test_parse_a_method_with_options_of_both_parts():
    m = parse_method("ktae@ngram=3+taco@lambda=0.5")
    assert m == Method(estimator="ktae", estimator_options={"ngram": 3}, calibration="taco",
                       calibration_options={"lam": 0.5})
    assert parse_method(m.name) == m
    assert m.describe() == "ktae (ngram=3) + taco (lam=0.5)"
    assert m.describe(kinds=True) == "ktae (ngram=3) + calibration taco (lam=0.5)"
    assert (m.label("final"), m.label("diff")) == ("KTAE+TACO", "KTAE+TACO \u2212 GRPO")
    # settings may also follow the last name, as compare entries write them
    assert parse_method("ktae+taco@ngram=3@lambda=0.5") == m


def test_parse_names_without_options():
    assert parse_method("taco") == Method(estimator="grpo", calibration="taco")
    assert parse_method("none") == Method(estimator="grpo")
    assert parse_method("rloo", default_estimator="grpo").base == "rloo"
    assert parse_method("gtpo@a1=0.5").estimator_options == {"a1": 0.5}


@pytest.mark.parametrize(("text", "match"), [
    ("bogus", "credit: 'bogus' is not a registered advantage estimator"),
    ("ktae+gtpo", "repeats a kind"),
    ("ktae@ngram", "expected KEY=VALUE after '@'"),
    ("@ngram=2", "expected a name before '@'"),
    ("ktae@ngram=2@ngram=3", "ngram set twice"),
    ("ktae@ngram=0", r"^estimator_options \(ktae\): "),
    ("ktae+taco@lambda=2", r"^calibration_options \(taco\): lam: "),
])
def test_parse_refuses_bad_methods(text, match):
    with pytest.raises(ValueError, match=match):
        parse_method(text)


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(ValueError) as err:
        parse_method("ktae+taco@bogus=1")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("credit: 'bogus' in 'ktae+taco@bogus=1' is not an option of "
                           "estimator 'ktae' (base, reward_threshold, h1")
    assert "or an option of calibration 'taco' (alpha, lam)" in text
    # the verifier's verdict is the caller's input, not an option
    with pytest.raises(ValueError, match="not an option of estimator 'ktae'"):
        parse_method("ktae@correct=1")


def test_user_rule_options_are_checked_against_its_signature():
    @ktae.register_estimator("scaled-sign")
    def scaled_sign(batch, *, scale: float = 1.0):
        return scale * (2.0 * batch.correct.double() - 1.0)

    assert parse_method("scaled-sign@scale=2").estimator_options == {"scale": 2}
    with pytest.raises(ValueError, match=r"'scal' .* estimator 'scaled-sign' \(scale\)$"):
        parse_method("scaled-sign@scal=2")
    # compare entries read the same options, then the train settings
    assert parse_arm("scaled-sign@scale=2").overrides == {"estimator_options": {"scale": 2}}
    with pytest.raises(ValueError, match=r"estimator 'scaled-sign' \(scale\) or a setting"):
        parse_arm("scaled-sign@scal=2")


def test_compare_arm_sets_a_calibration_option():
    arm = parse_arm("ktae+stapo@prob_threshold=0.2")
    assert arm.overrides == {"calibration_options": {"prob_threshold": 0.2}}


# --------------------------------------------------------------------------- one credit


def _training_credit(cfg: TrainConfig, gs: list[GroupInput], ignore=()) -> torch.Tensor:
    """The credit as ``ktae train`` computes it: the trainer's estimator call
    (:func:`methods.estimator_credit` with its settings) and its calibration."""
    method = dataclasses.replace(credit_settings(cfg.resolve()).method,
                                 ignore_token_ids=tuple(ignore))
    rows = [r for g in gs for r in g.responses]
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    lp, H = torch.zeros(len(rows), T, dtype=torch.float64), torch.zeros(len(rows), T,
                                                                        dtype=torch.float64)
    flat_lp = [r for g in gs for r in g.logprobs]
    flat_h = [r for g in gs for r in g.entropies]
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        lp[i, :len(r)] = torch.tensor(flat_lp[i], dtype=torch.float64)
        H[i, :len(r)] = torch.tensor(flat_h[i], dtype=torch.float64)
    mask = torch.tensor([[k < len(r) for k in range(T)] for r in rows])
    rewards = torch.tensor([x for g in gs for x in g.rewards], dtype=torch.float64)
    group = torch.tensor([i for i, g in enumerate(gs) for _ in g.responses])
    adv = methods.estimator_credit(method, rewards=rewards, group=group, token_ids=ids,
                                   mask=mask, correct=rewards > 0.5, logprobs=lp, entropies=H)
    if method.calibration is None:
        return adv
    return methods.calibrate(method, adv.double(), logprobs=lp, entropies=H,
                             mask=mask).advantages


@pytest.mark.parametrize(("text", "cfg"), [
    ("ktae@ngram=2+taco@lambda=0.5",
     TrainConfig(credit="ktae+taco", ktae_ngram=2, taco_lambda=0.5)),
    ("gtpo", TrainConfig(credit="gtpo")),
    ("prefix-value@weight=0.5", TrainConfig(credit="prefix-value",
                                           estimator_options={"weight": 0.5})),
    ("ktae+stapo", TrainConfig(credit="ktae+stapo")),
])
def test_one_method_one_credit_in_explain_audit_and_training(text, cfg):
    gs = groups()
    ignore = (9,)
    explained = credit_spec(text, ignore_token_ids=ignore)
    audited = parse_methods(text, ignore_token_ids=ignore)[text]
    assert explained == audited
    explain_values = credit_values(gs, explained)
    audit_values = credit_values(gs, audited)
    assert torch.equal(explain_values.final, audit_values.final)
    trained = _training_credit(cfg, gs, ignore)
    assert torch.allclose(explain_values.final, trained.double(), atol=1e-6)
    # the core's one-call computation agrees with the page's
    whole = methods.method_credit(
        explained, rewards=explain_values.rewards, group=explain_values.group,
        token_ids=explain_values.token_ids, mask=explain_values.mask,
        correct=explain_values.correct,
        logprobs=_training_inputs(gs, "logprobs", explain_values.mask.shape[1]),
        entropies=_training_inputs(gs, "entropies", explain_values.mask.shape[1]))
    assert torch.allclose(whole.final.double(), explain_values.final.double(), atol=1e-9)


def _training_inputs(gs, attr, T):
    rows = [r for g in gs for r in getattr(g, attr)]
    out = torch.zeros(len(rows), T, dtype=torch.float64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.float64)
    return out


# --------------------------------------------------------------------------- inputs


def test_user_rule_gets_the_verifiers_verdict_in_explain_and_audit():
    @ktae.register_estimator("verdict")
    def verdict(batch):
        return 2.0 * batch.correct.double() - 1.0

    # every reward > 0, but the verifier calls some responses wrong
    gs = groups(correct=[[True, False, True], [False, True, False]])
    for g in gs:
        g.rewards = [0.5] * len(g.responses)
    expected = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    for spec in (credit_spec("verdict"), parse_methods("verdict")["verdict"]):
        token = credit_values(gs, spec).views["token"]
        assert torch.equal(token[:, 0], expected)


def test_prefix_value_gets_the_verifiers_verdict_in_explain():
    gs = groups(correct=[[True, False, False], [False, True, False]])
    for g in gs:  # every reward > 0: "reward > 0" would call every response correct
        g.rewards = [1.0, 0.5, 0.2]
    with_verdict = credit_values(gs, credit_spec("prefix-value")).views["token"]
    for g in gs:
        g.correct = None
    by_reward = credit_values(gs, credit_spec("prefix-value")).views["token"]
    assert not torch.equal(with_verdict, by_reward)


def test_a_rule_reading_logprobs_gets_them_or_one_line():
    seen = {}

    @ktae.register_estimator("by-logprob", needs=("logprobs",))
    def by_logprob(batch):
        seen["logprobs"] = batch.logprobs
        return batch.logprobs.clone()

    values = credit_values(groups(), credit_spec("by-logprob"))
    assert torch.allclose(values.views["token"][0, :3].float(),
                          torch.tensor([-0.1, -0.15, -0.2]))
    with pytest.raises(ValueError) as err:
        credit_values(groups(scored=False), credit_spec("by-logprob"))
    assert str(err.value).startswith("credit: estimator 'by-logprob' needs the sampling "
                                     "policy's log-probs")
    assert "\n" not in str(err.value)


def test_the_module_sits_below_train_explain_and_viz():
    import subprocess
    import sys

    code = ("import sys, ktae.core.methods; bad = sorted(m for m in sys.modules if "
            "m.startswith(('ktae.train', 'ktae.explain', 'ktae.viz', 'ktae.credit_audit', "
            "'trl', 'transformers'))); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_method_says_whether_it_reads_scores():
    @ktae.register_estimator("by-entropy-logprob", needs=("logprobs",))
    def by_logprob(batch):
        return batch.logprobs

    assert parse_method("by-entropy-logprob", check=False).needs_scores
    assert parse_method("gtpo").needs_scores and parse_method("taco").needs_scores
    assert not parse_method("ktae").needs_scores


def test_train_setting_names_work_as_option_names():
    assert parse_method("ktae+taco@ktae_ngram=2@taco_lambda=0.5") == parse_method(
        "ktae@ngram=2+taco@lam=0.5")
    assert credit_spec("ktae@ktae_ngram=2").estimator_options["ngram"] == 2
