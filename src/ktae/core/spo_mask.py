"""SPO's probability mask: only tokens the rollout policy found uncertain stay in the loss.

Guo et al. (2025), "Segment Policy Optimization: Effective Segment-Level Credit Assignment
in RL for Large Language Models", arXiv 2505.23564 (its probability-mask policy
optimization). The released code (github.com/AIFrameResearch/SPO, commit b9fc6a2,
``src/treetune/trainers/ppo_trainer.py``, ``use_prob_mask``) computes, per token::

    prob_mask   = exp(old_logprobs) < 0.9
    action_mask = action_mask & prob_mask
    pg_loss     = masked_mean(max(pg_losses1, pg_losses2), action_mask)

so the clipped surrogate is averaged over the tokens the rollout (old) policy gave a
probability below the threshold; confident tokens leave the loss. As a calibration
(name ``spo-mask``) it returns that mask as ``loss_mask`` (removed tokens get weight 0),
so the token mean runs over the kept tokens, as in the code. It applies to any
estimator's advantages (SPO pairs it with its segment advantages; ``grpo+spo-mask`` is
the mask alone).
"""

from __future__ import annotations

from ktae.core.calibration_rules import CALIBRATIONS, RuleResult, require
from ktae.core.policy_loss import check_number

SPO_PROB_THRESHOLD = 0.9


@CALIBRATIONS.register("spo-mask", needs=("old_logprobs",))
def spo_mask(adv, *, logprobs, entropies=None, old_logprobs, mask, generator=None,
             prob_threshold: float = SPO_PROB_THRESHOLD) -> RuleResult:
    """Keep only the real tokens with ``p_old < prob_threshold`` in the loss (0.9, in
    [0, 1]); ``flagged`` marks the removed tokens. Needs ``old_logprobs`` (pass the
    current log-probs when the batch is on-policy)."""
    prob_threshold = check_number(prob_threshold, "prob_threshold", low=0, high=1)
    old = require(old_logprobs, "old_logprobs", "spo-mask",
                  "the rollout policy's [B, T] log-probs of the sampled tokens; pass the "
                  "current log-probs when the batch is on-policy")
    keep = mask & (old.exp() < prob_threshold)
    return RuleResult(keep.to(adv.dtype), mask & ~keep, keep)
