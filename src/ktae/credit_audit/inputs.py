"""What ``ktae audit`` audits: groups of responses with per-token local-error labels
(:class:`AuditGroup`) and where they came from (:class:`AuditInput`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AuditGroup:
    """One group and its labels: ``labels[i]`` holds one of ``"w"``, ``"r"``, ``"."``
    per token of response ``i``; ``level`` and ``step`` break the figures down."""

    group: object  # ktae.groups.input.GroupInput
    labels: list[str]
    level: object = None
    step: int | None = None
    key: str = ""
    kinds: list[str] | None = None
    """Per response, one code of :data:`ktae.credit_audit.token_kinds.KINDS` per token
    (what :func:`audit` adds from the tokenizer; None: no breakdown by kind)."""


@dataclass
class AuditInput:
    """What is audited: groups, the tokenizer, a description and, for a run directory,
    where to find a model that can score its responses."""

    groups: list[AuditGroup]
    tokenizer: object
    description: str
    kind: str
    scorer: str | None = None
    meta: list[str] = field(default_factory=list)
    references: dict = field(default_factory=dict)
    """``{id(group): [B, V] tensor}``: the clean answer summaries of the input-gradient
    importance, read from the sampling's own cache for the groups whose credit reads it
    (:func:`ktae.groups.scoring.importance_groups`' ``references``)."""
