"""ktae: token-level credit for RL fine-tuning of language models.

Core API (pure torch):
    compute_advantages(name, *, rewards, group, token_ids=None, mask=None, entropies=None,
                       **options)
    key_token_table(*, rewards, group, token_ids, mask=None, **options)
    policy_loss(logprobs, old_logprobs, advantages, mask, ...)
    calibrate_advantages(name, advantages, *, logprobs, entropies, mask, old_logprobs, ...)
    register_estimator(name, *, needs=()), register_calibration(name, *, needs=())
                                              (bring your own rule: docs/plugins.md)
    audit(input=None, *, model=None, credit=None, ...)   (the credit audit; needs the
                                                          eval extra, and matplotlib
                                                          for its PNGs)
"""

from ktae._version import __version__ as __version__
from ktae.core.calibration import CALIBRATIONS, CalibrationResult, calibrate_advantages
from ktae.core.estimators import ADVANTAGE_ESTIMATORS, compute_advantages
from ktae.core.ktae import KeyTokenTable, key_token_table
from ktae.core.policy_loss import kl_penalty, policy_loss
from ktae.core.user_rules import (
    CalibrationBatch,
    RuleBatch,
    register_calibration,
    register_estimator,
)


def audit(input=None, **options):
    """The credit audit of ``ktae audit``: :func:`ktae.credit_audit.run.audit`."""
    from ktae.credit_audit.run import audit as _audit

    return _audit(input, **options)


__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "CALIBRATIONS",
    "CalibrationBatch",
    "CalibrationResult",
    "KeyTokenTable",
    "RuleBatch",
    "audit",
    "calibrate_advantages",
    "compute_advantages",
    "key_token_table",
    "kl_penalty",
    "policy_loss",
    "register_calibration",
    "register_estimator",
]
