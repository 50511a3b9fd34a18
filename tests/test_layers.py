"""The layers of the package (docs/layers.md, and "Layout" in docs/contributing.md: each
package imports only its own layer and the layers below it, so the trainer, evaluation and
plots depend on the core, never the reverse): every ``ktae.*`` package and top-level module
has a layer in :data:`LAYERS`; none imports a package of a layer above its own, at the top of a module or
inside a function, and no two packages import each other, directly or through others.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "ktae"

LAYERS = (
    ("core", "checkpoints", "cli_common", "plugins", "_version"),  # pure torch or the standard library
    ("ktae",),  # the package root: the public API over the core
    ("rewards", "tasks", "data", "viz", "integrations"),
    ("models",),  # the named and shipped models, their prompting and generation
    ("eval",),
    ("runs",),  # the run directory's format, below its writer and its readers
    ("groups",),  # scored response groups: what the explainers and the audit both read
    ("explain", "sim", "credit_audit"),  # they read runs, never the trainer
    ("train",),
    ("cli",),  # ktae.cli and ktae.__main__
)
"""Every package and top-level module of ``ktae``, lowest layer first (``ktae``: the root
``__init__``). A package may import the packages of its own layer and of the layers below."""

ALLOWED_UPWARD = {
    ("ktae", "credit_audit"): "ktae.audit(), the public entry to the audit, imports it when "
                              "called",
}
"""The imports above a package's layer that remain, each with its reason; they are left out
of the cycle check. An entry no import needs any more fails
:func:`test_every_allowed_upward_import_is_still_needed`."""


def _node(module: str) -> str | None:
    """The package or top-level module of ``ktae`` that ``module`` belongs to (None outside
    ``ktae``; ``"ktae"`` for the root itself; ``ktae.__main__`` counts as ``cli``)."""
    parts = module.split(".")
    if parts[0] != "ktae":
        return None
    if len(parts) == 1:
        return "ktae"
    return "cli" if parts[1] == "__main__" else parts[1]


def imports_of(source: str, module: str, *, is_package: bool = False) -> list[tuple[str, int]]:
    """``(imported ktae node, line)`` of every import in ``source`` (the code of ``module``),
    at the top or inside a function or class; relative imports resolved; ``from ktae
    import X`` names the subpackage or module ``X`` when there is one, else the root."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:
                base = package[:len(package) - node.level + 1]
                name = ".".join([*base, name] if name else base)
            targets = [name]
            if name == "ktae":
                targets = [f"ktae.{a.name}" if _is_part(a.name) else "ktae" for a in node.names]
        else:
            continue
        out.extend((_node(t), node.lineno) for t in targets if _node(t) is not None)
    return out


def _is_part(name: str) -> bool:
    return (SRC / name).is_dir() or (SRC / f"{name}.py").is_file()


