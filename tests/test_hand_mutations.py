"""The mutation study's tools still apply (studies/mutation/): each fragment of
hand_mutations.py occurs exactly once in its file (a refactor that moves one must update
the table, or the mutation would be skipped as "not applied" instead of being checked), and
mutmut_run.py's selections name modules and tests that exist."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mutations():
    spec = importlib.util.spec_from_file_location("hand_mutations",
                                                  ROOT / "studies" / "mutation" / "hand_mutations.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("hand_mutations", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.MUTATIONS


@pytest.mark.parametrize("mutation", _mutations(), ids=lambda m: m.what)
def test_each_recorded_fragment_is_found_once(mutation):
    text = (ROOT / mutation.path).read_text()
    assert text.count(mutation.old) == 1, mutation.what
    assert text.count(mutation.new) == 0, mutation.what
    for test in mutation.tests:
        assert (ROOT / test.split("::")[0]).is_file(), test


def test_mutmut_selections_name_existing_modules_and_tests():
    """studies/mutation/mutmut_run.py's table: every module it mutates and every test file
    and test function its selections name exist (a renamed test would leave a module's
    mutants unchecked, and mutmut would report them as survivors)."""
    spec = importlib.util.spec_from_file_location(
        "mutmut_run", ROOT / "studies" / "mutation" / "mutmut_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert len(module.MODULES) >= 6
    for path, selection in module.MODULES.items():
        assert (ROOT / path).is_file(), path
        tests = [a for a in selection if a.startswith("tests/")]
        assert tests, path
        for test in tests:
            file, _, name = test.partition("::")
            assert (ROOT / file).is_file(), test
            if name:
                assert f"def {name}(" in (ROOT / file).read_text(), test


def test_mutation_script_refuses_an_unknown_tool():
    import subprocess

    done = subprocess.run(["bash", str(ROOT / "studies" / "mutation" / "mutation.sh"), "nope"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: studies/mutation/mutation.sh [hand [N...] | mutmut")
