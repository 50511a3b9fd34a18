"""Named rewards of ``ktae train --reward NAME``: one entry per answer format.

A reward scores a batch of completions against their reference answers and returns one
:class:`~ktae.rewards.RewardResult` per completion: ``score`` is what the policy is
trained on, ``correct`` the correctness signal of KTAE, dynamic sampling and the
held-out accuracy. Entries:

* ``boxed`` (default): the strict last-``\\boxed{}`` reward (:func:`ktae.rewards.math_reward`,
  scores 1 / 0; symbolic checks in verifier processes with a hard deadline).

Adding a reward is one :class:`Reward` in :data:`REWARDS`: a name, a one-line summary
(shown by ``ktae train --help`` and in error messages) and a batch ``score`` function
with the signature of :func:`score_boxed`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ktae.rewards.batch import batch_math_reward
from ktae.rewards.verify import RewardResult

ScoreFn = Callable[..., list[RewardResult]]
"""``score(completions, answers, *, timeout, num_workers, data_sources) -> results``."""


@dataclass(frozen=True)
class Reward:
    """One named reward: ``score`` maps B completions and B answers to B results."""

    name: str
    summary: str
    score: ScoreFn
    template: str | None = None
    """The prompt template that asks for this reward's answer format (None: any)."""


def score_boxed(completions: Sequence[str], answers: Sequence, *, timeout: float = 5.0,
                num_workers: int | None = 1, data_sources: Sequence | None = None
                ) -> list[RewardResult]:
    """The strict boxed reward of each completion (1.0 when its last box is equivalent to
    the answer, else 0.0). ``data_sources`` is ignored."""
    return batch_math_reward(list(completions), list(answers), timeout=timeout,
                             num_workers=num_workers)


REWARDS: dict[str, Reward] = {r.name: r for r in (
    Reward("boxed", "the strict last \\boxed{} answer, checked for equivalence (1 / 0)",
           score_boxed),
)}
"""Every reward ``--reward`` accepts, by name."""

DEFAULT_REWARD = "boxed"


def get_reward(name: str) -> Reward:
    """The reward called ``name``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name not in REWARDS:
        raise ValueError(f"reward: expected one of {', '.join(REWARDS)}, got {name!r}")
    return REWARDS[name]
