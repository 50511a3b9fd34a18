"""studies/mutation/hand_mutations.py's recorded mutations still apply: each fragment occurs exactly
once in its file (a refactor that moves one must update the table, or the mutation would
be skipped as "not applied" instead of being checked)."""

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
