"""KTAE's options: defaults, validation and bounds, shared by both modes (docs/method.md §3 and §4).

Every check raises ``ValueError`` naming the option and what it expects. Numeric options
must be finite and within bounds that keep every intermediate finite:

- ``h1, h2, h3, k1`` in ``[0, 1e6]`` (``h1 + h2 > 0``) and ``top`` in ``[0, 1e6]``: a key
  value is at most ``top`` in magnitude, so a token's advantage stays below
  ``1e6 + |A_base|`` and a float32 loss summed over any realistic batch stays far from
  overflow; h3 and k1 beyond 1e6 could turn ``0 * inf`` into NaN (h3) or saturate every
  term frequency to 0 (k1). Useful settings are of order 1.
- ``b`` in ``[0, 1]``; ``reward_threshold`` finite.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from ktae.core.registry import Alias

#: Qwen2.5's ``<|endoftext|>`` (its EOS and pad), ignored by the released runtime.
QWEN_ENDOFTEXT_ID = 151643

#: Default hyper-parameters of the released runtime (docs/method.md §3) and of the paper variant.
RUNTIME_DEFAULTS = {"h1": 1.0, "h2": 1.0, "h3": 1.0}
PAPER_DEFAULTS = {"h1": 1.0, "h2": 2.0, "h3": 1.0}

#: Upper bound of ``h1, h2, h3, k1`` and ``top`` (see the module docstring).
MAX_WEIGHT = 1e6

#: How the values of the spans covering a token become its value (``ngram > 1``).
NGRAM_REDUCES = ("maxabs", "mean")

MODES = ("exact", "reference")
#: How a group's responses become the two classes KTAE compares: a hard split at a reward
#: threshold (docs/method.md §3), or graded membership from the rewards (:mod:`ktae.core.ktae_graded`).
SPLITS = ("threshold", "graded")
VARIANTS = ("runtime", "paper")


@dataclass(frozen=True)
class KTAEOptions:
    """Validated options of one KTAE call (see :func:`ktae.core.ktae.ktae_advantages`)."""

    h1: float
    h2: float
    h3: float
    k1: float
    b: float
    top: float
    variant: str
    mode: str
    reward_threshold: float
    ignore_token_ids: tuple[int, ...]
    ngram: int
    ngram_reduce: str
    split: str = "threshold"

    def stats_kwargs(self) -> dict:
        """The options the statistics take (both modes)."""
        return dict(h1=self.h1, h2=self.h2, h3=self.h3, k1=self.k1, b=self.b, top=self.top,
                    variant=self.variant)


def _number(name: str, value, lo: float, hi: float, expected: str) -> float:
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected {expected}, got {type(value).__name__} {value!r}")
    v = float(value)
    if not (math.isfinite(v) and lo <= v <= hi):
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return v


def _integer(name: str, value, lo: int, expected: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < lo:
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return int(value)


def _choice(name: str, value, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        expected = " or ".join(repr(c) for c in choices)
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return value


def token_id_list(value, name: str = "ignore_token_ids") -> tuple[int, ...]:
    """A list, tuple, set or 1-D integer tensor/array of token ids in ``[0, 2**63)``."""
    if value is None:
        return ()
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if isinstance(value, torch.Tensor):
            integer = not (value.is_floating_point() or value.is_complex()
                           or value.dtype == torch.bool)
        else:
            integer = np.issubdtype(value.dtype, np.integer)
        if value.ndim != 1 or not integer:
            raise ValueError(f"{name}: expected a 1-D integer tensor or a list of token ids, "
                             f"got {type(value).__name__} of shape {tuple(value.shape)} and "
                             f"dtype {value.dtype}")
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset,
                                                                   range)):
        hint = f" (e.g. [{value}])" if isinstance(value, numbers.Integral) else ""
        raise ValueError(f"{name}: expected a list of token ids{hint}, "
                         f"got {type(value).__name__} {value!r}")
    out = []
    for x in value:
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise ValueError(f"{name}: expected integer token ids, got {x!r}")
        if not 0 <= int(x) < 2**63:
            raise ValueError(f"{name}: expected token ids in [0, 2**63), got {int(x)}")
        out.append(int(x))
    return tuple(sorted(set(out)))


def resolve_options(*, reward_threshold=None, h1=None, h2=None, h3=None, k1=2.0, b=0.5,
                    top=1.0, ignore_token_ids=None, mode="exact", variant="runtime", ngram=1,
                    ngram_reduce="mean", split="threshold") -> KTAEOptions:
    """Validate KTAE's options and fill the variant's defaults (h's None = default)."""
    mode = _choice("mode", mode, MODES)
    split = _choice("split", split, SPLITS)
    variant = _choice("variant", variant, VARIANTS)
    defaults = PAPER_DEFAULTS if variant == "paper" else RUNTIME_DEFAULTS
    bounded = f"a non-negative finite number <= {MAX_WEIGHT:g}"
    hs = {}
    for name, val in (("h1", h1), ("h2", h2), ("h3", h3)):
        hs[name] = defaults[name] if val is None else _number(name, val, 0.0, MAX_WEIGHT, bounded)
    if hs["h1"] + hs["h2"] <= 0:
        raise ValueError("h1, h2: expected h1 + h2 > 0 (at least one of F and IG on)")
    k1 = _number("k1", k1, 0.0, MAX_WEIGHT, bounded)
    b = _number("b", b, 0.0, 1.0, "0 <= b <= 1")
    top = _number("top", top, 0.0, MAX_WEIGHT, bounded)
    ngram = _integer("ngram", ngram, 1, "a positive integer (span length in tokens)")
    ngram_reduce = _choice("ngram_reduce", ngram_reduce, NGRAM_REDUCES)
    if reward_threshold is not None:
        reward_threshold = _number("reward_threshold", reward_threshold, -math.inf, math.inf,
                                   "a finite number")
    ignored = token_id_list(ignore_token_ids)
    if mode == "reference":
        if ngram != 1:
            raise ValueError("ngram: the reference mode reproduces the released runtime, which "
                             "scores single tokens only; use mode='exact' for ngram > 1")
        if reward_threshold not in (None, 0.0):
            raise ValueError("reward_threshold: the reference mode uses the runtime's rule "
                             "(reward > 0)")
        if split == "graded":
            raise ValueError("split: the reference mode reproduces the released runtime, "
                             "which splits at reward > 0; use mode='exact' for "
                             "split='graded'")
        if ignore_token_ids is None:
            ignored = (QWEN_ENDOFTEXT_ID,)
    if split == "graded" and reward_threshold is not None:
        raise ValueError("reward_threshold: split='graded' uses the reward values "
                         "themselves; remove reward_threshold or use split='threshold'")
    return KTAEOptions(h1=hs["h1"], h2=hs["h2"], h3=hs["h3"], k1=k1, b=b, top=top,
                       variant=variant, mode=mode,
                       reward_threshold=0.0 if reward_threshold is None else reward_threshold,
                       ignore_token_ids=ignored, ngram=ngram, ngram_reduce=ngram_reduce,
                       split=split)


def check_chunk_tokens(chunk_tokens) -> int | None:
    """``chunk_tokens``: None (the device's default) or a positive integer."""
    if chunk_tokens is None:
        return None
    return _integer("chunk_tokens", chunk_tokens, 1, "a positive integer")


# --------------------------------------------------------------------------- run settings


def _check_mode(value, settings) -> None:
    if value not in MODES:
        raise ValueError(f"expected 'exact' or 'reference', got {value!r}")


def _check_weight(value, settings) -> None:
    if value is not None and value < 0:
        raise ValueError(f"expected >= 0, got {value!r}")


def _check_ngram(value, settings) -> None:
    if value < 1:
        raise ValueError(f"expected a positive integer, got {value!r}")
    if value > 1 and settings.get("ktae_mode") == "reference":
        raise ValueError("the reference mode reproduces the released runtime, which scores "
                         "single tokens only; use ktae_mode exact")


def _check_ngram_reduce(value, settings) -> None:
    if value not in NGRAM_REDUCES:
        raise ValueError(f"expected 'mean' or 'maxabs', got {value!r}")


def _weight(h: str, help: str, doc: str) -> Alias:
    paper = ("" if PAPER_DEFAULTS[h] == RUNTIME_DEFAULTS[h]
             else f"; {PAPER_DEFAULTS[h]:g} with --estimator-option variant=paper")
    return Alias(f"ktae_{h}", h, float | None, None, help=help, doc=doc, check=_check_weight,
                 default_text=f"default {RUNTIME_DEFAULTS[h]:g}{paper}")


KTAE_ALIASES = (
    Alias("advantage_base", "base", always=True, declared=False),
    Alias("ktae_mode", "mode", str, "exact", help="exact | reference", always=True,
          check=_check_mode,
          doc="KTAE statistics: ``exact`` or ``reference`` (the released runtime's float32 "
              "quirks)."),
    _weight("h1", "KTAE Fisher weight h1",
            "KTAE weight of the Fisher score (docs/method.md §3); None = the estimator's "
            "default (1)."),
    _weight("h2", "KTAE information-gain weight h2",
            "KTAE weight of the information gain; None = the estimator's default (1)."),
    _weight("h3", "KTAE term-frequency weight h3",
            "KTAE weight of the term-frequency direction; None = the estimator's default (1)."),
    Alias("ktae_ngram", "ngram", int, 1, help="KTAE span length N (1 = key tokens; "
          "docs/ngram.md)", check=_check_ngram,
          doc="KTAE span length N: 1 scores single tokens; N > 1 spans of N tokens "
              "(docs/ngram.md)."),
    Alias("ktae_ngram_reduce", "ngram_reduce", str, "mean",
          help="span values -> token value: mean | maxabs", check=_check_ngram_reduce,
          doc="How a token's value comes from its spans' (N > 1): ``mean`` or ``maxabs``."),
)
"""The ``ktae train`` settings of the ``ktae`` estimator (:class:`ktae.core.registry.Alias`):
the run's ``advantage_base`` is its ``base`` and ``ktae_mode`` its ``mode``, always passed;
``ktae_h1``..``ktae_h3``, ``ktae_ngram`` and ``ktae_ngram_reduce`` when set."""
