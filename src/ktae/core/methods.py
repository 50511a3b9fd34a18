"""Credit methods: how one is named, parsed, described and computed on a batch.

A method is an advantage estimator (:data:`ktae.ADVANTAGE_ESTIMATORS`: ``grpo``, ``ktae``,
a user rule, ...) and an optional loss-time calibration (:data:`ktae.CALIBRATIONS`:
``taco``, ...), each with keyword options. Every command names one the same way::

    NAME[+NAME][@KEY=VALUE[@KEY=VALUE...]]      e.g. ktae@ngram=3+taco, taco@lambda=0.5

``none`` stands for "no token credit" (the sequence advantage); KEY is an option of the
estimator or of the calibration, possibly prefixed by its name (``ktae_ngram``), or a run
setting the part's record declares (:class:`ktae.core.registry.Alias`: ``taco_lambda``,
also ``lambda``, is TACO's ``lam``), checked against the rule's signature with a one-line
error listing the valid ones; VALUE is read as YAML (``3``, ``0.5``, ``true``, ``[1, 2]``;
anything else stays a string).

A run names its method in one setting, ``credit``, with the aliases' settings
(``ktae_ngram: 3``) and the explicit ``estimator_options``/``calibration_options`` beside
it; :func:`settings_method` makes the one :class:`Method` of all of them, checked.

:func:`method_credit` computes a method's credit on a padded batch the way the trainer
does: the verifier's ``correct`` goes to every estimator that takes it
(:func:`passes_correct`), the batch's log-probs/entropies to a rule that reads them (one
line when the caller has none), each as the method's registry record says
(:class:`ktae.core.registry.Record`). ``ktae train``, ``ktae compare``, ``ktae explain``
and ``ktae audit`` go through this module. Pure torch: it imports the core and the
registries only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from ktae.core.baselines import SEQUENCE_BASELINES
from ktae.core.calibration import CALIBRATIONS, calibrate_advantages, calibration_options
from ktae.core.estimators import ADVANTAGE_ESTIMATORS, compute_advantages
from ktae.core.needs import ARGUMENT, NEEDS, Need
from ktae.core.registry import Alias, Record

CREDIT_NONE = "none"
"""The name of "no token credit": the sequence advantage alone."""
DEFAULT_ESTIMATOR = "grpo"
"""The estimator of a method that names only a calibration (``taco`` is ``grpo+taco``)."""
SEQUENCE_LABELS = {"grpo": "GRPO", "drgrpo": "Dr.GRPO", "rloo": "RLOO"}
"""Display names of the sequence-level estimators (the rest: upper case)."""
CALLER_INPUTS = ("correct",)
"""Estimator inputs the caller fills from the batch (the user cannot also set them)."""


# --------------------------------------------------------------------------- naming


def parse_credit(credit: str) -> tuple[str | None, str | None]:
    """``"ktae+taco"`` -> ``("ktae", "taco")``; ``"none"`` -> ``(None, None)``."""
    estimators = set(ADVANTAGE_ESTIMATORS.names())
    calibrations = set(CALIBRATIONS.names())
    estimator, calibration = None, None
    parts = [p.strip() for p in str(credit).split("+") if p.strip()]
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


def split_method(text: str) -> tuple[str, list[tuple[str, str]]]:
    """``"ktae@ngram=3+taco"`` -> ``("ktae+taco", [("ngram", "3")])``: the names and the
    ``@KEY=VALUE`` settings (raw strings), in order. The settings may follow any name."""
    text = str(text).strip()
    names, settings = [], []
    for part in text.split("+"):
        name, *pairs = [p.strip() for p in part.split("@")]
        if not name:
            raise ValueError(f"credit: expected a name before '@' in {text!r}")
        names.append(name)
        for setting in pairs:
            key, sep, raw = (x.strip() for x in setting.partition("="))
            if not sep or not key or not raw:
                raise ValueError(f"credit: expected KEY=VALUE after '@' in {text!r}, "
                                 f"got {setting!r}")
            settings.append((key, raw))
    return "+".join(names), settings


def option_value(raw: str):
    """A setting's value as YAML reads it (``3`` -> 3, ``[1, 2]`` -> a list), else the text."""
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def user_estimator_options(name: str) -> list[str] | None:
    """The options of estimator ``name`` a method string may set (its record's options:
    not the caller's inputs such as ``correct``; None: any)."""
    options = ADVANTAGE_ESTIMATORS.record(name).options
    return None if options is None else list(options)


