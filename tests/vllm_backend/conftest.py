"""The vLLM tests: real engines of vLLM's CPU build (``pip install 'ktae[vllm]'``, see
docs/vllm.md; ``.ci/vllm`` builds that environment and runs them).

(The folder is not called ``vllm``: on ``sys.path`` through pytest, that name would make
``import vllm`` find this folder as a namespace package where vLLM is not installed.)

Where vLLM is not importable every test here is skipped, unless ``KTAE_REQUIRE_VLLM=1``
(``.ci/vllm`` sets it): then each one fails, so a broken vLLM install fails CI instead of
passing as skipped. The same holds for SmolLM2-135M-Instruct (``ktae models prepare
smollm2-135m``), which the real-model tests need.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REQUIRED = os.environ.get("KTAE_REQUIRE_VLLM") == "1"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # test_train_helpers


def pytest_collection_modifyitems(config, items):
    if HAVE_VLLM or REQUIRED:
        return
    here = Path(__file__).resolve().parent
    skip = pytest.mark.skip(reason="vLLM is not installed (pip install 'ktae[vllm]')")
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _vllm_present():
    if not HAVE_VLLM:
        pytest.fail("vLLM is not importable, and KTAE_REQUIRE_VLLM=1 requires the vLLM tests: "
                    "install it with pip install 'ktae[vllm]' (see docs/vllm.md)")


@pytest.fixture(scope="session")
def default_model() -> str:
    """The shipped tiny model (built in KTAE_CACHE on first use)."""
    from ktae.models.warmstart import default_model_path

    return str(default_model_path())


@pytest.fixture(scope="session")
def smollm2() -> str:
    """SmolLM2-135M-Instruct's float32 directory (``ktae models prepare smollm2-135m``)."""
    from ktae.models.model_path import resolve_model_path

    try:
        path = resolve_model_path("smollm2-135m")
    except ValueError as err:
        if REQUIRED:
            pytest.fail(f"SmolLM2 is not prepared ({err}); run ktae models prepare smollm2-135m")
        pytest.skip("SmolLM2 is not prepared (ktae models prepare smollm2-135m)")
    return path
