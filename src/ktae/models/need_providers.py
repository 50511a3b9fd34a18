"""How the trainer computes each need from the policy on a rollout batch.

Each function is the :attr:`ktae.core.needs.Need.provider` of one need: it takes the
batch under the policy that generated it (:class:`ktae.core.needs.ModelResponses`) and
returns the need's ``[b, T]`` value, detached. The log-probs and the entropies come from
the caller's one pass of the policy, shared.
"""

from __future__ import annotations

import torch

from ktae.core.needs import ModelResponses
from ktae.core.self_distill import SDPO_TEMPLATE
from ktae.models.input_grad_importance import answer_tokens, response_importance
from ktae.models.self_teacher import teacher_logprobs as self_teacher_logprobs
from ktae.models.token_grad_proxy import response_token_grad_proxy

TEACHER_OPTIONS = {"teacher_choice": ("choose", "first"), "teacher_source": ("source", "group"),
                   "teacher_template": ("template", SDPO_TEMPLATE), "teacher_seed": ("seed", 0)}
"""The method options the self-teacher pass reads: option -> (its keyword, default)."""


def policy_logprobs(responses: ModelResponses) -> torch.Tensor:
    """``[b, T]`` the generating policy's log-probs of the response tokens (need
    ``logprobs``)."""
    return responses.policy_scores()[0].detach()


def policy_entropies(responses: ModelResponses) -> torch.Tensor:
    """``[b, T]`` the generating policy's next-token entropies (need ``entropies``)."""
    return responses.policy_scores()[1].detach()


def input_grad_importance(responses: ModelResponses) -> torch.Tensor:
    """``[b, T]`` input-gradient importance of each response token under the policy (need
    ``input_grad_importance``: :func:`ktae.models.input_grad_importance.
    response_importance`), the answer being each row's reference ``answer``, the noise from
    ``responses.generator``."""
    try:
        conclusion, answers = answer_tokens(responses.tokenizer,
                                            [row.get("answer") for row in responses.rows])
    except ValueError as err:
        raise ValueError("needs each prompt's reference answer (dataset column 'answer'): "
                         f"{err}") from None
    return response_importance(responses.model, responses.prompt_ids, responses.prompt_mask,
                               responses.completion_ids, responses.completion_mask, answers,
                               responses.tokenizer.pad_token_id, conclusion=conclusion,
                               generator=responses.generator).detach()


def teacher_logprobs(responses: ModelResponses) -> torch.Tensor:
    """``[b, T]`` the policy's log-probs of each response token after its privileged
    context (need ``teacher_logprobs``: :func:`ktae.models.self_teacher.teacher_logprobs`),
    the own-context log-probs where no teacher exists. Options from the method's
    (:data:`TEACHER_OPTIONS`); the reference solutions from each row's ``solution``."""
    kw = {key: responses.options.get(option, default)
          for option, (key, default) in TEACHER_OPTIONS.items()}
    references = None
    if kw["source"] == "reference":
        references = [row.get("solution") for row in responses.rows]
    out, _ = self_teacher_logprobs(
        responses.model, responses.tokenizer, responses.prompt_ids, responses.prompt_mask,
        responses.completion_ids, responses.completion_mask, correct=responses.correct,
        group=responses.group, student_logprobs=responses.policy_scores()[0],
        references=references, temperature=responses.temperature, **kw)
    return out.detach()


def token_grad_proxy(responses: ModelResponses) -> torch.Tensor:
    """``[b, T, H]`` DelTA's token-gradient proxy ``(1 - p) h`` of each response token under
    the generating policy, at the sampling temperature (need ``token_grad_proxy``:
    :func:`ktae.models.token_grad_proxy.response_token_grad_proxy`)."""
    return response_token_grad_proxy(
        responses.model, responses.prompt_ids, responses.prompt_mask,
        responses.completion_ids, responses.completion_mask,
        temperature=responses.temperature).detach()