def _record(kind: str, name: str | None) -> Record | None:
    if name is None:
        return None
    return (ADVANTAGE_ESTIMATORS if kind == "estimator" else CALIBRATIONS).record(name)


def resolve_option(estimator: str | None, calibration: str | None, key: str, *,
                   where: str, also: str = "") -> tuple[str, str]:
    """Which part ``key`` is an option of: ``("estimator", option)`` or ``("calibration",
    option)``: an option of the part, the option with the part's name and ``_`` before it
    (``ktae_top``), or an alias setting that reaches the part (:func:`alias_key`:
    ``ktae_ngram``, TACO's ``lambda``); else a one-line ``ValueError`` listing both parts'
    options (``also``: what else the caller would have accepted, appended to the message)."""
    est = [] if estimator is None else user_estimator_options(estimator)
    if est is None or key in est:
        return "estimator", key
    cal = [] if calibration is None else calibration_options(calibration)
    for kind, name, options in (("estimator", estimator, est),
                                ("calibration", calibration, cal)):
        if name is None:
            continue
        own = key.removeprefix(f"{name}_")
        if options is None or own in options:
            return kind, own if options is not None else key
        option = alias_key(_record(kind, name), key)
        if option is not None:
            return kind, option
    parts = []
    if estimator is not None:
        parts.append(f"an option of estimator {estimator!r} ({', '.join(est) or 'none'})")
    if calibration is not None:
        parts.append(f"an option of calibration {calibration!r} ({', '.join(cal) or 'none'})")
    own = " or ".join(parts) or "an option of a credit method"
    raise ValueError(f"credit: {key!r} in {where!r} is not {own}{also}")


# --------------------------------------------------------------------------- run settings


def setting_aliases() -> list[tuple[Record, Alias]]:
    """Every alias the registries' records declare (:class:`ktae.core.registry.Alias`),
    with its record: the estimators' first, by name, each in declaration order."""
    return [(record, alias) for registry in (ADVANTAGE_ESTIMATORS, CALIBRATIONS)
            for record in registry.records() for alias in record.aliases]


def declared_aliases() -> list[Alias]:
    """The aliases that are settings of their own (``ktae_ngram``, ``taco_alpha``): the
    trainer's config has a field, ``ktae train`` a flag and a config file a key for each."""
    out: dict[str, Alias] = {}
    for record, alias in setting_aliases():
        if alias.declared:
            if alias.name in out:
                raise ValueError(f"{record.kind} {record.name!r}: setting {alias.name!r} is "
                                 "declared twice")
            out[alias.name] = alias
    return list(out.values())


def _reaches(owner: Record, alias: Alias, part: Record | None) -> bool:
    """Whether ``alias`` (declared by ``owner``) sets an option of ``part``."""
    if part is None:
        return False
    if part.name == owner.name and part.kind == owner.kind:
        return True
    return alias.shared and part.kind == owner.kind and (
        part.options is None or alias.option in part.options)


def alias_key(part: Record, key: str) -> str | None:
    """The option of ``part`` that ``key`` names as an alias setting reaching it: the
    setting's name (``taco_lambda``) or its :attr:`~ktae.core.registry.Alias.short` name
    (``lambda``); None if none."""
    for owner, alias in setting_aliases():
        if _reaches(owner, alias, part) and key in (alias.name, alias.short):
            return alias.option
    return None


def alias_setting(parts: list[str], key: str) -> str | None:
    """The declared setting (``ktae_ngram``) a method string's ``key`` (``ngram``) stands
    for, among the aliases declared by the named ``parts`` (``["ktae", "taco"]``); None if
    none."""
    for owner, alias in setting_aliases():
        if alias.declared and owner.name in parts and key in (alias.name, alias.short):
            return alias.name
    return None


def check_alias_settings(settings: Mapping[str, object]) -> None:
    """Each declared alias's own check of its value in ``settings`` (setting -> value),
    whatever the credit; the ``ValueError`` names the setting (``ktae_ngram: ...``)."""
    for alias in declared_aliases():
        if alias.check is not None and alias.name in settings:
            try:
                alias.check(settings[alias.name], settings)
            except ValueError as err:
                raise ValueError(f"{alias.name}: {err}") from None


