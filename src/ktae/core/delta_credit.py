"""DelTA: the sequence advantage reweighted per token by a discriminator in token-gradient space.

Zhang, Wu and Lin (2026), "DelTA: Discriminative Token Credit Assignment for Reinforcement
Learning from Verifiable Rewards", arXiv 2605.21467. Sources read: the paper's abstract and
appendix titles (F, last-layer token-gradient proxy; G, the soft assignment score; H,
implementation details), and the authors' released code, github.com/RUCBM/DelTA,
``verl-DelTA/verl/workers/actor/dp_actor.py`` (``DataParallelPPOActor.compute_log_prob_h``,
``impl=Normal``, and ``update_policy``, which trains on its ``weighted_advantages``) and
``recipe/dapo/srcs/run_DelTA.sh``. The code is followed throughout; the steps below are
numbered here and name the code's variables, not the paper's equations.

A response ``i`` with sequence advantage ``A_i`` (GRPO's) and real tokens ``t``; the policy
that generated the batch gives each token its probability ``p_it`` (at the sampling
temperature) and its last-layer hidden state ``h_it`` (the input of the output head).

1. Token-gradient proxy (appendix F): ``v_it = (1 - p_it) h_it``, ``[H]``, the part of
   ``d log p_it / d(logits)`` that the output head turns into the sampled token's row.
2. Initial centroids, advantage-weighted: ``a+_i = max(A_i, 0)``, ``a-_i = max(-A_i, 0)``,
   ``mu+ = sum a+_i v_it / max(sum a+_i, 1e-8)`` over real tokens, ``mu-`` likewise.
3. Distances ``D+(v) = ||v - mu+||^2``, ``D-(v) = ||v - mu-||^2``; margins
   ``m+ = D- - D+`` (a positive response's token, closer to ``mu+``), ``m- = D+ - D-``.
   Scales ``gamma+`` (``gamma-``): the population standard deviation of ``m+`` over the
   real tokens of the positive (negative) responses, ``sqrt(max(var, 1e-8))``.
4. ``K`` refinement steps (the soft assignment, appendix G): ``s+ = sigmoid(m+ / gamma+)``,
   ``mu+ <- sum a+_i s+_it v_it / max(sum a+_i s+_it, 1e-8)`` over positive responses (``mu-``
   likewise); the scales of the next step are those of the margins under the centroids
   the step started from.
5. Token weight (appendix H): ``w_it = lam_min + (lam_max - lam_min) sigmoid(m_it / gamma)``
   with the margin and scale of the response's side under the refined centroids;
   ``lam_min`` on responses with ``A_i = 0``. Self-normalised over the batch:
   ``w <- w * N / max(sum w, 1e-8)``, ``N`` the number of real tokens, so the weights
   average 1. The credit is ``A_i w_it``.

Defaults are the authors' run script: ``K = 1``, ``lam_min = 0.8``, ``lam_max = 1.2``.
What the code computes and does not use is left out: the diagonal variance ``d`` (replaced
by ones before use, so distances are squared Euclidean), the discriminator ``W, b`` and
its score ``pred`` (read only by an unused top-score mask).
"""

from __future__ import annotations

import torch

from ktae.core.advantages import ADVANTAGE_ESTIMATORS, AdvantageBatch
from ktae.core.baselines import SEQUENCE_BASELINES
from ktae.core.policy_loss import check_number

DELTA_K = 1
DELTA_LAM_MIN = 0.8
DELTA_LAM_MAX = 1.2
_EPS = 1e-8  # the released code's guard, kept so that its weights are reproduced


def token_grad_proxy(hidden: torch.Tensor, logprobs: torch.Tensor,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, T, H]``: ``(1 - p) h`` (module docstring, 1) from the ``[B, T, H]`` last-layer
    hidden states ``hidden`` and the ``[B, T]`` log-probs of the sampled tokens; 0 where
    ``mask`` (``[B, T]``) is False."""
    v = (1.0 - logprobs.exp()).unsqueeze(-1) * hidden
    if mask is not None:
        v = v * mask.unsqueeze(-1).to(v.dtype)
    return v


def _check_proxy(proxy, mask: torch.Tensor) -> torch.Tensor:
    if not isinstance(proxy, torch.Tensor) or proxy.dim() != 3 \
            or tuple(proxy.shape[:2]) != tuple(mask.shape):
        shape = tuple(proxy.shape) if isinstance(proxy, torch.Tensor) else None
        raise ValueError(f"token_grad_proxy: expected a [B, T, H] tensor with [B, T] = "
                         f"{tuple(mask.shape)}, got shape {shape}")
    if not proxy.is_floating_point():
        raise ValueError(f"token_grad_proxy: expected a float tensor, got {proxy.dtype}")
    v = torch.where(mask.unsqueeze(-1), proxy.to(torch.float64), 0)
    if not torch.isfinite(v).all():
        raise ValueError("token_grad_proxy: expected finite values on the real tokens")
    return v


def _side_scale(margin: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """The code's ``gamma``: ``sqrt(max(E[m^2] - E[m]^2, 1e-8))`` over ``on`` (count >= 1)."""
    w = on.to(margin.dtype)
    n = w.sum().clamp_min(1.0)
    mean = (margin * w).sum() / n
    return ((margin.square() * w).sum() / n - mean.square()).clamp_min(_EPS).sqrt()


