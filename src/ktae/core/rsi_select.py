"""RSI-S: only tokens whose Relative Surprisal Index lies in a stable band stay in the loss.

Lv et al. (2026), "Which Tokens Matter? Adaptive Token Selection for RLVR with the
Relative Surprisal Index", arXiv 2606.31575 (docs/method.md §18). With ``p_t`` the current
policy's probability of the sampled token and ``H_t`` the entropy of its next-token
distribution, both detached::

    s_t   = -log p_t                              (surprisal of the sampled token)
    RSI_t = s_t / max(H_t, eps)                   (Relative Surprisal Index, eps = 1e-8)
    keep_t = rsi_min <= RSI_t <= rsi_max          (RSI Selection, RSI-S)

Dividing by the entropy makes the band entropy-adaptive: a token stays when its surprisal
lies between ``rsi_min * H_t`` and ``rsi_max * H_t``, so the same surprisal is kept at an
uncertain position and dropped at a confident one. Below the band are redundant,
unsurprising tokens; above it the unstable tail of very unlikely ones. Every real token is
judged, whatever its advantage's sign; removed tokens leave ``loss_mask`` (weight 0), so
the token mean runs over the kept ones.

The formula and the band follow the paper's abstract and a third-party implementation
(defaults ``rsi_min = 0.1``, ``rsi_max = 3.0`` and the entropy floor ``eps = 1e-8`` are
that implementation's); the paper's full text is not among the sources read, and
docs/method.md §18 says what that leaves unchecked.

Degenerate input: a position with ``H_t = 0`` (a one-hot distribution) has ``RSI_t = 0``
when the sampled token has ``p_t = 1`` (removed as redundant when ``rsi_min > 0``) and a
huge ``RSI_t`` otherwise (removed as tail). A surprisal below 0 (``logp`` rounding above 0)
counts as 0.
"""

from __future__ import annotations

import torch

from ktae.core.calibration_rules import CALIBRATIONS, RuleResult, masked_mean, require_entropies
from ktae.core.policy_loss import check_number

RSI_MIN = 0.1
RSI_MAX = 3.0
RSI_ENTROPY_FLOOR = 1e-8


def relative_surprisal_index(logprobs: torch.Tensor, entropies: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` float64: ``RSI = max(-logp, 0) / max(H, 1e-8)`` (docs/method.md §18)."""
    surprisal = (-logprobs.to(torch.float64)).clamp_min(0)
    return surprisal / entropies.to(torch.float64).clamp_min(RSI_ENTROPY_FLOOR)


@CALIBRATIONS.register("rsi-s", needs=("entropies",))
def rsi_selection(adv, *, logprobs, entropies, old_logprobs=None, mask, generator=None,
                  rsi_min: float = RSI_MIN, rsi_max: float = RSI_MAX) -> RuleResult:
    """RSI-S: keep the real tokens with ``rsi_min <= RSI <= rsi_max`` in the loss.

    Options ``rsi_min >= 0`` (0.1) and ``rsi_max > rsi_min`` (3.0), both finite.
    ``flagged`` marks the removed tokens. Metrics (fractions of the real tokens):
    ``low_rsi_fraction`` (``RSI < rsi_min``) and ``high_rsi_fraction`` (``RSI > rsi_max``).
    """
    rsi_min = check_number(rsi_min, "rsi_min", low=0)
    rsi_max = check_number(rsi_max, "rsi_max", low=rsi_min, low_open=True)
    entropies = require_entropies(entropies, "rsi-s")
    rsi = relative_surprisal_index(logprobs, entropies)
    low, high = mask & (rsi < rsi_min), mask & (rsi > rsi_max)
    keep = mask & ~low & ~high
    return RuleResult(keep.to(adv.dtype), low | high, keep,
                      {"low_rsi_fraction": masked_mean(low, mask),
                       "high_rsi_fraction": masked_mean(high, mask)})
