"""GTPO: entropy-shaped token rewards (Tan et al., arXiv 2508.04349; docs/method.md §6).

GTPO ("Group Token Policy Optimization", the fifth baseline of the TACO paper) gives
every token its own reward from the entropy ``H[i,t]`` of the old (rollout) policy's
next-token distribution, detached. No official code exists: these are the paper's
equations (its Eq. 3, 5 and 6) as independent reimplementations read them, as
docs/method.md §6 fixes them. Per group, with ``O+`` the correct and ``O-`` the incorrect
responses, ``O+_t`` the correct responses holding a real token at position ``t``
(length > t for right-padded responses), ``d_t = |O+_t|`` and ``h_t = |O-_t|``::

    correct i:    r~[i,t] =  a1 * r_i + a2 * d_t * H[i,t] / (sum_{k in O+_t} H[k,t] + eps)
    incorrect j:  r~[j,t] = -a1 - a2 * h_t * (1/H[j,t]) / (sum_{k in O-_t} 1/H[k,t] + eps)

so correct responses move credit towards their high-entropy tokens and incorrect ones
concentrate blame on their confident (low-entropy) tokens. Then each polarity's token
rewards are z-scored over that polarity's real tokens of the group (``normalize="batch"``:
over the batch), which gives the token advantages::

    A[i,t] = (r~[i,t] - mean(R~)) / (std(R~) + 1e-6)     R~ = the polarity's token rewards

with the population std over tokens and GRPO's ``1e-6`` guard. Defaults ``a1 = 1.0``,
``a2 = 0.1``, ``eps = 1e-8``. Correctness: ``reward > reward_threshold`` (0), or an
explicit boolean ``correct[B]``.

Numerics: computed in float64. The incorrect share is evaluated as
``(m/H[j,t]) / (sum_k m/H[k,t] + eps * m)`` with ``m`` the smallest entropy among
``O-_t`` (algebraically the formula above, without overflow); where ``m = 0`` this is the
formula's limit: the zero-entropy tokens at ``t`` share ``1/z`` each (``z`` of them), the
others 0.

Degenerate groups (all finite, tested):

* All correct or all incorrect: only one polarity, z-scored as usual, so its tokens get
  advantages of mean 0 (unlike GRPO's all-zero advantages): credit moves between tokens
  by entropy share, not between responses.
* One response, or a polarity with a single response whose entropies are all equal or
  all zero: every token reward of that polarity is (nearly) the same value, and the
  advantages are 0 up to rounding (the ``1e-6`` guard keeps them below ~1e-3).
* Zero entropies in a correct response: their share is 0 (``0 / (0 + eps)``).
* Rewards: any finite value up to about 1e150 in magnitude (the z-score squares
  deviations in float64; beyond that the advantages of the polarity become 0).

Because each polarity is centred on its own mean, the sign of a token's advantage
reflects its entropy share relative to its polarity, not the response's correctness; this
follows from the equations as written and is documented rather than changed.
"""

from __future__ import annotations

import torch

from ktae.core.advantages import ADVANTAGE_ESTIMATORS, AdvantageBatch
from ktae.core.checks import as_tensor
from ktae.core.policy_loss import check_number

GTPO_A1 = 1.0
GTPO_A2 = 0.1
GTPO_EPS = 1e-8
ZSCORE_EPS = 1e-6
NORMALIZE = ("group", "batch")


def _correctness(batch: AdvantageBatch, correct, reward_threshold) -> torch.Tensor:
    B = batch.rewards.shape[0]
    if correct is None:
        threshold = check_number(reward_threshold, "reward_threshold")
        return batch.rewards > threshold
    c = as_tensor(correct, "correct", device=batch.device)
    if c.shape != (B,):
        raise ValueError(f"correct: expected shape ({B},), got {tuple(c.shape)}")
    if c.dtype != torch.bool:
        if c.is_floating_point() and not torch.isfinite(c).all():
            raise ValueError("correct: expected booleans or 0/1, got NaN/inf")
        if not ((c == 0) | (c == 1)).all():
            raise ValueError("correct: expected booleans or 0/1 values")
        c = c != 0
    return c


