"""Tests written against mutants that survived ``studies/mutation/mutation.sh mutmut``
(studies/mutation/report.md).

Each test pins behaviour a surviving mutant changed: mostly which field or option an error
message names (what a user reads to fix a config), and how ``credit_method`` carries a run's
options to ``ktae explain`` / ``ktae audit``. Test names contain ``credit`` so the mutmut
selection for ``runs/credit.py`` (``-k credit or ...``) picks them up.
"""

from __future__ import annotations

import math
import re

import pytest

from ktae.runs.config import TrainConfig
from ktae.runs.credit import credit_method, credit_settings


def _settings(**fields):
    return credit_settings(TrainConfig(**fields).resolve())


def _raises(match: str, **fields):
    with pytest.raises(ValueError, match=match):
        _settings(**fields)


# ---- credit_settings: the field or option an error names --------------------------------

def test_credit_ktae_mode_on_another_estimator_names_ktae_mode():
    _raises(r"^ktae_mode: only used by the 'ktae' estimator, but credit is 'grpo'$",
            credit="grpo", ktae_mode="reference")


def test_credit_ktae_field_on_another_estimator_names_that_field():
    _raises(r"^ktae_h2: only used by the 'ktae' estimator", credit="grpo", ktae_h2=0.5)


def test_credit_trainer_option_error_says_where_it_comes_from():
    _raises(re.escape("estimator_options: 'correct' is set by the trainer (from the "
                      "accuracy reward)") + "$",
            credit="ktae", estimator_options={"correct": [True]})


def test_credit_estimator_option_given_twice_names_estimator_options():
    _raises(re.escape("estimator_options: 'h1' is given twice (as a field and in "
                      "estimator_options)") + "$",
            credit="ktae", ktae_h1=0.5, estimator_options={"h1": 0.4})


def test_credit_calibration_option_given_twice_names_calibration_options():
    _raises(re.escape("calibration_options: 'alpha' is given twice (as a field and in "
                      "calibration_options)") + "$",
            credit="ktae+taco", taco_alpha=0.3, calibration_options={"alpha": 0.2})


@pytest.mark.parametrize("fields, name", [
    (dict(taco_alpha=0.3), "taco_alpha"),
    (dict(taco_lambda=0.3), "taco_lambda"),
    (dict(taco_alpha=0.3, taco_lambda=0.3), "taco_alpha"),
    (dict(taco_lambda=0.3, calibration_options={"alpha": 0.1}), "calibration_options"),
])
def test_credit_without_calibration_names_the_orphan_option(fields, name):
    _raises(rf"^{name}: credit 'ktae' has no calibration to pass it to$", credit="ktae",
            **fields)


@pytest.mark.parametrize("fields, name, key", [
    (dict(taco_alpha=0.3), "taco_alpha", "alpha"),
    (dict(taco_lambda=0.3), "taco_lambda", "lam"),
])
def test_credit_calibration_without_the_option_names_the_field(fields, name, key):
    _raises(rf"^{name}: calibration 'stapo' takes no '{key}' option \(got 0.3\)$",
            credit="ktae+stapo", **fields)


def test_credit_taco_hard_takes_alpha_but_not_lambda():
    assert _settings(credit="ktae+taco-hard", taco_alpha=0.3).calibration_options == {
        "alpha": 0.3}
    _raises(r"^taco_lambda: calibration 'taco-hard'", credit="ktae+taco-hard",
            taco_lambda=0.3)


# ---- credit_method: a run's options reach explain/audit only for the run's own parts ----

RUN = dict(credit="ktae+taco", ktae_h1=0.5, ktae_mode="reference", taco_alpha=0.3,
           taco_lambda=0.2)


def _run(**fields):
    return TrainConfig(**{**RUN, **fields}).resolve()


def test_credit_method_default_is_trainconfig_default():
    method = credit_method("ktae")
    assert (method.estimator, method.calibration) == ("ktae", None)
    assert method.estimator_options == {"base": "grpo", "mode": "exact"}
    assert method.calibration_options == {}
    assert method.ignore_token_ids == ()


def test_credit_method_keeps_the_runs_own_estimator_and_calibration_options():
    method = credit_method("ktae+taco", train_config=_run(), ignore_token_ids=[7, 9])
    assert method.estimator_options == {"base": "grpo", "mode": "reference", "h1": 0.5}
    assert method.calibration_options == {"alpha": 0.3, "lam": 0.2}
    assert method.ignore_token_ids == (7, 9)


