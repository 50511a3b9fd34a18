"""Bring your own credit rule: ``ktae.register_estimator`` and ``ktae.register_calibration``.

A user rule is a plain function of one documented batch object plus its own keyword
options; the decorators wrap it into the calling convention of the existing registries
(:data:`ktae.ADVANTAGE_ESTIMATORS`, :data:`ktae.CALIBRATIONS`), so it runs wherever a
built-in does: ``ktae.compute_advantages(name, ...)``, ``ktae.calibrate_advantages``,
``ktae train --credit name`` (and ``name+taco``), ``ktae compare`` arms, ``ktae explain``
and ``ktae audit``. ``docs/plugins.md`` shows a complete rule.

Estimators::

    @ktae.register_estimator("mine", needs=("token_ids",))
    def mine(batch: ktae.RuleBatch, *, scale: float = 1.0) -> torch.Tensor:
        ...   # [B] (one advantage per response) or [B, T] (per token)

Calibrations (applied at loss time to the estimator's advantages)::

    @ktae.register_calibration("damp", needs=("entropies",))
    def damp(batch: ktae.CalibrationBatch, *, lam: float = 0.5) -> torch.Tensor:
        ...   # [B, T] weights: the factor each token's advantage is multiplied by

Checks, each a one-line ``ValueError`` naming the rule: an option the function does not
declare (listing the ones it does; a function with ``**kwargs`` takes any), an input it
declares in ``needs`` that the caller did not give, and its output: a tensor of shape
``[B]`` or ``[B, T]``, finite, and 0 on padding (calibration weights: ``[B, T]`` and
finite; their padding is ignored).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ktae.core.advantages import ADVANTAGE_ESTIMATORS, AdvantageBatch
from ktae.core.calibration_rules import CALIBRATIONS, RULE_ARGS, RuleResult
from ktae.core.gtpo import _correctness
from ktae.core.needs import CALIBRATION, ESTIMATOR, SCORES, get_need, readable_by
from ktae.core.policy_loss import token_tensor

#: Inputs the caller passes to a user estimator, so no rule option may take these names.
_CALLER_INPUTS = ("correct", "logprobs")


@dataclass(frozen=True)
class RuleBatch:
    """What a user advantage estimator receives. Shapes: B responses, T tokens, P groups.

    Attributes:
        rewards: ``[B]`` float32 or float64 rewards.
        correct: ``[B]`` bool, the verifier's verdict (the trainer's accuracy reward; from
            ``compute_advantages(..., correct=...)``, else ``reward > 0``).
        group: ``[B]`` int64 group ids, dense in ``0..P-1`` (the prompt each answers).
        num_groups: P.
        token_ids: ``[B, T]`` int64 response token ids, or None (sequence-level call).
        mask: ``[B, T]`` bool, True on real response tokens, or None.
        logprobs: ``[B, T]`` the sampling policy's log-probabilities of the sampled tokens
            (0 on padding), or None where the caller has none.
        entropies: ``[B, T]`` the sampling policy's next-token entropies (0 on padding), or
            None where the caller has none.
        input_grad_importance: ``[B, T]`` each token's input-gradient importance under the
            policy (:mod:`ktae.models.input_grad_importance`; 0 on padding), or None where
            the caller has no model to differentiate: ``scores["input_grad_importance"]``.
        scores: every per-token score the caller gave, by need name
            (:data:`ktae.core.needs.NEEDS`; ``entropies``, ``input_grad_importance``, ...).
    """

    rewards: torch.Tensor
    correct: torch.Tensor
    group: torch.Tensor
    num_groups: int
    token_ids: torch.Tensor | None
    mask: torch.Tensor | None
    logprobs: torch.Tensor | None
    entropies: torch.Tensor | None
    input_grad_importance: torch.Tensor | None = None
    scores: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CalibrationBatch:
    """What a user calibration receives (all ``[B, T]``, detached, padding 0).

    Attributes:
        advantages: the estimator's token advantages.
        logprobs: the current policy's log-probabilities of the sampled tokens.
        entropies: the current policy's next-token entropies, or None.
        old_logprobs: the rollout (old) policy's log-probabilities, or None.
        mask: bool, True on real response tokens.
        generator: the caller's ``torch.Generator`` for random rules, or None.
    """

    advantages: torch.Tensor
    logprobs: torch.Tensor
    entropies: torch.Tensor | None
    old_logprobs: torch.Tensor | None
    mask: torch.Tensor
    generator: torch.Generator | None


def _rule_options(fn: Callable, kind: str, name: str, reserved) -> list[str] | None:
    """The keyword options ``fn`` declares after its batch argument (None: ``**kwargs``)."""
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                            inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise TypeError(f"{kind} {name!r}: expected a function taking the batch as its first "
                        "argument, then keyword options")
    options = []
    for p in params[1:]:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if p.name in reserved:
            raise TypeError(f"{kind} {name!r}: option {p.name!r} is an input the caller "
                            f"passes; read it from the batch instead")
        options.append(p.name)
    return options


def _check_needs(needs, kind: str, name: str) -> tuple[str, ...]:
    """The declared needs' names; one a ``kind`` may not read is a ``ValueError``
    listing those it may (:func:`ktae.core.needs.readable_by`)."""
    needs = (needs,) if isinstance(needs, str) else tuple(needs)
    needs = tuple(n if isinstance(n, str) else get_need(n).name for n in needs)
    allowed = readable_by(kind)
    bad = [n for n in needs if n not in allowed]
    if bad:
        raise ValueError(f"{kind} {name!r}: needs={bad[0]!r} is not an input; expected some "
                         f"of {', '.join(allowed)}")
    return needs


def check_rule_output(out, kind: str, name: str, B: int, mask: torch.Tensor | None, *,
                      token_level_only: bool = False, zero_padding: bool = True
                      ) -> torch.Tensor:
    """``out`` as returned by rule ``name``: a tensor of shape ``[B]`` or ``[B, T]``
    (``[B, T]`` only with ``token_level_only``), finite, and (``zero_padding``) 0 where
    ``mask`` is False."""
    where = f"{kind} {name!r}"
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"{where}: returned {type(out).__name__}, expected a torch.Tensor")
    shapes = [] if token_level_only else [(B,)]
    if mask is not None:
        shapes.append(tuple(mask.shape))
    if tuple(out.shape) not in shapes:
        expected = " or ".join(str(s) for s in shapes)
        raise ValueError(f"{where}: returned shape {tuple(out.shape)}, expected {expected}")
    if not (out.is_floating_point() or out.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"{where}: returned dtype {out.dtype}, expected floats")
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        at = [int(i) for i in bad.nonzero()[0]]
        raise ValueError(f"{where}: returned NaN or inf at {at}")
    if out.dim() == 2 and zero_padding:
        off = (out != 0) & ~mask
        if bool(off.any()):
            at = [int(i) for i in off.nonzero()[0]]
            raise ValueError(f"{where}: returned {float(out[tuple(at)]):g} on padding at {at}, "
                             "expected 0 where mask is False")
    return out


def register_estimator(name: str, *, needs=()) -> Callable:
    """Register ``fn(batch: RuleBatch, **options) -> [B] or [B, T]`` as advantage estimator
    ``name`` (decorator; returns ``fn`` unchanged).

    Args:
        name: the name ``compute_advantages``, ``--credit`` and compare arms use; must not
            be taken.
        needs: inputs the rule reads beyond ``rewards``, ``correct`` and ``group``: some of
            ``"token_ids"``, ``"mask"``, ``"logprobs"``, ``"entropies"``,
            ``"input_grad_importance"`` (the model's input-gradient importance of each
            token: one extra backward pass), or any other need an estimator may read
            (:data:`ktae.core.needs.NEEDS`; the rule reads it as ``batch.scores[name]``).
            A caller that lacks one gets a one-line error; the trainer computes each from
            the model only for rules that declare it.

    The rule's keyword options (every parameter after the batch) are what
    ``compute_advantages(name, ..., key=value)``, ``--estimator-option key=value`` and a
    compare arm ``name@key=value`` set; other names are refused, listing these.
    """
    needs = _check_needs(needs, ESTIMATOR, name)

    def deco(fn: Callable) -> Callable:
        accepted = _rule_options(fn, "advantage estimator", name, _CALLER_INPUTS)

        def estimator(batch: AdvantageBatch, *, correct=None, logprobs=None, **options):
            mask = batch.mask
            if logprobs is not None:
                if mask is None:
                    raise ValueError("logprobs: need token_ids or mask as well")
                logprobs = token_tensor(logprobs, "logprobs", tuple(mask.shape), batch.device)
                logprobs = torch.where(mask, logprobs.detach(), 0)
            rb = RuleBatch(rewards=batch.rewards,
                           correct=_correctness(batch, correct, 0.0),
                           group=batch.gid, num_groups=batch.num_groups,
                           token_ids=batch.token_ids, mask=mask, logprobs=logprobs,
                           entropies=batch.entropies,
                           input_grad_importance=batch.input_grad_importance,
                           scores=dict(batch.scores))
            for need in needs:
                missing = (need not in rb.scores if get_need(need).via == SCORES
                           else getattr(rb, need) is None)
                if missing:
                    raise ValueError(f"{need}: required by advantage estimator {name!r} "
                                     f"(declared in its needs)")
            out = check_rule_output(fn(rb, **options), "advantage estimator", name,
                                    batch.rewards.shape[0], mask)
            return out.to(batch.rewards.dtype)

        estimator.__name__ = getattr(fn, "__name__", name)
        estimator.__doc__ = fn.__doc__
        ADVANTAGE_ESTIMATORS.register(name, needs=needs, inputs=_CALLER_INPUTS,
                                      options=accepted, user_rule=fn)(estimator)
        return fn

    return deco


def register_calibration(name: str, *, needs=()) -> Callable:
    """Register ``fn(batch: CalibrationBatch, **options) -> [B, T] weights`` as calibration
    ``name`` (decorator; returns ``fn`` unchanged).

    The weights multiply the advantages token by token (``ktae.calibrate_advantages``'s
    ``weights``; a token is ``flagged`` where its weight is not 1). ``needs``: some of
    ``"entropies"``, ``"old_logprobs"``. Options as for :func:`register_estimator`
    (``--calibration-option key=value``, ``ktae.calibrate_advantages(name, ..., key=value)``).
    """
    needs = _check_needs(needs, CALIBRATION, name)

    def deco(fn: Callable) -> Callable:
        accepted = _rule_options(fn, "calibration", name, RULE_ARGS | {"adv"})

        def rule(adv, *, logprobs, entropies, old_logprobs, mask, generator, **options):
            cb = CalibrationBatch(advantages=adv, logprobs=logprobs, entropies=entropies,
                                  old_logprobs=old_logprobs, mask=mask, generator=generator)
            for need in needs:
                if getattr(cb, need) is None:
                    raise ValueError(f"{need}: required by calibration {name!r} (declared in "
                                     "its needs)")
            weights = check_rule_output(fn(cb, **options), "calibration", name, adv.shape[0],
                                        mask, token_level_only=True, zero_padding=False)
            weights = torch.where(mask, weights.to(adv.dtype), 0)
            return RuleResult(weights=weights, flagged=mask & (weights != 1))

        # the rule's own options, with a default, for readers of the signature (--help)
        params = [inspect.Parameter("adv", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        params += [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY)
                   for p in ("logprobs", "entropies", "old_logprobs", "mask", "generator")]
        params += ([inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD)]
                   if accepted is None else
                   [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, default=None)
                    for p in accepted])
        rule.__signature__ = inspect.Signature(params)
        rule.__name__ = getattr(fn, "__name__", name)
        rule.__doc__ = fn.__doc__
        CALIBRATIONS.register(name, needs=needs, options=accepted, user_rule=fn)(rule)
        return fn

    return deco

