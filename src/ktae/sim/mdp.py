"""The synthetic sequential MDP and its tabular softmax policy (docs/method.md §14).

A trajectory has ``H`` steps; at each step the agent picks one of ``|A|`` actions, of
which ``n_opt`` are optimal (reward 1, the others 0); the normalised return is the sum
of step rewards divided by ``H``. The policy is a per-step softmax over logits
``theta[H, |A|]``; optimal logits start from N(1, 1), the others from N(0, 1).

Which actions are optimal does not matter to a tabular softmax whose logits are drawn
independently, so the optimal actions of every step are ``0 .. n_opt - 1``: the reward
of action ``a`` is ``a < n_opt``.

Many independent runs (seeds, settings, methods) are stacked as rows: the policy of a
block of runs is one ``[rows, |A|]`` tensor holding, for each run, its ``H`` step
distributions one after the other. Everything here is a pure function of tensors, and
each update touches the ``[rows, |A|]`` logits in three passes (exponential, block sums,
SGD step), plus one for the entropies of the rows that need them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Mean of the initial logits of optimal / other actions (the "pretrained prior").
OPTIMAL_LOGIT_MEAN = 1.0
OTHER_LOGIT_MEAN = 0.0

#: Rows are re-centred (their largest logit moved to 0) once their largest logit may have
#: drifted this far from 0, so that ``exp(theta)`` can neither overflow nor underflow
#: (float32: exp(±40) is 2e17 / 4e-18).
MAX_LOGIT_DRIFT = 40.0


def initial_logits(horizon: int, actions: int, n_opt: int,
                   generator: torch.Generator) -> torch.Tensor:
    """``[H, |A|]`` float32 logits: N(1, 1) for actions ``< n_opt``, N(0, 1) otherwise."""
    theta = torch.randn(horizon, actions, generator=generator, dtype=torch.float32)
    theta[:, :n_opt] += OPTIMAL_LOGIT_MEAN
    theta[:, n_opt:] += OTHER_LOGIT_MEAN
    return theta


def block_width(actions: int, samples: int) -> int:
    """Width ``b`` of the blocks of actions that two-level sampling draws from: the
    divisor of ``actions`` closest to ``sqrt(actions / samples)``, which minimises the
    work ``actions / b + samples * b`` per row."""
    best = (actions / max(samples, 1)) ** 0.5
    divisors = [b for b in range(1, int(actions**0.5) + 1) if actions % b == 0]
    divisors += [actions // b for b in divisors]
    return min(divisors, key=lambda b: (abs(b - best), b))


@dataclass(frozen=True)
class PolicyStats:
    """The current policy of each row, computed once per update. R rows, |A| actions.

    With ``w = exp(theta)`` and ``Z = sum_a w``, the policy is ``pi = w / Z``; ``w`` is
    kept unnormalised because every user folds ``1 / Z`` into a per-row factor (the
    logits are kept near 0 by :func:`recentre`, so ``w`` is safe in float32).

    Attributes:
        weights: ``[R, |A|]`` float32 ``w``.
        block_cdf: ``[R, |A| / b]`` float64 cumulative sums of ``w`` over blocks of ``b``
            consecutive actions; the last column is ``Z``.
        log_norm: ``[R]`` ``log Z`` (``log pi(a) = theta[a] - log_norm``).
        entropy: ``[R]`` entropy of each step's distribution (nats); 0 in the rows
            before ``entropy_from``.
    """

    weights: torch.Tensor
    block_cdf: torch.Tensor
    log_norm: torch.Tensor
    entropy: torch.Tensor

    @property
    def total(self) -> torch.Tensor:
        """``[R]`` float64 ``Z``."""
        return self.block_cdf[:, -1]


def policy_stats(theta: torch.Tensor, block: int, entropy_from: int = 0,
                 out: torch.Tensor | None = None) -> PolicyStats:
    """Softmax weights, block CDF, log-normaliser and entropy of each row of ``theta``.

    Args:
        theta: ``[R, |A|]`` logits.
        block: width of the action blocks of :func:`sample_actions`, a divisor of |A|
            (see :func:`block_width`).
        entropy_from: entropies are computed for rows ``entropy_from ..`` only (the
            others are 0), as ``H = log Z - sum_a pi(a) theta[a]``.
        out: optional buffer like ``theta`` for the weights (reused across updates, it
            spares the allocation of a large tensor at every update).

    Block sums are float32 (a few dozen terms), accumulated across blocks in float64, so
    actions of probability ~1e-5 keep their mass among |A| = 100,000.
    """
    R, A = theta.shape
    weights = torch.exp(theta, out=out)
    block_cdf = torch.cumsum(weights.view(R, A // block, block).sum(-1), 1, dtype=torch.float64)
    total = block_cdf[:, -1]
    log_norm = total.log()
    entropy = torch.zeros(R, dtype=torch.float64, device=theta.device)
    if entropy_from < R:
        dot = torch.linalg.vecdot(weights[entropy_from:], theta[entropy_from:])
        entropy[entropy_from:] = log_norm[entropy_from:] - dot.double() / total[entropy_from:]
    return PolicyStats(weights, block_cdf, log_norm.to(theta.dtype), entropy.to(theta.dtype))


def sample_actions(stats: PolicyStats, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: ``[R, G]`` action ids from ``[R, G]`` uniforms in [0, 1).

    Two levels: the block ``k`` with ``cdf[k-1] <= u Z < cdf[k]``, then within it the
    action whose cumulative weight passes the remainder; so action ``a`` is drawn with
    probability ``w[a] / Z = pi(a)``. Costs ``O(R (|A| / b + G b))`` after the block sums.
    """
    w, cdf = stats.weights, stats.block_cdf
    R, A = w.shape
    n_blocks = cdf.shape[1]
    b = A // n_blocks
    target = uniforms.to(torch.float64) * cdf[:, -1:]
    block = torch.searchsorted(cdf, target.contiguous(), right=True).clamp_max_(n_blocks - 1)
    before = torch.where(block > 0, cdf.gather(1, (block - 1).clamp_min(0)), 0.0)
    G = block.shape[1]
    first = block * b
    inner = w.gather(1, (first[..., None] + torch.arange(b, device=w.device)).view(R, G * b))
    inner_cdf = torch.cumsum(inner.view(R, G, b), -1).double()
    rest = (target - before)[..., None]
    offset = torch.searchsorted(inner_cdf, rest.contiguous(), right=True).squeeze(-1)
    return first + offset.clamp_max_(b - 1)


