"""Every built-in advantage estimator, registered: the core's door to the registry.

Each built-in is one module that registers its function with what it needs
(``@ADVANTAGE_ESTIMATORS.register(name, needs=...)``, :mod:`ktae.core.registry`);
importing this module imports them all, so that the core (:mod:`ktae.core.methods`)
and the package root read a complete registry without importing each other. A new
built-in is its module plus its import here (docs/contributing.md).
"""

from __future__ import annotations

from ktae.core import (  # noqa: F401  (each registers its estimator)
    delta_credit,
    gtpo,
    ktae,
    oar,
    prefix_value,
    self_distill,
)
from ktae.core.advantages import (  # grpo, drgrpo and rloo register there
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    estimator_needs,
    estimator_needs_entropies,
    estimator_needs_input_grad,
    estimator_needs_logprobs,
)

__all__ = ["ADVANTAGE_ESTIMATORS", "compute_advantages", "estimator_needs",
           "estimator_needs_entropies", "estimator_needs_input_grad", "estimator_needs_logprobs"]
