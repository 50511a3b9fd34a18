"""RL fine-tuning on TRL: ``KTAEGRPOTrainer``, ``TrainConfig`` and the ``ktae train`` pieces.

Requires the ``[train]`` extra (trl, accelerate, pyyaml, matplotlib). Submodules:
``trainer`` (KTAEGRPOTrainer), ``dynamic_sampling``, ``session`` (train), ``flags`` (the
flags of TrainConfig's fields), ``cli_train``, ``cli_compare``. The run directory's format
(``TrainConfig``, the credit settings, rollouts, checkpoints) is :mod:`ktae.runs`.
"""

from ktae.runs.config import TrainConfig

__all__ = ["TrainConfig"]
