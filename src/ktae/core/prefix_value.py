"""Prefix-value credit: each token is credited with the change of the group's success rate
among the responses that share the prefix up to it.

Within a group (the responses to one prompt), for response ``i`` and its ``t``-th real
token (``t = 0, 1, ...``; padding is skipped, so the tokens are counted, not indexed)::

    V_i(t)  = c / n    n = #responses of the group whose first t+1 tokens equal i's,
                       c = how many of those are correct
    V_i(-1) = the group's accuracy (every response shares the empty prefix, empty
              responses included)
    d_i(t)  = V_i(t) - V_i(t-1)                                  (the token's credit)

``d`` is 0 on tokens the response shares with all the group members that also share its
previous prefix; it moves only where responses branch. Its sum over a response telescopes
to ``D_i = V_i(L_i - 1) - V_i(-1)``: the success rate of i's exact duplicates (itself
included) minus the group's.

Advantage. ``A_i`` is the base sequence advantage (GRPO by default) and ``L_i`` the
response's number of real tokens. A response the rule applies to (``apply``: the wrong
ones by default) gets::

    A[i,t] = (1 - weight) * A_i + weight * A_i * L_i * u_i(t) / D_i

where ``u = d`` (``unit="token"``), or ``d`` summed over a unit and shared equally by its
tokens (``"word"``: the tokens from one ``word_starts`` flag to the next; ``"span"``: the
tokens from one branch point, where the number of responses sharing the prefix drops, to
the next). Because ``sum_t u_i(t) = D_i``, every response keeps GRPO's total
``sum_t A[i,t] = A_i * L_i``: ``weight`` is the share of it that follows the prefix credit
instead of being spread evenly (``total="keep"``, the default). That concentrates up to
``L_i`` tokens' worth of advantage on the tokens where the response branches. With
``total="add"`` the prefix credit comes on top of the base advantage instead::

    A[i,t] = A_i + weight * A_i * u_i(t) / D_i

so that a response's total grows by ``weight * A_i`` (one token's worth at weight 1):
where V falls steadily along a wrong response, its branching tokens get at most
``(1 + weight) * A_i`` and every other token keeps ``A_i``. Both forms have the slope
``A_i / D_i`` in ``u`` up to a positive factor, so they rank a response's tokens the same
way and differ only in how much credit moves. Other responses, and responses with ``D_i = 0`` (a group
of one; duplicates as successful as the group; an all-correct or all-wrong group, where
``A_i = 0`` anyway), keep ``A_i`` on every token. ``D_i`` is a difference of fractions
with denominators at most the group size G, so ``|D_i| >= 1/G^2`` when non-zero and the
redistribution is bounded by ``weight * |A_i| * L_i * G^2`` per token (in practice a
response's credit concentrates on the tokens where it leaves the successful responses).

Words. The core has no tokenizer, so ``unit="word"`` needs ``word_starts`` ``[B, T]``
bool, True on each token that begins a word (a caller with a tokenizer sets it on tokens
whose text starts with whitespace); the first real token of a response always begins one.

Computation: vectorised passes over the real tokens, no Python loop over groups,
responses or positions; the groups with both outcomes, in chunks of whole groups that run
as tasks on the caller's threads (:mod:`ktae.core.chunk_pool`). Prefixes are hashed by two
polynomial rolling hashes, ``sum_s (id_s + salt + 1) * base**s`` (a cumulative sum over
the flattened real tokens, minus the sum before the response) modulo the primes ``2**31 -
1`` and ``2**31 - 19`` (reduced with shifts, no division; ids of 31 bits or more are
first replaced by a residue). Within a group, the common prefix length of each pair of
responses is found by a binary search over the first of those hashes (two prefixes
compared by whether their partial sums differ by a multiple of the prime: one remainder,
no reduction of either key), and the class of a token is
named by its lowest-ranked member's token at the same position (:mod:`ktae.core.prefix_lcp`;
groups of more than its ``MAX_GROUP`` responses, or ``CLASSES = "unique"``, take one
``torch.unique`` of every token's 62-bit key instead); ``bincount`` gives the class sizes
``n`` and an ``index_add`` their correct counts ``c``. The result is exact, not only
exact with high probability: a class is genuine when all its members have the same token
and the same previous class (the group's root for the first token), which by induction
over the prefix length means the same group, length and prefix. That is checked on every
call (each token against its class's representative); on a collision the keys are
recomputed with other bases and salts, and a collision under every attempt raises (never
observed: it needs two prefixes equal modulo both primes three times over). The estimator
leaves out the groups with one outcome (all correct or all wrong: ``D_i = 0``, their
tokens keep ``A_i``) before hashing. Where numba is installed (``ktae[fast]``), a CPU
batch of at least :data:`JIT_MIN_POSITIONS` positions takes compiled loops instead
(:data:`CLASSES`, :mod:`ktae.core.jit_counts`): a trie of each group's responses with
exact keys, then, for ``unit="token"``, each row written with the same operations as here;
the same bits either way.

Cost: docs/speed.md times each path against one ``torch.sort`` of the batch's keys
(``benchmarks/bench_advantages.py --preset paper --prefix-value --compare``).

References: "prefix value" is the Monte-Carlo value of a partial response estimated from
the group's own samples, as in VinePPO (Kazemnejad et al. 2024) and tree-structured
GRPO variants, with the group as the only rollouts (no extra sampling).
"""

