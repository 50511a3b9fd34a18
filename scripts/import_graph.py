"""The internal import graph of ``src/ktae``: which modules import which, and the cycles.

Every module's imports are read with :mod:`ast`, at the top of the module and inside
functions ("lazy" imports, which run when the function is first called); imports under
``if TYPE_CHECKING:`` never run and are left out. An edge goes from the importing module
to the ``ktae`` module it names (``from ktae.core import methods`` names
``ktae.core.methods``; ``from ktae import __version__`` the root ``ktae``).

Reported:

- module cycles: the elementary cycles of the module graph (Johnson's algorithm), grouped
  by their strongly connected part;
- package cycles: the same on the graph of top-level packages (``ktae.core``,
  ``ktae.train``, ...; a top-level module such as ``ktae.cli`` is its own node, the root
  ``__init__`` is ``ktae``), from the edges between modules of different packages;
- lazy internal imports: the import statements inside functions that name ``ktae``
  modules (one per statement and module named).

``python scripts/import_graph.py`` prints the report; ``--skip DIR`` (repeatable, e.g.
``--skip credit_audit``) lists separately the cycles through a sub-package of ``ktae``.
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
"""The folder holding the ``ktae`` package."""


@dataclass(frozen=True)
class Edge:
    """One import of a ``ktae`` module by another."""

    source: str
    """The importing module (``ktae.train.cli_train``)."""
    target: str
    """The imported module (``ktae.runs.config``)."""
    line: int
    lazy: bool
    """Inside a function (runs when the function is first called)."""


@dataclass
class ImportGraph:
    """The modules of the package and their imports of one another."""

    modules: set[str] = field(default_factory=set)
    edges: list[Edge] = field(default_factory=list)

    def module_edges(self) -> set[tuple[str, str]]:
        """``(importer, imported)`` pairs, without self-imports."""
        return {(e.source, e.target) for e in self.edges if e.source != e.target}

    def package_edges(self) -> set[tuple[str, str]]:
        """``(importer, imported)`` pairs of packages (:func:`package_of`) that differ."""
        pairs = {(package_of(a), package_of(b)) for a, b in self.module_edges()}
        return {(a, b) for a, b in pairs if a != b}

    def lazy_edges(self) -> list[Edge]:
        """The imports inside functions."""
        return [e for e in self.edges if e.lazy]

    def module_cycles(self) -> list[list[str]]:
        """Every elementary cycle between modules, each starting at its smallest name."""
        return simple_cycles(self.module_edges())

    def package_cycles(self) -> list[list[str]]:
        """Every elementary cycle between packages."""
        return simple_cycles(self.package_edges())


def package_of(module: str) -> str:
    """The node of ``module`` in the package graph: its top-level sub-package
    (``ktae.integrations.verl.plugin``: ``ktae.integrations``), a top-level module itself
    (``ktae.cli``), or ``ktae`` for the root ``__init__``."""
    return ".".join(module.split(".")[:2])


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST):
    """``(node, lazy)`` of every import statement, skipping ``TYPE_CHECKING`` blocks."""
    todo = [(tree, False)]
    while todo:
        node, lazy = todo.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking_block(child):
                todo.extend((c, lazy) for c in child.orelse)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, lazy
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                               ast.Lambda))
            todo.append((child, inner))


def _targets(node, module: str, is_package: bool, modules: set[str]) -> list[str]:
    """The ``ktae`` modules an import statement names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            prefix = package[:len(package) - node.level + 1]
            base = ".".join([*prefix, base] if base else prefix)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:  # ``import ktae.x.y`` of a missing y: x
            name = name.rpartition(".")[0]
        if name and name not in out:
            out.append(name)
    return out


def build(src: Path = SRC, package: str = "ktae") -> ImportGraph:
    """The import graph of every ``.py`` file of ``src/package``."""
    files = sorted((src / package).rglob("*.py"))
    graph = ImportGraph(modules={_module_name(p, src) for p in files})
    for path in files:
        module = _module_name(path, src)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, lazy in _imports(tree):
            for target in _targets(node, module, path.name == "__init__.py", graph.modules):
                graph.edges.append(Edge(module, target, node.lineno, lazy))
    graph.edges.sort(key=lambda e: (e.source, e.line, e.target))
    return graph


def simple_cycles(edges, limit: int = 100_000) -> list[list[str]]:
    """The elementary cycles of the directed graph ``edges`` (Johnson's algorithm), each
    rotated to start at its smallest node, sorted; at most ``limit`` of them."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
        graph.setdefault(b, set())
    order = sorted(graph)
    found: list[list[str]] = []
    for i, start in enumerate(order):
        allowed = set(order[i:])
        blocked: set[str] = set()
        blocked_by: dict[str, set[str]] = defaultdict(set)
        path = [start]
        stack = [(start, iter(sorted(graph[start] & allowed)))]
        closes = {start: False}
        blocked.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is not None:
                if child == start:
                    found.append(list(path))
                    closes[node] = True
                    if len(found) >= limit:
                        return sorted(found)
                elif child not in blocked:
                    path.append(child)
                    blocked.add(child)
                    closes[child] = False
                    stack.append((child, iter(sorted(graph[child] & allowed))))
                continue
            stack.pop()
            path.pop()
            if closes[node]:
                _unblock(node, blocked, blocked_by)
                if stack:
                    closes[stack[-1][0]] = True
            else:
                for nxt in graph[node] & allowed:
                    blocked_by[nxt].add(node)
    return sorted(found)


def _unblock(node: str, blocked: set[str], blocked_by: dict[str, set[str]]) -> None:
    todo = [node]
    while todo:
        n = todo.pop()
        if n in blocked:
            blocked.discard(n)
            todo.extend(blocked_by.pop(n, ()))


def through(cycle: list[str], skip: tuple[str, ...], package: str = "ktae") -> bool:
    """Whether ``cycle`` passes through one of the sub-packages ``skip``
    (``("credit_audit",)``)."""
    return any(m == f"{package}.{s}" or m.startswith(f"{package}.{s}.")
               for m in cycle for s in skip)


def report(graph: ImportGraph, skip: tuple[str, ...] = ()) -> str:
    """The text ``python scripts/import_graph.py`` prints."""
    lines = [f"{len(graph.modules)} modules, {len(graph.module_edges())} module imports "
             f"({len(graph.lazy_edges())} lazy internal import statements)"]
    for title, cycles in (("module cycles", graph.module_cycles()),
                          ("package cycles", graph.package_cycles())):
        kept = [c for c in cycles if not through(c, skip)]
        lines.append(f"{title}: {len(cycles)}" + (
            f" ({len(cycles) - len(kept)} through {', '.join(skip)})" if skip else ""))
        lines += ["  " + " -> ".join([*c, c[0]]) for c in kept]
        if skip and len(kept) < len(cycles):
            lines.append(f"  ... and {len(cycles) - len(kept)} through {', '.join(skip)}")
    lazy = defaultdict(int)
    for e in graph.lazy_edges():
        lazy[e.source] += 1
    lines.append("lazy internal imports by module:")
    lines += [f"  {n:3d} {m}" for m, n in sorted(lazy.items(), key=lambda x: (-x[1], x[0]))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip", action="append", default=[],
                        help="a sub-package whose cycles are counted but not listed")
    args = parser.parse_args(argv)
    print(report(build(), tuple(args.skip)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
