"""Users' credit rules: ``ktae.register_estimator`` / ``register_calibration``, the
``--plugin`` flag, the ``ktae.plugins`` entry points, and docs/plugins.md's example."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ktae
from ktae import plugins
from ktae.cli import build_parser, main
from ktae.core.methods import passes_correct
from ktae.runs.credit import credit_settings
from ktae.train.cli_compare import parse_arm
from ktae.train.cli_train import config_from_args

DOC = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


#: every test registers its rules afresh (conftest.py)
pytestmark = pytest.mark.usefixtures("clean_registries")


def doc_blocks() -> list[str]:
    """The python blocks of docs/plugins.md that register a rule."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    return [b for b in blocks if "ktae.register_" in b]


@pytest.fixture
def doc_plugin(tmp_path) -> Path:
    """docs/plugins.md's rule and calibration as one plugin file."""
    first, *rest = doc_blocks()
    path = tmp_path / "late_credit.py"
    path.write_text(first + "\n\n" + "\n\n".join(rest))
    return path


def batch():
    ids = torch.tensor([[5, 6, 7, 0], [5, 8, 0, 0], [9, 9, 9, 9], [1, 0, 0, 0]])
    mask = ids != 0
    return dict(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), group=[0, 0, 1, 1],
                token_ids=ids, mask=mask)


# ----------------------------------------------------------------- the documented example


def test_doc_example_is_about_fifteen_lines():
    assert 10 <= len(doc_blocks()[0].strip().splitlines()) <= 20


def test_doc_rule_runs_through_compute_advantages(doc_plugin):
    plugins.load_plugin(str(doc_plugin))
    kw = batch()
    adv = ktae.compute_advantages("late-credit", gamma=0.5, **kw)
    # group 0: right minus accuracy 0.5 = +-0.5, halved per token from the end
    torch.testing.assert_close(adv[0, :3], torch.tensor([0.125, 0.25, 0.5]))
    torch.testing.assert_close(adv[1, :2], torch.tensor([-0.25, -0.5]))
    torch.testing.assert_close(adv[2], torch.tensor([0.0625, 0.125, 0.25, 0.5]))
    assert adv[3, 0] == -0.5 and (adv[~kw["mask"]] == 0).all()
    # the trainer's verdict (correct) wins over reward > 0
    flipped = ktae.compute_advantages("late-credit", correct=torch.tensor([0, 1, 1, 0]), **kw)
    assert flipped[0, 2] < 0 < flipped[1, 1]
    assert passes_correct("late-credit", {})


def test_doc_rule_through_ktae_train_validation(doc_plugin):
    argv = ["--plugin", str(doc_plugin), "train", "--credit", "late-credit+damp-uncertain",
            "--estimator-option", "gamma=0.9", "--calibration-option", "lam=0.3"]
    argv = plugins.load_from_argv(argv)
    assert "--plugin" not in argv
    cfg = config_from_args(build_parser(argv).parse_args(argv))
    settings = credit_settings(cfg)
    assert (settings.estimator, settings.estimator_options) == ("late-credit", {"gamma": 0.9})
    assert (settings.calibration, settings.calibration_options) == ("damp-uncertain",
                                                                    {"lam": 0.3})
    bad = ["train", "--credit", "late-credit", "--estimator-option", "gama=0.9"]
    with pytest.raises(ValueError, match=r"gama: unknown option for advantage estimator "
                                         r"'late-credit'; expected gamma$") as err:
        config_from_args(build_parser(bad).parse_args(bad))
    assert "\n" not in str(err.value)


def test_doc_calibration_runs_through_calibrate_advantages(doc_plugin):
    plugins.load_plugin(str(doc_plugin))
    H = torch.tensor([[0.1, 2.0, 3.0], [0.1, 2.0, 3.0]])
    res = ktae.calibrate_advantages("damp-uncertain", torch.tensor([1.0, -1.0]),
                                    logprobs=torch.zeros(2, 3), entropies=H,
                                    mask=torch.ones(2, 3), lam=0.25)
    torch.testing.assert_close(res.advantages, torch.tensor([[1.0, 1.0, 0.75],
                                                             [-1.0, -1.0, -1.0]]))
    assert res.flag_rate == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="entropies: required by calibration 'damp-uncertain'"):
        ktae.calibrate_advantages("damp-uncertain", torch.tensor([1.0]),
                                  logprobs=torch.zeros(1, 2), mask=torch.ones(1, 2))


