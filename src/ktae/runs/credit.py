"""Credit settings of the trainer, read from ``TrainConfig``'s ``credit`` (no TRL import).

``none`` keeps the algo's sequence-level advantage; ``ktae`` (docs/method.md §3) or any registered
advantage estimator replaces it; ``taco`` (docs/method.md §8) or any registered calibration is applied
at loss time; ``estimator+calibration`` combines one of each (e.g. ``ktae+taco``).

Options have one namespace per part: ``estimator_options`` go to the estimator and
``calibration_options`` to the calibration. The settings a method's record declares
(:class:`ktae.core.registry.Alias`: ``ktae_ngram``, ``taco_alpha``, ...) are passed only
when set (``always`` ones: always), and only to a method that takes them; anything a
method does not take is an error before any model loads.

Naming, parsing, checking and computing a method live in :mod:`ktae.core.methods`: the
config's credit setting becomes one :class:`ktae.core.methods.Method` there
(:func:`ktae.core.methods.settings_method`); this module hands it ``TrainConfig``'s
fields (:func:`credit_settings`; :func:`credit_method` for ``ktae explain`` and ``ktae
audit`` with a run's settings) and reads one ``CREDIT@KEY=VALUE`` entry of ``ktae train
--credit`` and ``ktae compare --credit`` (:func:`parse_arm`).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from ktae.core.methods import (
    Method,
    alias_setting,
    option_value,
    parse_credit,
    resolve_option,
    setting_aliases,
    settings_method,
    split_method,
)
from ktae.core.self_distill import SelfDistill
from ktae.runs.config import TrainConfig
from ktae.runs.fields import value_type


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
    self_distill: SelfDistill | None = None
    """The self-distillation loss term (:class:`ktae.core.self_distill.SelfDistill`), or None."""

    @property
    def method(self) -> Method:
        """The credit method (:class:`ktae.core.methods.Method`) these settings name."""
        return Method(estimator=self.estimator, estimator_options=dict(self.estimator_options),
                      calibration=self.calibration,
                      calibration_options=dict(self.calibration_options))


def alias_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The run's value of every setting a method's record reads as an option
    (``{"advantage_base": "grpo", "ktae_ngram": 1, ...}``)."""
    return {alias.name: getattr(cfg, alias.name) for _, alias in setting_aliases()}


def credit_settings(cfg: TrainConfig) -> CreditSettings:
    """The run's method (:func:`ktae.core.methods.settings_method` of ``cfg.credit``, the
    alias settings and the option fields), checked before anything loads.

    Raises:
        ValueError: unknown names, options given to a method that does not take them, or
            option values the method refuses (the message names the field or option).
    """
    method = settings_method(cfg.credit, settings=alias_settings(cfg),
                             estimator_options=cfg.estimator_options,
                             calibration_options=cfg.calibration_options,
                             default_estimator=cfg.advantage_base)
    return CreditSettings(estimator=method.estimator,
                          estimator_options=dict(method.estimator_options),
                          calibration=method.calibration,
                          calibration_options=dict(method.calibration_options),
                          dynamic_sampling=bool(cfg.dynamic_sampling),
                          max_generation_rounds=cfg.max_generation_rounds, seed=cfg.seed,
                          self_distill=SelfDistill.parse(cfg.self_distill,
                                                         cfg.self_distill_options))