def test_credit_method_drops_the_runs_options_for_another_estimator():
    method = credit_method("grpo+taco", train_config=_run(ktae_ngram=2, ktae_mode="exact",
                                                          ktae_ngram_reduce="maxabs"))
    assert (method.estimator, method.estimator_options) == ("grpo", {})
    assert method.calibration_options == {"alpha": 0.3, "lam": 0.2}


def test_credit_method_drops_the_runs_estimator_options_dict_for_another_estimator():
    run = _run(ktae_h1=None, ktae_mode="exact", estimator_options={"h2": 0.7})
    assert credit_method("grpo", train_config=run).estimator_options == {}
    assert credit_method("ktae", train_config=run).estimator_options["h2"] == 0.7


def test_credit_method_drops_the_runs_calibration_options_for_another_calibration():
    run = _run(taco_alpha=None, taco_lambda=None, calibration_options={"alpha": 0.4})
    assert credit_method("ktae+taco", train_config=run).calibration_options == {"alpha": 0.4}
    other = credit_method("ktae+stapo", train_config=run)
    assert (other.calibration, other.calibration_options) == ("stapo", {})
    none = credit_method("ktae", train_config=run)
    assert (none.calibration, none.calibration_options) == (None, {})
    assert none.estimator_options["h1"] == 0.5


def test_credit_method_without_estimator_uses_the_runs_base():
    run = _run(credit="taco", algo="drgrpo", ktae_h1=None, ktae_mode="exact")
    method = credit_method("taco", train_config=run)
    assert (method.estimator, method.calibration) == ("drgrpo", "taco")
    assert method.calibration_options == {"alpha": 0.3, "lam": 0.2}


def test_credit_method_settings_go_on_top_of_the_runs_options():
    method = credit_method("ktae+taco@ngram=3@alpha=0.9", train_config=_run(ktae_mode="exact"),
                           ignore_token_ids=(4,))
    assert method.estimator_options == {"base": "grpo", "mode": "exact", "h1": 0.5,
                                        "ngram": 3}
    assert method.calibration_options == {"alpha": 0.9, "lam": 0.2}
    assert method.ignore_token_ids == (4,)


def test_credit_method_settings_on_another_estimator_start_from_its_defaults():
    method = credit_method("grpo+taco@alpha=0.9", train_config=_run())
    assert (method.estimator, method.estimator_options) == ("grpo", {})
    assert method.calibration_options == {"alpha": 0.9, "lam": 0.2}


@pytest.mark.parametrize("field", ["ktae_h2", "ktae_h3"])
def test_credit_method_drops_each_ktae_weight_for_another_estimator(field):
    run = _run(ktae_h1=None, **{field: 0.7})
    assert credit_method("ktae", train_config=run).estimator_options[field[-2:]] == 0.7
    assert credit_method("grpo", train_config=run).estimator_options == {}


def test_credit_method_settings_without_estimator_use_the_runs_base():
    run = _run(credit="taco", algo="drgrpo", ktae_h1=None, ktae_mode="exact")
    method = credit_method("taco@alpha=0.9", train_config=run)
    assert (method.estimator, method.calibration) == ("drgrpo", "taco")
    assert method.calibration_options == {"alpha": 0.9, "lam": 0.2}


# ---- core/methods.py: Method's names in tables and page headers -----------------------------

def test_method_describe_and_name_spell_every_part():
    from ktae.core.methods import Method, parse_method

    m = Method("ktae", {"base": "drgrpo", "ngram": 2}, "taco", {"alpha": 0.1})
    assert m.describe() == "ktae (base=drgrpo, ngram=2) + taco (alpha=0.1)"
    assert m.describe(kinds=True) == "ktae (base=drgrpo, ngram=2) + calibration taco (alpha=0.1)"
    assert m.name == "ktae@base=drgrpo@ngram=2+taco@alpha=0.1"
    assert parse_method(m.name) == m
    assert Method("grpo").describe() == Method("grpo").describe(kinds=True) == "grpo"
    assert Method("grpo", calibration="stapo").describe() == "grpo + stapo"
    assert Method("grpo", calibration="stapo").describe(kinds=True) == "grpo + calibration stapo"


