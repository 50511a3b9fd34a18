"""Counts per (group, unit) by scatter and gather into per-chunk tables: no sort.

KTAE needs, per (group, distinct token) of a chunk of groups, the number of correct and
incorrect responses containing the token and its occurrences in each class
(:class:`ktae.core.token_counts.TokenCounts`). A sort of the chunk's keys
(:func:`ktae.core.token_counts.count_units`) finds them by putting equal keys next to
each other; here each key gets a dense id instead, and the counts are scatters into
tables indexed by that id:

1. Dense ids of the units. Token ids below a bound near the chunk's size get theirs from
   a presence bitmap over ``[0, bound)``: its non-zero positions, in order, and a lookup
   table filled at those positions (:func:`dense_ids`). Larger ids (span codes) are
   placed in an open-addressing hash table of twice the keys' number, probed in parallel
   rounds (:func:`hash_ids`): the ids are then exact too, as the table stores the keys.
2. The pair (group, unit) of each occurrence: a dense id the same way, from
   ``group * units + unit``.
3. Responses containing each pair, by class: a presence bitmap over (pair, rank of the
   response in its group, class), summed over the ranks.
4. Occurrences by class: one ``bincount`` over (pair, class).

Spans (n-grams) are nearly all distinct within a chunk, so a table per distinct span
costs as much as one per span: :func:`count_spans_scatter` skips the dense ids and names
each (group, span) pair by one of its occurrences, its *representative*
(:func:`representatives`: a few rounds of a hash table rebuilt with a new hash each
round), and counts into tables indexed by occurrence.

Every step is a pass over the chunk's units or over a table of a few times their number,
on any device (pure torch). Which occurrence a parallel scatter keeps when several write
one slot can differ between runs on an accelerator; the dense ids (the order of the
pairs) can then differ, never a count, so each token's value cannot.
"""

from __future__ import annotations

import torch

from ktae.core.token_counts import TokenCounts, _group_totals, _ranks_in_groups

#: Largest group (responses) counted here; larger groups take the sort, whose cost does
#: not grow with the group size (the presence table here holds ``2 G`` flags per pair).
MAX_GROUP = 64

#: A presence bitmap is used for keys below ``DENSE_FACTOR`` times their number (plus a
#: small constant); sparser keys are hashed.
DENSE_FACTOR = 8
_DENSE_FLOOR = 1 << 16

#: Multiplier of the hash (Knuth's 64-bit golden ratio constant, as a signed int64).
_GOLDEN = -7046029254386353131
#: :func:`representatives`: one odd multiplier per round (cycled), the golden ratio's first.
_MULTIPLIERS = (_GOLDEN, 0x2545F4914F6CDD1D, 0x1B873593CC9E2D51, 0x27D4EB2F165667C5)
#: :func:`representatives`: table slots per key (a quarter full: on a chunk of 110k spans
#: 1 key in 10 was left after the first round, 1 in 100 of those after the second).
_REP_FACTOR = 4

_KEY_LIMIT = 1 << 62