def alias_options(kind: str, part: str | None, settings: Mapping[str, object], *,
                  credit: str) -> dict:
    """The options of the ``kind`` part (``"estimator"`` or ``"calibration"``) named
    ``part`` that the alias settings in ``settings`` stand for: those reaching it, when
    ``always`` or not at their default.

    Raises:
        ValueError: one line naming the setting, for a declared setting off its default
            that reaches no part of ``credit`` (the first off the ``always`` ones first).
    """
    record = _record(kind, part)
    registry = ADVANTAGE_ESTIMATORS if kind == "estimator" else CALIBRATIONS
    options, errors = {}, []
    for owner, alias in setting_aliases():
        if owner.kind != registry.kind or alias.name not in settings:
            continue
        value = settings[alias.name]
        if not alias.declared and value is None:
            continue
        if _reaches(owner, alias, record):
            if alias.always or value != alias.default:
                options[alias.option] = value
        elif alias.declared and value != alias.default:
            if record is None:
                text = f"credit {credit!r} has no {kind} to pass it to"
            elif alias.shared:
                text = f"{kind} {part!r} takes no {alias.option!r} option (got {value})"
            else:
                text = f"only used by the {owner.name!r} {kind}, but credit is {credit!r}"
            errors.append((alias.always, f"{alias.name}: {text}"))
    if errors:
        raise ValueError(sorted(errors, key=lambda e: e[0])[0][1])
    return options


def _merge(aliased: dict, explicit: Mapping, where: str) -> dict:
    both = sorted(set(aliased) & set(explicit))
    if both:
        raise ValueError(f"{where}: {both[0]!r} is given twice (as a field and in {where})")
    return {**aliased, **explicit}


def settings_method(credit: str, *, settings: Mapping[str, object] | None = None,
                    estimator_options: Mapping | None = None,
                    calibration_options: Mapping | None = None,
                    default_estimator: str = DEFAULT_ESTIMATOR, ignore_token_ids=(),
                    check: bool = True) -> Method:
    """The one :class:`Method` a run's settings name, checked.

    ``credit``: the method (``ktae+taco``; ``@KEY=VALUE`` settings apply last, on top);
    ``settings``: the alias settings (``{"ktae_ngram": 3, "advantage_base": "grpo"}``,
    :func:`alias_options`); ``estimator_options``, ``calibration_options``: the explicit
    options (an option given both ways is an error); ``default_estimator``: the estimator
    of a credit naming none (the run's ``advantage_base``). ``check``: run
    :func:`check_method`.

    Raises:
        ValueError: one line naming the setting or option: an unknown name, a setting no
            part takes, an option given twice, an option of the trainer's (``correct``), or
            a value a rule refuses.
    """
    names, pairs = split_method(credit)
    estimator, calibration = parse_credit(names)
    estimator = estimator or default_estimator
    settings = settings or {}
    explicit_est, explicit_cal = dict(estimator_options or {}), dict(calibration_options or {})
    est = alias_options("estimator", estimator, settings, credit=credit)
    for key in CALLER_INPUTS:  # what the trainer passes every estimator that takes it
        if key in explicit_est:
            raise ValueError(f"estimator_options: {key!r} is set by the trainer (from the "
                             "accuracy reward)")
    est = _merge(est, explicit_est, "estimator_options")
    if calibration is None and explicit_cal:
        raise ValueError(f"calibration_options: credit {credit!r} has no calibration to "
                         "pass it to")
    cal = alias_options("calibration", calibration, settings, credit=credit)
    cal = _merge(cal, explicit_cal, "calibration_options")
    if pairs:
        return parse_method(credit, estimator_options=est, calibration_options=cal,
                            ignore_token_ids=ignore_token_ids, default_estimator=estimator,
                            check=check)
    method = Method(estimator=estimator, estimator_options=est, calibration=calibration,
                    calibration_options=cal, ignore_token_ids=tuple(ignore_token_ids))
    if check:
        check_method(method)
    return method


