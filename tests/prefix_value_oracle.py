"""Slow reference of the prefix-value credit (ktae.core.prefix_value), for tests.

Written straight from the definition, one response and one position at a time: for
response i and its t-th real token, V_i(t) is the share of correct responses among the
group's responses whose first t+1 real tokens equal i's (compared as Python lists), and
V_i(-1) the group's accuracy; the credit is V_i(t) - V_i(t-1).
"""

from __future__ import annotations

import numpy as np

GRPO_EPS = 1e-6


def _real_tokens(token_ids, mask) -> list[list[int]]:
    ids, m = np.asarray(token_ids), np.asarray(mask).astype(bool)
    return [[int(x) for x, keep in zip(row, mrow, strict=True) if keep]
            for row, mrow in zip(ids, m, strict=True)]


def slow_prefix_values(token_ids, mask, correct, group) -> tuple[list[list[float]],
                                                                 list[list[float]]]:
    """Per response, V_i(t) and d_i(t) for t = 0..L_i-1 (lists over real tokens)."""
    seqs = _real_tokens(token_ids, mask)
    correct = [bool(c) for c in correct]
    group = [int(g) for g in group]
    values, credits = [], []
    for i, seq in enumerate(seqs):
        members = [j for j in range(len(seqs)) if group[j] == group[i]]
        prev = sum(correct[j] for j in members) / len(members)
        v_row, d_row = [], []
        for t in range(len(seq)):
            same = [j for j in members if seqs[j][:t + 1] == seq[:t + 1]]
            v = sum(correct[j] for j in same) / len(same)
            v_row.append(v)
            d_row.append(v - prev)
            prev = v
        values.append(v_row)
        credits.append(d_row)
    return values, credits


def slow_grpo(rewards, group) -> list[float]:
    """GRPO (docs/method.md §2): (R - mean) / (std + 1e-6), unbiased std; size 1: R / (1 + 1e-6);
    equal rewards: 0."""
    rewards = [float(r) for r in rewards]
    out = []
    for i, r in enumerate(rewards):
        g = [rewards[j] for j in range(len(rewards)) if int(group[j]) == int(group[i])]
        if len(g) == 1:
            out.append(r / (1 + GRPO_EPS))
        elif max(g) == min(g):
            out.append(0.0)
        else:
            out.append((r - np.mean(g)) / (np.std(g, ddof=1) + GRPO_EPS))
    return out


def slow_prefix_value_advantages(rewards, group, token_ids, mask, correct, *,
                                 apply: str = "wrong", weight: float = 1.0,
                                 unit: str = "token", word_starts=None,
                                 total: str = "keep") -> np.ndarray:
    """``[B, T]`` advantages: GRPO, with the prefix credit moved in for chosen responses."""
    ids, m = np.asarray(token_ids), np.asarray(mask).astype(bool)
    seqs = _real_tokens(ids, m)
    values, credits = slow_prefix_values(ids, m, correct, group)
    seq_adv = slow_grpo(rewards, group)
    out = np.zeros(ids.shape)
    for i, seq in enumerate(seqs):
        cols = [t for t in range(ids.shape[1]) if m[i, t]]
        a, L = seq_adv[i], len(seq)
        members = [j for j in range(len(seqs)) if int(group[j]) == int(group[i])]
        acc = sum(bool(correct[j]) for j in members) / len(members)
        D = (values[i][-1] - acc) if L else 0.0
        chosen = {"wrong": not correct[i], "right": bool(correct[i]), "all": True}[apply]
        if not chosen or L == 0 or abs(D) < 1e-12:
            for c in cols:
                out[i, c] = a
            continue
        d = list(credits[i])
        if unit != "token":
            starts = []
            for t in range(L):
                if unit == "word":
                    starts.append(t == 0 or bool(np.asarray(word_starts)[i, cols[t]]))
                else:  # span: the number of responses sharing the prefix drops
                    now = sum(1 for j in members if seqs[j][:t + 1] == seq[:t + 1])
                    before = sum(1 for j in members if seqs[j][:t] == seq[:t])
                    starts.append(t == 0 or now != before)
            spans, cur = [], []
            for t in range(L):
                if starts[t] and cur:
                    spans.append(cur)
                    cur = []
                cur.append(t)
            spans.append(cur)
            for span in spans:
                mean = sum(d[t] for t in span) / len(span)
                for t in span:
                    d[t] = mean
        for t, c in enumerate(cols):
            if total == "keep":
                out[i, c] = (1 - weight) * a + weight * a * L * d[t] / D
            else:
                out[i, c] = a + weight * a * d[t] / D
    return out
