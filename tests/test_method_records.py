"""One registry record per estimator and calibration: what each caller reads from it.

The verl options layer is checked for every registered method without verl installed
(:mod:`ktae.integrations.verl.options` imports no verl): its block keys come from the
record, and its start-up check runs the real method with each option at its default.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch

import ktae
from ktae.core.baselines import SEQUENCE_BASELINES
from ktae.core.ktae import key_token_table
from ktae.core.methods import Method, parse_method, passes_correct
from ktae.integrations.verl import options as verl

SRC = Path(__file__).resolve().parents[1] / "src" / "ktae"


@pytest.fixture(autouse=True)
def _registries(clean_registries):
    yield


def _user_rules():
    """A user estimator and calibration, registered as users do (``needs=``)."""
    @ktae.register_estimator("records-rule", needs=("mask",))
    def rule(batch, *, scale: float = 1.0):
        sign = batch.correct.to(batch.rewards.dtype) * 2 - 1
        return torch.where(batch.mask, scale * sign[:, None], 0.0)

    @ktae.register_calibration("records-damp", needs=("entropies",))
    def damp(batch, *, lam: float = 0.5):
        return 1 - lam * batch.entropies.clamp(0, 1)


def _defaults(fn, names) -> dict:
    """Each option of ``names`` that has a non-None default in ``fn``'s signature."""
    params = inspect.signature(getattr(fn, "__wrapped__", fn)).parameters
    return {n: params[n].default for n in names if n in params
            and params[n].default is not inspect.Parameter.empty
            and params[n].default is not None}


def _batch(entropies=True, token_ids=True, importance=True):
    out = dict(rewards=torch.tensor([1.0, 0.5, 1.0, 0.5]), group=[0, 0, 0, 0])
    if importance:
        out["input_grad_importance"] = torch.tensor([[0.1, 2.0, 0.3], [1.0, 0.0, 0.5],
                                                     [0.2, 0.2, 4.0], [3.0, 0.1, 0.1]])
    if token_ids:
        out["token_ids"] = torch.tensor([[1, 2, 3], [1, 4, 5], [1, 2, 6], [7, 4, 5]])
    else:
        out["mask"] = torch.ones(4, 3, dtype=torch.bool)
    if entropies:
        out["entropies"] = torch.tensor([[0.5, 1.0, 2.0], [0.1, 0.2, 0.3], [1.0, 1.0, 1.0],
                                         [2.0, 0.5, 0.1]])
    return out


def test_every_estimator_is_a_verl_estimator_with_its_records_options():
    _user_rules()
    estimators = verl.plugin_estimators()
    for record in ktae.ADVANTAGE_ESTIMATORS.records():
        if record.name in SEQUENCE_BASELINES:  # verl's own grpo and rloo
            assert record.name not in estimators
            continue
        keys = estimators[record.name]
        refused = [n for n in record.need_records if n.model and n.name not in verl.VERL_NEEDS]
        if refused:  # needs the actor's model: refused
            with pytest.raises(ValueError, match=rf"adv_estimator={record.name}: .*"
                                                 rf"\(needs={refused[0].name}\)"):
                verl.estimator_settings(record.name, {record.name: {}})
            continue
        own = [o for o in record.options if o != "reward_threshold"]
        correctness = ["reward_threshold", "correct_key"] if record.takes_correct else []
        assert list(keys) == own + correctness, record.name
        block = _defaults(record.user_rule or record.fn, record.options)
        settings = verl.estimator_settings(record.name, {record.name: block})
        verl._check_estimator_values(settings)  # the real estimator, as at start-up
        with pytest.raises(ValueError, match=rf"algorithm\.{record.name}\.bogus: unknown"):
            verl.estimator_settings(record.name, {record.name: {"bogus": 1}})
    assert {"ktae", "gtpo", "prefix-value", "records-rule"} <= set(estimators)


def test_every_calibration_is_a_verl_loss_mode_with_its_needs():
    _user_rules()
    for record in ktae.CALIBRATIONS.records():
        block = _defaults(record.user_rule or record.fn, record.options)
        settings = verl.calibration_settings({"loss_mode": record.name, "ktae": block})
        verl.check_calibration_values(settings)
        # what the record declares is what the rule does without the current entropies
        assert verl.calibration_needs_entropy(settings) == ("entropies" in record.needs)


def _keywords(record) -> dict:
    """The per-token inputs passed as keywords that a method declaring them reads (log-probs,
    DelTA's [B, T, H] token-gradient proxy)."""
    values = {"logprobs": torch.full((4, 3), -1.0), "teacher_logprobs": torch.full((4, 3), -0.5),
              "token_grad_proxy": torch.arange(24.0).reshape(4, 3, 2)}
    return {n: v for n, v in values.items() if n in record.needs}


