"""The trainer's self-distillation loss terms: SDPO's distillation loss, SDPG's KL term.

``ktae train --self-distill sdpo|sdpo-token|sdpg`` (docs/method.md §17). At rollout time
each row's privileged prompt is built once (:func:`teacher_prompts`: the row's prompt, the
template and a right response of its group or its reference solution) and kept in the
batch (:data:`TEACHER_KEYS`). At each loss pass the trainer runs the current policy, no
gradient, over ``privileged prompt + response`` (the teacher's ``[b, T, V]`` logits) and the
policy once more, with gradient, over ``prompt + response`` (the student's logits), and
adds the term (:func:`distill_term`) to TRL's loss. The whole teacher distribution is
needed per token (SDPG's full-vocabulary KL, SDPO's top-k), so it is computed here, a
micro-batch at a time, never stored: a rollout-time need would hold ``b * T * V`` floats
per batch (V: the whole vocabulary).
"""

from __future__ import annotations

import contextlib

import torch

from ktae.core.self_distill import (
    SelfDistill,
    full_vocab_kl,
    sdpg_beta,
    sdpg_distill_loss,
    sdpo_logit_loss,
    sdpo_token_loss,
)
from ktae.models.self_teacher import choose_teachers, solution_tokens

TEACHER_IDS, TEACHER_MASK, HAS_TEACHER = ("ktae_teacher_prompt_ids", "ktae_teacher_prompt_mask",
                                          "ktae_has_teacher")
TEACHER_KEYS = (TEACHER_IDS, TEACHER_MASK, HAS_TEACHER)
"""The batch keys the rollout adds: ``[b, P']`` left-padded privileged prompts, their
mask, and ``[b]`` whether a row has a teacher."""

def teacher_prompts(settings: SelfDistill, tokenizer, prompt_ids: torch.Tensor,
                    prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                    completion_mask: torch.Tensor, *, correct: torch.Tensor,
                    group: torch.Tensor, rows: list[dict]) -> dict:
    """The :data:`TEACHER_KEYS` tensors of a generated batch (module docstring): each row's
    privileged prompt (:mod:`ktae.models.self_teacher`), left-padded; a row without a teacher
    keeps its own prompt and ``has_teacher`` False."""
    o = settings.options
    before_text, _, after_text = o["teacher_template"].partition("{solution}")

    def enc(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    before, after = enc(before_text), enc(after_text)
    b = completion_ids.shape[0]
    if o["teacher_source"] == "group":
        teachers = choose_teachers(correct, group, completion_mask.sum(dim=1),
                                   choose=o["teacher_choice"], seed=o["teacher_seed"])
        drop = {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
        solutions = [None if j < 0 else solution_tokens(completion_ids, completion_mask, j, drop)
                     for j in teachers.tolist()]
    else:
        solutions = [None if not row.get("solution") else enc(str(row["solution"]))
                     for row in rows]
    contexts, has = [], []
    for i in range(b):
        own = prompt_ids[i][prompt_mask[i].bool()].tolist()
        has.append(solutions[i] is not None)
        contexts.append(own + before + solutions[i] + after if has[-1] else own)
    P = max(len(c) for c in contexts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((b, P), pad, dtype=torch.long)
    mask = torch.zeros(b, P, dtype=torch.long)
    for i, c in enumerate(contexts):
        ids[i, P - len(c):] = torch.tensor(c, dtype=torch.long)
        mask[i, P - len(c):] = 1
    device = prompt_ids.device
    return {TEACHER_IDS: ids.to(device), TEACHER_MASK: mask.to(device),
            HAS_TEACHER: torch.tensor(has, device=device)}


def completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask
                      ) -> torch.Tensor:
    """``[b, T, V]`` the logits that predict each completion token (positions counted from
    the first real prompt token)."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attn = torch.cat([prompt_mask, completion_mask], dim=1).long()
    pos = (attn.cumsum(dim=1) - 1).clamp_min(0)
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    return model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1:P + T - 1]


AGGREGATION = {"grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm"}
"""The aggregation of the term under each TRL ``loss_type`` (others: ``token-mean``)."""


def distill_term(settings: SelfDistill, model, inputs: dict, *, temperature: float,
                 loss_type: str, step: int, total_steps: int,
                 teacher=None) -> tuple[torch.Tensor, dict]:
    """The term for one micro-batch (module docstring) and its metrics: the teacher's
    logits without gradient, then the student's with it, the kind's loss (:mod:`ktae.core.
    self_distill`), aggregated as the policy loss is (:data:`AGGREGATION`): SDPO's over the
    real tokens of the rows with a teacher, SDPG's over every real token (its KL 0 on rows
    without one), as the authors' codes do. ``teacher``: a context manager factory under
    which ``model`` is the teacher (:meth:`ktae.train.ema_teacher.EmaTeacher.applied`);
    None: the current policy."""
    o = settings.options
    ids, cmask = inputs["completion_ids"], inputs["completion_mask"]
    has = inputs[HAS_TEACHER].bool()
    mask = cmask.bool() & has[:, None]
    with torch.no_grad(), (teacher(model) if teacher is not None else contextlib.nullcontext()):
        t = completion_logits(model, inputs[TEACHER_IDS], inputs[TEACHER_MASK], ids, cmask).float()
    z = completion_logits(model, inputs["prompt_ids"], inputs["prompt_mask"], ids, cmask).float()
    logp = torch.log_softmax(z / temperature, dim=-1).gather(-1, ids[..., None]).squeeze(-1)
    old = inputs.get("old_per_token_logps")
    old = logp.detach() if old is None else old
    aggregation = AGGREGATION.get(loss_type, "token-mean")
    extra = {"max_response_length": ids.shape[1]} if aggregation.endswith("norm") else {}
    metrics = {"teacher_row_fraction": has.float().mean().item()}
    if settings.kind == "sdpo":
        term = sdpo_logit_loss(z, t, logp, mask, old_logprobs=old, alpha=o["alpha"],
                               topk=o["topk"], add_tail=o["add_tail"], is_clip=o["is_clip"],
                               temperature=temperature, aggregation=aggregation, **extra)
        term = o["coef"] * term
    elif settings.kind == "sdpo-token":
        q = torch.log_softmax(t / temperature, -1).gather(-1, ids[..., None]).squeeze(-1)
        term = o["coef"] * sdpo_token_loss(logp, q, mask, old_logprobs=old,
                                           is_clip=o["is_clip"], aggregation=aggregation,
                                           **extra)
    else:
        beta = sdpg_beta(step, total_steps, beta=o["beta"], warmup_steps=o["warmup_steps"],
                         decay_steps=o["decay_steps"])
        kl = torch.where(mask, full_vocab_kl(z, t, temperature=temperature), 0)
        adv = inputs["advantages"]
        adv = adv[:, None].expand_as(kl) if adv.dim() == 1 else adv
        term = sdpg_distill_loss(kl, adv, cmask.bool(), beta=beta,
                                 positive_only=o["positive_only"], aggregation=aggregation,
                                 **extra)
        metrics["beta_effective"] = beta
        metrics["kl_distill"] = (kl.detach().sum() / mask.sum().clamp_min(1)).item()
    metrics["self_distill_term"] = term.detach().item()
    return term, metrics