from __future__ import annotations

import functools

import torch

from ktae.core import jit_counts, prefix_lcp
from ktae.core.advantages import ADVANTAGE_ESTIMATORS, AdvantageBatch
from ktae.core.baselines import SEQUENCE_BASELINES
from ktae.core.checks import as_tensor, check_mask
from ktae.core.chunk_pool import group_chunks, new_output, outside_rows_tasks, run_tasks, zero_rows
from ktae.core.gtpo import _correctness
from ktae.core.policy_loss import check_number
from ktae.core.token_counts import real_positions, row_lengths

APPLY = ("wrong", "all", "right")
UNITS = ("token", "word", "span")
TOTALS = ("keep", "add")

#: Two prime moduli ``2**31 - c``, reduced with shifts and small products (no division).
_MODULI_C = (1, 19)
_LOW31 = 2**31 - 1
#: Per attempt, per modulus: (base, token salt, group multiplier).
_BASES = (
    ((1_000_003, 17, 972_663_749), (911_382_323, 29, 1_548_263_029)),
    ((257_189_531, 1_013, 16_807), (482_711, 7_919, 1_103_515_245)),
    ((69_069, 104_729, 2_147_483_582), (1_664_525, 15_485_863, 39_916_801)),
)

#: Real tokens per task (whole groups; the tasks run in parallel on CPU,
#: :mod:`ktae.core.chunk_pool`); accelerators prefer fewer, larger launches.
CHUNK_TOKENS = 1 << 19
DEVICE_CHUNK_TOKENS = 1 << 23

_LARGE_ID_SALTS = (0x2545F4914F6CDD1D, 0x1B873593CC9E2D51, 0x27D4EB2F165667C5)


