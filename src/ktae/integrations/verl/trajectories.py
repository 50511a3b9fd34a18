"""Multi-turn batches of verl 0.9.1's v1 trainer: one response per trajectory, as verl's GRPO.

An agent loop may return several outputs for one trajectory (one per model call). The v1
agent loop (``trainer/ppo/v1/agent_loop_tq.py: AgentLoopWorkerTQ._agent_loop_postprocess``)
stores each as its own row under the key ``{uid}_{session_id}_{index}``, gives every row
the final output's reward (on its last token) and reward extra info, and
``trainer/ppo/v1/utils.py: compute_advantage_for_multi_trajectories`` then treats the
rows so:

* ``grpo``: GRPO over the *final* row of each ``{uid}_{session_id}`` (largest index) only,
  grouped by ``uid``; that advantage is broadcast to every row of the session;
* any other estimator: ``compute_advantage`` on all rows, each row its own response.

The second rule would make KTAE and GTPO count a trajectory of three turns as three
responses in its group. The plugin follows the first instead: each session's rows are
joined, in turn order, into one response (a masked position between two turns, standing
for the tool or user tokens between them, so that n-gram spans do not cross turns);
KTAE or GTPO runs on those trajectories with the final row's reward, correctness and
``uid``, exactly as verl's GRPO does; each row then gets its own tokens' advantages
back. Batches whose sessions all have one row (every single-turn batch, and the legacy
trainer's, which has no keys) are computed row by row as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def parse_key(key: str) -> tuple[str, int]:
    """``{uid}_{session_id}_{index}`` -> (``{uid}_{session_id}``, index), as verl splits it."""
    parts = str(key).rsplit("_", 2)
    if len(parts) != 3 or not parts[2].isdigit():
        raise ValueError(f"TransferQueue key {key!r}: expected verl's '{{uid}}_{{session_id}}_"
                         "{index}' (trainer/ppo/v1/agent_loop_tq.py)")
    return f"{parts[0]}_{parts[1]}", int(parts[2])


@dataclass(frozen=True)
class TurnLayout:
    """Where each turn row of a batch sits in its trajectory.

    Attributes:
        final: ``[S]`` row of each session's last turn (S sessions, in order of first row).
        session: ``[B]`` session of each row.
        start: ``[B]`` column of each row's first token in its trajectory.
        lengths: ``[B]`` each row's response length (its real tokens and masked ones).
        width: columns of the joined ``[S, width]`` trajectories.
    """

    final: torch.Tensor
    session: torch.Tensor
    start: torch.Tensor
    lengths: torch.Tensor
    width: int

    def _targets(self, T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row positions ``(r, t)`` with ``t < lengths[r]`` and their trajectory columns."""
        t = torch.arange(T, device=self.lengths.device)
        inside = t[None, :] < self.lengths[:, None]
        rows, cols = inside.nonzero(as_tuple=True)
        return rows, cols, self.start[rows] + cols

    def join(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` row values -> ``[S, width]`` trajectory values (0 between turns)."""
        rows, cols, target = self._targets(x.shape[1])
        out = torch.zeros(len(self.final), self.width, dtype=x.dtype, device=x.device)
        out[self.session[rows], target] = x[rows, cols]
        return out

    def split(self, joined: torch.Tensor, T: int) -> torch.Tensor:
        """``[S, width]`` trajectory values -> ``[B, T]`` row values (0 past each row)."""
        rows, cols, target = self._targets(T)
        out = torch.zeros(len(self.session), T, dtype=joined.dtype, device=joined.device)
        out[rows, cols] = joined[self.session[rows], target]
        return out


def turn_layout(keys: Sequence[str] | None, mask: torch.Tensor,
                lengths: torch.Tensor | None = None) -> TurnLayout | None:
    """The trajectories of a v1 batch's rows, or None when no session has two rows.

    Args:
        keys: the rows' TransferQueue keys (None: no session structure, e.g. legacy).
        mask: ``[B, T]`` response mask.
        lengths: ``[B]`` response lengths (TransferQueue's nested lengths); None: up to
            each row's last real token.
    """
    if keys is None:
        return None
    B, T = mask.shape
    if len(keys) != B:
        raise ValueError(f"keys: expected one TransferQueue key per row ({B}), got {len(keys)}")
    ids: dict[str, int] = {}
    session_list, index_list = [], []
    for key in keys:
        name, index = parse_key(key)
        session_list.append(ids.setdefault(name, len(ids)))
        index_list.append(index)
    S = len(ids)
    if S == B:
        return None
    device = mask.device
    session = torch.tensor(session_list, dtype=torch.int64, device=device)
    index = torch.tensor(index_list, dtype=torch.int64, device=device)
    if lengths is None:
        last = torch.where(mask.bool(), torch.arange(1, T + 1, device=device), 0)
        lengths = last.amax(dim=1)
    lengths = lengths.to(device=device, dtype=torch.int64)
    # turn order: by session, then index (indexes are unique within a session)
    order = torch.argsort(session * (int(index.max()) + 1) + index)
    slots = (lengths + 1)[order]  # each turn and the masked position after it
    ends = slots.cumsum(0)
    sorted_session = session[order]
    first = torch.ones(B, dtype=torch.bool, device=device)
    first[1:] = sorted_session[1:] != sorted_session[:-1]
    base = torch.zeros(S, dtype=torch.int64, device=device)
    base[sorted_session[first]] = (ends - slots)[first]
    start = torch.empty(B, dtype=torch.int64, device=device)
    start[order] = ends - slots - base[sorted_session]
    last_turn = torch.ones(B, dtype=torch.bool, device=device)
    last_turn[:-1] = sorted_session[:-1] != sorted_session[1:]
    final = torch.empty(S, dtype=torch.int64, device=device)
    final[sorted_session[last_turn]] = order[last_turn]
    width = int((start + lengths).max())
    return TurnLayout(final=final, session=session, start=start, lengths=lengths,
                      width=max(width, 1))


def join_inputs(layout: TurnLayout, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Per-row ``compute_advantages`` arguments -> per-trajectory ones.

    Rewards, correctness and group come from each session's final row (verl's GRPO takes
    the final row's ``token_level_rewards``); ``token_ids``, ``mask`` and ``entropies``
    are the rows' joined in turn order.
    """
    final = layout.final
    group = np.asarray(kwargs["group"], dtype=object)
    session = layout.session.cpu().numpy()
    if not (group == group[final.cpu().numpy()][session]).all():
        row = int(np.nonzero(group != group[final.cpu().numpy()][session])[0][0])
        raise ValueError(f"index: row {row} has uid {group[row]!r} but the last turn of its "
                         f"trajectory has {group[int(final[session[row]])]!r}")
    out = dict(kwargs)
    out["rewards"] = kwargs["rewards"][final.to(kwargs["rewards"].device)]
    out["group"] = group[final.cpu().numpy()]
    for name in ("token_ids", "mask", "entropies"):
        if kwargs.get(name) is not None:
            out[name] = layout.join(kwargs[name])
    if kwargs.get("correct") is not None:
        out["correct"] = kwargs["correct"][final.to(kwargs["correct"].device)]
    return out
