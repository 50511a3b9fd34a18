"""``compute_advantages``: validate once, then dispatch to a registered estimator.

Estimators are pure functions ``fn(batch: AdvantageBatch, **options) -> Tensor``
registered by name in :data:`ADVANTAGE_ESTIMATORS`; they return ``[B]`` (sequence level)
or ``[B, T]`` (token level). :func:`compute_advantages` broadcasts sequence-level
results over the mask, so every estimator is usable at token level. Each is registered
with what it needs (``@ADVANTAGE_ESTIMATORS.register("gtpo", needs=("mask", "entropies"))``;
:class:`ktae.core.registry.Record`, each need a :class:`ktae.core.needs.Need`); its options
are its keyword parameters. The built-in estimators register in :mod:`ktae.core.estimators`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ktae.core.baselines import SEQUENCE_BASELINES
from ktae.core.checks import as_tensor, check_float, check_mask
from ktae.core.chunk_pool import one_thread_caller
from ktae.core.groups import group_index
from ktae.core.needs import NEEDS, SCORES
from ktae.core.registry import Registry

ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")


@dataclass(frozen=True)
class AdvantageBatch:
    """A validated batch. Shapes: B responses, T tokens, P groups.

    Attributes:
        rewards: ``[B]`` float32 or float64 (bfloat16/half are promoted to float32).
        gid: ``[B]`` int64 dense group ids in ``0..P-1``.
        num_groups: P.
        token_ids: ``[B, T]`` int64, or None for sequence-level calls.
        mask: ``[B, T]`` bool (True = real response token), or None.
        entropies, input_grad_importance: ``scores["entropies"]`` and
            ``scores["input_grad_importance"]`` (or None), kept as attributes for code
            that builds or reads batches by them.
        scores: the per-token scores the caller gave, by need name
            (:data:`ktae.core.needs.NEEDS`, those passed as ``scores``: ``entropies``,
            ``input_grad_importance``, ...): ``[B, T]`` float, 0 on padding, never
            negative; an estimator reads the ones it declares (``batch.scores[name]``).
    """

    rewards: torch.Tensor
    gid: torch.Tensor
    num_groups: int
    token_ids: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    entropies: torch.Tensor | None = None
    input_grad_importance: torch.Tensor | None = None
    scores: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self):
        given = {name: value for name, value in (("entropies", self.entropies),
                                                 ("input_grad_importance",
                                                  self.input_grad_importance))
                 if value is not None}
        scores = {**given, **self.scores}
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "entropies", scores.get("entropies"))
        object.__setattr__(self, "input_grad_importance", scores.get("input_grad_importance"))

    @property
    def device(self) -> torch.device:
        return self.rewards.device


def make_batch(*, rewards, group, token_ids=None, mask=None,
               scores: Mapping | None = None) -> AdvantageBatch:
    """Validate user input into an :class:`AdvantageBatch` (errors name the argument);
    ``scores``: per-token scores by need name (None values left out)."""
    device = rewards.device if isinstance(rewards, torch.Tensor) else None
    rewards = check_float(as_tensor(rewards, "rewards", device=device), "rewards", ndim=1)
    device = rewards.device
    if rewards.dtype not in (torch.float32, torch.float64):
        rewards = rewards.to(torch.float32)
    B = rewards.shape[0]
    if B == 0:
        raise ValueError("rewards: expected at least one response, got an empty batch")
    gid, num_groups = group_index(group, B, device)
    unsigned_64 = False
    if token_ids is not None:
        token_ids = as_tensor(token_ids, "token_ids", device=device)
        if token_ids.dim() != 2 or token_ids.shape[0] != B:
            raise ValueError(f"token_ids: expected shape ({B}, T), got {tuple(token_ids.shape)}")
        if token_ids.is_floating_point() or token_ids.is_complex() or token_ids.dtype == torch.bool:
            raise ValueError(f"token_ids: expected integer ids, got dtype {token_ids.dtype}")
        unsigned_64 = token_ids.dtype == torch.uint64
        token_ids = token_ids.long()  # uint64 ids >= 2**63 wrap to negative: checked below
    if mask is not None:
        mask = as_tensor(mask, "mask", device=device)
        if token_ids is not None:
            shape = tuple(token_ids.shape)
        elif mask.dim() == 2 and mask.shape[0] == B:
            shape = tuple(mask.shape)
        else:
            raise ValueError(f"mask: expected shape ({B}, T), got {tuple(mask.shape)}")
        mask = check_mask(mask, "mask", shape)
    elif token_ids is not None:
        mask = torch.ones_like(token_ids, dtype=torch.bool)
    if token_ids is not None and unsigned_64:
        _check_int64_range(token_ids, mask)
    # Token values are checked (non-negative where mask is 1) by the estimators that read
    # them, on the real tokens they gather anyway: see ktae.core.token_counts.
    checked = {name: _check_token_scores(value, mask, device, name)
               for name, value in (scores or {}).items() if value is not None}
    return AdvantageBatch(rewards, gid, num_groups, token_ids, mask, scores=checked)


def _check_token_scores(values, mask, device, name: str) -> torch.Tensor:
    """``[B, T]`` finite, non-negative float scores (entropies, importances) on the mask's
    shape; 0 on padding.

    Negative values (which only rounding in a model's entropy computation produces) are
    taken as 0.
    """
    if mask is None:
        raise ValueError(f"{name}: need token_ids or mask as well (which positions are "
                         "real tokens)")
    values = check_float(as_tensor(values, name, device=device), name, ndim=2)
    if tuple(values.shape) != tuple(mask.shape):
        raise ValueError(f"{name}: expected shape {tuple(mask.shape)}, "
                         f"got {tuple(values.shape)}")
    if values.dtype not in (torch.float32, torch.float64):
        values = values.to(torch.float32)
    return torch.where(mask, values.detach().clamp_min(0), 0)


def _check_int64_range(token_ids: torch.Tensor, mask: torch.Tensor) -> None:
    """uint64 ids, already viewed as int64: negative ones were >= 2**63 (real tokens only)."""
    over = (token_ids < 0) & mask
    if over.any():
        i, j = (int(v) for v in over.nonzero()[0])
        value = int(token_ids[i, j]) % 2**64
        raise ValueError(f"token_ids: expected ids below 2**63 (they are stored as int64), "
                         f"got {value} at [{i}, {j}]")


def broadcast(seq_adv: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``[B] -> [B, T]``: every real token gets its response's advantage, padding 0."""
    if mask is None:
        return seq_adv
    return seq_adv[:, None] * mask.to(seq_adv.dtype)


@one_thread_caller
def compute_advantages(name: str, *, rewards, group, token_ids=None, mask=None,
                       entropies=None, **options) -> torch.Tensor:
    """Advantages from a registered estimator.

    Args:
        name: ``"grpo"``, ``"drgrpo"``, ``"rloo"``, ``"ktae"`` or any registered name
            (see :data:`ADVANTAGE_ESTIMATORS`).
        rewards: ``[B]`` rewards (float32/float64/bfloat16).
        group: ``[B]`` group ids: integer tensor/array or a sequence of hashable ids.
        token_ids: ``[B, T]`` integer token ids (required by token-level estimators).
        mask: ``[B, T]`` 0/1 or bool, 1 = real response token. Defaults to all ones when
            ``token_ids`` is given.
        entropies: ``[B, T]`` per-token entropies of the policy that generated the batch
            (required by ``gtpo``; ignored by estimators that do not read them). Needs
            ``token_ids`` or ``mask``; negative values count as 0.
        **options: estimator options (e.g. KTAE's ``h1``, ``mode``; GTPO's ``a1``), and
            any other per-token score by its need's name (:data:`ktae.core.needs.NEEDS`):
            ``input_grad_importance``, ``[B, T]``, the input-gradient importance of each
            token under the policy (required by ``oar-g``;
            :func:`ktae.models.input_grad_importance.input_grad_importance` computes it
            from a model). Each needs ``token_ids`` or ``mask``; negative values count as
            0; an estimator that does not declare one ignores it. ``token_grad_proxy``,
            ``[B, T, H]``, DelTA's last-layer token-gradient proxy ``(1 - p) h`` (required
            by ``delta``; :mod:`ktae.models.token_grad_proxy` computes it from a model).

    Returns:
        ``[B, T]`` (zero where mask is 0) when ``token_ids`` or ``mask`` is given, else
        ``[B]``; on the device of ``rewards``, float32 (float64 for float64 rewards).
        Finite for any finite rewards, except that ``drgrpo``/``rloo`` raise
        ``ValueError`` when ``R - baseline`` exceeds the dtype's range
        (:mod:`ktae.core.baselines`).

    Raises:
        ValueError: unknown estimator, an option the estimator does not take (for
            estimators with explicit keyword options; the message lists the valid ones),
            or bad input (the message names the argument).

    Example:
        >>> import torch, ktae
        >>> ktae.compute_advantages("grpo", rewards=torch.tensor([1., 0., 1., 1.]),
        ...                         group=[0, 0, 1, 1])
        tensor([ 0.7071, -0.7071,  0.0000,  0.0000])
    """
    record = ADVANTAGE_ESTIMATORS.record(name)
    scores = {"entropies": entropies}
    scores.update({n: options.pop(n) for n, need in NEEDS.items()
                   if need.via == SCORES and n in options})
    record.check(options)
    for need in record.need_records:  # a sequence-level call: the estimator names what lacks
        if need.via == SCORES and scores.get(need.name) is None and (
                token_ids is not None or mask is not None):
            raise ValueError(f"{need.name}: required by advantage estimator {name!r} "
                             f"({need.shape}: {need.what})")
    batch = make_batch(rewards=rewards, group=group, token_ids=token_ids, mask=mask,
                       scores=scores)
    out = record.fn(batch, **options)
    if out.dim() == 1:
        out = broadcast(out, batch.mask)
    return out


def estimator_needs(name: str) -> tuple:
    """The :class:`ktae.core.needs.Need` records estimator ``name`` declares, in order."""
    return ADVANTAGE_ESTIMATORS.record(name).need_records


def estimator_needs_entropies(name: str) -> bool:
    """Whether estimator ``name`` declares the need ``entropies`` (for callers that name
    the need; the others loop over :func:`estimator_needs`)."""
    return "entropies" in ADVANTAGE_ESTIMATORS.record(name).needs


def estimator_needs_input_grad(name: str) -> bool:
    """Whether estimator ``name`` declares the need ``input_grad_importance`` (as
    :func:`estimator_needs_entropies`)."""
    return "input_grad_importance" in ADVANTAGE_ESTIMATORS.record(name).needs


def estimator_needs_logprobs(name: str) -> bool:
    """Whether estimator ``name`` declares the need ``logprobs`` (as
    :func:`estimator_needs_entropies`)."""
    return "logprobs" in ADVANTAGE_ESTIMATORS.record(name).needs


def _register_baseline(name: str, fn) -> None:
    def estimator(batch: AdvantageBatch) -> torch.Tensor:
        return fn(batch.rewards, batch.gid, batch.num_groups)

    estimator.__doc__ = fn.__doc__
    estimator.__name__ = f"{name}_estimator"
    ADVANTAGE_ESTIMATORS.register(name)(estimator)


for _name, _fn in SEQUENCE_BASELINES.items():
    _register_baseline(_name, _fn)