def package_imports() -> dict[tuple[str, str], list[str]]:
    """``(importer, imported) -> ["file:line", ...]`` over every source file of ``ktae``,
    between different packages."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent)
        parts = list(rel.with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        here = _node(module)
        for there, line in imports_of(path.read_text(encoding="utf-8"), module,
                                      is_package=is_package):
            if there != here:
                edges[(here, there)].append(f"{rel.as_posix()}:{line}")
    return dict(edges)


def _rank() -> dict[str, int]:
    return {name: i for i, layer in enumerate(LAYERS) for name in layer}


def cycles(edges) -> list[list[str]]:
    """The groups of packages that import one another, directly or through others, in the
    graph ``edges`` (pairs): its strongly connected parts of more than one package, each
    sorted, in sorted order."""
    graph: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        graph[a].append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in sorted(graph):  # Tarjan's algorithm, without recursion
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    top = stack.pop()
                    part.append(top)
                    if top == node:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return sorted(found)


def _modules(package: str) -> list[str]:
    path = SRC.joinpath(*package.split(".")[1:])
    return [package, *(f"{package}.{m.name}" for m in pkgutil.walk_packages([str(path)]))]


def _imported_after(modules: list[str], then: str = "") -> set[str]:
    """The ``ktae.*`` modules loaded once ``modules`` are imported in a fresh interpreter
    (and the code ``then`` has run)."""
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            f"{then}\n"
            "print('\\n'.join(m for m in sys.modules if m.startswith('ktae')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def _train(modules) -> set[str]:
    return {m for m in modules if m == "ktae.train" or m.startswith("ktae.train.")}


def test_every_eval_module_imports_without_the_trainer(tmp_path):
    modules = _modules("ktae.eval")
    assert "ktae.eval.sweep" in modules and len(modules) > 5
    (tmp_path / "checkpoint-2").mkdir()  # incomplete: no marker
    # the sweep's checkpoint reading runs too (its imports were inside functions)
    then = (f"from ktae.eval.sweep import incomplete_checkpoints, run_checkpoints\n"
            f"assert incomplete_checkpoints({str(tmp_path)!r}) == ['checkpoint-2']\n"
            f"try:\n    run_checkpoints({str(tmp_path)!r})\nexcept ValueError:\n    pass")
    loaded = _imported_after(modules, then)
    assert "ktae.eval.sweep" in loaded and "ktae.checkpoints" in loaded
    assert not _train(loaded)


def test_the_run_readers_import_without_the_trainer():
    """ktae.runs, the groups, the explainers and the audit, every module imported in a fresh
    interpreter."""
    modules = [*_modules("ktae.runs"), *_modules("ktae.groups"), *_modules("ktae.explain"),
               *_modules("ktae.credit_audit")]
    assert "ktae.runs.reader" in modules and "ktae.credit_audit.run" in modules
    loaded = _imported_after(modules)
    assert "ktae.runs.config" in loaded and not _train(loaded)

def test_no_eval_source_names_the_trainer():
    """At the top or inside a function: a lazy import is still an upward dependency."""
    for path in (SRC / "eval").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            assert not _train(names), f"{path.name}:{node.lineno} imports {names}"
    assert not _train(_imported_after(["ktae.checkpoints"]))


def test_checkpoint_helpers_are_one_definition_below_the_trainer():
    from ktae import checkpoints
    from ktae.eval import sweep
    from ktae.runs import rundir

    for name in ("COMPLETE_MARKER", "is_complete_checkpoint", "latest_complete_checkpoint",
                 "checkpoint_step", "CHECKPOINT_NAME"):
        assert getattr(rundir, name) is getattr(checkpoints, name)
    assert sweep.is_complete_checkpoint is checkpoints.is_complete_checkpoint


def test_the_explainers_and_the_audit_read_the_held_out_seed_from_the_task():
    from ktae import tasks
    from ktae.train import data

    assert data.EVAL_SEED is tasks.EVAL_SEED
    for path in (SRC / "credit_audit" / "run.py", SRC / "explain" / "sources.py",
                 SRC / "eval" / "sweep.py"):
        text = path.read_text(encoding="utf-8")
        assert "ktae.train.data" not in text and "ktae.runs.rundir" not in text, path


# --------------------------------------------------------------------------- every layer


def test_every_package_has_one_layer():
    placed = [name for layer in LAYERS for name in layer]
    assert len(placed) == len(set(placed))
    present = {"ktae", "cli"} | {p.stem for p in SRC.glob("*.py") if not p.stem.startswith("__")} \
        | {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    assert present == set(placed), f"missing: {present - set(placed)}, gone: {set(placed) - present}"


def test_no_package_imports_a_layer_above_its_own():
    """Function-level imports count: a lazy import is still an upward dependency."""
    rank = _rank()
    upward = {edge: where for edge, where in package_imports().items()
              if rank[edge[1]] > rank[edge[0]] and edge not in ALLOWED_UPWARD}
    assert not upward, "\n".join(f"{a} imports {b} (a layer above): {', '.join(w)}"
                                  for (a, b), w in sorted(upward.items()))


def test_no_import_cycles_between_packages():
    edges = [e for e in package_imports() if e not in ALLOWED_UPWARD]
    assert cycles(edges) == []


def test_every_allowed_upward_import_is_still_needed():
    edges = package_imports()
    stale = [edge for edge in ALLOWED_UPWARD if edge not in edges]
    assert not stale, f"no import needs {stale} any more: remove it from ALLOWED_UPWARD"


def test_the_explainers_and_the_audit_read_runs_without_the_trainer():
    edges = package_imports()
    for reader in ("explain", "credit_audit", "eval", "viz", "runs"):
        assert (reader, "train") not in edges, edges.get((reader, "train"))
    assert ("explain", "runs") in edges and ("credit_audit", "runs") in edges
    text = (SRC / "credit_audit" / "run.py").read_text(encoding="utf-8")
    assert "sources._" not in text and "import _" not in text  # no private helpers


def test_the_import_reader_sees_every_kind_of_import():
    code = ("import ktae\nimport ktae.core.ktae as k\nfrom ktae import train, audit\n"
            "from . import sources\nfrom ..viz.tokens import token_pieces\nimport json\n"
            "def f():\n    from ktae.runs.config import TrainConfig\n"
            "class C:\n    def g(self):\n        import ktae.eval.runner\n")
    got = imports_of(code, "ktae.explain.cli")
    assert got == [("ktae", 1), ("core", 2), ("train", 3), ("ktae", 3), ("explain", 4),
                   ("viz", 5), ("runs", 8), ("eval", 11)]
    assert imports_of("from . import x\n", "ktae.runs", is_package=True) == [("runs", 1)]


def test_the_cycle_finder_finds_a_cycle_through_several_packages():
    assert cycles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [["a", "b", "c"]]
    assert cycles([("a", "b"), ("b", "c"), ("a", "c")]) == []
    assert cycles([("x", "y"), ("y", "x"), ("p", "q"), ("q", "r"), ("r", "q")]) == [
        ["q", "r"], ["x", "y"]]
    # two circles through one package are one group
    assert cycles([("k", "c"), ("c", "k"), ("k", "a"), ("a", "v"), ("v", "k")]) == [
        ["a", "c", "k", "v"]]
