"""What a page of ``ktae explain`` shows: the :class:`Report` the renderers draw.

:func:`ktae.explain.report.build_report` computes it (the credit views and key-token
statistics of each group); :mod:`ktae.viz.report_html`, :mod:`ktae.viz.report_terminal`
and :mod:`ktae.viz.report_png` only read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ktae.viz.tokens import TokenPiece

STAT_KEYS = ("a", "b", "c", "d", "p_value", "fisher", "info_gain", "tf_correct",
             "tf_incorrect", "direction", "value")
"""Key-token table columns shown per token (``KeyTokenTable`` field names)."""
STAT_LABELS = dict(zip(STAT_KEYS, ("a", "b", "c", "d", "p", "F", "IG", "TF_T", "TF_F", "D",
                                   "value"), strict=True))


@dataclass
class ResponseReport:
    """One response: token ids and texts, per-view values and per-token statistics."""

    index: int
    reward: float
    correct: bool
    token_ids: list[int]
    pieces: list[TokenPiece]
    values: dict[str, list[float]]
    stats: list[dict]
    logprobs: list[float] | None = None
    entropies: list[float] | None = None
    weights: list[float] | None = None
    flagged: list[bool] | None = None
    in_loss: list[bool] | None = None
    labels: list[str] | None = None
    """Per token: the local-error labels of its characters (as long as its text), or None."""


@dataclass
class GroupReport:
    """One group: prompt, responses, its colour scale and key-token rows."""

    label: str
    anchor: str
    prompt: str
    answer: str | None
    responses: list[ResponseReport]
    positive: list[dict]
    negative: list[dict]
    zero_tokens: int
    divergence: float
    scale: float
    sequence: list[float]

    @property
    def num_correct(self) -> int:
        return sum(r.correct for r in self.responses)


@dataclass
class Report:
    """What the renderers draw: views ``[(key, label)]``, groups, and header lines;
    ``calibrated``: a calibration is shown; ``partial_loss``: some tokens were left out
    of the loss."""

    title: str
    views: list[tuple[str, str]]
    default_view: str
    groups: list[GroupReport]
    meta: list[str] = field(default_factory=list)
    calibrated: bool = False
    partial_loss: bool = False

    def label(self, key: str) -> str:
        return dict(self.views)[key]

    def ranked(self) -> list[GroupReport]:
        """Groups by how much token credit differs from the sequence advantage (most first)."""
        return sorted(self.groups, key=lambda g: -g.divergence)
