"""How the trainer turns the policy's last hidden states into per-token log-probabilities.

TRL 1.16 computes every policy pass's log-probabilities (and entropies) with a fused LM
head (``trl.trainer.utils.add_fused_lm_head``): the vocabulary projection runs in tiles
and is recomputed in the backward pass, so the ``[rows, length, vocab]`` logits never
exist at once. On a GPU, with Triton, it scores only the completion positions. Without
Triton (on the CPU) it projects *every* position, prompt included, and folds each tile
into its statistics with a dozen elementwise torch passes, forward and backward.

The ``full`` head asks the model's own forward for the logits of the completion
positions only (``logits_to_keep``) and takes one ``log_softmax`` of them: one projection
of the tokens that are scored, no recomputation. It holds several tensors of the size of
the micro-batch's logits at once (:func:`full_head_peak_bytes`), so it is chosen
(``auto``) on the CPU while that peak fits in :data:`FULL_HEAD_BUDGET`; elsewhere, or for
a model whose forward takes no ``logits_to_keep``, TRL's head runs unchanged.
docs/step-time.md measures both.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext

import torch

from ktae.core.entropy import categorical_entropy
from ktae.runs.config import LOGPROB_HEADS as HEADS

FULL_HEAD_BUDGET = 1 << 30
"""Bytes of the full head's peak (:func:`full_head_peak_bytes`) up to which ``auto`` runs it."""

PEAK_LOGITS_TENSORS = {"no_grad": 2.25, "grad": 3.0, "entropy_grad": 5.25}
"""The full head's peak in float32 logits tensors (a boolean mask counts a quarter), by pass:

* ``no_grad`` (the old-policy and reference passes): the log-softmax, the probabilities and
  the mask of ``-inf`` entries while the entropy is taken in place (before it, the logits
  and their copy divided by the temperature: 2);
* ``grad`` (a pass with gradients whose entropy has none), through the backward pass: the
  saved log-softmax, its gradient (the gather's) and the gradient of the logits;
* ``entropy_grad`` (a pass whose entropy keeps its gradient, as the trainer's policy pass
  asks): the forward pass keeps the log-softmax, the probabilities and the product's other
  factor for the backward pass, which adds their gradients.

``tests/test_logprob_head.py`` measures each against the estimate.
"""


def check_head(head: str) -> str:
    if head not in HEADS:
        raise ValueError(f"logprob_head: expected one of {', '.join(HEADS)}, got {head!r}")
    return head


def takes_logits_to_keep(model) -> bool:
    """Whether the (PEFT-unwrapped) model's forward accepts ``logits_to_keep``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(type(base).forward).parameters


def full_head_peak_bytes(rows: int, length: int, vocab: int, *, grad: bool = True,
                         entropy_grad: bool = False) -> int:
    """The most memory :func:`full_logps` holds at once, in bytes, for ``rows`` x ``length``
    scored positions of a ``vocab``-sized vocabulary: :data:`PEAK_LOGITS_TENSORS` tensors
    of ``rows x (length + 1) x vocab`` float32 (the model's forward returns one position
    more). ``grad``: a pass with gradients, counted through its backward pass;
    ``entropy_grad``: the entropy keeps its gradient too."""
    kind = "entropy_grad" if grad and entropy_grad else "grad" if grad else "no_grad"
    return int(PEAK_LOGITS_TENSORS[kind] * rows * (length + 1) * vocab * 4)


def choose_head(head: str, device: torch.device, rows: int, length: int, vocab: int, *,
                grad: bool = True, entropy_grad: bool = False) -> str:
    """The head a pass over ``rows`` x ``length`` scored positions runs (``full`` or
    ``chunked``); ``auto``: ``full`` on the CPU while its peak (:func:`full_head_peak_bytes`
    with ``grad`` and ``entropy_grad``) fits in :data:`FULL_HEAD_BUDGET`."""
    if check_head(head) != "auto":
        return head
    if device.type != "cpu":
        return "chunked"
    peak = full_head_peak_bytes(rows, length, vocab, grad=grad, entropy_grad=entropy_grad)
    return "full" if peak <= FULL_HEAD_BUDGET else "chunked"


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
