"""ktae: token-level credit for RL fine-tuning of language models.

Core API (pure torch):
    compute_advantages(name, *, rewards, group, token_ids=None, mask=None, **options)
"""

from ktae.core.advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from ktae.core.calibration import CALIBRATIONS, CalibrationResult, calibrate_advantages
from ktae.core.policy_loss import kl_penalty, policy_loss

__all__ = ["ADVANTAGE_ESTIMATORS", "compute_advantages"]
__all__ += ["CALIBRATIONS", "CalibrationResult", "calibrate_advantages"]
__all__ += ["kl_penalty", "policy_loss"]
__version__ = "0.1.0"