def dense_ids(key: torch.Tensor, bound: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(key, return_inverse=True)`` for int64 keys in ``[0, bound)`` by a
    presence bitmap: ``(uniq ascending [U], inverse [M])``; ``inverse`` is int32 for
    ``bound <= 2**31`` (its lookup table, read at random, then takes half the cache of an
    int64 one), else int64."""
    # the running count of the bitmap is the lookup table (a dense id + 1 at each present
    # key), and each key writes itself at its id: no nonzero, no index_copy of the ids
    present = mark(key, bound)
    dtype = torch.int32 if bound <= 1 << 31 else torch.int64
    lookup = torch.cumsum(present.view(torch.uint8), 0, dtype=dtype)
    del present
    inverse = lookup.index_select(0, key).sub_(1)
    u = int(lookup[-1]) if bound else 0
    uniq = torch.empty(u, dtype=torch.int64, device=key.device)
    return uniq.scatter_(0, inverse.long(), key), inverse


def mark(key: torch.Tensor, size: int) -> torch.Tensor:
    """``[size]`` bool presence bitmap: True at each of ``key``'s values, by a scatter of
    a constant (stride-0) source (``benchmarks/bench_counting.py`` times it against
    ``index_fill_``)."""
    present = torch.zeros(size, dtype=torch.bool, device=key.device)
    one = torch.ones(1, dtype=torch.bool, device=key.device)
    return present.scatter_(0, key, one.expand(key.numel()))


def hash_ids(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct keys and each key's dense id, ``(uniq [U], inverse [M])``, for any
    non-negative int64 keys: an open-addressing table (linear probing, at most half
    full) filled in rounds; a round places every pending key whose slot is free or holds
    its key, and moves the others one slot on. ``uniq`` is in slot order, not sorted."""
    m = key.numel()
    device = key.device
    size = 1 << max(4, (2 * m).bit_length())
    bits = size.bit_length() - 1
    mask = size - 1
    table = torch.full((size,), -1, dtype=torch.int64, device=device)
    slot = ((key * _GOLDEN) >> (64 - bits)) & mask  # the product's top bits
    where = torch.empty(m, dtype=torch.int64, device=device)
    pending = torch.arange(m, device=device)
    pk = key
    while pending.numel():
        cur = table.index_select(0, slot)
        free = cur < 0
        # several keys may claim one free slot: one of them wins, the others probe on
        table.index_put_((slot[free],), pk[free])
        cur = torch.where(free, table.index_select(0, slot), cur)
        hit = cur == pk
        where.index_copy_(0, pending[hit], slot[hit])
        miss = (~hit).nonzero().squeeze(1)
        pending, pk = pending.index_select(0, miss), pk.index_select(0, miss)
        slot = (slot.index_select(0, miss) + 1) & mask
    used = (table >= 0).nonzero().squeeze(1)
    lookup = torch.empty(size, dtype=torch.int64, device=device)
    lookup.index_copy_(0, used, torch.arange(used.numel(), device=device))
    return table.index_select(0, used), lookup.index_select(0, where)


def representatives(key: torch.Tensor) -> torch.Tensor:
    """``[M]`` for each key the index of one key equal to it, the same for all equal keys
    (``key[rep] == key``, ``rep[rep] == rep``): exact ids of the distinct keys, not dense.

    Each round hashes the pending keys into a table of about :data:`_REP_FACTOR` slots per
    key with a new multiplier, scatters each key's index to its slot (one writer per slot
    wins) and reads the slot back: a key whose slot holds an equal key takes that index.
    All copies of a key share its slot, so they are placed in the same round, on the same
    index; keys whose slot another key won try again with the next hash.
    """
    m = key.numel()
    device = key.device
    bits = max(4, (_REP_FACTOR * m - 1).bit_length())
    table = torch.empty(1 << bits, dtype=torch.int64, device=device)
    rep = pending = None
    pk = key
    for r in range(64):  # ends in a few rounds: a key is left out of one with odds <= 1/4
        slot = (pk * _MULTIPLIERS[r % len(_MULTIPLIERS)]).bitwise_right_shift_(64 - bits)
        slot.bitwise_and_((1 << bits) - 1)  # the product's top bits
        table.scatter_(0, slot, torch.arange(m, device=device) if pending is None else pending)
        won = table.index_select(0, slot)
        missed = (key.index_select(0, won) != pk).nonzero().squeeze(1)
        if pending is None:
            rep, pending = won, missed
        else:
            rep.index_copy_(0, pending, won)
            pending = pending.index_select(0, missed)
        if not pending.numel():
            return rep
        pk = key.index_select(0, pending)
    raise RuntimeError("representatives: keys left unplaced after 64 rounds")


def _ids(key: torch.Tensor, bound: int) -> tuple[torch.Tensor, torch.Tensor]:
    if is_dense(bound, key.numel()):
        return dense_ids(key, bound)
    return hash_ids(key)


def is_dense(bound: int, n: int) -> bool:
    """Whether ``n`` keys in ``[0, bound)`` get their dense ids from a presence bitmap
    (:func:`dense_ids`) rather than a hash table (:func:`hash_ids`)."""
    return bound <= DENSE_FACTOR * n + _DENSE_FLOOR


def pair_ids(unit: torch.Tensor, bound: int, row: torch.Tensor, gid: torch.Tensor,
             num_groups: int, hashed: bool = True):
    """Dense ids of the (group, unit) pairs of a chunk, or None when the keys do not fit in
    62 bits, or (``hashed=False``) when the units or the pairs would need a hash table.

    Returns ``(inverse [M], group [U], unit [U])``: each occurrence's pair and each pair's
    group and unit id.
    """
    if is_dense(bound, unit.numel()):  # few ids: make them dense first
        uniq, unit = dense_ids(unit, bound)
        width = max(1, uniq.numel())
    elif not hashed:
        return None
    else:
        uniq, width = None, bound
    if num_groups * width >= _KEY_LIMIT or not (hashed or is_dense(num_groups * width,
                                                                    unit.numel())):
        return None
    key = (gid * width).index_select(0, row).add_(unit)
    pair, inverse = _ids(key, num_groups * width)
    group = pair // width
    token = pair - group * width
    return inverse, group, token if uniq is None else uniq.index_select(0, token)


def count_units_scatter(unit: torch.Tensor, bound: int, row: torch.Tensor,
                        row_len: torch.Tensor, gid: torch.Tensor, num_groups: int,
                        correct: torch.Tensor, hashed: bool = True) -> TokenCounts | None:
    """:func:`ktae.core.token_counts.count_units` without a sort, or None where the sort
    is the one to use (groups over :data:`MAX_GROUP`, keys beyond 62 bits, and with
    ``hashed=False`` ids too sparse for a presence bitmap, :func:`is_dense`).

    Args are those of ``count_units``, and ``bound``: the units lie in ``[0, bound)``.
    ``unit`` is not modified. The result's ``pair`` maps each unit to its pair (``order``
    and ``run_length`` are None); pairs are sorted by (group, unit) when the ids were
    dense, in hash order otherwise.
    """
    sizes, rank = _ranks_in_groups(gid, num_groups)
    g_max = int(sizes.max()) if sizes.numel() else 1
    if g_max > MAX_GROUP:
        return None
    found = pair_ids(unit, bound, row, gid, num_groups, hashed)
    if found is None:
        return None
    inverse, group, token = found
    u = group.numel()
    # presence of (class, rank, pair) laid out so that summing over the ranks adds whole
    # rows of U flags (class-major); occurrences of (class, pair) likewise
    incorrect = (~correct).long()
    cell = (incorrect * g_max + rank).mul_(u).index_select(0, row).add_(inverse)
    present = mark(cell, 2 * g_max * u)
    # byte sums (at most MAX_GROUP < 256): a bool sum would widen every flag first
    ab = present.view(torch.uint8).view(2, g_max, u).sum(1, dtype=torch.uint8).long()
    del present
    # int32 keys (2 u < 2**31 here: u pairs of a chunk) read half the bytes of int64 ones
    occurrences = torch.bincount((incorrect * u).to(inverse.dtype).index_select(0, row)
                                 .add_(inverse), minlength=2 * u).view(2, u)
    run_length = occurrences.sum(0)
    return TokenCounts(group=group, token=token, a=ab[0], b=ab[1],
                       count_correct=occurrences[0], count_incorrect=occurrences[1],
                       run_length=run_length, order=None, pair=inverse,
                       **_group_totals(gid, num_groups, sizes, correct, row_len))


def count_spans_scatter(unit: torch.Tensor, bound: int, row: torch.Tensor,
                        row_len: torch.Tensor, gid: torch.Tensor, num_groups: int,
                        correct: torch.Tensor) -> TokenCounts | None:
    """:func:`ktae.core.token_counts.count_units` for units that are nearly all distinct
    (spans), without a sort or dense ids; None where the sort is the one to use (as
    :func:`count_units_scatter`).

    Args are those of :func:`count_units_scatter`. The pairs of the result are indexed by
    their representatives among the ``M`` units (:func:`representatives`): ``U = M``,
    ``pair`` maps each unit to its representative, ``group`` and ``token`` are each
    unit's, and a slot that represents no pair has ``a = b = 0`` and no occurrences.
    """
    sizes, rank = _ranks_in_groups(gid, num_groups)
    g_max = int(sizes.max()) if sizes.numel() else 1
    if g_max > MAX_GROUP or num_groups * bound >= _KEY_LIMIT:
        return None
    m = unit.numel()
    group = gid.index_select(0, row)
    rep = representatives((group * bound).add_(unit))
    incorrect = (~correct).long()
    cell = (incorrect * g_max + rank).mul_(m).index_select(0, row).add_(rep)
    present = mark(cell, 2 * g_max * m)
    del cell
    ab = present.view(torch.uint8).view(2, g_max, m).sum(1, dtype=torch.uint8).long()
    del present
    occurrences = torch.bincount((incorrect * m).index_select(0, row).add_(rep),
                                 minlength=2 * m).view(2, m)
    return TokenCounts(group=group, token=unit, a=ab[0], b=ab[1],
                       count_correct=occurrences[0], count_incorrect=occurrences[1],
                       run_length=occurrences.sum(0), order=None, pair=rep,
                       **_group_totals(gid, num_groups, sizes, correct, row_len))
