"""RL fine-tuning on TRL: ``KTAEGRPOTrainer``, ``TrainConfig`` and the ``ktae train`` pieces.

Requires the ``[train]`` extra (trl, accelerate, pyyaml, matplotlib). Submodules:
``config`` (TrainConfig), ``trainer`` (KTAEGRPOTrainer, CreditSettings),
``dynamic_sampling``, ``rundir``, ``session`` (train), ``cli_train``, ``cli_compare``.
"""

from ktae.train.config import TrainConfig

__all__ = ["TrainConfig"]
