"""Credit methods of the simulator, each a thin call into the public ``ktae`` API.

A method is ``BASE`` or ``BASE+CALIBRATION`` (a bare calibration name means
``broadcast+CALIBRATION``), with the token advantages computed as follows on a batch of
G trajectories per run (one run = one group; ``r[i,t]`` the 0/1 reward of step ``t`` of
trajectory ``i``, ``R_i = sum_t r[i,t] / H`` its normalised return):

``broadcast``
    GRPO: ``ktae.compute_advantages("grpo", rewards=R, group=run, mask=...)``, the
    trajectory's group-normalised return given to every step.
``step`` (the oracle)
    Each step's own reward, group-normalised across the G trajectories at that step:
    ``A[i,t] = (r[i,t] - mean_j r[j,t]) / (std_j r[j,t] + 1e-6)`` (unbiased std; 0 when
    the G rewards at step t are equal), i.e. ``ktae.compute_advantages("grpo")`` with one
    group per (run, step).
``ktae``
    ``ktae.compute_advantages("ktae", ...)`` with tokens = (step, action) pairs, id
    ``t * |A| + a``, and ``correct`` = the trajectory's return is above its group's mean
    (with ``ktae_threshold``: the library's ``reward_threshold`` rule, return > threshold);
    with ``ktae_ngram=N > 1``, KTAE over spans of N consecutive steps (docs/ngram.md).
``ktae-graded``
    KTAE with ``split="graded"`` (docs/graded.md): no correct/incorrect split, every
    trajectory weighs in by its return's place in its group's range
    (``(R_i - min R) / (max R - min R)``); ``ktae_threshold`` does not apply, spans do.
any other estimator (``prefix-value``, a user's ``ktae.register_estimator`` rule, ...)
    ``ESTIMATOR[@KEY=VALUE...][+CALIBRATION[@KEY=VALUE...]]`` as ``ktae train --credit``
    reads it (:func:`ktae.core.methods.parse_method`), computed as the trainer computes it
    (:func:`ktae.core.methods.estimator_credit`) with tokens = (step, action) pairs as for
    ``ktae``, ``correct`` = the return is above its group's mean, and the current policy's
    log-probabilities and entropies for a rule that reads them; a per-trajectory result
    is given to every step. The names above keep their meaning (``ktae`` is the
    simulator's KTAE, with ``ktae_threshold`` and ``ktae_ngram``); ``ktae@KEY=VALUE``
    takes this path, its options (``ngram`` too) given as written.
``+CALIBRATION``
    ``ktae.calibrate_advantages(CALIBRATION, A, logprobs, entropies, mask)`` on the base
    advantages, with the current per-step softmax's log-probability of the sampled action
    and its entropy (also the rollout policy's log-probability, ``old_logprobs``: one
    update per sampled batch).

"The batch" of batch-level rules (fractions or counts of the batch's tokens) is one run's
group: such rules are called once per run. Rules in :data:`TOKEN_LOCAL_RULES` depend on
each token alone, so one call covers every run (the tests check that this gives the same
result as one call per run).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ktae.core.calibration import CALIBRATIONS, CalibrationResult, calibrate_advantages
from ktae.core.estimators import ADVANTAGE_ESTIMATORS, compute_advantages
from ktae.core.methods import estimator_credit, split_method
from ktae.core.methods import parse_method as parse_credit_method

BASES = ("broadcast", "step", "ktae", "ktae-graded")
SIM_NEEDS = ("logprobs", "entropies")
"""The needs from a model that the simulator passes to an estimator (its policy's)."""

#: Calibrations whose weight of a token depends on that token alone.
TOKEN_LOCAL_RULES = frozenset({"taco", "taco-hard", "taco-prob-only", "taco-step",
                               "adv-reweight", "rsi-s"})


@dataclass(frozen=True)
class Method:
    """A parsed method name: a base credit and an optional calibration on top."""

    name: str
    base: str
    calibration: str | None = None
    #: a registered estimator's method (:class:`ktae.core.methods.Method`, with its
    #: options and its calibration's), for a base not in :data:`BASES`
    rule: object = field(default=None, compare=False)

    @property
    def needs_generator(self) -> bool:
        return self.calibration is not None and self.calibration not in TOKEN_LOCAL_RULES


def all_methods() -> tuple[str, ...]:
    """The bases, every registered calibration on broadcast, and ``ktae+taco``."""
    return (*BASES, *CALIBRATIONS.names(), "ktae+taco")


def parse_method(name: str) -> Method:
    """``"step"``, ``"taco"`` (= ``broadcast+taco``), ``"ktae+taco"`` -> :class:`Method`."""
    calibrations = CALIBRATIONS.names()
    if name in BASES:
        return Method(name, name)
    if name in calibrations:
        return Method(name, "broadcast", name)
    base, plus, rule = name.partition("+")
    if plus and base in BASES and rule in calibrations:
        return Method(name, base, rule)
    estimator = split_method(name)[0].partition("+")[0]
    if estimator not in ADVANTAGE_ESTIMATORS.names() or (estimator in BASES
                                                        and "@" not in name):
        raise ValueError(
            f"methods: unknown method {name!r}; expected one of {', '.join(BASES)}, a "
            f"calibration ({', '.join(calibrations)}), BASE+CALIBRATION such as 'ktae+taco', "
            f"a registered estimator ({', '.join(_other_estimators())}) as "
            f"ESTIMATOR[@KEY=VALUE][+CALIBRATION], or 'all'")
    try:
        method = parse_credit_method(name)
    except ValueError as err:
        raise ValueError(f"methods: {name!r}: {err}") from None
    for need in method.model_needs:
        if need.name not in SIM_NEEDS:
            raise ValueError(f"methods: {name!r} reads {need.what} (needs={need.name}), "
                             "which the tabular policy does not have; use ktae train")
    return Method(name, method.estimator, method.calibration, rule=method)


def _other_estimators() -> list[str]:
    """The registered estimators the simulator reaches through the trainer's path."""
    return [n for n in ADVANTAGE_ESTIMATORS.names() if n not in BASES]


def parse_methods(names) -> tuple[Method, ...]:
    """A comma-separated string or a sequence of names; ``"all"`` expands."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    expanded: list[str] = []
    for n in names:
        for m in (all_methods() if n == "all" else (n,)):
            if m not in expanded:
                expanded.append(m)
    if not expanded:
        raise ValueError("methods: expected at least one method name")
    return tuple(parse_method(n) for n in expanded)


@dataclass(frozen=True)
class CreditBatch:
    """One method's trajectories of a block of runs. B trajectories, T = max steps.

    Attributes:
        step_rewards: ``[B, T]`` float32 0/1 step rewards, 0 on padding.
        mask: ``[B, T]`` bool, True on the real steps of each trajectory.
        group: ``[B]`` int64 run id of each trajectory (a run's G trajectories are one
            group, stored contiguously).
        horizon: ``[B]`` int64 steps of each trajectory's run.
        token_ids: ``[B, T]`` int64 ``t * |A| + action``, 0 on padding.
        logprobs: ``[B, T]`` current-policy log-probability of each sampled action.
        entropies: ``[B, T]`` entropy of the step's distribution.
        run_slices: ``(start, end)`` of each run's trajectories, in run order.
    """

    step_rewards: torch.Tensor
    mask: torch.Tensor
    group: torch.Tensor
    horizon: torch.Tensor
    token_ids: torch.Tensor
    logprobs: torch.Tensor
    entropies: torch.Tensor
    run_slices: tuple[tuple[int, int], ...]

    @property
    def returns(self) -> torch.Tensor:
        """``[B]`` normalised returns ``sum_t r[i,t] / H``."""
        return self.step_rewards.sum(1) / self.horizon.to(self.step_rewards.dtype)

    def above_group_mean(self) -> torch.Tensor:
        """``[B]`` bool: return above its group's mean, compared exactly in integers
        (``k_i * G > sum_j k_j`` with ``k`` the count of rewarded steps)."""
        k = self.step_rewards.sum(1).round().long()
        P = int(self.group.max()) + 1
        total = torch.zeros(P, dtype=torch.long, device=k.device).index_add_(0, self.group, k)
        size = torch.zeros_like(total).index_add_(0, self.group, torch.ones_like(k))
        return k * size[self.group] > total[self.group]


def base_advantages(base: str, batch: CreditBatch, *,
                    ktae_threshold: float | None = None, ktae_ngram: int = 1) -> torch.Tensor:
    """``[B, T]`` token advantages of a base credit (0 on padding)."""
    if base == "broadcast":
        return compute_advantages("grpo", rewards=batch.returns, group=batch.group,
                                  mask=batch.mask)
    if base == "step":
        T = batch.mask.shape[1]
        steps = torch.arange(T, device=batch.mask.device)
        per_step_group = (batch.group[:, None] * T + steps)[batch.mask]
        adv = compute_advantages("grpo", rewards=batch.step_rewards[batch.mask],
                                 group=per_step_group)
        return torch.zeros_like(batch.step_rewards).masked_scatter_(batch.mask, adv)
    if base == "ktae-graded":
        spans = {"ngram": ktae_ngram} if ktae_ngram != 1 else {}
        return compute_advantages("ktae", rewards=batch.returns, group=batch.group,
                                  token_ids=batch.token_ids, mask=batch.mask,
                                  split="graded", **spans)
    if base == "ktae":
        if ktae_threshold is None:
            correctness = {"correct": batch.above_group_mean()}
        else:
            correctness = {"reward_threshold": float(ktae_threshold)}
        spans = {"ngram": ktae_ngram} if ktae_ngram != 1 else {}
        return compute_advantages("ktae", rewards=batch.returns, group=batch.group,
                                  token_ids=batch.token_ids, mask=batch.mask,
                                  **correctness, **spans)
    raise ValueError(f"base: expected one of {', '.join(BASES)}, got {base!r}")


@dataclass(frozen=True)
class Credit:
    """A method's output on a batch, each ``[B, T]``: ``advantages`` (0 on padding),
    ``loss_mask`` (the tokens that stay in the loss) and ``flagged`` (the tokens whose
    credit a calibration reduces; all False without one)."""

    advantages: torch.Tensor
    loss_mask: torch.Tensor
    flagged: torch.Tensor


def _loss_mask(result: CalibrationResult, mask: torch.Tensor) -> torch.Tensor:
    return getattr(result, "loss_mask", mask)


def rule_advantages(method, batch: CreditBatch) -> torch.Tensor:
    """``[B, T]`` advantages of a registered estimator's :class:`ktae.core.methods.Method`
    (0 on padding), one call over the block of runs (each run one group). Given the mask,
    ``compute_advantages`` spreads a per-trajectory result over the real steps."""
    adv = estimator_credit(method, rewards=batch.returns, group=batch.group,
                           token_ids=batch.token_ids, mask=batch.mask,
                           correct=batch.above_group_mean(), logprobs=batch.logprobs,
                           entropies=batch.entropies)
    return adv.to(batch.step_rewards.dtype)


def calibrate(rule: str, adv: torch.Tensor, batch: CreditBatch,
              generators: list[torch.Generator] | None = None,
              options: dict | None = None) -> Credit:
    """A calibration rule on base advantages ``adv`` ``[B, T]``.

    Token-local rules run once on the whole batch; the others once per run (its group is
    its batch), drawing from that run's generator when the rule is random.
    """
    # on-policy (one update per sampled batch): the rollout policy is the current one
    kwargs = dict(logprobs=batch.logprobs, entropies=batch.entropies, mask=batch.mask,
                  old_logprobs=batch.logprobs)
    options = dict(options or {})
    if rule in TOKEN_LOCAL_RULES:
        result = calibrate_advantages(rule, adv, **kwargs, **options)
        return Credit(result.advantages, _loss_mask(result, batch.mask), result.flagged)
    out = torch.zeros_like(adv)
    loss_mask = torch.zeros_like(batch.mask)
    flagged = torch.zeros_like(batch.mask)
    for k, (s, e) in enumerate(batch.run_slices):
        part = {key: value[s:e] for key, value in kwargs.items()}
        gen = None if generators is None else generators[k]
        result = calibrate_advantages(rule, adv[s:e], generator=gen, **part, **options)
        out[s:e] = result.advantages
        loss_mask[s:e] = _loss_mask(result, part["mask"])
        flagged[s:e] = result.flagged
    return Credit(out, loss_mask, flagged)


def method_advantages(method: Method, batch: CreditBatch, *,
                      ktae_threshold: float | None = None, ktae_ngram: int = 1,
                      generators: list[torch.Generator] | None = None) -> Credit:
    """A method's :class:`Credit` on a batch."""
    if method.rule is not None:
        adv = rule_advantages(method.rule, batch)
        options = method.rule.calibration_options
    else:
        adv = base_advantages(method.base, batch, ktae_threshold=ktae_threshold,
                              ktae_ngram=ktae_ngram)
        options = None
    if method.calibration is None:
        return Credit(adv, batch.mask, torch.zeros_like(batch.mask))
    return calibrate(method.calibration, adv, batch, generators, options)