def expected_step_reward(stats: PolicyStats, n_opt: torch.Tensor) -> torch.Tensor:
    """``[R]`` float64 probability mass of each row on its optimal actions ``< n_opt``."""
    head = stats.weights[:, :int(n_opt.max())]
    optimal = torch.arange(head.shape[1], device=n_opt.device)[None, :] < n_opt[:, None]
    mass = torch.where(optimal, head, 0).sum(1, dtype=torch.float64)
    return (mass / stats.total).clamp_(0.0, 1.0)


def sampled_logprobs(theta: torch.Tensor, log_norm: torch.Tensor,
                     actions: torch.Tensor) -> torch.Tensor:
    """``[R, G]`` log-probabilities of the sampled actions under the current policy."""
    return theta.gather(1, actions) - log_norm[:, None]


def sgd_step(theta: torch.Tensor, stats: PolicyStats, actions: torch.Tensor,
             coef: torch.Tensor, lr: float) -> torch.Tensor:
    """One SGD step, in place, on the loss ``-sum_{r,i} coef[r,i] * log pi_r(a[r,i])``.

    ``coef[r, i]`` is the (already normalised) weight of sample ``i`` of row ``r``,
    0 for samples outside the loss. For a softmax row the gradient of that loss is
    ``(sum_i coef[r,i]) * pi_r - sum_i coef[r,i] * onehot(a[r,i])``, so the step is

        theta[r] -= lr * (sum_i coef[r,i]) * pi_r;   theta[r, a[r,i]] += lr * coef[r,i]

    which is what autograd gives for that loss (checked in the tests).

    Returns:
        ``[R]`` a bound on how far the step moved each row's largest logit
        (``2 * lr * sum_i |coef[r,i]|``), for :func:`recentre`.
    """
    scale = (lr * coef.sum(1, dtype=torch.float64) / stats.total).to(theta.dtype)
    theta.addcmul_(stats.weights, scale[:, None], value=-1.0)
    theta.scatter_add_(1, actions, (lr * coef).to(theta.dtype))
    return 2 * lr * coef.abs().sum(1)


def recentre(theta: torch.Tensor, drift: torch.Tensor) -> None:
    """In place: rows whose largest logit may have drifted beyond
    :data:`MAX_LOGIT_DRIFT` get their largest logit moved to 0 (the softmax is
    unchanged) and their drift reset. ``drift`` ``[R]`` is the running bound."""
    rows = (drift > MAX_LOGIT_DRIFT).nonzero().squeeze(1)
    if rows.numel():
        theta[rows] -= theta[rows].amax(1, keepdim=True)
        drift[rows] = 0.0
