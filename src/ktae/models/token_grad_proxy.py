"""DelTA's last-layer token-gradient proxy ``(1 - p) h`` from a causal LM.

``h`` is the input of the model's output head (its last-layer hidden state after the final
norm) at the position that predicts the token, ``p`` the token's probability at the
sampling temperature; both from one no-grad pass, as the authors' ``_forward_micro_batch_with_h``
(github.com/RUCBM/DelTA, ``verl-DelTA/verl/workers/actor/dp_actor.py``) reads ``h`` with a
forward pre-hook on ``lm_head``. The arithmetic is :func:`ktae.core.delta_credit.token_grad_proxy`.
"""

from __future__ import annotations

import torch

from ktae.core.delta_credit import token_grad_proxy
from ktae.core.policy_loss import check_number

ROWS_PER_PASS = 8
"""Rows of the batch in one forward pass."""


def response_token_grad_proxy(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                              completion_ids: torch.Tensor, completion_mask: torch.Tensor, *,
                              temperature: float = 1.0,
                              rows_per_pass: int = ROWS_PER_PASS) -> torch.Tensor:
    """``[b, T, H]`` float32 ``(1 - p) h`` of each response token, 0 on padding.

    ``prompt_ids``/``prompt_mask``: ``[b, P]``, left-padded; ``completion_ids``/
    ``completion_mask``: ``[b, T]``, right-padded. No gradient; ``rows_per_pass`` rows at a
    time. Positions are counted from each row's first real token.
    """
    temperature = check_number(temperature, "temperature", low=0, low_open=True)
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError("model: expected a causal LM with an output head "
                         "(get_output_embeddings() is None)")
    captured: list[torch.Tensor] = []
    hook = head.register_forward_pre_hook(lambda _m, args: captured.append(args[0].detach()))
    b, P = prompt_ids.shape
    T = completion_ids.shape[1]
    device = next(model.parameters()).device
    parts = []
    try:
        with torch.no_grad():
            for start in range(0, b, rows_per_pass):
                sl = slice(start, min(start + rows_per_pass, b))
                ids = torch.cat([prompt_ids[sl], completion_ids[sl]], dim=1).to(device)
                attn = torch.cat([prompt_mask[sl], completion_mask[sl]], dim=1).long().to(device)
                pos = (attn.cumsum(dim=1) - 1).clamp_min(0)
                captured.clear()
                logits = model(input_ids=ids, attention_mask=attn,
                               position_ids=pos).logits[:, P - 1:P + T - 1].float()
                if len(captured) != 1:
                    raise ValueError("model: its output head ran "
                                     f"{len(captured)} times in one pass, expected once")
                h = captured[0][:, P - 1:P + T - 1].float()
                logp = torch.log_softmax(logits / temperature, dim=-1)
                tok = logp.gather(-1, ids[:, P:, None]).squeeze(-1)
                mask = completion_mask[sl].bool().to(device)
                parts.append(token_grad_proxy(h, tok, mask))
    finally:
        hook.remove()
    return torch.cat(parts).to(completion_ids.device)
