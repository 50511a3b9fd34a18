"""ktae: token-level credit for RL fine-tuning of language models.

Core API (pure torch):
    compute_advantages(name, *, rewards, group, token_ids=None, mask=None, **options)
"""

from ktae.core.advantages import ADVANTAGE_ESTIMATORS, compute_advantages

__all__ = ["ADVANTAGE_ESTIMATORS", "compute_advantages"]
__version__ = "0.1.0"
