"""The repository's layout: nothing in the package imports a study, and the scripts of
``studies/``, ``scripts/`` and ``benchmarks/`` import each other without a circle (lazy
imports inside functions counted); every study folder has its report, indexed in
``studies/README.md``; ``scripts/`` holds the maintained tools only; every benchmark is run
by a test; and every file path or relative link the docs and the reports cite exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TREES = ("studies", "scripts", "benchmarks")
MAINTAINED_TOOLS = {"tables.py", "import_graph.py", "compare_trl_releases.py",
                    "suite_self_check.py"}
"""``scripts/``: the tools CI, the tests and the user and contributor docs run; a study's
harness lives in its study's folder."""
BENCHMARK_HELPERS = {"synthetic.py"}
"""Modules of ``benchmarks/`` that are not benchmarks (the synthetic batches they share)."""


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


def test_every_study_folder_has_a_report_indexed_in_the_readme():
    index = (REPO / "studies" / "README.md").read_text()
    folders = sorted(p for p in (REPO / "studies").iterdir() if p.is_dir()
                     and p.name != "__pycache__")
    assert len(folders) >= 8
    for folder in folders:
        assert (folder / "report.md").is_file(), f"{folder.name} has no report.md"
        assert f"]({folder.name}/report.md)" in index, f"studies/README.md misses {folder.name}"


def test_scripts_holds_only_the_maintained_tools():
    held = {p.relative_to(REPO / "scripts").as_posix() for p in (REPO / "scripts").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}
    assert held == MAINTAINED_TOOLS, f"scripts/ holds {sorted(held - MAINTAINED_TOOLS)}, " \
        "a study's harness belongs in its study's folder"


def test_every_benchmark_is_run_by_a_test():
    tests = "\n".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    benchmarks = [p for p in sorted((REPO / "benchmarks").iterdir())
                  if p.suffix in (".py", ".sh") and p.name not in BENCHMARK_HELPERS]
    assert len(benchmarks) >= 20
    # a test runs a script by its file name, or loads a module by its name
    missing = [p.name for p in benchmarks
               if not re.search(rf"\b{p.stem}\b" if p.suffix == ".py" else re.escape(p.name),
                                tests)]
    assert not missing, f"no test names {missing}"


_CITED_PATH = re.compile(r"(?<![\w/.-])((?:benchmarks|studies|scripts|configs|records)/"
                         r"[\w./-]+\.(?:json|txt|log|md|py|sh|yaml|jsonl|gz))")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_paths_and_links_in_the_docs_and_reports_exist():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "studies").rglob("*.md"))]
    missing = []
    for page in pages:
        text = page.read_text()
        for cited in _CITED_PATH.findall(text):
            if not (REPO / cited).exists():
                missing.append(f"{page.relative_to(REPO)}: {cited}")
        for target in _LINK.findall(text):
            if "://" not in target and not (page.parent / target).exists():
                missing.append(f"{page.relative_to(REPO)}: ({target})")
    assert not missing, "\n".join(missing)
