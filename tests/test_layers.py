"""The layers of the package: evaluation and the shared checkpoint helpers do not import the
trainer (STYLE.md: the trainer, evaluation and plots depend on the core, never the reverse).
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "ktae"


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
