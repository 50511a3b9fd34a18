"""The supported TRL range: the ``train`` extra requires it, and ``ktae train``, ``ktae
compare``, :func:`ktae.train.session.preflight` and ``KTAEGRPOTrainer(...)`` refuse a TRL
outside it in one line, before any model loads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trl
from packaging.requirements import Requirement

from ktae.train.trl_version import SUPPORTED_TRL, UnsupportedTRLError, check_trl

ROOT = Path(__file__).resolve().parents[1]
RANGE = "trl>=1.15.0,<=1.16.0"


@pytest.fixture
def old_trl(monkeypatch):
    """TRL reporting 1.14.2; loading a model fails the test."""
    import transformers

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded under an unsupported TRL")

    monkeypatch.setattr(trl, "__version__", "1.14.2")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_model)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", no_model)


def test_train_extra_requires_the_supported_range():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    (spec,) = [Requirement(r) for r in extras["train"] if Requirement(r).name == "trl"]
    assert str(spec.specifier) == str(Requirement(f"trl{SUPPORTED_TRL}").specifier)
    assert f"trl{SUPPORTED_TRL}" == RANGE


@pytest.mark.parametrize("version", ["1.15.0", "1.15.3", "1.16.0"])
def test_supported_releases_pass(version):
    assert check_trl(version) == version


@pytest.mark.parametrize("version", ["1.14.2", "1.13.0", "1.16.1", "1.17.0", "2.0.0",
                                     "1.16.0rc1", "1.17.0.dev0", "not-a-version"])
def test_other_releases_are_refused_in_one_line(version):
    with pytest.raises(UnsupportedTRLError) as err:
        check_trl(version)
    text = str(err.value)
    assert "\n" not in text
    assert text == (f"trl {version} is installed; ktae's trainer supports {RANGE} only: "
                    f"pip install '{RANGE}'")


def test_the_imported_trl_is_checked(monkeypatch):
    assert check_trl() == trl.__version__  # this environment's TRL is a supported one
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(UnsupportedTRLError, match=r"trl 1\.17\.0 is installed"):
        check_trl()


def test_missing_trl_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl raises ImportError
    with pytest.raises(UnsupportedTRLError, match=r"trl is not installed; .*pip install 'ktae\[train\]'"):
        check_trl()


def test_trainer_construction_refuses_before_building(old_trl, monkeypatch):
    from trl import GRPOTrainer

    from ktae.runs.credit import CreditSettings
    from ktae.train.trainer import KTAEGRPOTrainer

    def never(*args, **kwargs):
        raise AssertionError("GRPOTrainer.__init__ ran under an unsupported TRL")

    monkeypatch.setattr(GRPOTrainer, "__init__", never)
    with pytest.raises(UnsupportedTRLError, match=r"trl 1\.14\.2 is installed; .*trl>=1\.15\.0"):
        KTAEGRPOTrainer(model="any-model", reward_funcs=[], credit=CreditSettings())


def test_preflight_refuses(old_trl, tmp_path):
    from ktae.runs.config import TrainConfig
    from ktae.train.session import preflight

    with pytest.raises(UnsupportedTRLError, match=r"trl 1\.14\.2 is installed"):
        preflight(TrainConfig(output_dir=str(tmp_path / "run")))


@pytest.mark.parametrize("command", ["train", "compare"])
def test_commands_refuse_in_one_line(old_trl, tmp_path, capsys, monkeypatch, command):
    from ktae.cli import main

    def no_preflight(*args, **kwargs):
        raise AssertionError("preflight ran under an unsupported TRL")

    import ktae.train.session as session

    monkeypatch.setattr(session, "preflight", no_preflight)
    argv = [command, "--max-steps", "1", "--output-dir", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"ktae {command}: trl 1.14.2 is installed; ktae's trainer supports {RANGE} "
                   f"only: pip install '{RANGE}'")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