def test_compare_arm_sets_the_rules_own_options(doc_plugin):
    plugins.load_plugin(str(doc_plugin))
    arm = parse_arm("late-credit@gamma=0.5@learning_rate=1e-5")
    assert arm.overrides == {"estimator_options": {"gamma": 0.5}, "learning_rate": 1e-5}
    with pytest.raises(ValueError, match=r"not an option of estimator 'late-credit' \(gamma\)"):
        parse_arm("late-credit@gama=0.5")


def test_compare_arm_options_reach_the_config(doc_plugin, monkeypatch, tmp_path):
    """``ktae compare``: an arm's option is set after the common --estimator-option ones."""
    import ktae.train.session as session
    from ktae.train import cli_compare, cli_train

    plugins.load_plugin(str(doc_plugin))
    configs = []
    real = cli_train.config_from_args
    monkeypatch.setattr(cli_train, "config_from_args",
                        lambda ns: configs.append(real(ns)) or configs[-1])

    def stop(cfg):
        raise ValueError("stopped before training")

    monkeypatch.setattr(session, "preflight", stop)
    argv = ["compare", "--credit", "late-credit,late-credit@gamma=0.5", "--seeds", "1",
            "-o", str(tmp_path / "cmp"), "--estimator-option", "gamma=0.7"]
    assert cli_compare.run(build_parser(argv).parse_args(argv)) == 2
    assert [c.estimator_options for c in configs] == [{"gamma": 0.7}, {"gamma": 0.5}]
    # a calibration's own option in an arm, after the common --calibration-option ones
    configs.clear()
    argv = ["compare", "--credit", "late-credit+damp-uncertain,"
            "late-credit+damp-uncertain@lam=0.25", "--seeds", "1", "-o", str(tmp_path / "c2"),
            "--calibration-option", "lam=0.75", "--estimator-option", "gamma=0.7"]
    assert cli_compare.run(build_parser(argv).parse_args(argv)) == 2
    assert [(c.estimator_options, c.calibration_options) for c in configs] == [
        ({"gamma": 0.7}, {"lam": 0.75}), ({"gamma": 0.7}, {"lam": 0.25})]


# ----------------------------------------------------------------- finding plugins


def test_plugin_from_a_file_is_found_by_the_command_line(tmp_path, capsys):
    path = tmp_path / "my_rule.py"
    path.write_text(textwrap.dedent("""
        import ktae

        @ktae.register_estimator("from-file")
        def from_file(batch, *, scale: float = 1.0):
            return scale * (batch.correct.float() - 0.5)
    """))
    assert "from-file" not in ktae.ADVANTAGE_ESTIMATORS
    rest = plugins.load_from_argv(["train", f"--plugin={path}", "--credit", "from-file"])
    assert rest == ["train", "--credit", "from-file"]
    assert "from-file" in ktae.ADVANTAGE_ESTIMATORS
    plugins.load_plugin(str(path))  # a second load does not register twice
    adv = ktae.compute_advantages("from-file", rewards=[1.0, 0.0], group=[0, 0], scale=4)
    assert adv.tolist() == [2.0, -2.0]


