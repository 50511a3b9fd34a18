"""``scripts/compare_trl_releases.py``: the overridden names come from the trainer itself,
and a changed body or signature is reported (wheels built here from the installed TRL)."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import pytest
import trl

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_trl_releases.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("compare_trl_releases", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_overridden_names_are_the_trainers(script):
    names = script.overridden_names()
    assert {"_generate_and_score_completions", "_calculate_rewards", "_prepare_inputs",
            "_compute_loss", "_get_per_token_logps_and_entropies", "_get_train_sampler",
            "_save_checkpoint", "training_step", "__init__"} <= set(names)
    assert "_init_training_state" not in names  # a callback now, and not GRPOTrainer's


def _wheel(path: Path, edit=None) -> zipfile.ZipFile:
    root = Path(trl.__file__).parent
    with zipfile.ZipFile(path, "w") as z:
        for name in ("trainer/grpo_trainer.py", "trainer/utils.py",
                     "generation/vllm_generation.py"):
            text = (root / name).read_text()
            if edit is not None:
                text = edit(name, text)
            z.writestr(f"trl/{name}", text)
    return zipfile.ZipFile(path)


def test_a_changed_body_and_signature_are_reported(script, tmp_path, monkeypatch):
    def older(name, text):
        if name == "trainer/utils.py":
            text = text.replace("def shuffle_sequence_dict(",
                                "def shuffle_sequence_dict(extra, ", 1)
        if name == "trainer/grpo_trainer.py":
            text = text.replace("    def _prepare_inputs(self, ",
                                "    def _prepare_inputs(self, extra, ", 1)
        return text

    wheels = {"new": _wheel(tmp_path / "new.whl"), "old": _wheel(tmp_path / "old.whl", older)}
    monkeypatch.setattr(script, "fetch", lambda version, into: wheels[version])
    lines = {line.split()[0]: line for line in script.compare(["new", "old"])}
    assert "signature same, body same" in lines["GRPOTrainer._compute_loss"]
    # one changed line: removed and added
    assert "signature DIFFERS, body 2 lines differ" in lines["GRPOTrainer._prepare_inputs"]
    assert "signature DIFFERS" in lines["shuffle_sequence_dict"]
    assert "signature same, body same" in lines["RepeatSampler.__iter__"]


def test_one_release_is_refused(script, capsys):
    with pytest.raises(SystemExit):
        script.main(["1.16.0"])
    assert "versions: expected a reference release" in capsys.readouterr().err
