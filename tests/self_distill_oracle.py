# Copyright 2024 Bytedance Ltd. and/or its affiliates
# Copyright 2022 The HuggingFace Team. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ruff: noqa: E501, B905  (the authors' lines, kept as written)
"""The SDPO and SDPG authors' own functions, for parity tests (docs/method.md §17).

Copied from the authors' released verl forks (Apache License 2.0, header above):

* SDPO, github.com/lasgroup/SDPO at commit 0e6d5106abe69f578c63bf38a9394e22905c8773,
  ``verl/trainer/ppo/core_algos.py``: ``compute_self_distillation_loss`` (with its nested
  ``add_tail`` and ``renorm_topk_log_probs``) and ``agg_loss``'s ``token-mean`` branch;
  ``verl/workers/actor/dp_actor.py``: the EMA step of ``DataParallelPPOActor._update_teacher``
  (as ``update_teacher``, its config reads replaced by the ``update_rate`` argument);
* SDPG, github.com/lauyikfung/SDPG at commit f71329ee8a69b6778c2083958872ff8ca425ddde,
  ``verl/trainer/ppo/core_algos.py``: ``_compute_effective_beta`` and
  ``compute_sdpg_loss``; ``verl/workers/actor/dp_actor.py``: the per-token KL of
  ``_compute_kl_distill_micro_batch`` (its ``_kl_entropy_fn`` and the clamp at 20).

Changes, all outside the arithmetic: verl's ``masked_sum``/``masked_mean`` inlined; the
configs are plain attribute objects (``SimpleNamespace``) instead of verl's dataclasses,
so the ``isinstance(config, ActorConfig)`` assertion and ``global_batch_info`` are left
out; metrics are dropped.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def masked_sum(values, mask):
    return (values * mask).sum()


def masked_mean(values, mask):
    return (values * mask).sum() / (mask.sum() + 1e-8)


def agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None):
    assert loss_agg_mode == "token-mean"
    if batch_num_tokens is None:
        batch_num_tokens = loss_mask.sum()
    return masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size


# ---------------------------------------------------------------- SDPO (lasgroup/SDPO)


def update_teacher(teacher_module, actor_module, update_rate: float) -> None:
    if update_rate == 0.0:
        return
    if teacher_module is None or teacher_module is actor_module:
        raise ValueError("EMA teacher requires a separate teacher_module in the actor worker.")
    with torch.no_grad():
        for teacher_param, student_param in zip(
            teacher_module.parameters(),
            actor_module.parameters(),
        ):
            student_data = student_param.data.to(device=teacher_param.device)
            teacher_param.data.mul_(1.0 - update_rate).add_(student_data, alpha=update_rate)


def compute_self_distillation_loss(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    self_distillation_config: Any,
    old_log_probs: torch.Tensor | None = None,
    student_all_log_probs: torch.Tensor | None = None,
    teacher_all_log_probs: torch.Tensor | None = None,
    student_topk_log_probs: torch.Tensor | None = None,
    teacher_topk_log_probs: torch.Tensor | None = None,
    self_distillation_mask: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
):
    loss_mask = response_mask
    if self_distillation_mask is not None:
        loss_mask = loss_mask * self_distillation_mask.unsqueeze(1)

    if self_distillation_config.full_logit_distillation:
        use_topk = self_distillation_config.distillation_topk is not None
        if use_topk:

            def add_tail(log_probs: torch.Tensor) -> torch.Tensor:
                log_s = torch.logsumexp(log_probs, dim=-1, keepdim=True)
                log_s = torch.clamp(log_s, max=-1e-7)
                tail_log = torch.log(-torch.expm1(log_s))
                return torch.cat([log_probs, tail_log], dim=-1)

            def renorm_topk_log_probs(logp: torch.Tensor) -> torch.Tensor:
                logZ = torch.logsumexp(logp, dim=-1, keepdim=True)
                return logp - logZ

            student_distill_log_probs = student_topk_log_probs
            teacher_distill_log_probs = teacher_topk_log_probs
            if self_distillation_config.distillation_add_tail:
                student_distill_log_probs = add_tail(student_distill_log_probs)
                teacher_distill_log_probs = add_tail(teacher_distill_log_probs)
            else:
                student_distill_log_probs = renorm_topk_log_probs(student_distill_log_probs)
                teacher_distill_log_probs = renorm_topk_log_probs(teacher_distill_log_probs)
        else:
            student_distill_log_probs = student_all_log_probs
            teacher_distill_log_probs = teacher_all_log_probs

        if self_distillation_config.alpha == 0.0:
            kl_loss = F.kl_div(
                student_distill_log_probs, teacher_distill_log_probs, reduction="none", log_target=True
            )
        elif self_distillation_config.alpha == 1.0:
            kl_loss = F.kl_div(
                teacher_distill_log_probs, student_distill_log_probs, reduction="none", log_target=True
            )
        else:
            alpha = torch.tensor(
                self_distillation_config.alpha,
                dtype=student_distill_log_probs.dtype,
                device=student_distill_log_probs.device,
            )
            mixture_log_probs = torch.logsumexp(
                torch.stack([student_distill_log_probs + torch.log(1 - alpha),
                             teacher_distill_log_probs + torch.log(alpha)]),
                dim=0,
            )
            kl_teacher = F.kl_div(mixture_log_probs, teacher_distill_log_probs, reduction="none", log_target=True)
            kl_student = F.kl_div(mixture_log_probs, student_distill_log_probs, reduction="none", log_target=True)
            kl_loss = torch.lerp(kl_student, kl_teacher, alpha)

        per_token_loss = kl_loss.sum(-1)
    else:
        assert self_distillation_config.alpha == 1.0, "Only reverse KL is supported for non-full-logit distillation"
        log_ratio = student_log_probs - teacher_log_probs
        per_token_loss = log_ratio.detach() * student_log_probs

    is_clip = self_distillation_config.is_clip
    if is_clip is not None:
        negative_approx_kl = (student_log_probs - old_log_probs).detach()
        negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
        ratio = torch.exp(negative_approx_kl).clamp(max=is_clip)
        per_token_loss = per_token_loss * ratio

    if rollout_is_weights is not None:
        per_token_loss = per_token_loss * rollout_is_weights

    loss = agg_loss(
        loss_mat=per_token_loss,
        loss_mask=loss_mask,
        loss_agg_mode=loss_agg_mode,
        batch_num_tokens=loss_mask.sum().clamp(min=1.0),
    )
    return loss


# ---------------------------------------------------------------- SDPG (lauyikfung/SDPG)


def _compute_effective_beta(beta: float, current_step: int, total_steps: int,
                            warmup_steps: int, decay_steps: int) -> float:
    effective = beta
    # Warmup: 0 → beta over first warmup_steps steps
    if warmup_steps > 0 and current_step < warmup_steps:
        effective = beta * (current_step / warmup_steps)
    # Decay: beta → 0 over last decay_steps steps
    if decay_steps > 0 and total_steps > 0:
        decay_start = total_steps - decay_steps
        if current_step >= decay_start:
            remaining = max(total_steps - current_step, 0)
            effective = effective * (remaining / decay_steps)
    return effective


def sdpg_kl_per_token(actor_logits: torch.Tensor, teacher_logits: torch.Tensor,
                      temperature: float) -> torch.Tensor:
    """``_compute_kl_distill_micro_batch`` after its two forward passes: the teacher's
    ``log_softmax`` (no temperature), the actor's logits divided by the temperature,
    ``_kl_entropy_fn`` and ``kl_trimmed.clamp(max=20.0)``."""
    with torch.no_grad():
        teacher_log_softmax = F.log_softmax(teacher_logits, dim=-1)
    if temperature != 1.0:
        actor_logits = actor_logits / temperature

    def _kl_entropy_fn(a_logits, t_log_soft):
        a_log_soft = F.log_softmax(a_logits, dim=-1)
        a_probs = a_log_soft.exp()
        entropy = -(a_probs * a_log_soft).sum(-1)
        kl = (a_probs * (a_log_soft - t_log_soft)).sum(-1)
        return kl, entropy

    kl_trimmed, _ = _kl_entropy_fn(actor_logits, teacher_log_softmax)
    return kl_trimmed.clamp(max=20.0)


def compute_sdpg_loss(old_log_prob, log_prob, kl_distill_per_token, advantages, response_mask,
                      loss_agg_mode="token-mean", config=None, rollout_is_weights=None,
                      rollout_log_prob=None, current_step=0, total_steps=0):
    clip_base = rollout_log_prob if rollout_log_prob is not None else old_log_prob
    negative_approx_kl = torch.clamp(log_prob - clip_base, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)

    clip_ratio_low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    clip_ratio_high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    clip_ratio_c = config.clip_ratio_c

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)

    pg_losses3 = -advantages * clip_ratio_c
    pg_losses = torch.where(advantages < 0, torch.min(pg_losses3, clip_pg_losses1), clip_pg_losses1)

    logw = log_prob - old_log_prob
    inverse_w = torch.exp(-logw)

    alpha = config.policy_loss.alpha
    kl_mode = config.policy_loss.kl_mode

    beta_base = config.policy_loss.beta
    beta = _compute_effective_beta(beta_base, current_step, total_steps,
                                   config.policy_loss.beta_warmup_steps,
                                   config.policy_loss.beta_decay_steps)

    beta_term = beta * kl_distill_per_token

    if config.policy_loss.beta_distill_positive_advantage_only:
        beta_term = beta_term * (advantages > 0).float()

    if kl_mode == "fkl":
        pg_losses = pg_losses + beta_term + alpha * inverse_w
    elif kl_mode == "rkl":
        pg_losses = pg_losses + beta_term + (alpha / 2) * (logw + 1) ** 2
    elif kl_mode == "ufkl":
        pg_losses = pg_losses + beta_term + alpha * (inverse_w + logw)
    elif kl_mode == "urkl":
        pg_losses = pg_losses + beta_term + (alpha / 2) * logw ** 2
    else:
        raise ValueError(f"Unknown kl_mode: {kl_mode}. Choose from fkl, rkl, ufkl, urkl")

    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights

    return agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)