@pytest.mark.parametrize("method, labels", [
    (("ktae", {"base": "drgrpo"}, "taco"), ("Dr.GRPO", "KTAE", "KTAE+TACO",
                                            "KTAE+TACO \u2212 Dr.GRPO")),
    (("rloo", {}, None), ("RLOO", "RLOO", "RLOO", "RLOO \u2212 RLOO")),
    (("gtpo", {}, None), ("GRPO", "GTPO", "GTPO", "GTPO \u2212 GRPO")),
    (("grpo", {}, "stapo"), ("GRPO", "GRPO", "GRPO+STAPO", "GRPO+STAPO \u2212 GRPO")),
    (("ktae", {"base": "my-base"}, None), ("MY-BASE", "KTAE", "KTAE", "KTAE \u2212 MY-BASE")),
])
def test_method_label_of_each_view(method, labels):
    from ktae.core.methods import Method

    estimator, options, calibration = method
    m = Method(estimator, options, calibration)
    assert tuple(m.label(p) for p in ("seq", "token", "final", "diff")) == labels


# ---- core/methods.py: which part a method string's setting belongs to ----------------------

def test_method_option_without_estimator_goes_to_the_calibration():
    from ktae.core.methods import resolve_option

    # ktae compare resolves the settings of a credit naming only a calibration ("taco@...")
    assert resolve_option(None, "taco", "alpha", where="taco@alpha=1") == ("calibration",
                                                                          "alpha")
    assert resolve_option(None, "taco", "taco_lambda", where="w") == ("calibration", "lam")
    with pytest.raises(ValueError, match=r"^credit: 'x' in 'w' is not an option of a credit "
                                         r"method$"):
        resolve_option(None, None, "x", where="w")


def test_method_option_of_an_estimator_taking_any_keyword():
    import ktae
    from ktae.core.methods import resolve_option

    saved = dict(ktae.ADVANTAGE_ESTIMATORS._items)
    try:
        ktae.register_estimator("any-kw")(lambda batch, **options: batch.rewards)
        assert resolve_option("any-kw", None, "anything", where="w") == ("estimator",
                                                                         "anything")
    finally:
        ktae.ADVANTAGE_ESTIMATORS._items.clear()
        ktae.ADVANTAGE_ESTIMATORS._items.update(saved)


def test_method_option_set_twice_names_the_text():
    from ktae.core.methods import parse_method

    with pytest.raises(ValueError, match=re.escape(
            "credit: lambda set twice in 'ktae@ngram=2+taco@lam=0.1@lambda=0.2'") + "$"):
        parse_method(" ktae@ngram=2+taco@lam=0.1@lambda=0.2 ")


@pytest.fixture
def restore_rules():
    import ktae

    saved = dict(ktae.ADVANTAGE_ESTIMATORS._items), dict(ktae.CALIBRATIONS._items)
    yield ktae
    for target, items in zip((ktae.ADVANTAGE_ESTIMATORS._items, ktae.CALIBRATIONS._items),
                             saved, strict=True):
        target.clear()
        target.update(items)


def test_method_option_error_lists_none_for_a_part_without_options(restore_rules):
    from ktae.core.methods import resolve_option

    restore_rules.register_calibration("no-options")(lambda batch: batch.advantages * 0 + 1)
    with pytest.raises(ValueError, match=re.escape(
            "credit: 'x' in 'w' is not an option of estimator 'grpo' (none) or an option of "
            "calibration 'no-options' (none)") + "$"):
        resolve_option("grpo", "no-options", "x", where="w")


# ---- core/methods.py: method_credit, what explain, audit and the simulator show ------------

def _batch():
    import torch

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]],
                        dtype=torch.bool)
    return dict(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), group=torch.tensor([0, 0, 0, 0]),
                token_ids=torch.tensor([[5, 6, 7, 0], [5, 8, 0, 0], [6, 7, 8, 9], [9, 0, 0, 0]]),
                mask=mask, correct=torch.tensor([True, False, True, False]))


def test_method_credit_of_a_sequence_estimator_is_its_advantage_on_real_tokens():
    import torch

    from ktae.core.methods import Method, method_credit

    b = _batch()
    out = method_credit(Method("grpo"), **b)
    assert out.token is None and out.calibration is None
    expected = torch.where(b["mask"], out.seq[:, None], 0.0)
    assert torch.equal(out.final, expected)
    assert torch.equal(out.in_loss, b["mask"])
    assert (out.final[~b["mask"]] == 0).all() and out.seq.abs().sum() > 0


