"""Self-distillation credit: SDPO's advantage and losses, SDPG's distillation term.

docs/method.md §17. The policy is its own teacher: the same model, given a privileged
context (a right response of the group, or a reference solution: the need
``teacher_logprobs``, :mod:`ktae.models.self_teacher`), scores each response token again.
With ``s_t = log pi(y_t | x, y_<t)`` (the student, the need ``logprobs``) and ``q_t = log
pi(y_t | c, x, y_<t)`` (the teacher), both of the sampled token:

**SDPO** (Hübotter et al. 2026, arXiv 2601.20802; code github.com/lasgroup/SDPO,
``core_algos.py: compute_self_distillation_loss``). Its token-level loss (``alpha = 1``,
``full_logit_distillation = False``) is ``(s_t - q_t).detach() * s_t``, whose gradient is
the policy gradient of the token advantage::

    A_SDPO[t] = q_t - s_t                                        (teacher minus student)
    A[t]      = lam * A_GRPO + (1 - lam) * A_SDPO[t]             (estimator ``sdpo``)

``lam = 0`` is SDPO alone (its verl config sets ``adv_estimator: grpo`` but the ``sdpo``
loss mode reads no advantage). :func:`sdpo_token_loss` is the code's token-level loss with
its importance ratio ``min(exp(s - s_old), is_clip)``; :func:`sdpo_logit_loss` its
full-logit one (the authors' default): the generalised Jensen-Shannon divergence
(``alpha = 0.5``) between student and teacher over the top-``k`` student tokens (100) plus
a tail bucket.

**SDPG** (Liu et al. 2026, arXiv 2606.04036; code github.com/lauyikfung/SDPG,
``core_algos.py: compute_sdpg_loss, _compute_effective_beta``, ``dp_actor.py:
_compute_kl_distill_micro_batch``): GRPO's advantage in the clipped loss, plus per token::

    D_t  = sum_v p(v) (log p(v) - log q(v))      p = softmax(z_student / T), q = softmax(z_teacher)
    l_t += beta(step) * min(D_t, 20) * [A_t > 0 if positive_only]
    beta(step) = beta * min(1, step / warmup) * (remaining / decay  in the last ``decay`` steps)

the full-vocabulary reverse KL from the student to the teacher (the student's logits at
the sampling temperature, the teacher's raw, as the code does), with the gradient through
the student only.

Pure torch: the model passes that produce these inputs are the callers'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ktae.core.advantages import ADVANTAGE_ESTIMATORS, AdvantageBatch
from ktae.core.baselines import SEQUENCE_BASELINES
from ktae.core.policy_loss import aggregate_loss, check_number

SDPO_TEMPLATE = "\n\nCorrect solution:\n\n{solution}\n\nCorrectly solve the original question.\n"
"""SDPO's ``solution_template`` inside its ``reprompt_template`` (``actor.yaml``): the text
around the teaching solution, placed after the prompt."""
TEACHER_CHOICES = ("first", "random", "shortest")
TEACHER_SOURCES = ("group", "reference")
SDPO_IS_CLIP = 2.0
SDPO_ALPHA = 0.5
SDPO_TOPK = 100
SDPO_TEACHER_UPDATE_RATE = 0.05
"""SDPO's default ``teacher_update_rate`` under its default ``teacher_regularization: ema``
(``actor.yaml``); ktae's option ``teacher_update_rate`` defaults to 0 (the current policy)."""
SDPG_BETA = 1e-3
SDPG_KL_CLAMP = 20.0
_LOG_RATIO_CLAMP = 20.0


def check_teacher_options(*, teacher_choice: str = "first", teacher_source: str = "group",
                          teacher_template: str = SDPO_TEMPLATE, teacher_seed: int = 0) -> None:
    """One-line ``ValueError`` naming a bad option of the self-teacher pass."""
    if teacher_choice not in TEACHER_CHOICES:
        raise ValueError(f"teacher_choice: expected one of {', '.join(TEACHER_CHOICES)}, "
                         f"got {teacher_choice!r}")
    if teacher_source not in TEACHER_SOURCES:
        raise ValueError(f"teacher_source: expected one of {', '.join(TEACHER_SOURCES)}, "
                         f"got {teacher_source!r}")
    if not isinstance(teacher_template, str) or teacher_template.count("{solution}") != 1:
        raise ValueError("teacher_template: expected a text holding '{solution}' exactly "
                         f"once, got {teacher_template!r}")
    if isinstance(teacher_seed, bool) or not isinstance(teacher_seed, int):
        raise ValueError(f"teacher_seed: expected an integer, got {teacher_seed!r}")