def _margins(v: torch.Tensor, mu_pos: torch.Tensor, mu_neg: torch.Tensor):
    d_pos = (v - mu_pos).square().sum(dim=-1)
    d_neg = (v - mu_neg).square().sum(dim=-1)
    return d_neg - d_pos, d_pos - d_neg


def delta_weights(proxy: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                  K: int = DELTA_K, lam_min: float = DELTA_LAM_MIN,
                  lam_max: float = DELTA_LAM_MAX) -> torch.Tensor:
    """``[B, T]`` float64: DelTA's self-normalised token weights (module docstring, 2-5).

    Args:
        proxy: ``[B, T, H]`` token-gradient proxies ``(1 - p) h`` (:func:`token_grad_proxy`).
        advantages: ``[B]`` sequence advantages (their signs pick each response's side).
        mask: ``[B, T]`` bool, the real response tokens.
        K: refinement steps of the soft assignment (>= 0).
        lam_min, lam_max: the range of a weight before normalisation (0 <= lam_min <= lam_max).

    Returns 0 on padding; the weights of the real tokens average 1.
    """
    mask = torch.as_tensor(mask).bool()
    v = _check_proxy(proxy, mask)
    a = torch.as_tensor(advantages, device=v.device).to(torch.float64)
    if a.shape != mask.shape[:1]:
        raise ValueError(f"advantages: expected shape {tuple(mask.shape[:1])}, got "
                         f"{tuple(a.shape)}")
    m = mask.to(torch.float64)
    pos_on = (a > 0)[:, None] & mask
    neg_on = (a < 0)[:, None] & mask
    base_pos = a.clamp_min(0)[:, None] * m
    base_neg = (-a).clamp_min(0)[:, None] * m

    def centroid(w):
        return torch.einsum("bt,bth->h", w, v) / w.sum().clamp_min(_EPS)

    mu_pos, mu_neg = centroid(base_pos), centroid(base_neg)
    m_pos, m_neg = _margins(v, mu_pos, mu_neg)
    g_pos, g_neg = _side_scale(m_pos, pos_on), _side_scale(m_neg, neg_on)
    for _ in range(K):
        mu_pos = centroid(torch.sigmoid(m_pos / g_pos) * base_pos)
        mu_neg = centroid(torch.sigmoid(m_neg / g_neg) * base_neg)
        g_pos, g_neg = _side_scale(m_pos, pos_on), _side_scale(m_neg, neg_on)
        m_pos, m_neg = _margins(v, mu_pos, mu_neg)
    span = lam_max - lam_min
    w_pos = lam_min + span * torch.sigmoid(m_pos / g_pos)
    w_neg = lam_min + span * torch.sigmoid(m_neg / g_neg)
    w = torch.where(pos_on, w_pos, torch.where(neg_on, w_neg, lam_min)) * m
    return w * (m.sum() / w.sum().clamp_min(_EPS))


@ADVANTAGE_ESTIMATORS.register("delta", needs=("mask", "token_grad_proxy"),
                               inputs=("token_grad_proxy",))
def delta_advantages(batch: AdvantageBatch, *, token_grad_proxy=None, base: str = "grpo",
                     K: int = DELTA_K, lam_min: float = DELTA_LAM_MIN,
                     lam_max: float = DELTA_LAM_MAX) -> torch.Tensor:
    """``[B, T]``: ``A_i w_it`` with DelTA's weights (module docstring) from the batch's
    ``token_grad_proxy`` (``[B, T, H]``). Options: ``base`` ("grpo", "drgrpo", "rloo"),
    ``K >= 0`` (1, refinement steps), ``lam_min`` (0.8) and ``lam_max`` (1.2), the range of
    a weight before normalisation, ``0 <= lam_min <= lam_max``."""
    if not isinstance(base, str) or base not in SEQUENCE_BASELINES:
        raise ValueError(f"base: expected one of {sorted(SEQUENCE_BASELINES)}, got {base!r}")
    if isinstance(K, bool) or not isinstance(K, int) or K < 0:
        raise ValueError(f"K: expected an integer >= 0, got {K!r}")
    lam_min = check_number(lam_min, "lam_min", low=0)
    lam_max = check_number(lam_max, "lam_max", low=0)
    if lam_max < lam_min:
        raise ValueError(f"lam_max: expected >= lam_min ({lam_min}), got {lam_max}")
    if batch.mask is None or token_grad_proxy is None:
        raise ValueError("token_grad_proxy: required by advantage estimator 'delta' (the "
                         "[B, T, H] token-gradient proxy (1 - p) h of each response token, "
                         "computed from the model)")
    seq = SEQUENCE_BASELINES[base](batch.rewards, batch.gid, batch.num_groups)
    w = delta_weights(token_grad_proxy, seq, batch.mask, K=K, lam_min=lam_min,
                      lam_max=lam_max)
    return (seq[:, None].to(torch.float64) * w).to(batch.rewards.dtype)