def test_method_credit_spreads_a_token_level_rule_returning_one_value_per_response(
        restore_rules):
    import torch

    from ktae.core.methods import Method, method_credit

    restore_rules.register_estimator("per-response")(lambda batch: batch.rewards - 0.25)
    b = _batch()
    out = method_credit(Method("per-response"), **b)
    expected = torch.where(b["mask"], (b["rewards"] - 0.25)[:, None], 0.0)
    assert torch.equal(out.token, expected) and torch.equal(out.final, expected)


def test_method_credit_passes_the_verifiers_correct_not_the_reward(restore_rules):
    import torch

    from ktae.core.methods import Method, method_credit

    seen = {}

    def rule(batch):
        seen["correct"] = batch.correct
        return batch.rewards

    restore_rules.register_estimator("reads-correct")(rule)
    b = _batch()
    b["correct"] = torch.tensor([False, True, True, False])
    method_credit(Method("reads-correct"), **b)
    assert torch.equal(seen["correct"], b["correct"])


def test_method_credit_passes_logprobs_and_the_rollout_entropies(restore_rules):
    import torch

    from ktae.core.methods import Method, method_credit

    seen = {}

    def rule(batch):
        seen["logprobs"], seen["entropies"] = batch.logprobs, batch.entropies
        return batch.rewards

    restore_rules.register_estimator("reads-scores", needs=("logprobs", "entropies"))(rule)
    b = _batch()
    logp = torch.full(b["mask"].shape, -0.5)
    ent, old_ent = torch.full(b["mask"].shape, 0.3), torch.full(b["mask"].shape, 0.7)
    method_credit(Method("reads-scores"), **b, logprobs=logp, entropies=ent,
                  old_entropies=old_ent)
    m = b["mask"]  # the rule sees its inputs on real tokens (padding zeroed)
    assert (seen["logprobs"][m] == -0.5).all() and (seen["entropies"][m] == 0.7).all()
    method_credit(Method("reads-scores"), **b, logprobs=logp, entropies=ent)
    assert (seen["entropies"][m] == 0.3).all()


def _scores(mask):
    import torch

    logp = torch.full(mask.shape, -0.1)
    logp[0, 1] = -5.0
    return logp, torch.rand(mask.shape, generator=torch.Generator().manual_seed(0))


def test_method_credit_calibrated_final_and_loss_mask():
    import torch

    from ktae.core.methods import Method, calibrate, estimator_credit, method_credit

    b = _batch()
    logp, ent = _scores(b["mask"])
    method = Method("ktae", calibration="forking-tokens")
    out = method_credit(method, **b, logprobs=logp, entropies=ent)
    token = estimator_credit(method, **b, logprobs=logp, entropies=ent)
    expected = calibrate(method, token.double(), logprobs=logp, entropies=ent, mask=b["mask"])
    assert torch.equal(out.token, token) and out.token.abs().sum() > 0
    assert out.seq.shape == (4,) and out.seq.abs().sum() > 0
    assert torch.equal(out.final, expected.advantages.double())
    assert not torch.equal(out.final, out.token.double())
    assert torch.equal(out.in_loss, expected.loss_mask.bool() & b["mask"])
    assert not torch.equal(out.in_loss, b["mask"])  # forking-tokens removes tokens
    assert torch.equal(out.calibration.flagged, expected.flagged)


def test_method_credit_calibration_without_scores_is_an_error():
    from ktae.core.methods import Method, method_credit

    b = _batch()
    logp, ent = _scores(b["mask"])
    message = (r"^credit: calibration 'taco' needs per-token log-probs and entropies, which "
               r"this caller does not have$")
    for scores in (dict(logprobs=logp), dict(entropies=ent), {}):
        with pytest.raises(ValueError, match=message):
            method_credit(Method("ktae", calibration="taco"), **b, **scores)


# ---- core/methods.py: split_method's KEY=VALUE settings -------------------------------------

@pytest.mark.parametrize("text", ["ktae@ngram", "ktae@=3", "ktae@ngram=", "ktae@="])
def test_method_setting_needs_key_and_value(text):
    from ktae.core.methods import split_method

    with pytest.raises(ValueError, match=re.escape(
            f"credit: expected KEY=VALUE after '@' in {text!r}, got {text.split('@')[1]!r}")):
        split_method(text)