def ema_update_(teacher, student, rate: float) -> None:
    """SDPO's EMA teacher step, in place, parameter by parameter (``dp_actor.py:
    _update_teacher``, run once after each policy update)::

        theta_teacher <- (1 - rate) * theta_teacher + rate * theta_student

    ``teacher``, ``student``: sequences of tensors of equal shapes; ``rate`` in ``[0, 1]``
    (0 leaves the teacher where it is, 1 copies the student)."""
    rate = check_number(rate, "teacher_update_rate", low=0, high=1)
    teacher, student = list(teacher), list(student)
    if len(teacher) != len(student):
        raise ValueError(f"teacher: expected {len(student)} tensors (one per student "
                         f"parameter), got {len(teacher)}")
    with torch.no_grad():
        for t, s in zip(teacher, student, strict=True):
            t.mul_(1.0 - rate).add_(s.detach().to(device=t.device, dtype=t.dtype), alpha=rate)


def _token(x, name: str, mask: torch.Tensor) -> torch.Tensor:
    if x is None:
        raise ValueError(f"{name}: required by advantage estimator 'sdpo' (the [B, T] "
                         "log-probs of the sampled tokens)")
    x = torch.as_tensor(x, device=mask.device)
    if tuple(x.shape) != tuple(mask.shape):
        raise ValueError(f"{name}: expected shape {tuple(mask.shape)}, got {tuple(x.shape)}")
    if not x.is_floating_point() or not torch.isfinite(torch.where(mask, x, 0)).all():
        raise ValueError(f"{name}: expected finite float log-probs on the real tokens")
    return torch.where(mask, x.detach().to(torch.float64), 0)


@ADVANTAGE_ESTIMATORS.register("sdpo", needs=("mask", "teacher_logprobs", "logprobs"),
                               inputs=("logprobs", "teacher_logprobs"))
def sdpo_advantages(batch: AdvantageBatch, *, logprobs=None, teacher_logprobs=None,
                    lam: float = 0.0, base: str = "grpo", teacher_choice: str = "first",
                    teacher_source: str = "group", teacher_template: str = SDPO_TEMPLATE,
                    teacher_seed: int = 0) -> torch.Tensor:
    """``[B, T]``: ``lam * A_base + (1 - lam) * (teacher_logprobs - logprobs)`` on the real
    tokens (module docstring). Options: ``lam`` in [0, 1] (0: SDPO alone), ``base``
    ("grpo", "drgrpo", "rloo"); the self-teacher pass's ``teacher_choice`` ("first",
    "random", "shortest"), ``teacher_source`` ("group", "reference"), ``teacher_template``
    (holding ``{solution}``) and ``teacher_seed``, read by the caller that computes
    ``teacher_logprobs`` (:mod:`ktae.models.self_teacher`)."""
    lam = check_number(lam, "lam", low=0, high=1)
    if not isinstance(base, str) or base not in SEQUENCE_BASELINES:
        raise ValueError(f"base: expected one of {sorted(SEQUENCE_BASELINES)}, got {base!r}")
    check_teacher_options(teacher_choice=teacher_choice, teacher_source=teacher_source,
                          teacher_template=teacher_template, teacher_seed=teacher_seed)
    if batch.mask is None:
        raise ValueError("mask: required by advantage estimator 'sdpo' (its advantages are "
                         "per token); pass token_ids or mask")
    student = _token(logprobs, "logprobs", batch.mask)
    teacher = _token(teacher_logprobs, "teacher_logprobs", batch.mask)
    seq = SEQUENCE_BASELINES[base](batch.rewards, batch.gid, batch.num_groups).to(torch.float64)
    adv = lam * seq[:, None] + (1 - lam) * (teacher - student)
    return torch.where(batch.mask, adv, 0).to(batch.rewards.dtype)


def sdpo_token_loss(logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor,
                    *, old_logprobs: torch.Tensor | None = None,
                    is_clip: float | None = SDPO_IS_CLIP,
                    aggregation: str = "token-mean",
                    max_response_length: float | None = None) -> torch.Tensor:
    """SDPO's token-level distillation loss (``compute_self_distillation_loss`` with
    ``full_logit_distillation = False``): per token ``(s - q).detach() * s``, times the
    ratio ``min(exp(clamp(s - s_old, +-20)), is_clip)`` (detached; None: no ratio), then
    aggregated over ``mask`` (the real tokens of rows that have a teacher;
    :func:`ktae.core.policy_loss.aggregate_loss`)."""
    per_token = (logprobs - teacher_logprobs).detach() * logprobs
    per_token = _clipped_ratio_times(per_token, logprobs, old_logprobs, is_clip)
    return aggregate_loss(per_token, mask, aggregation, max_response_length)



