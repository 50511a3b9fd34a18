"""Metrics of the batch that is trained on (pure tensor functions, no TRL import).

TRL logs reward statistics for each generation pass. Under dynamic sampling a step runs
several passes and trains on a selection of their groups, so those per-pass figures do not
describe what the policy was trained on. The trainer therefore moves TRL's per-pass values
to ``generation/<key>`` (their mean over the passes of the step) and logs the standard
keys from the trained batch with :func:`trained_batch_metrics`.
"""

from __future__ import annotations

import torch


def _nanstd(x: torch.Tensor) -> float:
    x = x[~torch.isnan(x)]
    return float(x.std()) if x.numel() > 1 else 0.0


def _nanmean(x: torch.Tensor) -> float:
    x = x[~torch.isnan(x)]
    return float(x.mean()) if x.numel() else float("nan")


def trained_batch_metrics(*, rewards: torch.Tensor, per_func: torch.Tensor,
                          func_names: list[str], lengths: torch.Tensor,
                          truncated: torch.Tensor, correct: torch.Tensor,
                          num_generations: int) -> dict[str, float]:
    """TRL-named metrics (and ktae's) of a global batch of ``B`` responses.

    Args:
        rewards: ``[B]`` total (weighted) rewards. per_func: ``[B, F]`` each reward
            function's output (NaN where it did not apply). func_names: the F names.
        lengths: ``[B]`` response lengths in tokens (all generated tokens, also of rows a
            loss mask hides). truncated: ``[B]`` bool, responses that hit the length limit.
        correct: ``[B]`` bool. num_generations: G (rows are contiguous groups of G).

    Returns:
        ``reward``, ``reward_std``, ``rewards/<name>/mean|std``, ``frac_reward_zero_std``
        (share of groups whose rewards are all equal), ``completions/mean_length``,
        ``min_length``, ``max_length``, ``clipped_ratio``, ``mean_terminated_length``,
        ``min_terminated_length``, ``max_terminated_length``, ``ktae/accuracy``,
        ``ktae/response_length`` and ``ktae/mixed_group_fraction`` (share of groups holding
        both correct and incorrect responses: the groups a correctness signal can rank).
    """
    rewards = rewards.detach().float().cpu()
    per_func = per_func.detach().float().cpu()
    lengths = lengths.detach().float().cpu()
    truncated = truncated.detach().bool().cpu()
    grouped = rewards.view(-1, num_generations)
    group_std = torch.nan_to_num(grouped, nan=0.0).std(dim=1) if num_generations > 1 else \
        torch.zeros(grouped.shape[0])
    out = {
        "reward": _nanmean(rewards),
        "reward_std": _nanstd(rewards),
        "frac_reward_zero_std": float(torch.isclose(group_std, torch.zeros_like(group_std))
                                      .float().mean()),
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": float(lengths.min()),
        "completions/max_length": float(lengths.max()),
        "completions/clipped_ratio": float(truncated.float().mean()),
        "ktae/accuracy": float(correct.detach().float().mean()),
        "ktae/response_length": float(lengths.mean()),
        "ktae/mixed_group_fraction": mixed_group_fraction(correct, num_generations),
    }
    terminated = lengths[~truncated]
    if terminated.numel() == 0:  # TRL's convention for "none terminated"
        terminated = torch.zeros(1)
    out["completions/mean_terminated_length"] = float(terminated.mean())
    out["completions/min_terminated_length"] = float(terminated.min())
    out["completions/max_terminated_length"] = float(terminated.max())
    for i, name in enumerate(func_names):
        out[f"rewards/{name}/mean"] = _nanmean(per_func[:, i])
        out[f"rewards/{name}/std"] = _nanstd(per_func[:, i])
    return out


def mixed_group_fraction(correct: torch.Tensor, num_generations: int) -> float:
    """Share of the groups (contiguous blocks of ``num_generations`` rows of the ``[B]``
    bool ``correct``) that hold both a correct and an incorrect response."""
    grouped = correct.detach().bool().cpu().view(-1, num_generations)
    return float((grouped.any(dim=1) & ~grouped.all(dim=1)).float().mean())


def truncated_rows(completion_ids: torch.Tensor, token_mask: torch.Tensor,
                   stop_ids: list[int]) -> torch.Tensor:
    """``[B]`` bool: responses whose last real token is not a stop (EOS/pad) id, i.e. that
    were cut at the length limit (TRL's rule, on padded tensors). Empty responses are not
    truncated."""
    lengths = token_mask.sum(dim=1).long()
    last = completion_ids.gather(1, (lengths - 1).clamp_min(0)[:, None]).squeeze(1)
    stops = torch.tensor(sorted(set(stop_ids)), device=completion_ids.device,
                         dtype=completion_ids.dtype)
    return (lengths > 0) & ~torch.isin(last, stops)
