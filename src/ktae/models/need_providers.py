"""How the trainer computes each need from the policy on a rollout batch.

Each function is the :attr:`ktae.core.needs.Need.provider` of one need: it takes the
batch under the policy that generated it (:class:`ktae.core.needs.ModelResponses`) and
returns the need's ``[b, T]`` value, detached. The log-probs and the entropies come from
the caller's one pass of the policy, shared.
"""

from __future__ import annotations

import torch

from ktae.core.needs import ModelResponses
from ktae.models.input_grad_importance import answer_tokens, response_importance


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
