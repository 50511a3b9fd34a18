"""Prefix classes from the longest common prefix of each pair of a group's responses.

The prefix-value credit (:mod:`ktae.core.prefix_value`) needs, for every real token, the
class of responses of its group that share the prefix up to it. Responses of a group
share their prefixes along a tree: with ``l(i, j)`` the length of the longest common
prefix of responses i and j (in real tokens), response j shares i's first ``t + 1``
tokens exactly when ``l(i, j) > t``. So the ``G (G - 1)`` pair lengths of a group say
everything, and each is found by a binary search over prefix hashes (``log2 T`` steps of
one gather per pair), not by comparing tokens one by one. A class is then named by its
*representative*, the lowest-ranked response of the group in it, ``r(i, t) = min {k :
l(i, k) > t}``; the class id of a token is the index of the representative's token at
the same position, so class ids need no sort or table. ``r(i, t)`` only grows with ``t``,
and changes exactly where response ``k`` outlives every lower-ranked one, at ``t =
max_{j < k} l(i, j)``: those few changes are written to the tokens, and a running maximum
carries them along each response.

Hashes can collide; a collision only makes some ``l(i, j)`` too long (equal prefixes
always hash alike), so it can only merge classes. Every token is checked against its
representative (same token, same class one position earlier: by induction over the
position, the class's members then share the whole prefix), and a failed check is
reported to the caller, who rehashes.

Cost: a few gathers and elementwise passes over the real tokens, plus ``O(P G^2 log T)``
for the pairs; only groups up to :data:`MAX_GROUP` responses (beyond, the caller sorts).
"""

from __future__ import annotations

import torch

from ktae.core.token_counts import _ranks_in_groups

#: Largest group handled here (the pair lengths grow as G^2).
MAX_GROUP = 64


def members_of_groups(gid: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``([P, G] rows of each group by rank, -1 where the group is smaller; [B] rank)``."""
    sizes, rank = _ranks_in_groups(gid, num_groups)
    g_max = max(1, int(sizes.max())) if sizes.numel() else 1
    members = torch.full((num_groups, g_max), -1, dtype=torch.int64, device=gid.device)
    members.view(-1).index_copy_(0, gid * g_max + rank,
                                 torch.arange(gid.numel(), device=gid.device))
    return members, rank


def pair_lcp(same, start: torch.Tensor, length: torch.Tensor,
             members: torch.Tensor) -> torch.Tensor:
    """``[P, G, G]`` common prefix length of each pair of a group's responses (0 for absent
    members; ``l(i, i) = L_i``), taking equal hashes for equal prefixes.

    ``same(a, b, first_a, first_b)``: whether the prefix hashes ending at real tokens
    ``a`` and ``b`` (flat, row-major), of the responses starting at ``first_a`` and
    ``first_b``, are equal (bool, elementwise); ``start`` and ``length`` ``[B]``: each
    response's first real token and its length.
    """
    present = members >= 0
    row = members.clamp_min(0)
    n = torch.where(present, length.index_select(0, row.view(-1)).view(row.shape), 0)
    s = start.index_select(0, row.view(-1)).view(row.shape)
    s_i, s_j = s[:, :, None], s[:, None, :]
    lo = torch.zeros(members.shape + members.shape[1:], dtype=torch.int64, device=start.device)
    hi = torch.minimum(n[:, :, None], n[:, None, :])
    last = max(0, int((start + length).max()) - 1) if start.numel() else 0
    s_i, s_j = s_i.expand(lo.shape).reshape(-1), s_j.expand(lo.shape).reshape(-1)
    for _ in range(int(hi.max()).bit_length() if hi.numel() else 0):  # log2(T) halvings
        active = lo < hi
        mid = (lo + hi + 1) // 2  # >= 1 where active: compare the prefixes of length mid
        at = (mid - 1).clamp_min(0).view(-1)
        eq = same((s_i + at).clamp_max(last), (s_j + at).clamp_max(last), s_i, s_j).view(lo.shape)
        lo = torch.where(active & eq, mid, lo)
        hi = torch.where(active & ~eq, mid - 1, hi)
    return lo


def representative_classes(lcp: torch.Tensor, members: torch.Tensor, rank: torch.Tensor,
                           gid: torch.Tensor, start: torch.Tensor, n: int) -> torch.Tensor:
    """``[n]`` class of each real token: the index (among the ``n`` real tokens, row-major)
    of its representative's token at the same position."""
    g_max = members.shape[1]
    # l(i, k) for each response i (its group's row of the [P, G, G] table, by its rank)
    own = lcp.view(-1, g_max).index_select(0, gid * g_max + rank)  # [B, G]
    before = torch.cummax(own, dim=1).values  # max_{j <= k} l(i, j)
    before = torch.cat([torch.zeros_like(before[:, :1]), before[:, :-1]], dim=1)  # j < k
    takes_over = own > before  # k is the representative from t = before[i, k] on
    i, k = takes_over.nonzero().unbind(1)  # by response, then rank: along the flat order
    # class - own index = start of the representative - start of the response: constant
    # between takeovers, so a running sum of its jumps
    shift = start.index_select(0, members.view(-1).index_select(
        0, gid.index_select(0, i) * g_max + k)) - start.index_select(0, i)
    jumps = torch.diff(shift, prepend=shift.new_zeros(1))
    at = start.index_select(0, i) + before[i, k]
    cls = torch.zeros(n, dtype=torch.int64, device=start.device).index_copy_(0, at, jumps)
    return cls.cumsum_(0).add_(torch.arange(n, device=start.device))


def classes_are_exact(cls: torch.Tensor, tokens: torch.Tensor, heads: torch.Tensor) -> bool:
    """Whether every token has its representative's token and, one position earlier (not
    at the ``heads``, each response's first token, ascending), its representative's class.

    Checked as: each token has its representative's token; each representative is its
    own (``cls[cls[x]] == cls[x]``); and, where the representative changes within a
    response, the previous classes agree. Where it does not change, ``cls[x] - 1 ==
    cls[x - 1]``, so the previous-class condition is the second check at ``x - 1``. A
    token that is its own representative (``cls[x] == x``: every token after its response
    leaves the others) passes the first two trivially, and the representative can change
    only at or just after a token that is not its own: only those are read.
    """
    n = cls.numel()
    shared = (cls != torch.arange(n, device=cls.device)).nonzero().squeeze(1)
    rep = cls.index_select(0, shared)
    if not bool((tokens.index_select(0, rep) == tokens.index_select(0, shared)).all()):
        return False
    if not bool((cls.index_select(0, rep) == rep).all()):
        return False
    x = torch.cat([shared, shared + 1])
    x = x[(x > 0) & (x < n)]
    first = torch.searchsorted(heads, x).clamp_max(max(0, heads.numel() - 1))
    if heads.numel():
        x = x[heads.index_select(0, first) != x]  # a new response starts at x
    before, now = cls.index_select(0, x - 1), cls.index_select(0, x)
    step = now - before != 1  # the representative changes at x
    return bool((before[step] == cls.index_select(0, now[step] - 1)).all())
