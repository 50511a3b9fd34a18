"""The modules of the command line import cleanly on their own, without circles, and a
bad option is refused before the heavy libraries load."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "ktae"
HEAVY = ("trl", "transformers", "datasets", "matplotlib")


def _ktae_imports(path: Path) -> set[str]:
    """Every ``ktae.*`` module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ktae"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("ktae"))
    return found


def test_explain_sources_and_the_audit_do_not_import_each_other():
    audit = _ktae_imports(SRC / "credit_audit" / "run.py")
    sources = _ktae_imports(SRC / "explain" / "sources.py")
    explain = set().union(*(_ktae_imports(p) for p in (SRC / "explain").glob("*.py")))
    assert any(m.startswith("ktae.groups") for m in audit)  # the audit reads groups there
    assert not any(m.startswith("ktae.explain") for m in audit), audit
    assert not any(m.startswith("ktae.credit_audit") for m in sources | explain), explain


@pytest.mark.parametrize("module", ["ktae.credit_audit.run", "ktae.explain.sources",
                                    "ktae.viz.labels", "ktae.cli_common", "ktae.cli"])
def test_each_module_imports_alone_in_a_fresh_interpreter(module):
    code = (f"import sys, {module}\n"
            "assert 'ktae.credit_audit.run' not in sys.modules or "
            f"'{module}' == 'ktae.credit_audit.run', 'explain imported the audit'\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    if module != "ktae.explain.sources" and module != "ktae.credit_audit.run":
        assert out.stdout.strip() == "[]", out.stdout


def test_span_labels_read_from_one_place():
    from ktae.credit_audit import run
    from ktae.viz.labels import span_labels

    assert not hasattr(run, "span_labels")  # defined and read in ktae.viz.labels only
    assert span_labels("1+1=3", [[4, 5]], None, "x") == "rrrrw"
    assert span_labels("1+1=3", [[4, 5]], [[2, 5]], "x") == "..rrw"
    with pytest.raises(ValueError, match="x: 'wrong' span \\[4, 9\\] lies outside"):
        span_labels("1+1=3", [[4, 9]], None, "x")
