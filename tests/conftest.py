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