def _clipped_ratio_times(per_token: torch.Tensor, logprobs: torch.Tensor,
                         old_logprobs: torch.Tensor | None, is_clip: float | None
                         ) -> torch.Tensor:
    """``per_token`` times SDPO's detached importance ratio ``min(exp(clamp(s - s_old,
    +-20)), is_clip)``; unchanged when ``is_clip`` is None."""
    if is_clip is None:
        return per_token
    is_clip = check_number(is_clip, "is_clip", low=0, low_open=True)
    if old_logprobs is None:
        raise ValueError("old_logprobs: required by the importance ratio (is_clip)")
    d = (logprobs - old_logprobs).detach().clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return per_token * d.exp().clamp(max=is_clip)

def topk_with_tail(log_probs: torch.Tensor, index: torch.Tensor, *,
                   add_tail: bool = True) -> torch.Tensor:
    """``[..., k(+1)]``: ``log_probs`` (``[..., V]``, normalised) at ``index`` (``[..., k]``),
    with the log of the remaining mass appended (``add_tail``), else renormalised over
    the k (the code's ``add_tail`` / ``renorm_topk_log_probs``)."""
    top = log_probs.gather(-1, index)
    if not add_tail:
        return top - torch.logsumexp(top, dim=-1, keepdim=True)
    log_s = torch.logsumexp(top, dim=-1, keepdim=True).clamp(max=-1e-7)
    return torch.cat([top, torch.log(-torch.expm1(log_s))], dim=-1)


def sdpo_logit_divergence(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor,
                          *, alpha: float = SDPO_ALPHA) -> torch.Tensor:
    """``[...]``: per position, over the last axis (distributions given as log-probs):
    ``alpha = 0`` KL(teacher || student), ``1`` KL(student || teacher), in between the
    generalised Jensen-Shannon divergence ``lerp(KL(s || m), KL(t || m), alpha)`` with
    ``m = (1 - alpha) s + alpha t`` (the code's three branches)."""
    alpha = check_number(alpha, "alpha", low=0, high=1)
    s, t = student_log_probs, teacher_log_probs

    def kl(p, r):  # KL(p || r) of log-probs, as F.kl_div(r, p, log_target=True).sum(-1)
        return (p.exp() * (p - r)).sum(-1)

    if alpha == 0.0:
        return kl(t, s)
    if alpha == 1.0:
        return kl(s, t)
    a = torch.tensor(alpha, dtype=s.dtype, device=s.device)
    m = torch.logsumexp(torch.stack([s + torch.log(1 - a), t + torch.log(a)]), dim=0)
    return torch.lerp(kl(s, m), kl(t, m), a)


def sdpo_logit_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                    logprobs: torch.Tensor, mask: torch.Tensor, *,
                    old_logprobs: torch.Tensor | None = None, alpha: float = SDPO_ALPHA,
                    topk: int | None = SDPO_TOPK, add_tail: bool = True,
                    is_clip: float | None = SDPO_IS_CLIP, temperature: float = 1.0,
                    aggregation: str = "token-mean",
                    max_response_length: float | None = None) -> torch.Tensor:
    """SDPO's full-logit loss, its authors' default: ``[B, T, V]`` logits of the student
    (with gradient) and the teacher (detached), both divided by ``temperature``; the
    divergence of :func:`sdpo_logit_divergence` over the student's top-``topk`` tokens
    (the teacher's log-probs at the same tokens; None: the whole vocabulary), times the
    ratio of :func:`sdpo_token_loss` on ``logprobs``, aggregated over ``mask``."""
    s = torch.log_softmax(student_logits / temperature, dim=-1)
    t = torch.log_softmax(teacher_logits.detach() / temperature, dim=-1)
    if topk is not None:
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
            raise ValueError(f"topk: expected a positive integer or None, got {topk!r}")
        index = s.detach().topk(min(topk, s.shape[-1]), dim=-1).indices
        s, t = topk_with_tail(s, index, add_tail=add_tail), topk_with_tail(t, index,
                                                                           add_tail=add_tail)
    per_token = sdpo_logit_divergence(s, t, alpha=alpha)
    per_token = _clipped_ratio_times(per_token, logprobs, old_logprobs, is_clip)
    return aggregate_loss(per_token, mask, aggregation, max_response_length)


