"""Fixtures shared by the training tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random Llama with the character tokenizer, saved once per test session
    (see ``test_train_helpers.save_tiny_model``)."""
    from test_train_helpers import save_tiny_model

    torch.set_num_threads(1)
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def clean_registries():
    """Users' rules registered by a test are gone after it: the estimator and calibration
    registries and the loaded plugins are restored (modules that register rules use it
    with ``autouse``)."""
    import ktae
    from ktae import plugins

    targets = (ktae.ADVANTAGE_ESTIMATORS._items, ktae.CALIBRATIONS._items, plugins._loaded)
    saved = [dict(t) for t in targets]
    yield
    for target, items in zip(targets, saved, strict=True):
        target.clear()
        target.update(items)


@pytest.fixture
def keep_threads():
    """A test that runs a benchmark's ``main`` in process lets it set torch's thread
    count: the test's is put back after it."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def pytest_configure(config):
    """``KTAE_TEST_THREADS=N`` runs every test at N torch threads (the CI sweep's setting;
    modules with the ``single_thread`` fixture of ``oracle`` read it too). Without it, each
    of pytest-xdist's workers (``-n``) runs at the CPU's cores over the workers, at least
    one, so the workers do not oversubscribe the cores; tests that set their own threads
    still do.

    Training in the test process leaves ``malloc`` as it is (``KTAE_KEEP_FREED_MEMORY=0``,
    :mod:`ktae.train.allocator`): the setting is process-wide and would keep the test
    process's peak memory resident for the rest of the session; tests/test_allocator.py
    checks it in processes of its own."""
    import os

    os.environ.setdefault("KTAE_KEEP_FREED_MEMORY", "0")
    if os.environ.get("KTAE_TEST_THREADS"):
        torch.set_num_threads(int(os.environ["KTAE_TEST_THREADS"]))
    elif os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
        workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
