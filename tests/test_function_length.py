"""Every function in src/ktae reads in one sitting: at most :data:`LIMIT` lines.

A function's length is its lines from ``def`` (decorators excluded) to its last line,
less its docstring: documentation does not make a function harder to hold in one's
head, code does. A long orchestration function becomes a short composition of named
steps (``ktae.train.session.train``, ``ktae.eval.runner.evaluate``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "ktae"
LIMIT = 80
"""Lines of code (docstring excluded) a function may have."""
EXCEPTIONS: dict[str, str] = {}
"""``"path/in/src/ktae.py:qualified.name"`` -> why that function may be longer."""


def function_lengths(source: str) -> dict[str, int]:
    """``{qualified name: lines less docstring}`` of every function in ``source``, nested
    ones and methods included (``Class.method``, ``outer.inner``)."""
    lengths: dict[str, int] = {}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lengths[name] = _code_lines(child)
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def _code_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the end, less the docstring's lines."""
    total = fn.end_lineno - fn.lineno + 1
    first = fn.body[0]
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        total -= first.end_lineno - first.lineno + 1
    return total


def test_the_measure_counts_code_not_docstrings():
    source = '''
def short():
    """A docstring
    of three
    lines."""
    return 1


class Box:
    def method(self):
        x = 1
        return x

    @staticmethod
    def decorated():

        def inner():
            pass
        return inner
'''
    assert function_lengths(source) == {"short": 2, "Box.method": 3, "Box.decorated": 5,
                                        "Box.decorated.inner": 2}


def test_every_function_is_at_most_the_limit():
    too_long = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        for name, n in function_lengths(path.read_text(encoding="utf-8")).items():
            if n > LIMIT and f"{where}:{name}" not in EXCEPTIONS:
                too_long.append(f"{where}:{name} ({n} lines)")
    assert not too_long, (f"functions longer than {LIMIT} lines of code (split them into "
                          f"named steps): {', '.join(too_long)}")


@pytest.mark.parametrize("key", sorted(EXCEPTIONS))
def test_every_exception_is_still_needed(key):
    where, name = key.split(":")
    lengths = function_lengths((SRC / where).read_text(encoding="utf-8"))
    assert name in lengths, f"{key}: no such function (drop its exception)"
    assert lengths[name] > LIMIT, f"{key}: {lengths[name]} lines, within the limit"
