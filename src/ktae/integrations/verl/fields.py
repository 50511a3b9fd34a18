"""What verl computes but does not hand to registered functions, carried for one call.

verl calls a registered advantage estimator with ``token_level_rewards``,
``response_mask``, ``index`` and ``config`` only, and a registered policy loss with the
log-probs, advantages and mask only. KTAE needs the response token ids (and the
verifier's accuracy), the calibrations need the current policy's entropy. The wrappers
in :mod:`ktae.integrations.verl.patches` read those from verl's batch and provide them
here, in a :class:`contextvars.ContextVar`, for exactly the duration of the upstream call
that ends in our function; our functions refuse to run without them. A context
variable (not a module global) keeps concurrent trainer threads or tasks apart.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

#: The verl functions whose wrappers provide :class:`ResponseFields` (their ``source``).
LEGACY_SOURCE = "verl.trainer.ppo.ray_trainer.compute_advantage"
V1_SOURCE = "verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_advantage"


@dataclass(frozen=True)
class ResponseFields:
    """Per-response data of the batch whose advantages verl is computing.

    Rows are aligned with the ``token_level_rewards`` the estimator receives.

    Attributes:
        responses: ``[B, T]`` response token ids, or None when the batch lacked them.
        extra_info: the reward function's extra outputs, name -> ``B`` values (verl's
            ``reward_extra_info``, e.g. ``acc`` from the ``dapo`` reward manager); a row
            that lacks a name holds None.
        entropies: ``[B, T]`` entropies of the rollout (old) policy, or None.
        source: which verl function provided them (for error messages).
        keys: the rows' TransferQueue keys, ``{uid}_{session_id}_{index}`` (v1 trainer;
            several rows of one session are the turns of one trajectory), or None.
        lengths: ``[B]`` response lengths before padding (masked tokens included), or None.
    """

    responses: torch.Tensor | None
    extra_info: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    entropies: torch.Tensor | None = None
    source: str = ""
    keys: Sequence[str] | None = None
    lengths: torch.Tensor | None = None


@dataclass(frozen=True)
class PolicyStep:
    """Current-policy quantities of one loss evaluation (one micro-batch).

    Attributes:
        entropies: ``[B, T]`` entropies of the current policy's next-token distributions,
            aligned with the ``log_prob`` the loss receives; None when verl did not
            compute them (``actor.calculate_entropy=false`` and no entropy bonus).
    """

    entropies: torch.Tensor | None


_RESPONSES: ContextVar[ResponseFields | None] = ContextVar("ktae_verl_responses", default=None)
_STEP: ContextVar[PolicyStep | None] = ContextVar("ktae_verl_policy_step", default=None)


@contextmanager
def _providing(var: ContextVar, value) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def providing_responses(fields: ResponseFields):
    """Make ``fields`` visible to :func:`current_responses` inside the block."""
    return _providing(_RESPONSES, fields)


def providing_step(step: PolicyStep):
    """Make ``step`` visible to :func:`current_step` inside the block."""
    return _providing(_STEP, step)


def current_responses() -> ResponseFields | None:
    """The innermost :class:`ResponseFields` being provided, or None."""
    return _RESPONSES.get()


def current_step() -> PolicyStep | None:
    """The innermost :class:`PolicyStep` being provided, or None."""
    return _STEP.get()


def extra_info_from_rows(rows: Sequence[Mapping[str, Any] | None]) -> dict[str, list]:
    """Column view of per-row ``reward_extra_info`` dicts (missing entries are None)."""
    names: dict[str, None] = {}
    for row in rows:
        for name in row or {}:
            names.setdefault(name)
    return {name: [(row or {}).get(name) for row in rows] for name in names}