@dataclass(frozen=True)
class Method:
    """A credit method: an advantage estimator and an optional calibration, with options.

    ``estimator``: a name of :data:`ktae.ADVANTAGE_ESTIMATORS`; ``estimator_options``: its
    keyword options (KTAE: ``base``, ``h1``, ``ngram``, ...); ``calibration``: a name of
    :data:`ktae.CALIBRATIONS` or None; ``calibration_options``: its options (TACO:
    ``alpha``, ``lam``); ``ignore_token_ids``: tokens KTAE gives no value (pad/EOS, as the
    trainer does).
    """

    estimator: str = "ktae"
    estimator_options: dict = field(default_factory=dict)
    calibration: str | None = None
    calibration_options: dict = field(default_factory=dict)
    ignore_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        ADVANTAGE_ESTIMATORS.get(self.estimator)  # ValueError listing the names
        if self.calibration is not None:
            CALIBRATIONS.get(self.calibration)

    @property
    def token_level(self) -> bool:
        """Whether the estimator gives per-token credit (not a sequence baseline)."""
        return self.estimator not in SEQUENCE_BASELINES

    @property
    def table_options(self) -> dict:
        """Its estimator options that the key-token table takes too
        (:func:`ktae.core.ktae.key_token_table`): those its estimator's record declares
        (KTAE's, :attr:`ktae.core.registry.Record.table_options`); empty for an estimator
        not built on the table."""
        shared = ADVANTAGE_ESTIMATORS.record(self.estimator).table_options
        return {k: v for k, v in self.estimator_options.items() if k in shared}

    @property
    def base(self) -> str:
        """The sequence-level advantage the token credit refines."""
        if not self.token_level:
            return self.estimator
        return self.estimator_options.get("base", DEFAULT_ESTIMATOR)

    @property
    def estimator_needs(self) -> tuple[Need, ...]:
        """What its estimator reads (:class:`ktae.core.needs.Need` records, in order)."""
        return ADVANTAGE_ESTIMATORS.record(self.estimator).need_records

    @property
    def model_needs(self) -> tuple[Need, ...]:
        """The estimator's needs that come from a model (``entropies``,
        ``input_grad_importance``, ...): a caller computes them, or reads a record."""
        return tuple(n for n in self.estimator_needs if n.model)

    @property
    def needs(self) -> tuple[Need, ...]:
        """Every need of the estimator, then those of the calibration not already listed."""
        out = list(self.estimator_needs)
        if self.calibration is not None:
            out += [n for n in CALIBRATIONS.record(self.calibration).need_records
                    if n not in out]
        return tuple(out)

    @property
    def needs_scores(self) -> bool:
        """Whether computing it reads per-token scores of a model: a calibration (the current
        policy's log-probs), or an estimator with a need from a model (:attr:`model_needs`)."""
        return self.calibration is not None or bool(self.model_needs)

    @property
    def needs_input_grad(self) -> bool:
        """Whether its estimator declares the need ``input_grad_importance`` (for callers
        that name the need; the others loop over :attr:`model_needs`)."""
        return any(n.name == "input_grad_importance" for n in self.estimator_needs)

    @property
    def name(self) -> str:
        """The method as a string :func:`parse_method` reads back (``ktae@ngram=3+taco``)."""
        def part(name, options):
            return name + "".join(f"@{k}={v}" for k, v in options.items())

        text = part(self.estimator, self.estimator_options)
        if self.calibration:
            text += "+" + part(self.calibration, self.calibration_options)
        return text

    def describe(self, *, kinds: bool = False) -> str:
        """``ktae (base=grpo, ngram=2) + taco (alpha=0.1)``: the name used in tables and
        page headers (``kinds``: ``+ calibration taco``)."""
        def opts(options):
            return " (" + ", ".join(f"{k}={v}" for k, v in options.items()) + ")" if options else ""

        text = self.estimator + opts(self.estimator_options)
        if self.calibration:
            text += (" + calibration " if kinds else " + ") + self.calibration
            text += opts(self.calibration_options)
        return text

    def label(self, part: str) -> str:
        """Display name of a view: ``seq``, ``token``, ``final`` or ``diff``."""
        seq = SEQUENCE_LABELS.get(self.base, self.base.upper())
        est = SEQUENCE_LABELS.get(self.estimator, self.estimator.upper())
        final = est + (f"+{self.calibration.upper()}" if self.calibration else "")
        return {"seq": seq, "token": est, "final": final, "diff": f"{final} \u2212 {seq}"}[part]