def test_method_setting_value_may_hold_an_equals_sign():
    from ktae.core.methods import split_method

    assert split_method("ktae@tag=a=b+taco@alpha=1") == ("ktae+taco", [("tag", "a=b"),
                                                                      ("alpha", "1")])


# ---- core/methods.py: calibrate, the seed and the old policy -------------------------------

def _calibration_inputs():
    import torch

    g = torch.Generator().manual_seed(1)
    mask = torch.ones(4, 6, dtype=torch.bool)
    adv = torch.randn(4, 6, generator=g, dtype=torch.float64)
    logp = -torch.rand(4, 6, generator=g)
    return adv, dict(logprobs=logp, entropies=torch.rand(4, 6, generator=g), mask=mask)


def test_method_calibrate_random_rule_is_seeded_by_seed_default_zero():
    import torch

    import ktae
    from ktae.core.methods import Method, calibrate

    adv, scores = _calibration_inputs()
    method = Method("grpo", calibration="taco-random", calibration_options={"alpha": 0.5})

    def expected(seed):
        return ktae.calibrate_advantages(
            "taco-random", adv, old_logprobs=scores["logprobs"],
            generator=torch.Generator().manual_seed(seed), alpha=0.5, **scores).advantages

    assert torch.equal(calibrate(method, adv, **scores).advantages, expected(0))
    assert torch.equal(calibrate(method, adv, **scores, seed=3).advantages, expected(3))
    assert not torch.equal(expected(0), expected(3))


def test_method_calibrate_reads_the_old_policy_when_given():
    import torch

    from ktae.core.methods import Method, calibrate

    adv, scores = _calibration_inputs()
    method = Method("grpo", calibration="adv-reweight")
    on_policy = calibrate(method, adv, **scores).advantages
    assert torch.equal(calibrate(method, adv, **scores, old_logprobs=scores["logprobs"])
                       .advantages, on_policy)
    off = calibrate(method, adv, **scores, old_logprobs=scores["logprobs"] - 1.0).advantages
    assert not torch.equal(off, on_policy)


# ---- train/cli_compare.py: what `ktae compare --help` says, and --credit's list errors ------

def _compare_parser():
    import argparse

    from ktae.train import cli_compare

    parser = argparse.ArgumentParser()
    cli_compare.add_arguments(parser)
    return parser, {a.dest: a for a in parser._actions}


def test_compare_help_of_its_own_flags():
    import argparse

    parser, actions = _compare_parser()
    assert actions["credit"].help == (
        "comma list of credits, each optionally with its own settings: CREDIT@KEY=VALUE[@...], "
        "e.g. none,ktae,ktae@ngram=3 (KEY: a ktae train setting, its name without the "
        "credit's prefix, or an option of the credit's estimator, e.g. "
        "prefix-value@weight=0.5) (default none,ktae,taco)")
    assert actions["output_dir"].help == (
        "folder of the runs ({credit}-seed{s}/), comparison.md and curves.png (default "
        "runs/compare)")
    assert actions["seeds"].help == ("seeds 0..N-1 per credit (default 3); finished runs are "
                                     "reused and interrupted ones resumed")
    assert actions["first_seed"].help == (
        "the grid's first seed: seeds K..K+N-1 with --seeds N (default 0); e.g. seeds kept "
        "aside for a final table")
    assert actions["seed"].help == actions["resume"].help == argparse.SUPPRESS
    assert actions["learning_rate"].help not in (None, argparse.SUPPRESS)
    args = parser.parse_args([])
    assert (args.credit, args.output_dir, args.seeds) == ("none,ktae,taco", "runs/compare", 3)
    assert parser.parse_args(["--seeds", "5"]).seeds == 5
    text = parser.format_help()
    assert "--seeds SEEDS" in text and "--seed SEED" not in text and "--resume" not in text


def test_compare_credit_list_errors():
    from ktae.train.cli_compare import parse_arms

    with pytest.raises(ValueError, match=r"^credit: expected a comma-separated list of names$"):
        parse_arms(" , ,")
    with pytest.raises(ValueError, match=re.escape(
            "credit: 'ktae@ngram=2' and 'ktae@ngram=2' would share the run directory "
            "ktae-ngram=2-seed*") + "$"):
        parse_arms("none,ktae@ngram=2, ktae@ngram=2 ")


