"""How the trainer turns the policy's last hidden states into per-token log-probabilities.

TRL 1.16 computes every policy pass's log-probabilities (and entropies) with a fused LM
head (``trl.trainer.utils.add_fused_lm_head``): the vocabulary projection runs in tiles
and is recomputed in the backward pass, so the ``[rows, length, vocab]`` logits never
exist at once. On a GPU, with Triton, it scores only the completion positions. Without
Triton (on the CPU) it projects *every* position, prompt included, and folds each tile
into its statistics with a dozen elementwise torch passes, forward and backward.

The ``full`` head asks the model's own forward for the logits of the completion
positions only (``logits_to_keep``) and takes one ``log_softmax`` of them: one projection
of the tokens that are scored, no recomputation. It holds the micro-batch's logits, so it
is chosen (``auto``) on the CPU while they fit in :data:`FULL_LOGITS_BUDGET`; elsewhere,
or for a model whose forward takes no ``logits_to_keep``, TRL's head runs unchanged.
docs/step-time.md measures both.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext

import torch

from ktae.core.entropy import categorical_entropy
from ktae.runs.config import LOGPROB_HEADS as HEADS

FULL_LOGITS_BUDGET = 1 << 30
"""Bytes of one micro-batch's float32 completion logits up to which ``auto`` holds them."""


def check_head(head: str) -> str:
    if head not in HEADS:
        raise ValueError(f"logprob_head: expected one of {', '.join(HEADS)}, got {head!r}")
    return head


def takes_logits_to_keep(model) -> bool:
    """Whether the (PEFT-unwrapped) model's forward accepts ``logits_to_keep``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(type(base).forward).parameters


def choose_head(head: str, device: torch.device, rows: int, length: int, vocab: int) -> str:
    """The head a pass over ``rows`` x ``length`` scored positions runs (``full`` or
    ``chunked``)."""
    if check_head(head) != "auto":
        return head
    if device.type != "cpu":
        return "chunked"
    return "full" if rows * length * vocab * 4 <= FULL_LOGITS_BUDGET else "chunked"


def full_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               logits_to_keep: int, temperature: float, *, compute_entropy: bool,
               entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities ``[rows, logits_to_keep]`` of the last ``logits_to_keep``
    tokens of ``input_ids`` under ``model`` at ``temperature``, and their entropies
    (``compute_entropy``; with gradients only when ``entropy_grad``). Positions whose
    ``attention_mask`` is 0 (padding) get 0 for both, as in TRL's head."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   logits_to_keep=logits_to_keep + 1, use_cache=False).logits
    # position t's logits predict token t + 1: the last kept position predicts nothing
    logits = logits[:, :-1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    del logits
    targets = input_ids[:, -logits_to_keep:]
    padding = attention_mask[:, -logits_to_keep:] == 0
    per_token = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).masked_fill(padding, 0.0)
    entropy = None
    if compute_entropy:
        with nullcontext() if entropy_grad else torch.no_grad():
            entropy = categorical_entropy(logp).masked_fill(padding, 0.0)
    return per_token, entropy