def gtpo_token_rewards(rewards: torch.Tensor, correct: torch.Tensor, gid: torch.Tensor,
                       num_groups: int, entropies: torch.Tensor, mask: torch.Tensor, *,
                       a1: float = GTPO_A1, a2: float = GTPO_A2,
                       eps: float = GTPO_EPS) -> torch.Tensor:
    """The shaped token rewards ``r~[B, T]`` (float64, 0 on padding) of the equations above.

    Args:
        rewards: ``[B]`` sequence rewards ``r_i``.
        correct: ``[B]`` bool, the polarity of each response.
        gid, num_groups: dense group ids ``[B]`` and their number.
        entropies: ``[B, T]`` non-negative old-policy entropies.
        mask: ``[B, T]`` bool, real tokens.
    """
    B, T = mask.shape
    H = torch.where(mask, entropies.to(torch.float64), 0)
    pos = mask & correct[:, None]
    neg = mask & ~correct[:, None]

    def per_position(x: torch.Tensor) -> torch.Tensor:
        """Each token's sum of ``x`` over the rows of its group at its position."""
        return torch.zeros(num_groups, T, dtype=x.dtype, device=x.device).index_add_(
            0, gid, x)[gid]

    d = per_position(pos.to(torch.float64))
    h = per_position(neg.to(torch.float64))
    share_pos = H / (per_position(torch.where(pos, H, 0)) + eps)

    inf = torch.tensor(float("inf"), dtype=torch.float64, device=H.device)
    smallest = torch.full((num_groups, T), float("inf"), dtype=torch.float64, device=H.device)
    smallest.scatter_reduce_(0, gid[:, None].expand(B, T), torch.where(neg, H, inf), "amin")
    m = smallest[gid]
    m = torch.where(torch.isfinite(m), m, 0)
    ratio = torch.where(m > 0, m / torch.where(neg & (H > 0), H, 1), (H == 0).to(H.dtype))
    ratio = torch.where(neg, ratio, 0)
    share_neg = ratio / (per_position(ratio) + eps * m)

    r = rewards.to(torch.float64)[:, None]
    shaped_pos = a1 * r + a2 * d * share_pos
    shaped_neg = -a1 - a2 * h * share_neg
    return torch.where(pos, shaped_pos, torch.where(neg, shaped_neg, 0))


def polarity_zscore(token_rewards: torch.Tensor, correct: torch.Tensor, gid: torch.Tensor,
                    num_groups: int, mask: torch.Tensor, *,
                    normalize: str = "group") -> torch.Tensor:
    """Z-score each polarity's token rewards over its real tokens of the group (or of the
    batch): ``(x - mean) / (std + 1e-6)``, population std; 0 on padding."""
    key = correct.long() if normalize == "batch" else gid * 2 + correct.long()
    num_keys = 2 if normalize == "batch" else 2 * num_groups

    def per_key(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(num_keys, dtype=x.dtype, device=x.device).index_add_(0, key, x)

    x = torch.where(mask, token_rewards, 0)
    count = per_key(mask.sum(dim=1).to(x.dtype)).clamp_min(1)
    mean = per_key(x.sum(dim=1)) / count
    dev = torch.where(mask, x - mean[key][:, None], 0)
    std = (per_key(dev.square().sum(dim=1)) / count).sqrt()
    return dev / (std[key][:, None] + ZSCORE_EPS)


@ADVANTAGE_ESTIMATORS.register("gtpo", needs=("mask", "entropies"))
def gtpo_advantages(batch: AdvantageBatch, *, correct=None, reward_threshold: float = 0.0,
                    a1: float = GTPO_A1, a2: float = GTPO_A2, eps: float = GTPO_EPS,
                    normalize: str = "group") -> torch.Tensor:
    """GTPO token advantages ``[B, T]`` (see the module docstring for the equations).

    Options:
        correct: ``[B]`` bool (or 0/1) correctness; default ``reward > reward_threshold``.
        reward_threshold: 0.0.
        a1, a2: the reward and entropy-bonus weights (1.0, 0.1).
        eps: the shares' denominator guard (1e-8, > 0).
        normalize: ``"group"`` (z-score each polarity within its group) or ``"batch"``.

    Needs ``entropies`` (old-policy, ``[B, T]``) and ``token_ids`` or ``mask``.
    """
    if batch.mask is None:
        raise ValueError("token_ids: required by advantage estimator 'gtpo' (its advantages "
                         "are per token); pass token_ids or mask")
    if batch.entropies is None:
        raise ValueError("entropies: required by advantage estimator 'gtpo' (the [B, T] "
                         "entropies of the rollout policy's next-token distributions)")
    a1 = check_number(a1, "a1")
    a2 = check_number(a2, "a2")
    eps = check_number(eps, "eps", low=0, low_open=True)
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize: expected one of {', '.join(NORMALIZE)}, "
                         f"got {normalize!r}")
    is_correct = _correctness(batch, correct, reward_threshold)
    shaped = gtpo_token_rewards(batch.rewards, is_correct, batch.gid, batch.num_groups,
                                batch.entropies, batch.mask, a1=a1, a2=a2, eps=eps)
    adv = polarity_zscore(shaped, is_correct, batch.gid, batch.num_groups, batch.mask,
                          normalize=normalize)
    return adv.to(batch.rewards.dtype)