def credit_method(text: str, *, train_config: TrainConfig | None = None,
                  ignore_token_ids=()) -> Method:
    """The method ``text`` names (``ktae``, ``ktae+taco``, ``ktae@ngram=3``, ...; see
    :mod:`ktae.core.methods`) with a run's hyper-parameters: ``train_config``'s settings
    (``ktae_h1``, ``taco_alpha``, ``estimator_options``, ...) for the parts that are the
    run's own estimator or calibration (default: :class:`TrainConfig`'s), then the
    string's ``@KEY=VALUE`` settings on top. What ``ktae explain`` and ``ktae audit`` read.
    """
    run = (train_config if train_config is not None else TrainConfig()).resolve()
    credit, _ = split_method(text)
    estimator, calibration = parse_credit(credit)
    run_estimator, run_calibration = parse_credit(split_method(run.credit)[0])
    settings = alias_settings(run)
    options = {"estimator": dict(run.estimator_options),
               "calibration": dict(run.calibration_options)}
    other = {"estimator": (estimator or run.advantage_base)
             != (run_estimator or run.advantage_base),
             "calibration": calibration != run_calibration}
    for record, alias in setting_aliases():  # the run's options of another part's method
        kind = "estimator" if record.kind == "advantage estimator" else "calibration"
        if other[kind] and alias.declared:
            settings[alias.name] = alias.default
    for kind, differs in other.items():
        if differs:
            options[kind] = {}
    return settings_method(text.strip(), settings=settings,
                           estimator_options=options["estimator"],
                           calibration_options=options["calibration"],
                           default_estimator=run.advantage_base,
                           ignore_token_ids=ignore_token_ids)


# --------------------------------------------------------------------------- entries


#: Settings an entry may not change: they define ``ktae compare``'s grid itself.
GRID_FIELDS = ("credit", "seed", "output_dir", "resume")


@dataclass(frozen=True)
class Arm:
    """One entry of ``--credit``: a credit and the settings its runs change."""

    label: str
    """The entry as written (``ktae@ngram=3``): the row name in the table."""
    credit: str
    """The credit part (``ktae``)."""
    overrides: dict = field(default_factory=dict)
    """``TrainConfig`` field -> value for this arm's runs."""

    @property
    def dirname(self) -> str:
        """Run directory prefix: ``ktae-taco``, ``ktae-ngram=3``."""
        return self.label.replace("+", "-").replace("@", "-").replace("/", "_")


def _value_types() -> dict[str, type]:
    """``TrainConfig`` field -> what the text of its value flag is read as."""
    hints = typing.get_type_hints(TrainConfig)
    return {f.name: value_type(hints[f.name]) for f in dataclasses.fields(TrainConfig)
            if f.metadata.get("flag", {}).get("kind") == "value"
            and f.name not in GRID_FIELDS}


def parse_arm(text: str) -> Arm:
    """``CREDIT[@KEY=VALUE...]`` -> :class:`Arm` (values typed as the ``ktae train`` flag).

    The entry is read by :func:`ktae.core.methods.split_method`; KEY is a ``ktae train``
    setting (a ``TrainConfig`` field such as ``learning_rate``, or a setting a named part's
    record declares, by its name or without its prefix: ``ktae@ngram=3`` sets
    ``ktae_ngram``, :func:`ktae.core.methods.alias_setting`), else an option of the entry's
    estimator or calibration (:func:`ktae.core.methods.resolve_option`), set as
    ``--estimator-option`` / ``--calibration-option`` after the common ones."""
    credit, settings = split_method(text)
    types = _value_types()
    parts = [p.strip() for p in credit.split("+") if p.strip()]
    estimator, calibration = parse_credit(credit)
    overrides: dict = {}
    for key, raw in settings:
        name = key if key in types else alias_setting(parts, key)
        if name is None:
            also = (f" or a setting an entry can change; expected one of {sorted(types)} "
                    "(or without the credit's prefix)")
            kind, option = resolve_option(estimator, calibration, key, where=text.strip(),
                                          also=also)
            chosen = overrides.setdefault(f"{kind}_options", {})
            if option in chosen:
                raise ValueError(f"credit: {key} set twice in {text!r}")
            chosen[option] = option_value(raw)
            continue
        if name in overrides:
            raise ValueError(f"credit: {name} set twice in {text!r}")
        try:
            overrides[name] = types[name](raw)
        except ValueError:
            raise ValueError(f"credit: {key}={raw!r} in {text!r}: expected "
                             f"{types[name].__name__}") from None
    return Arm(label=text.strip(), credit=credit, overrides=overrides)
