"""No new import cycle: ``scripts/import_graph.py`` counts the cycles between the modules
and between the packages of ``src/ktae`` (imports inside functions included), and a
change that adds one fails here, listing the cycles left (docs/layers.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODULE_CYCLES = 0
"""No cycle between modules: the explainers and the audit read groups from ``ktae.groups``
and never import each other, and no module imports the package root."""
PACKAGE_CYCLES = 0
"""No cycle between packages: the root's ``ktae.audit()`` imports ``ktae.credit_audit`` when
called (the one upward import of tests/test_layers.py), and nothing below imports the root
back."""


def _graph():
    spec = importlib.util.spec_from_file_location("import_graph",
                                                  ROOT / "scripts" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module, module.build(ROOT / "src")


def _shown(cycles) -> str:
    return "\n".join(" -> ".join([*c, c[0]]) for c in cycles)


def test_no_new_cycle_between_modules():
    _, graph = _graph()
    cycles = graph.module_cycles()
    assert len(cycles) <= MODULE_CYCLES, f"{len(cycles)} cycles:\n{_shown(cycles)}"


def test_no_new_cycle_between_packages():
    _, graph = _graph()
    cycles = graph.package_cycles()
    assert len(cycles) <= PACKAGE_CYCLES, f"{len(cycles)} cycles:\n{_shown(cycles)}"


def test_no_module_imports_the_package_root():
    """Modules import the module that defines a name (``ktae.core.estimators``), never the
    root's re-exports (``import ktae``, ``from ktae import compute_advantages``): the root
    is the users' door, and a module reaching back through it hides its real layer. The
    verl plugin is no exception: it reads the registries, which the root only re-exports."""
    _, graph = _graph()
    back = sorted(f"{e.source}:{e.line}" for e in graph.edges
                  if e.target == "ktae" and e.source != "ktae")
    assert not back, "imports of the package root: " + ", ".join(back)


def test_the_graph_reads_lazy_and_relative_imports(tmp_path):
    module, _ = _graph()
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg import c\n"
        "def f():\n    from . import d\n    import pkg\n")
    (pkg / "c.py").write_text("")
    (pkg / "sub" / "d.py").write_text("from ..sub import b\n")
    graph = module.build(tmp_path, "pkg")
    edges = {(e.source, e.target, e.lazy) for e in graph.edges}
    assert edges == {("pkg", "pkg.sub.b", False), ("pkg.sub.b", "pkg.sub.d", True),
                     ("pkg.sub.b", "pkg", True), ("pkg.sub.d", "pkg.sub.b", False)}
    assert graph.module_cycles() == [["pkg", "pkg.sub.b"], ["pkg.sub.b", "pkg.sub.d"]]
    assert graph.package_cycles() == [["pkg", "pkg.sub"]]  # the root and its package
    assert module.simple_cycles({("a", "b"), ("b", "a"), ("b", "c"), ("c", "a")}) == [
        ["a", "b"], ["a", "b", "c"]]
