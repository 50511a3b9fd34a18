"""Credit settings of the trainer, parsed from ``TrainConfig.credit`` (no TRL import).

``none`` keeps the algo's sequence-level advantage; ``ktae`` (SPEC 2) or any registered
advantage estimator replaces it; ``taco`` (SPEC 5) or any registered calibration is applied
at loss time; ``estimator+calibration`` combines one of each (e.g. ``ktae+taco``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ktae.train.config import TrainConfig


@dataclass(frozen=True)
class CreditSettings:
    """How the trainer assigns credit (built from :class:`ktae.train.config.TrainConfig`)."""

    estimator: str = "grpo"
    """Registered advantage estimator (``grpo``, ``drgrpo``, ``rloo``, ``ktae``, ...)."""
    estimator_options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the estimator (KTAE: base, h1, h2, h3, mode, ...)."""
    calibration: str | None = None
    """Registered loss-time calibration (``taco``, ...) or None."""
    calibration_options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the calibration (TACO: alpha, lam)."""
    dynamic_sampling: bool = False
    """Drop all-correct/all-wrong groups and refill from extra generation rounds."""
    max_generation_rounds: int = 3
    """Most generation rounds per step under dynamic sampling."""
    correct_reward_index: int = 0
    """Which reward function's output (> 0.5) marks a response correct."""
    seed: int = 0
    """Seed of refill prompt draws and random calibrations (combined with the step)."""


CREDIT_NONE = "none"


def credit_settings(cfg: TrainConfig) -> CreditSettings:
    """Translate ``cfg.credit`` (``none``/``ktae``/``taco``/names/``est+calib``)."""
    import ktae

    estimators = set(ktae.ADVANTAGE_ESTIMATORS.names())
    calibrations = set(_calibration_names())
    estimator, calibration = None, None
    parts = [p.strip() for p in cfg.credit.split("+") if p.strip()]
    if not parts:
        raise ValueError(f"credit: expected a name, got {cfg.credit!r}")
    for part in parts:
        if part == CREDIT_NONE:
            continue
        if part in estimators and estimator is None:
            estimator = part
        elif part in calibrations and calibration is None:
            calibration = part
        else:
            raise ValueError(
                f"credit: {part!r} is not a registered advantage estimator {sorted(estimators)} "
                f"or calibration {sorted(calibrations)}, or repeats a kind in {cfg.credit!r}")
    estimator = estimator or cfg.advantage_base
    est_opts: dict = {}
    cal_opts: dict = {}
    if estimator == "ktae":
        est_opts = dict(base=cfg.advantage_base, h1=cfg.ktae_h1, h2=cfg.ktae_h2, h3=cfg.ktae_h3,
                        mode=cfg.ktae_mode, ngram=cfg.ktae_ngram,
                        ngram_reduce=cfg.ktae_ngram_reduce)
    if calibration is not None and calibration.startswith("taco"):
        cal_opts = dict(alpha=cfg.taco_alpha, lam=cfg.taco_lambda)
    extra = dict(cfg.credit_options)
    (cal_opts if calibration is not None and estimator != "ktae" else est_opts).update(extra)
    return CreditSettings(estimator=estimator, estimator_options=est_opts,
                          calibration=calibration, calibration_options=cal_opts,
                          dynamic_sampling=bool(cfg.dynamic_sampling),
                          max_generation_rounds=cfg.max_generation_rounds, seed=cfg.seed)


def _calibration_names() -> list[str]:
    try:
        import ktae

        return list(ktae.CALIBRATIONS.names())
    except AttributeError:
        return []