def test_plugin_by_module_name(tmp_path, monkeypatch):
    (tmp_path / "ktae_test_by_name.py").write_text(textwrap.dedent("""
        import ktae

        @ktae.register_estimator("by-name")
        def by_name(batch):
            return batch.rewards
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ktae_test_by_name", raising=False)
    plugins.load_from_argv(["--plugin", "ktae_test_by_name"])
    assert "by-name" in ktae.ADVANTAGE_ESTIMATORS


def test_plugin_from_an_installed_entry_point(tmp_path, monkeypatch):
    """A distribution on sys.path declaring the ``ktae.plugins`` group is loaded with no
    flag (a real dist-info directory, read by importlib.metadata)."""
    (tmp_path / "ktae_test_ep_rules.py").write_text(textwrap.dedent("""
        import ktae

        @ktae.register_estimator("from-entry-point")
        def rule(batch):
            return batch.rewards * 0
    """))
    info = tmp_path / "ktae_test_ep-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ktae-test-ep\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ktae.plugins]\nrules = ktae_test_ep_rules\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ktae_test_ep_rules", raising=False)
    assert "from-entry-point" not in ktae.ADVANTAGE_ESTIMATORS
    plugins.load_from_argv(["train"])
    assert "from-entry-point" in ktae.ADVANTAGE_ESTIMATORS
    plugins.load_entry_points()  # once per process


@pytest.mark.parametrize("make, message", [
    (lambda p: str(p / "missing.py"), r"--plugin .*missing\.py: no such file"),
    (lambda p: "ktae_no_such_module_x", r"--plugin ktae_no_such_module_x: "
                                        r"ModuleNotFoundError: No module named"),
    (lambda p: _write(p / "broken.py", "raise RuntimeError('boom')\n"),
     r"--plugin .*broken\.py: RuntimeError: boom"),
])
def test_a_plugin_that_fails_is_one_line(tmp_path, capsys, make, message):
    assert main(["--plugin", make(tmp_path), "train", "--help"]) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(message, err) and "\n" not in err, err


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# ----------------------------------------------------------------- bad rules


def _register(name, fn, **kw):
    return ktae.register_estimator(name, **kw)(fn)


@pytest.mark.parametrize("fn, options, message", [
    (lambda b: b.rewards[:1], {}, r"advantage estimator 'bad': returned shape \(1,\), "
                                  r"expected \(4,\) or \(4, 4\)"),
    (lambda b: b.rewards * float("nan"), {}, r"advantage estimator 'bad': returned NaN or inf "
                                             r"at \[0\]"),
    (lambda b: torch.ones(b.mask.shape), {}, r"advantage estimator 'bad': returned 1 on "
                                             r"padding at \[0, 3\]"),
    (lambda b: b.rewards.tolist(), {}, r"advantage estimator 'bad': returned list"),
    (lambda b, *, scale=1.0: b.rewards, {"scael": 2},
     r"scael: unknown option for advantage estimator 'bad'; expected scale$"),
    (lambda b: b.rewards, {"scale": 2},
     r"scale: unknown option for advantage estimator 'bad'; expected no options$"),
])
def test_a_bad_rule_is_a_one_line_error(fn, options, message):
    _register("bad", fn)
    with pytest.raises(ValueError, match=message) as err:
        ktae.compute_advantages("bad", **batch(), **options)
    assert "\n" not in str(err.value)


def test_needs_are_checked_and_passed():
    got = {}

    def rule(b):
        got.update(logprobs=b.logprobs, entropies=b.entropies)
        return b.rewards

    _register("wants-logprobs", rule, needs=("logprobs", "entropies"))
    kw = batch()
    with pytest.raises(ValueError, match="logprobs: required by advantage estimator "
                                         "'wants-logprobs'"):
        ktae.compute_advantages("wants-logprobs", **kw, entropies=torch.ones(4, 4))
    lp = torch.full((4, 4), -0.5)
    ktae.compute_advantages("wants-logprobs", **kw, entropies=torch.ones(4, 4), logprobs=lp)
    assert torch.equal(got["logprobs"], torch.where(kw["mask"], lp, 0))
    from ktae.core.advantages import estimator_needs_entropies, estimator_needs_logprobs
    assert estimator_needs_entropies("wants-logprobs")
    assert estimator_needs_logprobs("wants-logprobs")


def test_registration_errors():
    with pytest.raises(ValueError, match="needs='probs' is not an input"):
        ktae.register_estimator("x", needs=("probs",))
    with pytest.raises(TypeError, match="option 'correct' is an input the caller passes"):
        _register("y", lambda b, *, correct=None: b.rewards)
    with pytest.raises(ValueError, match="advantage estimator 'grpo' is already registered"):
        _register("grpo", lambda b: b.rewards)


def test_a_user_rule_accepts_any_option_with_kwargs():
    _register("loose", lambda b, **opts: b.rewards * opts.get("k", 1))
    adv = ktae.compute_advantages("loose", rewards=[1.0, 0.0], group=[0, 0], k=3, other=1)
    assert adv.tolist() == [3.0, 0.0]


# ----------------------------------------------------------------- in ktae train


@pytest.mark.slow
def test_trainer_passes_correct_logprobs_and_entropies(tiny_model, tmp_path):
    """A rule that needs logprobs and entropies gets the rollout policy's, and the
    verifier's verdict."""
    from test_train_helpers import contains_digit, tiny_config

    from ktae.train.session import train

    seen = []

    @ktae.register_estimator("spy", needs=("logprobs", "entropies"))
    def spy(b, *, scale: float = 1.0):
        seen.append(b)
        return scale * torch.where(b.mask, b.logprobs, 0.0)

    cfg = tiny_config(tiny_model, tmp_path / "run", credit="spy", max_steps=1,
                      estimator_options={"scale": -1.0})
    train(cfg, reward_funcs=[contains_digit])
    assert len(seen) == 2  # the settings check's tiny batch, then the step
    b = seen[1]
    assert b.rewards.numel() == cfg.num_prompts * cfg.num_generations
    real = b.mask
    assert b.logprobs.shape == b.mask.shape == b.entropies.shape
    assert (b.logprobs[real] <= 0).all() and (b.logprobs[real] < 0).any()
    assert (b.logprobs[~real] == 0).all() and (b.entropies[real] > 0).all()
    assert b.correct.dtype == torch.bool
    assert torch.equal(b.correct, b.rewards > 0.5)  # contains_digit is the only reward


def test_doc_rule_in_explain_and_audit_credit_values(doc_plugin):
    """``ktae explain`` / ``audit`` compute credit through credit_values: a user rule and
    its options work there, and so does prefix-value."""
    from ktae.core.methods import Method
    from ktae.groups.credit import credit_values
    from ktae.groups.input import GroupInput

    plugins.load_plugin(str(doc_plugin))
    groups = [GroupInput(prompt="p", responses=[[5, 6, 7], [5, 8]], rewards=[1.0, 0.0])]
    vals = credit_values(groups, Method(estimator="late-credit",
                                        estimator_options={"gamma": 0.5}))
    expected = ktae.compute_advantages("late-credit", rewards=[1.0, 0.0], group=[0, 0],
                                       token_ids=vals.token_ids, mask=vals.mask, gamma=0.5)
    torch.testing.assert_close(vals.final.double(), expected.double())
    pv = credit_values(groups, Method(estimator="prefix-value"))
    assert pv.final[1, 0] == 0 and pv.final[1, 1] < 0  # the shared first token: no blame


def test_study_plugin_prefix_value_over_words():
    """studies/credit-study/prefix_value_words.py: a word begins at each token whose text starts
    with whitespace (the shipped tokenizer is character-level: at each space)."""
    from transformers import AutoTokenizer

    from ktae.models.warmstart import default_model_path

    plugins.load_plugin(str(Path(__file__).resolve().parents[1] / "studies" / "credit-study"
                            / "prefix_value_words.py"))
    tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    texts = ["12 + 34 = 46", "12 + 34 = 47", "12 + 35 = 47", "12 - 34 = 46"]
    ids = torch.tensor([tok.convert_tokens_to_ids(list(t)) for t in texts])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    got = ktae.compute_advantages("prefix-value-words", rewards=rewards, group=[0] * 4,
                                  token_ids=ids)
    starts = torch.tensor([[c == " " for c in t] for t in texts])
    want = ktae.compute_advantages("prefix-value", rewards=rewards, group=[0] * 4,
                                   token_ids=ids, unit="word", word_starts=starts)
    torch.testing.assert_close(got, want)
    per_token = ktae.compute_advantages("prefix-value", rewards=rewards, group=[0] * 4,
                                        token_ids=ids)
    assert not torch.allclose(got, per_token)  # the credit is spread over the word


def test_compare_arm_option_adds_to_the_common_ones_of_the_same_rule(monkeypatch, tmp_path):
    """``--estimator-option a=1`` with the arm ``two-options@b=2``: the run gets both."""
    import ktae.train.session as session
    from ktae.train import cli_compare, cli_train

    @ktae.register_estimator("two-options")
    def two_options(batch, *, a: float = 0.0, b: float = 0.0):
        return (a + b) * (batch.correct.double() - 0.5)

    configs = []
    real = cli_train.config_from_args
    monkeypatch.setattr(cli_train, "config_from_args",
                        lambda ns: configs.append(real(ns)) or configs[-1])
    monkeypatch.setattr(session, "preflight",
                        lambda cfg: (_ for _ in ()).throw(ValueError("stopped")))
    argv = ["compare", "--credit", "two-options,two-options@b=2", "--seeds", "1",
            "-o", str(tmp_path / "cmp"), "--estimator-option", "a=1"]
    assert cli_compare.run(build_parser(argv).parse_args(argv)) == 2
    assert [c.estimator_options for c in configs] == [{"a": 1}, {"a": 1, "b": 2}]