def _mod(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x mod (2**31 - c)`` for int64 ``0 <= x < 2**63``, ``c <= 19``: two folds of
    ``x = hi * 2**31 + lo = hi * c + lo`` and one conditional subtraction."""
    m = 2**31 - c
    x = (x & _LOW31) + (x >> 31) * c
    x = (x & _LOW31) + (x >> 31) * c
    return torch.where(x >= m, x - m, x)


def _powers(base: int, c: int, n: int, device: torch.device) -> torch.Tensor:
    """``base**k mod (2**31 - c)`` for ``k < n`` by doubling (log2(n) steps), int64."""
    m = 2**31 - c
    pw = torch.ones(1, dtype=torch.long, device=device)
    step = base % m
    while pw.numel() < n:
        pw = torch.cat([pw, _mod(pw * step, c)])
        step = step * step % m
    return pw[:n]


def _prefix_keys(tokens: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor,
                 start: torch.Tensor, gid: torch.Tensor, T: int, attempt,
                 moduli: int = len(_MODULI_C)) -> torch.Tensor:
    """``[moduli, N + 1]`` int64 running sums of the terms ``(id_s + salt + 1) * base**s``
    (one row per prime, the first ``moduli`` of them, reduced once, not fully; a leading
    0), from each real token (``< 2**31 - 19``), its count ``pos`` in its response and its
    row (``rows``, ``start``, ``gid``: used by :func:`_keys_at`, which turns the sums into
    prefix keys)."""
    N = tokens.numel()
    sums = tokens.new_zeros((moduli, N + 1))
    for total, c, (base, salt, _) in zip(sums, _MODULI_C[:moduli], attempt[:moduli],
                                         strict=True):
        pw = _powers(base, c, T, tokens.device)
        terms = (tokens + (salt + 1)).mul_(pw.index_select(0, pos))  # < 2**62
        # one fold leaves terms below 2**35.4: their sum fits in int64 up to 2**27 tokens
        terms = (terms & _LOW31).add_((terms >> 31).mul_(c)) if N < 2**27 else _mod(terms, c)
        torch.cumsum(terms, 0, out=total[1:])
    return sums


def _keys_at(sums: torch.Tensor, at: torch.Tensor, first: torch.Tensor,
             group: torch.Tensor | None, attempt) -> list[torch.Tensor]:
    """Per prime, the key of the prefix ending at real token ``at`` of the response whose
    first real token is ``first``: ``mult * (group + 1) + sum_{s <= pos}
    (id_s + salt + 1) * base**s`` modulo the prime; without ``group`` (prefixes of one
    group compared with each other) the group term is left out."""
    keys = []
    for row, c, (_, _, mult) in zip(sums, _MODULI_C, attempt, strict=True):
        x = row.index_select(0, at + 1) - row.index_select(0, first)
        if group is not None:
            x += _mod((group + 1) * mult, c)
        keys.append(_mod(x, c))
    return keys


#: How :func:`prefix_classes` finds the classes: ``"lcp"`` (prefix hashes and the common
#: prefix length of each pair of a group's responses, :mod:`ktae.core.prefix_lcp`; groups
#: over its ``MAX_GROUP`` take the sort), ``"unique"`` (one ``torch.unique`` of every
#: token's prefix hash), ``"jit"`` (a trie of each group's responses in one compiled pass,
#: :func:`ktae.core.jit_counts.prefix_class_rows`; needs numba, ``ktae[fast]``) or
#: ``"auto"``: ``"jit"`` on a CPU batch of at least :data:`JIT_MIN_POSITIONS` positions
#: where numba is installed, else ``"lcp"``. Same classes, so the same bits, every way; the
#: benchmark times them side by side.
CLASSES = "auto"
CLASSES_ALL = ("auto", "lcp", "unique", *(("jit",) if jit_counts.AVAILABLE else ()))
#: Below this many positions (``B * T``) ``"auto"`` keeps the torch path: numba's import
#: and cache load (about 1 s, once per process) would cost a short run more than it saves.
JIT_MIN_POSITIONS = 1 << 20


def _classes_for(token_ids: torch.Tensor, mask: torch.Tensor) -> str:
    """The algorithm :data:`CLASSES` names for this batch (``"auto"`` resolved)."""
    if CLASSES != "auto":
        return CLASSES
    big = mask.numel() >= JIT_MIN_POSITIONS
    return "jit" if big and jit_counts.usable(token_ids, mask) else "lcp"


def prefix_classes(token_ids: torch.Tensor, mask: torch.Tensor, gid: torch.Tensor,
                   num_groups: int, classes: str | None = None):
    """Prefix classes of the real tokens, in row-major order of ``mask``, found as
    ``classes`` says (:data:`CLASSES` by default).

    Returns ``(flat, rows, pos, cls, prev, count)``: for each real token its flat index in
    ``[B * T]``, its row and its count ``t`` in the response (``[N]``), its prefix class
    (``[N]`` in ``0..U-1``), the class of the prefix one token shorter (``U + group`` for
    ``t = 0``: the group's root), and each class's number of responses (``[U]``; classes
    are numbered densely with ``"unique"``; with ``"lcp"`` and ``"jit"`` a class is the
    index of its representative token, ``U = N``, and indices of no class count 0).
    """
    classes = _classes_for(token_ids, mask) if classes in (None, "auto") else classes
    T = mask.shape[1]
    flat, rows, length = real_positions(mask)
    start = length.cumsum(0) - length
    row_start = start.index_select(0, rows)
    pos = torch.arange(rows.numel(), device=rows.device) - row_start
    tokens = token_ids.reshape(-1).index_select(0, flat)
    low, high = torch.aminmax(tokens) if tokens.numel() else (0, 0)
    if low < 0:
        raise ValueError("token_ids: expected non-negative ids on real tokens")
    large = bool(high >= 2**31 - max(_MODULI_C))
    # the first real token of each non-empty response, and its group's root class
    heads = (length > 0).nonzero().squeeze(1)
    head_at, head_group = start.index_select(0, heads), gid.index_select(0, heads)

    def previous(cls: torch.Tensor, U: int) -> torch.Tensor:
        return torch.roll(cls, 1).index_copy_(0, head_at, U + head_group)

    if classes == "jit" and jit_counts.usable(token_ids, mask):
        cls, count, _ = _jit_classes(token_ids, mask, torch.arange(mask.shape[0]), start,
                                     length, gid, torch.zeros(mask.shape[0], dtype=torch.bool),
                                     num_groups)
        return flat, rows, pos, cls, previous(cls, cls.numel()), count
    members = None
    if classes in ("lcp", "jit"):  # "jit" where the loops cannot run: the lcp path
        members, rank = prefix_lcp.members_of_groups(gid, num_groups)
        if members.shape[1] > prefix_lcp.MAX_GROUP:
            members = None
    for i, attempt in enumerate(_BASES):
        # ids beyond 31 bits: a residue of the id scrambled differently at each attempt
        hashed = _mod(tokens ^ _LARGE_ID_SALTS[i], max(_MODULI_C)) if large else tokens
        if members is not None:
            # One prime is enough here: a collision only lengthens a common prefix, which
            # the exactness check below finds (then the next attempt), about once in 2**31
            # comparisons of different prefixes.
            sums = _prefix_keys(hashed, pos, rows, start, gid, T, attempt, 1)[0]
            prime = 2**31 - _MODULI_C[0]

            def same(a, b, fa, fb, sums=sums, prime=prime):
                # equal keys: the two partial sums differ by a multiple of the prime
                diff = sums.index_select(0, a + 1) - sums.index_select(0, fa)
                diff -= sums.index_select(0, b + 1) - sums.index_select(0, fb)
                return diff.remainder_(prime) == 0

            lcp = prefix_lcp.pair_lcp(same, start, length, members)
            cls = prefix_lcp.representative_classes(lcp, members, rank, gid, start,
                                                       rows.numel())
            U = cls.numel()
            if prefix_lcp.classes_are_exact(cls, tokens, head_at):
                return flat, rows, pos, cls, previous(cls, U), torch.bincount(cls, minlength=U)
            continue
        sums = _prefix_keys(hashed, pos, rows, start, gid, T, attempt)
        k0, k1 = _keys_at(sums, torch.arange(rows.numel(), device=rows.device), row_start,
                          gid.index_select(0, rows), attempt)
        _, cls, count = torch.unique((k0 << 31) | k1, return_inverse=True, return_counts=True)
        U = count.numel()
        prev = previous(cls, U)
        if _classes_are_exact(cls, U, tokens, prev):
            return flat, rows, pos, cls, prev, count
    raise RuntimeError("prefix-value: prefix hash collision under every base; please report "
                       "this batch")


def _jit_classes(token_ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor,
                 start: torch.Tensor, lengths: torch.Tensor, gid: torch.Tensor,
                 correct: torch.Tensor, num_groups: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`ktae.core.jit_counts.prefix_class_rows` of the batch rows ``rows`` (``gid``
    dense in ``[0, num_groups)``; ``start``, ``lengths`` and ``correct`` per row):
    ``(cls, count, right)`` ``[N]`` int64 tensors."""
    group_tokens = torch.zeros(max(num_groups, 1), dtype=torch.long).index_add_(0, gid,
                                                                               lengths)
    found = jit_counts.prefix_class_rows(
        token_ids, mask, rows.numpy(), start.numpy(), gid.numpy(), correct.numpy(),
        int(lengths.sum()), int(group_tokens.max()))
    return tuple(torch.from_numpy(a) for a in found)


def _classes_are_exact(cls: torch.Tensor, U: int, tokens: torch.Tensor,
                       prev: torch.Tensor) -> bool:
    """Every class's members share their token and their previous class: each member is
    compared with one member of its class (whichever the scatter keeps)."""
    member = torch.empty(U, dtype=torch.long, device=cls.device).scatter_(
        0, cls, torch.arange(cls.numel(), device=cls.device))[cls]
    return bool(((tokens[member] == tokens) & (prev[member] == prev)).all())


def _prefix_credit(token_ids: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor,
                   gid: torch.Tensor, num_groups: int, classes: str | None = None) -> dict:
    """Per real token (row-major order of ``mask``): ``rows``, ``pos``, ``cls``, ``prev``
    (:func:`prefix_classes`), ``v`` = ``V_i(t)`` and ``d`` = ``V_i(t) - V_i(t-1)``
    (float64); per class ``n`` and ``c``; per group ``n_g`` and ``c_g`` (int64)."""
    flat, rows, pos, cls, prev, count = prefix_classes(token_ids, mask, gid, num_groups,
                                                       classes)
    U = count.numel()
    ok = correct.to(torch.long)
    n_g = torch.zeros(num_groups, dtype=torch.long, device=mask.device).index_add_(
        0, gid, torch.ones_like(gid))
    c_g = torch.zeros(num_groups, dtype=torch.long, device=mask.device).index_add_(0, gid, ok)
    # sizes and correct members of the U classes, then of the P roots (the empty prefixes)
    sizes = torch.cat([count, n_g.clamp_min(1)])
    right = torch.zeros_like(sizes).index_add_(0, cls, ok.index_select(0, rows))
    right[U:] = c_g
    table = right.to(torch.float64).div_(sizes.to(torch.float64))
    v = table.index_select(0, cls)
    return dict(flat=flat, rows=rows, pos=pos, cls=cls, prev=prev, v=v,
                d=v - table.index_select(0, prev), n=count,
                c=right[:U], n_g=n_g, c_g=c_g)


def prefix_values(token_ids: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor,
                  gid: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``V`` and ``d`` of the module docstring as ``[B, T]`` float64 (0 on padding).

    Args:
        token_ids: ``[B, T]`` int64; mask: ``[B, T]`` bool; correct: ``[B]`` bool;
        gid, num_groups: dense group ids ``[B]`` and their number.
    """
    p = _prefix_credit(token_ids, mask, correct, gid, num_groups)
    values = torch.zeros(mask.numel(), dtype=torch.float64, device=mask.device)
    credit = torch.zeros_like(values)
    values[p["flat"]] = p["v"]
    credit[p["flat"]] = p["d"]
    return values.view(mask.shape), credit.view(mask.shape)


def _unit_credit(d: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Each token gets the mean of ``d`` over its unit (units begin where ``starts``)."""
    unit = starts.long().cumsum(0) - 1
    n = int(unit[-1]) + 1 if unit.numel() else 0
    total = torch.zeros(n, dtype=d.dtype, device=d.device).index_add_(0, unit, d)
    size = torch.zeros(n, dtype=d.dtype, device=d.device).index_add_(0, unit, torch.ones_like(d))
    return (total / size)[unit]


@ADVANTAGE_ESTIMATORS.register("prefix-value", needs=("token_ids",), inputs=("word_starts",))
def prefix_value_advantages(batch: AdvantageBatch, *, correct=None,
                            reward_threshold: float = 0.0, apply: str = "wrong",
                            weight: float = 1.0, unit: str = "token", word_starts=None,
                            base: str = "grpo", total: str = "keep") -> torch.Tensor:
    """Prefix-value token advantages ``[B, T]`` (module docstring for the equations).

    Options:
        correct: ``[B]`` bool (or 0/1) correctness; default ``reward > reward_threshold``.
        reward_threshold: 0.0.
        apply: which responses get the prefix credit: ``"wrong"`` (default), ``"all"`` or
            ``"right"``; the others keep the base advantage on every token.
        weight: in [0, 1]; with ``total="keep"`` the share of each response's total
            advantage that follows the prefix credit (1.0), the rest staying spread evenly;
            with ``total="add"`` the prefix credit added on top, in units of ``|A_i|``.
        unit: ``"token"`` (default), ``"word"`` (needs ``word_starts``) or ``"span"``
            (from one branch point to the next).
        word_starts: ``[B, T]`` bool, True on the tokens that begin a word (``unit="word"``).
        base: the sequence advantage ``A_i``: ``"grpo"`` (default), ``"drgrpo"`` or
            ``"rloo"``.
        total: ``"keep"`` (default: each response keeps the base total, the credit is
            redistributed) or ``"add"`` (the credit is added to the base advantage).
    """
    if batch.mask is None:
        raise ValueError("token_ids: required by advantage estimator 'prefix-value' "
                         "(prefixes are token sequences)")
    if batch.token_ids is None:
        raise ValueError("token_ids: required by advantage estimator 'prefix-value' "
                         "(a mask alone does not say which prefixes are equal)")
    if apply not in APPLY:
        raise ValueError(f"apply: expected one of {', '.join(APPLY)}, got {apply!r}")
    if unit not in UNITS:
        raise ValueError(f"unit: expected one of {', '.join(UNITS)}, got {unit!r}")
    if base not in SEQUENCE_BASELINES:
        raise ValueError(f"base: expected one of {', '.join(SEQUENCE_BASELINES)}, got {base!r}")
    if total not in TOTALS:
        raise ValueError(f"total: expected one of {', '.join(TOTALS)}, got {total!r}")
    weight = check_number(weight, "weight", low=0.0, high=1.0)
    mask, ids = batch.mask, batch.token_ids
    if unit == "word":
        if word_starts is None:
            raise ValueError("word_starts: required by unit='word' ([B, T] bool, True on the "
                             "tokens that begin a word)")
        word_starts = check_mask(as_tensor(word_starts, "word_starts", device=batch.device),
                                 "word_starts", tuple(mask.shape))
    elif word_starts is not None:
        raise ValueError(f"word_starts: only used by unit='word', got unit={unit!r}")
    is_correct = _correctness(batch, correct, reward_threshold)
    seq = SEQUENCE_BASELINES[base](batch.rewards, batch.gid, batch.num_groups)
    seq = seq.to(torch.float64)
    # groups with one outcome get no prefix credit (D_i = 0): leave their tokens out
    ok = is_correct.long()
    n_g = torch.zeros(batch.num_groups, dtype=torch.long, device=batch.device).index_add_(
        0, batch.gid, torch.ones_like(ok))
    c_g = torch.zeros_like(n_g).index_add_(0, batch.gid, ok)
    mixed = (c_g > 0) & (c_g < n_g)
    out = new_output(mask.shape, batch.rewards.dtype, batch.device)
    row_len = row_lengths(mask)  # a word of 8 flags at a time
    chosen = {"wrong": ~is_correct, "right": is_correct,
              "all": torch.ones_like(is_correct)}[apply]
    chunk_tokens = CHUNK_TOKENS if batch.device.type == "cpu" else DEVICE_CHUNK_TOKENS
    classes = _classes_for(ids, mask)  # decided on the whole batch, not on each chunk

    row_counts = (n_g.index_select(0, batch.gid), c_g.index_select(0, batch.gid))
    jit = (classes == "jit" and unit == "token" and out.is_contiguous()
           and out.dtype in (torch.float32, torch.float64) and jit_counts.usable(ids, mask))

    def one_chunk(item) -> None:  # a task: writes its own rows of ``out``
        rows, first_group, num_groups = item
        if jit:
            _jit_chunk(out, ids, mask, rows, batch.gid.index_select(0, rows) - first_group,
                       num_groups, row_len.index_select(0, rows), is_correct, seq, chosen,
                       row_counts, weight, total)
            return
        zero_rows(out, rows)
        if not bool(row_len.index_select(0, rows).any()):
            return
        sub_mask = mask.index_select(0, rows)
        flat, values = _credit_rows(
            ids.index_select(0, rows), sub_mask, is_correct.index_select(0, rows),
            batch.gid.index_select(0, rows) - first_group, num_groups,
            seq.index_select(0, rows), chosen.index_select(0, rows),
            None if word_starts is None else word_starts.index_select(0, rows),
            unit, weight, total, classes)
        width = mask.shape[1]  # each token's position in the batch: its row moved to rows[r]
        at = rows.index_select(0, flat // width).mul_(width).add_(flat % width)
        out.view(-1).index_copy_(0, at, values.to(out.dtype))

    # every element of ``out`` is written by one task: a chunk's rows by the chunk, the
    # one-class groups' rows by blocks of rows
    chunks = group_chunks(batch.gid, batch.num_groups, row_len, chunk_tokens, keep=mixed)
    run_tasks(lambda task: task(),
              [*(functools.partial(one_chunk, c) for c in chunks),
               *outside_rows_tasks(out, mask, batch.gid, mixed, seq.to(batch.rewards.dtype))],
              device=batch.device)
    return out


def _jit_chunk(out: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor,
               gid: torch.Tensor, num_groups: int, lengths: torch.Tensor,
               is_correct: torch.Tensor, seq: torch.Tensor, chosen: torch.Tensor,
               group_counts: tuple[torch.Tensor, torch.Tensor], weight: float,
               total: str) -> None:
    """A chunk of whole groups (batch ``rows``; ``gid`` their groups, dense from 0) for
    ``unit="token"`` in the compiled loops of :mod:`ktae.core.jit_counts`: its rows of
    ``out`` written with the same bits as :func:`_credit_rows` gives (the same operations
    in the same order). ``lengths`` per chunk row; ``is_correct``, ``seq``, ``chosen`` per
    batch row; ``group_counts`` each row's group's responses and correct ones."""
    start = lengths.cumsum(0) - lengths
    classes = _jit_classes(ids, mask, rows, start, lengths, gid,
                           is_correct.index_select(0, rows), num_groups)
    n_g, c_g = (counts.index_select(0, rows).numpy() for counts in group_counts)
    jit_counts.write_prefix_rows(
        out, mask, rows.numpy(), start.numpy(), lengths.numpy(),
        tuple(c.numpy() for c in classes), n_g, c_g, seq.index_select(0, rows).numpy(),
        chosen.index_select(0, rows).numpy(), weight, total == "keep")


def _credit_rows(ids: torch.Tensor, mask: torch.Tensor, is_correct: torch.Tensor,
                 gid: torch.Tensor, num_groups: int, seq: torch.Tensor, chosen: torch.Tensor,
                 word_starts: torch.Tensor | None, unit: str, weight: float, total: str,
                 classes: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The advantages of the real tokens of whole groups (all with both outcomes):
    ``(flat [N] positions in the [B, T] rows, [N] float64 values)``."""
    p = _prefix_credit(ids, mask, is_correct, gid, num_groups, classes)
    rows, pos, cls, d = p["rows"], p["pos"], p["cls"], p["d"]
    first = pos == 0
    if unit == "word":
        d = _unit_credit(d, word_starts.flatten()[p["flat"]] | first)
    elif unit == "span":
        shorter = torch.cat([p["n"], p["n_g"]])[p["prev"]] != p["n"][cls]
        d = _unit_credit(d, shorter | first)

    # D_i from integers: c_end / n_end - c_g / n_g, zero exactly when its numerator is
    length = row_lengths(mask)
    end = cls[(length.cumsum(0) - 1).clamp_min(0)]  # each row's last real token (row-major)
    g = gid
    num = p["c"][end] * p["n_g"][g] - p["c_g"][g] * p["n"][end]
    D = num.to(torch.float64) / (p["n"][end] * p["n_g"][g]).to(torch.float64)
    moved = chosen & (num != 0) & (length > 0)

    D = torch.where(moved, D, 1.0)
    if total == "keep":
        scale = torch.where(moved, weight * seq * length / D, 0.0)
        keep = torch.where(moved, (1.0 - weight) * seq, seq)
    else:
        scale = torch.where(moved, weight * seq / D, 0.0)
        keep = seq
    return p["flat"], keep.index_select(0, rows) + scale.index_select(0, rows) * d
