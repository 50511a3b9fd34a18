"""What a credit method reads besides the rewards: each need declared once, with its provider.

A registered estimator or calibration lists its needs by name
(``@ADVANTAGE_ESTIMATORS.register("oar-g", needs=("mask", "input_grad_importance"))``);
each name is one :class:`Need` of :data:`NEEDS`: what it is, how it reaches the method,
whether it comes from a model, and how a caller holding the model computes it. The
trainer, ``ktae explain``, the checks of :mod:`ktae.core.methods` and the verl plugin
loop over a method's needs (:func:`needs_of`); none names one. A new need is its record
here (:func:`register_need`), its provider and the method that reads it
(docs/contributing.md).

Pure: the providers are ``"module:function"`` references, imported only when called
(:func:`load`), since they run a model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch

ARGUMENT = "argument"
"""A need that is an argument of every call (``token_ids``, ``mask``)."""
SCORES = "scores"
"""A ``[B, T]`` float score per response token, validated (finite, negative values taken
as 0, 0 on padding) into the batch's ``scores`` under the need's name."""
KEYWORD = "keyword"
"""A ``[B, T]`` tensor passed to the method as a keyword of the same name (log-probs,
whose values are negative)."""

ESTIMATOR = "advantage estimator"
CALIBRATION = "calibration"


@dataclass(frozen=True)
class Need:
    """One input a credit method may read, and where a caller gets it.

    ``Need("input_grad_importance", "the model's input-gradient importance of each
    response token", model=True, provider="ktae.models.need_providers:
    input_grad_importance", ...)``: OAR-G's.
    """

    name: str
    """The keyword of ``compute_advantages`` and the key of the batch's ``scores``."""
    what: str
    """What it is, in words (errors read ``reads {what} (needs={name})``)."""
    via: str = SCORES
    """How it reaches the method: :data:`ARGUMENT`, :data:`SCORES` or :data:`KEYWORD`."""
    model: bool = True
    """Computed from a model: a caller without the model, or a record of it, lacks it."""
    readers: tuple[str, ...] = (ESTIMATOR,)
    """The kinds of method that may declare it (:data:`ESTIMATOR`, :data:`CALIBRATION`)."""
    shape: str = "[B, T] float, per response token, 0 on padding"
    """Its shape and dtype (B responses, T tokens)."""
    provider: str | None = None
    """``"module:function"``: ``fn(responses: ModelResponses) -> [b, T]``, the value on the
    rollout batch of the policy that generated it (the trainer's); None: no caller
    computes it for an estimator at rollout time."""
    group_provider: str | None = None
    """``"module:function"``: ``fn(model, tokenizer, groups, *, temperature, **options)``
    setting each group's :attr:`fields` ``[0]`` (``ktae explain``); needs sharing the
    function are filled by one call, their :attr:`group_options` merged."""
    group_options: Mapping[str, object] = field(default_factory=dict)
    """Keywords the group provider gets for this need."""
    fields: tuple[str, ...] = ()
    """The attributes of a scored group (``GroupInput``) and keys of a recorded rollout
    that hold it, the first present on every group wins; default: its name."""
    recorded: bool = False
    """The trainer's rollout record keeps it (under ``fields[0]``), so a recorded run's
    groups have it without the model."""
    example: float | None = 1.0
    """The value of every token in the start-up check's tiny batch
    (:func:`ktae.core.methods.check_method`); None: the token ids as floats."""
    vector: bool = False
    """A ``[B, T, H]`` vector per token (H the model's hidden size) instead of a ``[B, T]``
    value; the start-up check's example is the token ids and their negatives (H = 2)."""

    def __post_init__(self):
        if self.via not in (ARGUMENT, SCORES, KEYWORD):
            raise ValueError(f"need {self.name!r}: via expected one of {ARGUMENT}, {SCORES}, "
                             f"{KEYWORD}, got {self.via!r}")
        if not self.fields:
            object.__setattr__(self, "fields", (self.name,))

    @property
    def per_token(self) -> bool:
        """Whether a caller passes it as a ``[B, T]`` tensor of its own (not an argument)."""
        return self.via != ARGUMENT

    def load_provider(self) -> Callable:
        """The rollout-batch provider (:attr:`provider`), imported now."""
        if self.provider is None:
            raise ValueError(f"need {self.name!r}: no provider computes it from a model")
        return load(self.provider)


NEEDS: dict[str, Need] = {}
"""Every declared need, by name."""


def register_need(need: Need) -> Need:
    """Declare ``need`` (its name must be new); returns it."""
    if need.name in NEEDS:
        raise ValueError(f"need {need.name!r} is already declared")
    NEEDS[need.name] = need
    return need


def get_need(name: str | Need) -> Need:
    """The record of ``name`` (a :class:`Need` passes through); a ``ValueError`` lists the
    declared ones."""
    if isinstance(name, Need):
        return name
    try:
        return NEEDS[name]
    except KeyError:
        raise ValueError(f"needs={name!r} is not a declared need; expected some of "
                         f"{', '.join(NEEDS)}") from None


def needs_of(names: Iterable[str | Need]) -> tuple[Need, ...]:
    """The records of a method's declared ``needs``, in order."""
    return tuple(get_need(n) for n in names)


def readable_by(kind: str) -> tuple[str, ...]:
    """The names a method of ``kind`` may declare in ``needs``."""
    return tuple(n.name for n in NEEDS.values() if kind in n.readers)


def held(groups, need: Need) -> bool:
    """Whether every one of ``groups`` holds ``need`` in one of its :attr:`Need.fields`."""
    return any(all(getattr(g, f, None) is not None for g in groups) for f in need.fields)


def group_calls(needs: Iterable[Need]) -> dict[str, dict]:
    """The group providers that fill ``needs``, each once, with its needs' options merged:
    ``{"module:function": options}``, in the needs' order."""
    calls: dict[str, dict] = {}
    for need in needs:
        if need.group_provider is None:
            raise ValueError(f"need {need.name!r}: no provider computes it for scored groups "
                             "(ktae train computes it from the generating policy)")
        calls.setdefault(need.group_provider, {}).update(need.group_options)
    return calls


def load(ref: str) -> Callable:
    """``"package.module:function"`` -> the function (the module imported now)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass
class ModelResponses:
    """A rollout batch under the policy that generated it: what a need's :attr:`Need.provider`
    reads. b rows, prompts left-padded to P tokens, responses right-padded to T.

    ``policy_pass()``: the caller's no-grad pass of the policy over the batch, ``([b, T]
    log-probs, [b, T] entropies)`` of the response tokens; computed once, whichever needs
    read it (:meth:`policy_scores`).
    """

    model: object
    """The policy (unwrapped from any distributed wrapper)."""
    tokenizer: object
    prompt_ids: torch.Tensor
    """``[b, P]`` int64."""
    prompt_mask: torch.Tensor
    """``[b, P]`` 0/1."""
    completion_ids: torch.Tensor
    """``[b, T]`` int64."""
    completion_mask: torch.Tensor
    """``[b, T]`` 0/1."""
    rows: list[dict]
    """The dataset row of each response (its ``answer`` column, ...)."""
    generator: torch.Generator | None = None
    """Seeded by the caller, for a provider that draws noise."""
    policy_pass: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None
    correct: torch.Tensor | None = None
    """``[b]`` bool, the verifier's verdict on each response (the self-teacher's choice)."""
    group: torch.Tensor | None = None
    """``[b]`` group ids (the responses to one prompt share one)."""
    options: Mapping[str, object] = field(default_factory=dict)
    """The method's options (the estimator's), for a provider that takes some."""
    temperature: float = 1.0
    """The sampling temperature the policy's log-probs are taken at."""
    _scores: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    def policy_scores(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log-probs, entropies)`` from :attr:`policy_pass`, computed on the first call."""
        if self._scores is None:
            if self.policy_pass is None:
                raise ValueError("this caller has no pass of the policy over the batch")
            self._scores = self.policy_pass()
        return self._scores


CALIBRATION_SCORES = ("logprobs", "entropies")
"""What a caller scores for any calibration: the current policy's log-probs and entropies
(a calibration reads both; its record's needs say what else)."""

_PROVIDERS = "ktae.models.need_providers"
_SCORING = "ktae.groups.scoring:score_groups"

register_need(Need("token_ids", "the response token ids", via=ARGUMENT, model=False,
                   shape="[B, T] int64"))
register_need(Need("mask", "which positions are real response tokens", via=ARGUMENT,
                   model=False, shape="[B, T] bool"))
register_need(Need(
    "logprobs", "the sampling policy's log-probs", via=KEYWORD,
    provider=f"{_PROVIDERS}:policy_logprobs", group_provider=_SCORING, example=-1.0))
register_need(Need(
    "entropies", "the rollout policy's entropies", readers=(ESTIMATOR, CALIBRATION),
    provider=f"{_PROVIDERS}:policy_entropies", group_provider=_SCORING,
    fields=("old_entropies", "entropies"), recorded=True))
register_need(Need(
    "input_grad_importance",
    "the model's input-gradient importance of each response token (one extra forward and "
    "backward pass; ktae.models.input_grad_importance)",
    provider=f"{_PROVIDERS}:input_grad_importance", group_provider=_SCORING,
    group_options={"importance": True}, recorded=True, example=None))
register_need(Need(
    "teacher_logprobs",
    "the policy's log-probs of each response token after a privileged context (a right "
    "response of its group or a reference solution; ktae.models.self_teacher)", via=KEYWORD,
    provider=f"{_PROVIDERS}:teacher_logprobs", group_provider="ktae.groups.teacher:teacher_groups",
    recorded=True, example=-0.5))
register_need(Need(
    "token_grad_proxy",
    "the last-layer token-gradient proxy (1 - p) h of each response token under the "
    "generating policy", via=KEYWORD,
    shape="[B, T, H] float, per response token, 0 on padding",
    provider=f"{_PROVIDERS}:token_grad_proxy",
    group_provider="ktae.groups.grad_proxy:grad_proxy_groups", vector=True, example=None))
register_need(Need("old_logprobs", "the rollout (old) policy's log-probs", via=KEYWORD,
                   readers=(CALIBRATION,)))