def _plotted(monkeypatch, tmp_path, table, **kw):
    """The figure ``plot_curves`` saves: per axis, its labels and (label, x, y) per line."""
    import matplotlib.figure

    from ktae.train.cli_compare import plot_curves

    saved = {}
    real = matplotlib.figure.Figure.savefig

    def capture(fig, path, **options):
        saved["fig"] = fig
        return real(fig, path, **options)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", capture)
    plot_curves(table, tmp_path / "curves.png", **kw)
    assert (tmp_path / "curves.png").stat().st_size > 0
    return [dict(xlabel=ax.get_xlabel(), ylabel=ax.get_ylabel(),
                 legend=[t.get_text() for t in ax.get_legend().get_texts()],
                 lines=[(ln.get_label(), list(ln.get_xdata()), [float(y) for y in ln.get_ydata()],
                         ln.get_marker(), ln.get_color()) for ln in ax.get_lines()])
            for ax in saved["fig"].axes]


def _row(evals, metrics):
    return {"evals": [{"step": s, "accuracy": a} for s, a in evals], "metrics": metrics}


def test_compare_curves_plot_the_seed_means(monkeypatch, tmp_path):
    table = {
        "none": [_row([(0, 0.2), (4, 0.4)], [{"round1_accuracy": 0.0}, {"round1_accuracy": 1.0},
                                             {"round1_accuracy": 1.0}]),
                 _row([(4, 0.6), (0, 0.4)], [{"accuracy": 1.0}, {"accuracy": 0.0},
                                             {"accuracy": 1.0}, {"accuracy": 1.0}])],
        "ktae": [_row([(0, 0.5)], [{"round1_accuracy": 0.5, "accuracy": 0.0}])],
    }
    left, right = _plotted(monkeypatch, tmp_path, table, window=2)
    assert (left["xlabel"], left["ylabel"]) == ("step", "held-out accuracy (greedy)")
    assert left["legend"] == ["none", "ktae"]
    (n1, x1, y1, m1, c1), (n2, x2, y2, m2, c2) = left["lines"]
    assert (n1, x1, m1) == ("none", [0, 4], "o") and y1 == pytest.approx([0.3, 0.5])
    assert (n2, x2, y2) == ("ktae", [0], [0.5])
    # sampled accuracy: the first 3 steps both seeds have, mean over seeds (0.5, 0.5, 1.0),
    # 2-step moving mean from step 2; the one-step run: a 1-step mean, one point (a marker)
    assert (right["xlabel"], right["ylabel"]) == ("step", "sampled accuracy (1/2-step mean)")
    assert right["legend"] == ["none", "ktae"]
    (r1, rx1, ry1, rm1, rc1), (r2, rx2, ry2, rm2, rc2) = right["lines"]
    assert (r1, rx1, rm1, rc1) == ("none", [2, 3], "None", c1) and ry1 == pytest.approx(
        [0.5, 0.75])
    assert (r2, rx2, ry2, rm2, rc2) == ("ktae", [1], [0.5], "o", c2)
    assert c1 != c2


def test_compare_curves_without_metrics_name_the_window(monkeypatch, tmp_path):
    left, right = _plotted(monkeypatch, tmp_path, {"none": [_row([(0, 0.1)], [])]}, window=7)
    assert right["ylabel"] == "sampled accuracy (7-step mean)" and right["lines"] == []
    assert left["lines"][0][1:3] == ([0], [0.1])


# ---- core/methods.py: check_method's probe ---------------------------------------------------

def test_method_check_names_the_misspelled_estimator_option():
    from ktae.core.methods import Method, check_method

    with pytest.raises(ValueError, match=r"^estimator_options \(ktae\): scael: unknown option "
                                         r"for advantage estimator 'ktae'; expected base, "):
        check_method(Method("ktae", {"scael": 1}))


def test_method_check_probe_has_padding(restore_rules):
    import torch

    from ktae.core.methods import Method, check_method

    restore_rules.register_estimator("pad-ones")(lambda batch: torch.ones(batch.mask.shape))
    with pytest.raises(ValueError, match=re.escape(
            "estimator_options (pad-ones): advantage estimator 'pad-ones': returned 1 on "
            "padding at [1, 2], expected 0 where mask is False")):
        check_method(Method("pad-ones"))


