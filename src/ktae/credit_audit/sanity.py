"""The audit's two sanity rules: reference rows that show the figures measure what they
say, reported beside the credit methods (never among them).

With ``A^G`` GRPO's credit of the response (one value per response) and the audit's token
labels (:mod:`ktae.core.credit_metrics`):

``oracle``
    ``-|A^G|`` on the labelled wrong tokens, ``+|A^G|`` on every other token: the credit
    a rule that knew the labels would give. Blame is exactly 1, lowest exactly 1,
    contamination exactly 0, the mass gap -2 and the scale 1 wherever ``A^G != 0``. Any
    other value means the figures (or the labels' alignment with the tokens) are broken.
``random``
    ``|A^G| z_t`` with ``z_t`` independent standard normal draws, from a CPU generator
    seeded with ``seed`` (in order over the batches of groups), blind to the labels. The
    audit draws it :data:`ktae.credit_audit.run.RANDOM_DRAWS` times: a response's figures
    are their mean over the draws (the rule's expectation: blame 0.5 and lowest the chance
    share), and the intervals resample the draws as well as the groups, so that they hold
    both sources of variance. Blame's interval holds 0.5 unless the figures are biased
    (or in about one audit in twenty).

Both keep GRPO's scale per response, so the mass figures stay comparable with the
methods'.
"""

from __future__ import annotations

import torch

from ktae.core.credit_metrics import WRONG

SANITY_RULES = ("oracle", "random")
"""Names of the sanity rules, in the order they are reported."""


def sanity_credit(rule: str, labels: torch.Tensor, mask: torch.Tensor,
                  reference: torch.Tensor, *, generator: torch.Generator) -> torch.Tensor:
    """``[B, T]`` float64 credit of sanity rule ``rule`` (0 outside ``mask``).

    Args:
        rule: one of :data:`SANITY_RULES`.
        labels: ``[B, T]`` int token labels (:data:`ktae.core.credit_metrics.WRONG`, ...).
        mask: ``[B, T]`` bool, the responses' real tokens.
        reference: ``[B, T]`` GRPO's credit on the same responses.
        generator: the draws of ``random``.
    """
    mask = mask.bool()
    size = torch.where(mask, reference.double().abs(), 0.0).amax(dim=1, keepdim=True)
    if rule == "oracle":
        credit = torch.where(labels == WRONG, -size, size)
    elif rule == "random":
        credit = size * torch.randn(labels.shape, generator=generator, dtype=torch.float64)
    else:
        raise ValueError(f"rule: expected one of {', '.join(SANITY_RULES)}, got {rule!r}")
    return torch.where(mask, credit, 0.0)
