"""Credit settings of the trainer, parsed from ``TrainConfig.credit`` (no TRL import).

``none`` keeps the algo's sequence-level advantage; ``ktae`` (docs/method.md §3) or any registered
advantage estimator replaces it; ``taco`` (docs/method.md §8) or any registered calibration is applied
at loss time; ``estimator+calibration`` combines one of each (e.g. ``ktae+taco``).

Options have one namespace per part: ``estimator_options`` go to the estimator and
``calibration_options`` to the calibration. The shortcut fields (``ktae_h1``..``ktae_h3``,
``ktae_ngram``, ``ktae_ngram_reduce``, ``taco_alpha``, ``taco_lambda``) are passed only when
set (the span settings: when not the estimator's default), and only to a method that takes
them; anything a method does not take is an error before any model loads.

Naming, parsing, checking and computing a method live in :mod:`ktae.core.methods`; this
module maps ``TrainConfig``'s fields onto it (:attr:`CreditSettings.method`,
:func:`credit_method` for ``ktae explain`` and ``ktae audit`` with a run's settings).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ktae.core.calibration import calibration_options
from ktae.core.methods import (
    CALLER_INPUTS,
    Method,
    check_method,
    parse_credit,
    split_method,
)
from ktae.runs.config import TrainConfig


@dataclass(frozen=True)
class CreditSettings:
    """How the trainer assigns credit (built from :class:`ktae.runs.config.TrainConfig`)."""

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

    @property
    def method(self) -> Method:
        """The credit method (:class:`ktae.core.methods.Method`) these settings name."""
        return Method(estimator=self.estimator, estimator_options=dict(self.estimator_options),
                      calibration=self.calibration,
                      calibration_options=dict(self.calibration_options))


def _merge(shortcuts: dict, explicit: dict, where: str) -> dict:
    both = sorted(set(shortcuts) & set(explicit))
    if both:
        raise ValueError(f"{where}: {both[0]!r} is given twice (as a field and in {where})")
    return {**shortcuts, **explicit}


def credit_settings(cfg: TrainConfig) -> CreditSettings:
    """Translate ``cfg.credit`` and the option fields; checks every option (before loading).

    Raises:
        ValueError: unknown names, options given to a method that does not take them, or
            option values the method refuses (the message names the field or option).
    """
    estimator, calibration = parse_credit(cfg.credit)
    estimator = estimator or cfg.advantage_base

    ktae_fields = {k: getattr(cfg, f"ktae_{k}") for k in ("h1", "h2", "h3")
                   if getattr(cfg, f"ktae_{k}") is not None}
    if cfg.ktae_ngram != 1:  # span settings only when they differ from the estimator's
        ktae_fields["ngram"] = cfg.ktae_ngram
    if cfg.ktae_ngram_reduce != "mean":
        ktae_fields["ngram_reduce"] = cfg.ktae_ngram_reduce
    if estimator == "ktae":
        shortcuts = dict(base=cfg.advantage_base, mode=cfg.ktae_mode, **ktae_fields)
    else:
        if ktae_fields or cfg.ktae_mode != "exact":
            name = f"ktae_{next(iter(ktae_fields))}" if ktae_fields else "ktae_mode"
            raise ValueError(f"{name}: only used by the 'ktae' estimator, but credit is "
                             f"{cfg.credit!r}")
        shortcuts = {}
    for key in CALLER_INPUTS:  # what the trainer passes every estimator that takes it
        if key in cfg.estimator_options:
            raise ValueError(f"estimator_options: {key!r} is set by the trainer (from the "
                             "accuracy reward)")
    est_opts = _merge(shortcuts, cfg.estimator_options, "estimator_options")

    taco_fields = {k: v for k, v in (("alpha", cfg.taco_alpha), ("lam", cfg.taco_lambda))
                   if v is not None}
    if calibration is None:
        if taco_fields or cfg.calibration_options:
            name = ("calibration_options" if cfg.calibration_options else
                    "taco_alpha" if "alpha" in taco_fields else "taco_lambda")
            raise ValueError(f"{name}: credit {cfg.credit!r} has no calibration to pass it to")
        cal_opts: dict = {}
    else:
        accepted = calibration_options(calibration)
        for key, value in taco_fields.items():
            if accepted is not None and key not in accepted:
                field_name = "taco_alpha" if key == "alpha" else "taco_lambda"
                raise ValueError(f"{field_name}: calibration {calibration!r} takes no {key!r} "
                                 f"option (got {value})")
        cal_opts = _merge(taco_fields, cfg.calibration_options, "calibration_options")
    settings = CreditSettings(estimator=estimator, estimator_options=est_opts,
                              calibration=calibration, calibration_options=cal_opts,
                              dynamic_sampling=bool(cfg.dynamic_sampling),
                              max_generation_rounds=cfg.max_generation_rounds, seed=cfg.seed)
    check_credit_options(settings)
    return settings


def check_credit_options(settings: CreditSettings) -> None:
    """Run the estimator and the calibration once on a tiny batch with the configured
    options, so a misspelled or out-of-range option fails now, not at step 1
    (:func:`ktae.core.methods.check_method`)."""
    check_method(settings.method)


def credit_method(text: str, *, train_config: TrainConfig | None = None,
                  ignore_token_ids=()) -> Method:
    """The method ``text`` names (``ktae``, ``ktae+taco``, ``ktae@ngram=3``, ...; see
    :mod:`ktae.core.methods`) with a run's hyper-parameters: ``train_config``'s options
    (``ktae_h1``, ``taco_alpha``, ``estimator_options``, ...) for the parts that are the
    run's own estimator or calibration (default: :class:`TrainConfig`'s), then the
    string's ``@KEY=VALUE`` settings on top. What ``ktae explain`` and ``ktae audit`` read.
    """
    base = train_config if train_config is not None else TrainConfig()
    credit, settings = split_method(text)
    estimator, calibration = parse_credit(credit)
    run_estimator, run_calibration = parse_credit(base.credit)
    changes: dict = {"credit": credit}
    if (estimator or base.advantage_base) != (run_estimator or base.advantage_base):
        # the run's estimator options belong to another estimator
        changes.update(ktae_h1=None, ktae_h2=None, ktae_h3=None, ktae_mode="exact",
                       ktae_ngram=1, ktae_ngram_reduce="mean", estimator_options={})
    if calibration != run_calibration:
        changes.update(taco_alpha=None, taco_lambda=None, calibration_options={})
    s = credit_settings(dataclasses.replace(base, **changes).resolve())
    if not settings:
        return dataclasses.replace(s.method, ignore_token_ids=tuple(ignore_token_ids))
    from ktae.core.methods import parse_method

    return parse_method(text, estimator_options=s.estimator_options,
                        calibration_options=s.calibration_options,
                        ignore_token_ids=ignore_token_ids, default_estimator=s.estimator)