# ---- core/methods.py: estimator_credit's inputs ------------------------------------------------

def test_method_passes_correct_to_ktae_unless_graded():
    from ktae.core.methods import passes_correct

    assert passes_correct("ktae", {}) and passes_correct("ktae", {"split": "threshold"})
    assert not passes_correct("ktae", {"split": "graded"})
    assert passes_correct("gtpo", {}) and not passes_correct("grpo", {})
    assert not passes_correct(None, {})


def test_method_ktae_ignores_the_methods_and_the_options_token_ids():
    import torch

    import ktae
    from ktae.core.methods import Method, estimator_credit

    b = _batch()

    def ktae_with(ids):
        return ktae.compute_advantages("ktae", rewards=b["rewards"], group=b["group"],
                                       token_ids=b["token_ids"], mask=b["mask"],
                                       correct=b["correct"], ignore_token_ids=ids)

    got = estimator_credit(Method("ktae", {"ignore_token_ids": [6]}, ignore_token_ids=(7,)), **b)
    assert torch.equal(got, ktae_with([6, 7]))
    assert not torch.equal(got, ktae_with([7])) and not torch.equal(got, ktae_with([6]))


def test_method_estimator_without_its_scores_is_an_error(restore_rules):
    from ktae.core.methods import Method, estimator_credit

    restore_rules.register_estimator("needs-logp", needs=("logprobs",))(lambda b: b.rewards)
    with pytest.raises(ValueError, match=re.escape(
            "credit: estimator 'needs-logp' reads the sampling policy's log-probs "
            "(needs=logprobs), which this caller does not have") + "$"):
        estimator_credit(Method("needs-logp"), **_batch())
    with pytest.raises(ValueError, match=re.escape(
            "credit: estimator 'gtpo' reads the rollout policy's entropies (needs=entropies), "
            "which this caller "
            "does not have") + "$"):
        estimator_credit(Method("gtpo"), **_batch())


