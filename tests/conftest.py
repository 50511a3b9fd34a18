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


def pytest_configure(config):
    """``KTAE_TEST_THREADS=N`` runs every test at N torch threads (the CI sweep's setting;
    modules with the ``single_thread`` fixture of ``oracle`` read it too)."""
    import os

    if os.environ.get("KTAE_TEST_THREADS"):
        torch.set_num_threads(int(os.environ["KTAE_TEST_THREADS"]))
