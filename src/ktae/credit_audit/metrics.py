"""The credit audit's figures: blame, lowest, contamination and the mass figures, per
response in one vectorised pass, and their bootstrap intervals.

They are defined and computed in :mod:`ktae.core.credit_metrics` (one formula, one
place: ``ktae simulate`` scores its MDP with the same functions); this module keeps the
names the audit has always imported.
"""

from __future__ import annotations

from ktae.core.credit_metrics import (
    CHANGED_RTOL,
    MASS_METRICS,
    METRICS,
    OTHER,
    RIGHT,
    WRONG,
    MassMetrics,
    ResponseMetrics,
    mass_metrics,
    mixed_groups,
    response_metrics,
    summarise,
    summarise_ratio,
)

__all__ = ["CHANGED_RTOL", "MASS_METRICS", "METRICS", "OTHER", "RIGHT", "WRONG", "MassMetrics",
           "ResponseMetrics", "mass_metrics", "mixed_groups", "response_metrics", "summarise",
           "summarise_ratio"]