# ---- train/cli_compare.py: run()'s refusals before anything trains ------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--credit", " , "], "ktae compare: credit: expected a comma-separated list of names"),
    (["--seeds", "0"], "ktae compare: seeds: expected >= 1, got 0"),
    (["--first-seed", "-1"], "ktae compare: first-seed: expected >= 0, got -1"),
    (["--threads", "0"], "ktae compare: torch_threads: expected a positive integer, got 0"),
    # an arm's own thread count is checked as the flag would be
    (["--credit", "none,none@torch_threads=100000"],
     "ktae compare: --threads: expected at most 4,096 threads, got 100,000"),
    (["--seed", "1"], "ktae compare: --seed: the grid sets it (seeds K..K+N-1 with --first-seed K "
                      "--seeds N; "
                      "finished runs are reused, interrupted ones resumed)"),
    (["--resume"], "ktae compare: --resume: the grid sets it (seeds K..K+N-1 with --first-seed K "
                   "--seeds N; "
                   "finished runs are reused, interrupted ones resumed)"),
    (["--credit", "ktae@no_such_key=1"], "ktae compare: credit: 'no_such_key' in "
                                         "'ktae@no_such_key=1' is not an option of estimator"),
])
def test_compare_refusals_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch, argv, message):
    from ktae.cli import main
    from ktae.train import session

    monkeypatch.setattr(session, "train", lambda *a, **k: pytest.fail("trained"))
    assert main(["compare", "--output-dir", str(tmp_path / "cmp"), *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message) and captured.err.count("\n") == 1, captured.err
    assert captured.out == ""
    assert not (tmp_path / "cmp").exists()


# ---- train/cli_compare.py: parse_arm, an entry of --credit --------------------------------------

@pytest.mark.parametrize("text, credit, overrides", [
    ("ktae@ngram=3", "ktae", {"ktae_ngram": 3}),
    (" ktae+taco@lambda=0.5@learning_rate=1e-5 ", "ktae+taco",
     {"taco_lambda": 0.5, "learning_rate": 1e-5}),
    ("prefix-value@weight=0.5", "prefix-value", {"estimator_options": {"weight": 0.5}}),
    ("ktae+stapo@prob_threshold=0.1@top=3", "ktae+stapo",
     {"calibration_options": {"prob_threshold": 0.1}, "estimator_options": {"top": 3}}),
    ("none", "none", {}),
])
def test_compare_arm_settings(text, credit, overrides):
    from ktae.train.cli_compare import Arm, parse_arm

    assert parse_arm(text) == Arm(label=text.strip(), credit=credit, overrides=overrides)


@pytest.mark.parametrize("text, message", [
    ("ktae@ngram=2@ktae_ngram=3", "credit: ktae_ngram set twice in 'ktae@ngram=2@ktae_ngram=3'"),
    ("prefix-value@weight=0.5@weight=0.6",
     "credit: weight set twice in 'prefix-value@weight=0.5@weight=0.6'"),
    ("ktae@ngram=x", "credit: ngram='x' in 'ktae@ngram=x': expected int"),
    ("ktae+stapo@nope=1", "credit: 'nope' in 'ktae+stapo@nope=1' is not an option of estimator "
                          "'ktae' (base, "),
])
def test_compare_arm_errors(text, message):
    from ktae.train.cli_compare import parse_arm

    with pytest.raises(ValueError) as err:
        parse_arm(text)
    assert str(err.value).startswith(message), str(err.value)


def test_compare_arm_may_not_change_the_grid():
    from ktae.train.cli_compare import parse_arm

    with pytest.raises(ValueError) as err:
        parse_arm("ktae@seed=1")
    text = str(err.value)
    assert text.startswith("credit: 'seed' in 'ktae@seed=1' is not an option of estimator "
                           "'ktae' (base, ")
    assert ") or a setting an entry can change; expected one of ['advantage_base', " in text
    assert "'seed'" not in text.split("expected one of")[1] and "'learning_rate'" in text
    assert text.endswith("] (or without the credit's prefix)")
    assert "or an option of calibration 'stapo' (prob_threshold, entropy_quantile)" in str(
        pytest.raises(ValueError, parse_arm, "ktae+stapo@nope=1").value)


def test_compare_curves_keep_each_arms_colour_and_skip_unknown_accuracy(monkeypatch, tmp_path):
    table = {
        "none": [_row([(0, 0.2)], [])],  # no training metrics: only on the left panel
        "ktae": [_row([(0, 0.5)], [{"accuracy": 1.0}, {"loss": 0.3}, {"accuracy": 0.0}])],
    }
    left, right = _plotted(monkeypatch, tmp_path, table, window=1)
    assert [ln[0] for ln in right["lines"]] == ["ktae"]
    assert right["lines"][0][4] == left["lines"][1][4] != left["lines"][0][4]
    assert right["lines"][0][1] == [1, 2, 3]
    assert right["lines"][0][2][0] == 1.0 and right["lines"][0][2][2] == 0.0
    assert math.isnan(right["lines"][0][2][1])  # a step without accuracy: a gap


def test_method_label_of_a_sequence_estimator_uses_its_display_name():
    from ktae.core.methods import Method

    assert [Method("drgrpo").label(p) for p in ("seq", "token", "final")] == ["Dr.GRPO"] * 3


def test_method_parse_credit_skips_none_and_needs_a_name():
    from ktae.core.methods import parse_credit

    assert parse_credit("none+ktae+taco") == ("ktae", "taco")
    assert parse_credit("none") == (None, None)
    with pytest.raises(ValueError, match=r"^credit: expected a name, got ' \+ '$"):
        parse_credit(" + ")


def test_compare_table_caption_is_its_own_paragraph():
    from ktae.train.cli_compare import markdown_table

    lines = markdown_table({}, algo="grpo", steps=3).splitlines()
    assert lines[0].startswith("Held-out greedy accuracy on the embedded test split after 3")
    assert lines[1] == "" and lines[2].startswith("| credit | seeds |")


def test_method_check_names_the_misspelled_calibration_option():
    from ktae.core.methods import Method, check_method

    with pytest.raises(ValueError, match=re.escape(
            "calibration_options (taco): alhpa: unknown option for calibration 'taco'; "
            "expected alpha, lam") + "$"):
        check_method(Method("grpo", calibration="taco", calibration_options={"alhpa": 1}))


def test_compare_curves_default_to_a_20_step_mean(monkeypatch, tmp_path):
    metrics = [{"accuracy": float(i % 2)} for i in range(25)]
    _, right = _plotted(monkeypatch, tmp_path, {"none": [_row([(0, 0.1)], metrics)]})
    assert right["ylabel"] == "sampled accuracy (20-step mean)"
    assert right["lines"][0][1] == list(range(20, 26))
