"""The entropy of a next-token distribution from its log-probabilities.

``H = -sum_v p_v log p_v`` with ``0 log 0 = 0``. A model may give some vocabulary entries a
logit of ``-inf`` (a masked vocabulary, a banned token): their log-probability is ``-inf``
and their probability 0, and the plain product ``p * logp`` is ``0 * -inf = NaN``, which
would make the entropy, and every rule that reads it, NaN. Here such an entry adds 0, to
the value and to the gradient. Every entropy ktae computes from a model's logits goes
through :func:`categorical_entropy` (the trainer's full log-prob head, ``ktae explain``'s
scoring).
"""

from __future__ import annotations

import torch


def categorical_entropy(logp: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``-sum(p * logp)`` over ``dim``, ``p = exp(logp)``, with ``0 log 0 = 0``.

    Args:
        logp: log-probabilities (a ``log_softmax``); ``-inf`` marks an impossible entry.
        dim: the dimension of the categories.

    Returns:
        The entropies, ``logp`` with ``dim`` removed: finite wherever each distribution has
        a finite log-probability. Under autograd (``logp`` requires a gradient) the
        gradient is finite too: ``-inf`` entries are replaced by 0 inside the product,
        which costs one more ``logp``-sized buffer; without autograd the product is taken
        in place, so the peak holds ``logp``, ``p`` and a boolean mask.

    Example:
        >>> import torch
        >>> logp = torch.log_softmax(torch.tensor([0.0, 0.0, float("-inf")]), dim=-1)
        >>> categorical_entropy(logp)  # log 2
        tensor(0.6931)
    """
    p = logp.exp()
    if logp.requires_grad and torch.is_grad_enabled():
        return -(p * torch.where(torch.isneginf(logp), 0.0, logp)).sum(dim)
    return -p.mul_(logp).masked_fill_(torch.isneginf(logp), 0.0).sum(dim)
