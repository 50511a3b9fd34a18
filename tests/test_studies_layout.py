"""The studies' home: nothing in the package imports a study, and the scripts of
``studies/``, ``scripts/`` and ``benchmarks/`` import each other without a circle (lazy
imports inside functions counted)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TREES = ("studies", "scripts", "benchmarks")


def _script_modules() -> dict[str, Path]:
    """Module name -> file, for every ``.py`` under :data:`TREES` (they import each other
    by bare name, from ``sys.path`` entries they add)."""
    out: dict[str, Path] = {}
    for tree in TREES:
        for path in sorted((REPO / tree).rglob("*.py")):
            if path.stem in out:
                raise AssertionError(f"two script modules named {path.stem}: {out[path.stem]} "
                                     f"and {path}: a bare import would be ambiguous")
            out[path.stem] = path
    return out


def _imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_nothing_in_the_package_imports_a_study():
    studies = {p.stem for p in (REPO / "studies").rglob("*.py")}
    for path in (REPO / "src" / "ktae").rglob("*.py"):
        hits = (_imported_names(path) & studies) | ({"studies"} & _imported_names(path))
        assert not hits, f"{path.relative_to(REPO)} imports {sorted(hits)}"


def test_scripts_and_studies_import_without_a_circle():
    modules = _script_modules()
    graph = {name: sorted(_imported_names(path) & set(modules) - {name})
             for name, path in modules.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                raise AssertionError(f"import circle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
    assert "stats" in graph and "verdict_tables" in graph  # the graph is the real one
    assert "verdict_analysis" in graph["verdict_tables"]