def parse_method(text: str, *, estimator_options: dict | None = None,
                 calibration_options: dict | None = None, ignore_token_ids=(),
                 default_estimator: str = DEFAULT_ESTIMATOR, check: bool = True) -> Method:
    """``"ktae@ngram=3+taco"`` -> :class:`Method`; ``estimator_options`` and
    ``calibration_options`` are defaults the string's settings override. A method naming
    no estimator uses ``default_estimator``. ``check``: run :func:`check_method`.

    Raises:
        ValueError: one line: an unknown name, a malformed setting, an option neither part
            takes (listing the ones they do), or a value a rule refuses.
    """
    credit, settings = split_method(text)
    estimator, calibration = parse_credit(credit)
    estimator = estimator or default_estimator
    est, cal = dict(estimator_options or {}), dict(calibration_options or {})
    seen = set()
    for key, raw in settings:
        kind, name = resolve_option(estimator, calibration, key, where=str(text).strip())
        if (kind, name) in seen:
            raise ValueError(f"credit: {key} set twice in {str(text).strip()!r}")
        seen.add((kind, name))
        (est if kind == "estimator" else cal)[name] = option_value(raw)
    method = Method(estimator=estimator, estimator_options=est, calibration=calibration,
                    calibration_options=cal, ignore_token_ids=tuple(ignore_token_ids))
    if check:
        check_method(method)
    return method


# --------------------------------------------------------------------------- checking


def passes_correct(estimator: str | None, options: dict) -> bool:
    """Whether the estimator gets the verifier's ``correct``: those whose record takes it
    (KTAE, GTPO, prefix-value, users' rules), unless ``options`` turn that off (KTAE's
    ``split=graded`` takes its classes from the reward values)."""
    return estimator is not None and ADVANTAGE_ESTIMATORS.record(estimator).reads_correct(options)


