"""Name -> method registries, so that a trainer picks an estimator from a config string.

Each registered method is one :class:`Record`: its function, the inputs a caller must
give it, whether it reads the verifier's ``correct``, and the options a user may set,
read from the function's signature, and the run settings that stand for one of its options
(:class:`Alias`: ``--ktae-ngram N`` is KTAE's ``ngram=N``). Every caller
(``compute_advantages``, ``calibrate_advantages``, the method strings of
:mod:`ktae.core.methods`, the trainer's config and flags, the verl plugin) reads these
records; none keeps its own list of options, names or settings. :func:`check_options` is
the one check of option names.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ktae.core.needs import Need, get_need, needs_of

F = TypeVar("F", bound=Callable)


def check_options(options, accepted, what: str, listed=None) -> None:
    """A one-line ``ValueError`` for an option name ``accepted`` lacks, listing ``listed``
    (default: ``accepted``), the ones a user may set. ``accepted`` None: any name."""
    if accepted is None:
        return
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        shown = accepted if listed is None else listed
        raise ValueError(f"{unknown[0]}: unknown option for {what}; expected "
                         f"{', '.join(shown) or 'no options'}")


def checked_keywords(what: str) -> Callable[[F], F]:
    """Decorator: a keyword the function does not declare is a :func:`check_options` error
    (not Python's ``TypeError``). The function keeps its signature."""
    def deco(fn: F) -> F:
        names = [p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            check_options(kwargs, names, what)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco


@dataclass(frozen=True)
class Alias:
    """A run setting that stands for one option of a method, declared in the method's record.

    ``Alias("ktae_ngram", "ngram", int, 1, ...)`` on the ``ktae`` estimator: the setting
    ``ktae_ngram`` (``ktae train --ktae-ngram N``, the config key ``ktae_ngram: N``,
    ``ktae compare --credit ktae@ngram=N``) is option ``ngram=N`` of KTAE. The trainer's
    config gets one field per declared alias (:func:`ktae.core.methods.declared_aliases`),
    and :func:`ktae.core.methods.alias_options` turns the settings into options; no other
    module names it.
    """

    name: str
    """The setting, ``PREFIX_KEY``: a ``TrainConfig`` field and config key; its flag is
    ``--`` and the name with dashes. ``KEY`` alone (:attr:`short`: ``ngram``, TACO's
    ``lambda``) is also a key of the method string (``ktae@ngram=3``, ``taco@lambda=0.5``)."""
    option: str
    """The method's option it sets (``ngram``; TACO's ``lam``)."""
    type: object = None
    """The setting's type annotation (``int``, ``float | None``)."""
    default: object = None
    """The setting's default: left there, the option is not passed (the method's own
    default applies), unless ``always``."""
    help: str = ""
    """The flag's one-line help."""
    doc: str = ""
    """What the setting does, with references (the field's documentation)."""
    check: Callable[[object, dict], None] | None = None
    """``check(value, settings)`` raises ``ValueError`` (its text without the setting's
    name) for a value the setting refuses whatever the credit; ``settings``: every alias
    setting of the run by name (for a check across two of the method's settings)."""
    default_text: str | None = None
    """The default ``--help`` shows when ``default`` is None (else it is read from the
    signatures of the methods the setting reaches)."""
    shared: bool = False
    """Every method of the same kind that takes ``option`` reads it (TACO's ``alpha`` and
    ``lam``, read by the whole TACO family and ``entropy-adv``); else only this one."""
    always: bool = False
    """Passed at its default too (KTAE's ``mode``)."""
    declared: bool = True
    """The method declares the setting (a field, flag and config key of its own); False: a
    setting every run has (``advantage_base``) that this method reads as an option."""

    @property
    def short(self) -> str:
        """The name without its prefix (``ngram`` of ``ktae_ngram``)."""
        return self.name.partition("_")[2] or self.name


@dataclass(frozen=True)
class Record:
    """One registered estimator or calibration.

    Attributes:
        name: the registered name (``"ktae"``, ``"taco"``).
        kind: ``"advantage estimator"`` or ``"calibration"``.
        fn: the function the registry calls.
        needs: the names of the inputs a caller must have to call it, each a declared
            :class:`ktae.core.needs.Need` (:attr:`need_records`): of an estimator, some of
            ``token_ids``, ``mask``, ``logprobs``, ``entropies``,
            ``input_grad_importance``; of a calibration, ``entropies`` and
            ``old_logprobs``. A caller computes a need from a model only for the methods
            that declare it.
        inputs: keyword arguments the caller fills from its batch rather than from the
            user, in signature order: ``correct`` (the verifier's verdict, for an
            estimator that reads it), and inputs derived from a model or tokenizer as they
            come (``word_starts`` of ``prefix-value``).
        options: what a user may set (``--estimator-option``, ``name@key=value``, verl's
            ``algorithm.<name>`` block), in signature order; None: any (``**kwargs``).
        keywords: what the function's own signature takes, options and inputs, in its
            order (a user rule's: its options): the list an unknown keyword's error shows.
        correct_unless: option values under which the estimator does not read
            ``correct`` (KTAE's ``split="graded"`` takes its classes from the rewards).
        user_rule: the user's function for a rule of ``ktae.register_estimator`` /
            ``register_calibration``, else None.
        aliases: the run settings that stand for its options (:class:`Alias`).
        table_options: of an estimator built on the key-token table (KTAE), the options
            the table takes too (:func:`ktae.core.ktae.key_token_table`), so that ``ktae
            explain`` and the audit show the table the estimator used; empty for the
            others.
    """

    name: str
    kind: str
    fn: Callable
    needs: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    options: tuple[str, ...] | None = ()
    keywords: tuple[str, ...] | None = ()
    correct_unless: tuple[tuple[str, object], ...] = ()
    user_rule: Callable | None = None
    aliases: tuple[Alias, ...] = ()
    table_options: tuple[str, ...] = ()

    @property
    def need_records(self) -> tuple[Need, ...]:
        """The records of :attr:`needs` (:data:`ktae.core.needs.NEEDS`), in order."""
        return needs_of(self.needs)

    @property
    def takes_correct(self) -> bool:
        """Whether it reads the verifier's ``correct`` (under some option values)."""
        return "correct" in self.inputs

    def reads_correct(self, options: dict) -> bool:
        """Whether a call with ``options`` gets the verifier's ``correct``."""
        return self.takes_correct and not any(options.get(key) == value
                                              for key, value in self.correct_unless)

    def check(self, options: dict, *, inputs: bool = True) -> None:
        """A one-line error for a keyword that is not an option (nor, with ``inputs``, an
        input the caller fills), listing the options (with ``inputs``: the keywords)."""
        if self.options is None:
            return
        if not inputs:
            check_options(options, self.options, f"{self.kind} {self.name!r}")
        else:
            check_options(options, (*self.options, *self.inputs),
                          f"{self.kind} {self.name!r}", self.keywords)


class Registry(Generic[F]):
    """Named :class:`Record` s (``@REGISTRY.register("name", needs=...)``).

    Every function takes one positional argument (the batch, or the advantages), then
    keywords; ``reserved``: keywords every function receives from its caller (a
    calibration's ``logprobs``, ``mask``, ...), which are neither options nor inputs.
    """

    def __init__(self, kind: str, *, reserved: frozenset[str] = frozenset()) -> None:
        self.kind = kind
        self.reserved = frozenset(reserved)
        self._items: dict[str, Record] = {}

    def register(self, name: str, *, needs=(), inputs=(), options=None,
                 correct_unless: dict | None = None, user_rule: Callable | None = None,
                 aliases: tuple[Alias, ...] = (),
                 table_options: tuple[str, ...] = ()) -> Callable[[F], F]:
        """Decorator registering ``fn`` as ``name``. ``inputs``: keywords the caller fills
        besides ``correct`` (which a parameter of that name declares); ``options``: the
        user's options when the signature cannot say (a wrapper taking ``**options``);
        else every other keyword parameter after the first. ``aliases``: the run settings
        that stand for some of its options (:class:`Alias`). ``needs``: names or
        :class:`ktae.core.needs.Need` records a method of this kind may read.
        ``table_options``: see :class:`Record`."""
        needs = tuple(get_need(n).name for n in ((needs,) if isinstance(needs, (str, Need))
                                                 else needs))
        for need in needs:
            if self.kind not in get_need(need).readers:
                raise ValueError(f"{self.kind} {name!r}: needs={need!r} is not read by a "
                                 f"{self.kind}")

        def deco(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            params = [p for p in list(inspect.signature(fn).parameters.values())[1:]
                      if p.name not in self.reserved]
            declared = [p.name for p in params
                        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
            taken = tuple(n for n in declared if n == "correct" or n in inputs)
            taken += tuple(n for n in inputs if n not in taken)
            if options is not None:
                own: tuple[str, ...] | None = tuple(options)
                keywords = own
            elif any(p.kind is p.VAR_KEYWORD for p in params):
                own = keywords = None
            else:
                own = tuple(n for n in declared if n not in taken)
                keywords = tuple(declared)
            for alias in aliases:
                if own is not None and alias.option not in own:
                    raise ValueError(f"{self.kind} {name!r}: alias {alias.name!r} names "
                                     f"{alias.option!r}, which is not one of its options")
            self._items[name] = Record(
                name=name, kind=self.kind, fn=fn, needs=tuple(needs), inputs=taken,
                options=own, keywords=keywords,
                correct_unless=tuple((correct_unless or {}).items()), user_rule=user_rule,
                aliases=tuple(aliases), table_options=tuple(table_options))
            return fn

        return deco

    def record(self, name: str) -> Record:
        """The record of ``name``; an unknown name is a ``ValueError`` listing the known."""
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items))
            raise ValueError(f"unknown {self.kind} {name!r}; expected one of: {known}") from None

    def get(self, name: str) -> F:
        """The function registered as ``name`` (see :meth:`record`)."""
        return self.record(name).fn

    def names(self) -> list[str]:
        return sorted(self._items)

    def records(self) -> list[Record]:
        """Every record, by name."""
        return [self._items[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._items
