"""Shared pieces of the verl plugin tests (run in the environment of ``pip install -e ".[verl,test]"``).

Every test module here starts with ``pytest.importorskip("verl")``, so in an environment
without verl the whole directory is skipped with that reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

#: Token id used for padding after each response (never inside the mask).
PAD_ID = 11


@dataclass
class VerlBatch:
    """A small rollout batch in verl's padded layout, with 3 uneven, interleaved uid groups."""

    uids: list[str]
    responses: torch.Tensor          # [B, T] int64, PAD_ID after each response
    response_mask: torch.Tensor      # [B, T] int64
    token_level_rewards: torch.Tensor  # [B, T] float32, the score on the last real token
    acc: list[bool]                  # the verifier's accuracy (reward extra info)

    @property
    def rewards(self) -> torch.Tensor:
        return self.token_level_rewards.sum(-1)


def make_verl_batch(seed: int = 0) -> VerlBatch:
    """Rewards follow DAPO's shaping: +1/-1 by accuracy plus an overlong penalty, so one
    correct response (row 2) has a negative total reward and only ``acc`` says it is right.
    """
    g = torch.Generator().manual_seed(seed)
    uids = ["a", "b", "a", "b", "a", "c", "b", "a"]
    lengths = torch.tensor([7, 3, 5, 1, 6, 7, 2, 4])
    B, T = len(uids), 7
    responses = torch.randint(0, 10, (B, T), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    responses = torch.where(mask.bool(), responses, PAD_ID)
    acc = [True, False, True, False, False, True, True, False]
    score = torch.tensor([1.0 if a else -1.0 for a in acc])
    score[2] -= 1.25  # correct, but past the overlong buffer: total -0.25
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), lengths - 1] = score
    return VerlBatch(uids, responses, mask, rewards, acc)


@pytest.fixture
def verl_batch() -> VerlBatch:
    return make_verl_batch()


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the session (3 logical CPUs: TransferQueue's controller
    and storage unit hold one each); always shut down."""
    import ray

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()