def check_method(method: Method, *, estimator_where: str = "estimator_options",
                 calibration_where: str = "calibration_options") -> None:
    """Check the options against each rule's signature, then run the estimator and the
    calibration once on a tiny batch, so a misspelled or out-of-range option fails now,
    not at step 1 (the message starts with ``estimator_where (name):``)."""
    ids = torch.tensor([[1, 2, 3], [1, 4, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    rewards = torch.tensor([1.0, 0.0])
    ones = torch.ones(ids.shape)
    logp = torch.full(ids.shape, -1.0)
    scores = {n.name: ids.double() if n.example is None else torch.full(ids.shape, n.example)
              for n in method.model_needs}
    scores.update({n.name: torch.stack([ids.double(), -ids.double()], dim=-1)
                   for n in method.model_needs if n.vector})
    try:
        ADVANTAGE_ESTIMATORS.record(method.estimator).check(method.estimator_options,
                                                            inputs=False)
        adv = estimator_credit(method, rewards=rewards, group=torch.tensor([0, 0]),
                               token_ids=ids, mask=mask, correct=rewards > 0.5, **scores)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{estimator_where} ({method.estimator}): {err}") from None
    if method.calibration is None:
        return
    try:
        CALIBRATIONS.record(method.calibration).check(method.calibration_options)
        calibrate(method, adv, logprobs=logp, entropies=ones, mask=mask)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{calibration_where} ({method.calibration}): {err}") from None


# --------------------------------------------------------------------------- computing


def sequence_credit(method: Method, *, rewards: torch.Tensor, group: torch.Tensor
                    ) -> torch.Tensor:
    """``[B]``: the sequence-level advantage the method's token credit refines."""
    return compute_advantages(method.base, rewards=rewards, group=group)


def estimator_credit(method: Method, *, rewards: torch.Tensor, group: torch.Tensor,
                     token_ids: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor,
                     compute: Callable = compute_advantages,
                     **scores: torch.Tensor | None) -> torch.Tensor:
    """The estimator's advantages (``[B, T]`` token credit, or ``[B]`` for a sequence
    estimator), computed as the trainer does.

    Args:
        rewards: ``[B]``; group: ``[B]`` group ids; token_ids, mask: ``[B, T]``.
        correct: ``[B]`` bool, the verifier's verdict, given to every estimator that takes
            it (:func:`passes_correct`).
        compute: the function called, :func:`ktae.compute_advantages` (the trainer passes
            the package's, so that a wrapper a user puts there sees its calls).
        **scores: the caller's ``[B, T]`` per-token inputs by need name
            (:data:`ktae.core.needs.NEEDS`: ``logprobs``, the sampling policy's;
            ``entropies``, the rollout policy's; ``input_grad_importance``, ...), or None;
            each goes to the estimator only when it declares the need.

    Raises:
        ValueError: the estimator reads a need the caller does not have.
        TypeError: a keyword that names no need.
    """
    name = method.estimator
    record = ADVANTAGE_ESTIMATORS.record(name)
    options = dict(method.estimator_options)
    if record.reads_correct(options):
        options["correct"] = correct
    if "ignore_token_ids" in (record.options or ()):
        options["ignore_token_ids"] = sorted(
            set(method.ignore_token_ids) | {int(i) for i in options.get("ignore_token_ids") or ()})
    unknown = sorted(set(scores) - set(NEEDS))
    if unknown:
        raise TypeError(f"estimator_credit: {unknown[0]!r} is not a need; expected some of "
                        f"{', '.join(NEEDS)}")
    for need in record.need_records:
        if need.via == ARGUMENT:
            continue
        if scores.get(need.name) is None:
            raise ValueError(f"credit: estimator {name!r} reads {need.what} "
                             f"(needs={need.name}), which this caller does not have")
        options[need.name] = scores[need.name]
    return compute(name, rewards=rewards, group=group, token_ids=token_ids, mask=mask,
                   **options)


def calibrate(method: Method, advantages: torch.Tensor, *, logprobs: torch.Tensor,
              entropies: torch.Tensor, mask: torch.Tensor,
              old_logprobs: torch.Tensor | None = None, seed: int = 0):
    """The method's calibration of ``advantages`` (``[B, T]``):
    :func:`ktae.calibrate_advantages` with the method's options (``old_logprobs``:
    ``logprobs`` when not given, as for an on-policy scorer; ``seed`` of a random rule)."""
    return calibrate_advantages(
        method.calibration, advantages, logprobs=logprobs, entropies=entropies, mask=mask,
        old_logprobs=logprobs if old_logprobs is None else old_logprobs,
        generator=torch.Generator().manual_seed(seed), **method.calibration_options)


@dataclass
class MethodCredit:
    """:func:`method_credit`'s result (``[B, T]`` unless said)."""

    seq: torch.Tensor
    """``[B]`` sequence advantage."""
    token: torch.Tensor | None
    """The estimator's token credit (None for a sequence estimator)."""
    final: torch.Tensor
    """What the loss reads per token: the calibrated credit, else the token credit, else
    the sequence advantage on every real token."""
    in_loss: torch.Tensor
    """bool: the tokens that reach the loss (a calibration's loss mask)."""
    calibration: object = None
    """The :class:`ktae.CalibrationResult`, or None."""


def method_credit(method: Method, *, rewards: torch.Tensor, group: torch.Tensor,
                  token_ids: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor,
                  logprobs: torch.Tensor | None = None, entropies: torch.Tensor | None = None,
                  old_entropies: torch.Tensor | None = None,
                  **scores: torch.Tensor | None) -> MethodCredit:
    """The method's credit on a padded batch: sequence advantage, the estimator's token
    credit (:func:`estimator_credit`; ``old_entropies``, else ``entropies``, for an
    estimator that reads the rollout policy's; ``scores``: its other needs by name,
    ``input_grad_importance``, ...) and the calibration (:func:`calibrate`, from
    ``logprobs`` and ``entropies``)."""
    seq_b = sequence_credit(method, rewards=rewards, group=group)
    seq = torch.where(mask, seq_b[:, None], 0.0)
    token = None
    if method.token_level:
        token = estimator_credit(method, rewards=rewards, group=group, token_ids=token_ids,
                                 mask=mask, correct=correct, logprobs=logprobs,
                                 entropies=old_entropies if old_entropies is not None
                                 else entropies, **scores)
        if token.dim() == 1:
            token = torch.where(mask, token[:, None], 0.0)
    adv = token if token is not None else seq
    if method.calibration is None:
        return MethodCredit(seq=seq_b, token=token, final=adv, in_loss=mask.clone())
    if logprobs is None or entropies is None:
        raise ValueError(f"credit: calibration {method.calibration!r} needs per-token "
                         "log-probs and entropies, which this caller does not have")
    res = calibrate(method, adv.double(), logprobs=logprobs, entropies=entropies, mask=mask)
    loss_mask = getattr(res, "loss_mask", None)
    in_loss = mask.clone() if loss_mask is None else loss_mask.bool() & mask
    return MethodCredit(seq=seq_b, token=token, final=res.advantages.double(), in_loss=in_loss,
                        calibration=res)
