"""Credit settings of the trainer, parsed from ``TrainConfig.credit`` (no TRL import).

``none`` keeps the algo's sequence-level advantage; ``ktae`` (SPEC 2) or any registered
advantage estimator replaces it; ``taco`` (SPEC 5) or any registered calibration is applied
at loss time; ``estimator+calibration`` combines one of each (e.g. ``ktae+taco``).

Options have one namespace per part: ``estimator_options`` go to the estimator and
``calibration_options`` to the calibration. The shortcut fields (``ktae_h1``..``ktae_h3``,
``ktae_ngram``, ``ktae_ngram_reduce``, ``taco_alpha``, ``taco_lambda``) are passed only when
set (the span settings: when not the estimator's default), and only to a method that takes
them; anything a method does not take is an error before any model loads.
"""

from __future__ import annotations

import inspect
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

#: Options the trainer itself passes to KTAE and GTPO (the user cannot also set them).
TRAINER_KTAE_OPTIONS = ("correct",)


def passes_correct(estimator: str | None, options: dict) -> bool:
    """Whether the trainer gives the estimator the verifier's ``correct``: KTAE, GTPO,
    prefix-value and users' rules (``ktae.register_estimator``) take it, except KTAE with
    ``split=graded``, whose classes come from the reward values."""
    from ktae.core.user_rules import estimator_takes_correct

    if estimator == "ktae":
        return options.get("split", "threshold") != "graded"
    return estimator == "gtpo" or (estimator is not None and estimator_takes_correct(estimator))


def parse_credit(credit: str) -> tuple[str | None, str | None]:
    """``"ktae+taco"`` -> ``("ktae", "taco")``; ``"none"`` -> ``(None, None)``."""
    import ktae

    estimators = set(ktae.ADVANTAGE_ESTIMATORS.names())
    calibrations = set(ktae.CALIBRATIONS.names())
    estimator, calibration = None, None
    parts = [p.strip() for p in credit.split("+") if p.strip()]
    if not parts:
        raise ValueError(f"credit: expected a name, got {credit!r}")
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
                f"or calibration {sorted(calibrations)}, or repeats a kind in {credit!r}")
    return estimator, calibration


def _merge(shortcuts: dict, explicit: dict, where: str) -> dict:
    both = sorted(set(shortcuts) & set(explicit))
    if both:
        raise ValueError(f"{where}: {both[0]!r} is given twice (as a field and in {where})")
    return {**shortcuts, **explicit}


def _calibration_parameters(name: str) -> set[str]:
    import ktae

    return set(inspect.signature(ktae.CALIBRATIONS.get(name)).parameters)


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
    for key in TRAINER_KTAE_OPTIONS:
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
        accepted = _calibration_parameters(calibration)
        for key, value in taco_fields.items():
            if key not in accepted:
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
    options, so a misspelled or out-of-range option fails now, not at step 1."""
    import torch

    import ktae

    ids = torch.tensor([[1, 2, 3], [1, 4, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    rewards = torch.tensor([1.0, 0.0])
    options = dict(settings.estimator_options)
    if passes_correct(settings.estimator, options):
        options["correct"] = rewards > 0.5
    from ktae.core.user_rules import estimator_needs_logprobs

    if estimator_needs_logprobs(settings.estimator):
        options["logprobs"] = torch.full(ids.shape, -1.0)
    try:
        adv = ktae.compute_advantages(settings.estimator, rewards=rewards, group=[0, 0],
                                      token_ids=ids, mask=mask, entropies=torch.ones(ids.shape),
                                      **options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"estimator_options ({settings.estimator}): {err}") from None
    if settings.calibration is None:
        return
    logp = torch.full(ids.shape, -1.0)
    try:
        ktae.calibrate_advantages(settings.calibration, adv, logprobs=logp,
                                  entropies=torch.ones(ids.shape), mask=mask, old_logprobs=logp,
                                  generator=torch.Generator().manual_seed(0),
                                  **settings.calibration_options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"calibration_options ({settings.calibration}): {err}") from None
