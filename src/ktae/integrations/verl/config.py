"""verl's ``PolicyLossConfig`` plus the ``ktae`` block of calibration options.

verl turns ``actor_rollout_ref.actor.policy_loss`` into a dataclass with Hydra, which
rejects keys the class lacks. This subclass adds one field, ``ktae`` (the options of the
calibration named by ``loss_mode``, e.g. ``{alpha: 0.01, lam: 0.9}``), and checks their
names and values when built (verl builds it at start-up, in ``validate_config``). The
plugin's ``validate_config`` wrapper selects this class when the block is present; it
can also be set explicitly with ``actor_rollout_ref.actor.policy_loss._target_=``
``ktae.integrations.verl.config.CalibratedPolicyLossConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.workers.config import PolicyLossConfig

from ktae.core.calibration import CALIBRATIONS
from ktae.integrations.verl.options import calibration_settings, check_calibration_values


@dataclass
class CalibratedPolicyLossConfig(PolicyLossConfig):
    """``PolicyLossConfig`` with ``ktae``: options of the calibration ``loss_mode`` names."""

    ktae: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        if self.ktae or self.loss_mode in CALIBRATIONS:
            check_calibration_values(calibration_settings(self))
