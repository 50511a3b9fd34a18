"""pyproject.toml asks only for extras that the installed distributions declare under that
exact name (older pip warns on every install otherwise), and the verifier's ANTLR runtime
is a direct requirement."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")
requirements = pytest.importorskip("packaging.requirements")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _requirements():
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    specs = list(project["dependencies"])
    for group in project["optional-dependencies"].values():
        specs += group
    return [requirements.Requirement(s) for s in specs]


def test_requested_extras_exist_with_that_spelling():
    for req in _requirements():
        if not req.extras or req.name == "ktae":
            continue
        try:
            provided = set(metadata.metadata(req.name).get_all("Provides-Extra") or [])
        except metadata.PackageNotFoundError:
            continue  # not installed here: nothing to compare with
        missing = req.extras - provided
        assert not missing, f"{req}: {req.name} declares extras {sorted(provided)}"


def test_math_verify_and_its_antlr_runtime_are_required_together():
    reqs = {r.name: r for r in _requirements()}
    assert "math-verify" in reqs and not reqs["math-verify"].extras
    antlr = reqs["antlr4-python3-runtime"]
    assert str(antlr.specifier) == "==4.13.2"
    try:
        latex = metadata.requires("latex2sympy2_extended") or []
    except metadata.PackageNotFoundError:
        pytest.skip("math-verify is not installed")
    # the pin lies inside the range math-verify's parser accepts
    base = [requirements.Requirement(r) for r in latex if "extra ==" not in r]
    runtime = next(r for r in base if r.name == "antlr4-python3-runtime")
    assert "4.13.2" in runtime.specifier
    assert metadata.version("antlr4-python3-runtime") == "4.13.2"


def test_version_is_the_distribution_version():
    import ktae

    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    assert ktae.__version__ == project["version"]
    try:
        assert metadata.version("ktae") == project["version"]
    except metadata.PackageNotFoundError:
        pytest.skip("ktae is not installed")


def test_python_m_ktae_is_the_ktae_command():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ktae", "--version"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == f"ktae {metadata.version('ktae')}"