def test_each_estimators_needs_are_what_it_reads():
    _user_rules()
    for record in ktae.ADVANTAGE_ESTIMATORS.records():
        ktae.compute_advantages(record.name, **_batch(), **_keywords(record))
        for name in _keywords(record):
            with pytest.raises(ValueError, match=name):
                ktae.compute_advantages(record.name, **_batch(),
                                        **{k: v for k, v in _keywords(record).items() if k != name})
        if "entropies" in record.needs:
            with pytest.raises(ValueError, match="entropies"):
                ktae.compute_advantages(record.name, **_batch(entropies=False))
        else:
            ktae.compute_advantages(record.name, **_batch(entropies=False), **_keywords(record))
        if "input_grad_importance" in record.needs:
            with pytest.raises(ValueError, match="input_grad_importance"):
                ktae.compute_advantages(record.name, **_batch(importance=False))
        else:
            ktae.compute_advantages(record.name, **_batch(importance=False), **_keywords(record))
        if "token_ids" in record.needs:
            with pytest.raises(ValueError, match="token_ids"):
                ktae.compute_advantages(record.name, **_batch(token_ids=False))
        else:
            ktae.compute_advantages(record.name, **_batch(token_ids=False), **_keywords(record))


def test_an_estimator_that_takes_correct_reads_it():
    """Every reward is above 0, so without ``correct`` all four count as right; the
    verifier says two are wrong. The estimators that take ``correct`` change their
    advantages; the others cannot be given it."""
    _user_rules()
    verdict = torch.tensor([True, False, False, True])
    for record in ktae.ADVANTAGE_ESTIMATORS.records():
        assert passes_correct(record.name, {}) == record.takes_correct
        if not record.takes_correct:
            with pytest.raises(ValueError, match="correct: unknown option"):
                ktae.compute_advantages(record.name, **_batch(), correct=verdict)
            continue
        plain = ktae.compute_advantages(record.name, **_batch())
        told = ktae.compute_advantages(record.name, **_batch(), correct=verdict)
        assert not torch.equal(plain, told), record.name
    assert {r.name for r in ktae.ADVANTAGE_ESTIMATORS.records() if r.takes_correct} >= {
        "ktae", "gtpo", "prefix-value", "records-rule"}
    assert not passes_correct("ktae", {"split": "graded"})


def test_a_new_keyword_option_reaches_every_caller_from_the_signature():
    """A built-in registers with ``needs`` alone: method strings, the option check, the
    trainer's ``correct`` and verl's block all read the new option from its signature."""
    @ktae.ADVANTAGE_ESTIMATORS.register("records-probe", needs=("token_ids",))
    def probe(batch, *, correct=None, reward_threshold: float = 0.0, gain: float = 1.0):
        right = batch.rewards > reward_threshold if correct is None else correct
        return gain * (right.to(batch.rewards.dtype) - 0.5)

    method = parse_method("records-probe@gain=2")
    assert method.estimator_options == {"gain": 2}
    assert passes_correct("records-probe", {})
    assert verl.plugin_estimators()["records-probe"] == ("gain", "reward_threshold",
                                                         "correct_key")
    with pytest.raises(ValueError, match=r"^gian: unknown option for advantage estimator "
                                         r"'records-probe'; expected correct, reward_threshold, "
                                         r"gain$"):
        ktae.compute_advantages("records-probe", **_batch(), gian=1)
    with pytest.raises(ValueError, match=r"'gian' in 'records-probe@gian=1' is not an option "
                                         r"of estimator 'records-probe' \(reward_threshold, "
                                         r"gain\)"):
        parse_method("records-probe@gian=1")


def _ktae_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_the_core_never_imports_the_package_root():
    for path in sorted((SRC / "core").glob("*.py")):
        imports = _ktae_imports(path)
        assert "ktae" not in imports, f"{path.name} imports the package root"


def test_every_module_registering_an_estimator_is_imported_by_the_registry_door():
    """A built-in's module registers with the decorator; the registry's door imports it."""
    decorator = re.compile(r"^@ADVANTAGE_ESTIMATORS\.register\(", re.M)
    registering = {f"ktae.core.{p.stem}" for p in (SRC / "core").glob("*.py")
                   if decorator.search(p.read_text(encoding="utf-8"))}
    assert {"ktae.core.ktae", "ktae.core.gtpo", "ktae.core.prefix_value"} <= registering
    assert registering <= _ktae_imports(SRC / "core" / "estimators.py")


def test_the_table_options_are_declared_by_the_estimator_built_on_the_table():
    """``Method.table_options``: the options ``ktae explain`` and the audit pass to the
    key-token table, read from the estimator's record (KTAE declares them), none named
    by the caller; an estimator not built on the table shares none."""
    shared = ktae.ADVANTAGE_ESTIMATORS.record("ktae").table_options
    table = inspect.signature(key_token_table).parameters
    estimator = ktae.ADVANTAGE_ESTIMATORS.record("ktae").keywords
    assert shared and set(shared) <= set(table) and set(shared) <= set(estimator)
    assert [r.name for r in ktae.ADVANTAGE_ESTIMATORS.records() if r.table_options] == ["ktae"]
    options = {"h1": 0.5, "ngram": 2, "base": "rloo", "chunk_tokens": 64}
    assert Method("ktae", options).table_options == {"h1": 0.5, "ngram": 2}
    assert Method("gtpo", {}).table_options == {}