def sdpg_beta(step: int, total_steps: int, *, beta: float = SDPG_BETA, warmup_steps: int = 0,
              decay_steps: int = 0) -> float:
    """SDPG's coefficient at optimizer step ``step`` (``_compute_effective_beta``): linear
    from 0 over the first ``warmup_steps``, linear to 0 over the last ``decay_steps`` of
    ``total_steps`` (skipped when ``total_steps`` is 0), the two multiplied."""
    beta = check_number(beta, "beta", low=0)
    for value, name in ((warmup_steps, "warmup_steps"), (decay_steps, "decay_steps"),
                        (total_steps, "total_steps"), (step, "step")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: expected a non-negative integer, got {value!r}")
    effective = beta
    if warmup_steps > 0 and step < warmup_steps:
        effective = beta * (step / warmup_steps)
    if decay_steps > 0 and total_steps > 0 and step >= total_steps - decay_steps:
        effective = effective * (max(total_steps - step, 0) / decay_steps)
    return effective


def full_vocab_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, *,
                  temperature: float = 1.0, clamp: float = SDPG_KL_CLAMP) -> torch.Tensor:
    """``[...]``: ``KL(p || q)`` per position over the vocabulary, ``p = softmax(student /
    temperature)`` (with gradient), ``q = softmax(teacher)`` (detached, no temperature, as
    SDPG's code), clamped above at ``clamp``."""
    p_log = torch.log_softmax(student_logits / temperature, dim=-1)
    q_log = torch.log_softmax(teacher_logits.detach(), dim=-1)
    return (p_log.exp() * (p_log - q_log)).sum(-1).clamp(max=clamp)


def sdpg_distill_loss(kl: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                      beta: float, positive_only: bool = False,
                      aggregation: str = "token-mean",
                      max_response_length: float | None = None) -> torch.Tensor:
    """SDPG's distillation term of the loss: ``beta * kl``, on tokens with ``A > 0`` only
    where ``positive_only`` (``beta_distill_positive_advantage_only``), aggregated over
    ``mask`` as the policy loss is. Adding it to the clipped loss of the same aggregation
    gives the code's ``agg(pg_losses + beta_term)``."""
    term = beta * kl
    if positive_only:
        term = term * (advantages > 0).to(term.dtype)
    return aggregate_loss(term, mask, aggregation, max_response_length)


# ------------------------------------------------------------------ the loss terms' settings

KINDS = ("none", "sdpo", "sdpo-token", "sdpg")
_TEACHER = {"teacher_choice": "first", "teacher_template": SDPO_TEMPLATE, "teacher_seed": 0}
OPTIONS = {
    "sdpo": {"coef": 1.0, "alpha": SDPO_ALPHA, "topk": SDPO_TOPK, "add_tail": True,
             "is_clip": SDPO_IS_CLIP, "teacher_update_rate": 0.0, "teacher_source": "group",
             **_TEACHER},
    "sdpo-token": {"coef": 1.0, "is_clip": SDPO_IS_CLIP, "teacher_update_rate": 0.0,
                   "teacher_source": "group", **_TEACHER},
    "sdpg": {"beta": SDPG_BETA, "warmup_steps": 0, "decay_steps": 0, "positive_only": False,
             "teacher_source": "reference", **_TEACHER},
}
"""Each term's options and their defaults (the authors')."""


def _value(text):
    if not isinstance(text, str):
        return text
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@dataclass(frozen=True)
class SelfDistill:
    """A configured term: its kind and its options (:data:`OPTIONS`)."""

    kind: str
    options: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, kind: str, options: dict) -> SelfDistill | None:
        """None for ``"none"``; one-line ``ValueError`` naming a bad kind or option."""
        if kind not in KINDS:
            raise ValueError(f"self_distill: expected one of {', '.join(KINDS)}, got {kind!r}")
        if kind == "none":
            if options:
                raise ValueError("self_distill_options: given without --self-distill")
            return None
        known = OPTIONS[kind]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"self_distill_options: {unknown[0]!r} is not an option of "
                             f"{kind}; expected some of {', '.join(known)}")
        opts = {**known, **{k: _value(v) for k, v in options.items()}}
        check_teacher_options(**{k: opts[k] for k in (*_TEACHER, "teacher_source")})
        for name in ("coef", "beta"):
            if name in opts:
                opts[name] = check_number(opts[name], name, low=0)
        for name in ("alpha", "teacher_update_rate"):
            if name in opts:
                opts[name] = check_number(opts[name], name, low=0, high=1)
        if opts.get("is_clip") is not None and "is_clip" in opts:
            opts["is_clip"] = check_number(opts["is_clip"], "is_clip", low=0, low_open=True)
        if "topk" in opts and opts["topk"] is not None and (
                isinstance(opts["topk"], bool) or not isinstance(opts["topk"], int)
                or opts["topk"] < 1):
            raise ValueError(f"topk: expected a positive integer or none, got {opts['topk']!r}")
        for name in ("add_tail", "positive_only"):
            if name in opts and not isinstance(opts[name], bool):
                raise ValueError(f"{name}: expected true or false, got {opts[name]!r}")
        for name in ("warmup_steps", "decay_steps"):
            if name in opts and (isinstance(opts[name], bool) or not isinstance(opts[name], int)
                                 or opts[name] < 0):
                raise ValueError(f"{name}: expected a non-negative integer, got {opts[name]!r}")
        return cls(kind, opts)
