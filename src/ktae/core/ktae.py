"""KTAE: Key-token Advantage Estimation (docs/method.md §3; paper section 3, Eq. 4-10).

For every distinct token ``v`` of a group, the correct (T) and incorrect (F) responses
give a 2x2 table ``[[a, b], [c, d]]`` (responses containing ``v`` or not). Then

    F  = exp(-2 p)          p: two-sided Fisher exact p-value        (Eq. 4-5)
    IG = H(Y) - H(Y | X)    bits                                      (Eq. 6-7)
    TF = f (k1 + 1) / (f + k1 (1 - b + b L / avg))                    (Eq. 8)
    D  = asin(sqrt(a/(a+c))) - asin(sqrt(b/(b+d)))
         + h3 (TF_T / (TF_F + 1e-5) - TF_F / (TF_T + 1e-5))            (Eq. 9)
    k  = (h1 F + h2 IG) D / (h1 + h2);   value = top (2 sigmoid(k) - 1)
    A_KTAE[i, t] = A_base[i] + value(token_ids[i, t])                  (Eq. 10)

``mode="exact"`` (default) computes these exactly (float64); ``mode="reference"``
reproduces the authors' released runtime including its float32 quirks (docs/method.md §4, see
:mod:`ktae.core.ktae_reference`). Both run as one vectorised pass over the batch
(:func:`ktae.core.token_counts.count_units`, one sort of each chunk's keys; tokens and
spans are counted by scatters into per-chunk tables instead, :mod:`ktae.core.scatter_counts`,
see :data:`COUNTING`): no Python loop over groups or tokens.

``ngram=N > 1`` (exact mode) scores spans of N consecutive tokens instead of single
tokens, with the same formulas per (group, distinct span); each token then gets the
value of the spans covering it, reduced by ``ngram_reduce`` (:mod:`ktae.core.ngrams`,
docs/ngram.md).

How the pass is organised (measured with ``benchmarks/bench_advantages.py``, README
"Speed"): the batch is split into chunks of whole groups (about 2**18 real tokens on CPU:
their sorts stay in cache), and the chunks run as coarse tasks, each on one torch thread,
on a pool as large as the caller's thread count (:mod:`ktae.core.chunk_pool`). There is no
barrier inside a chunk, so on a machine that other processes keep busy KTAE slows by the
CPU share it loses, where torch's intra-op parallelism over many short operations made it
wait a time slice at the end of each one. F, IG and Cohen's h of every 2x2 table the
batch's group compositions allow are evaluated once per call
(:mod:`ktae.core.table_stats`), not once per chunk. Transcendental functions go through
:mod:`ktae.core.pointwise`, so that a value never depends on its neighbours in an array:
results are bit for bit the same at any chunking and thread count.

``split="graded"`` replaces the correct/incorrect split by graded membership from the
reward values, and each statistic by its graded counterpart
(:mod:`ktae.core.ktae_graded`, docs/graded.md).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import torch

from ktae.core import jit_counts, stats
from ktae.core.advantages import ADVANTAGE_ESTIMATORS, AdvantageBatch, make_batch
from ktae.core.baselines import SEQUENCE_BASELINES
from ktae.core.checks import as_tensor
from ktae.core.chunk_pool import (
    group_chunks,
    new_output,
    one_thread_caller,
    outside_rows_tasks,
    run_tasks,
    zero_rows,
)
from ktae.core.ktae_graded import (
    graded_table,
    graded_token_values,
    soft_membership,
    threshold_membership,
)
from ktae.core.ktae_options import (
    KTAE_ALIASES,
    PAPER_DEFAULTS,
    QWEN_ENDOFTEXT_ID,
    RUNTIME_DEFAULTS,
    KTAEOptions,
    check_chunk_tokens,
    resolve_options,
)
from ktae.core.ktae_reference import reference_table
from ktae.core.ktae_table import KeyTokenTable
from ktae.core.ngrams import MAXABS_RTOL, Spans, find_spans, reduce_from_starts
from ktae.core.registry import checked_keywords
from ktae.core.scatter_counts import count_spans_scatter, count_units_scatter
from ktae.core.table_stats import TableStats, reference_table_stats, table_stats
from ktae.core.token_counts import (
    TokenCounts,
    _group_totals,
    count_units,
    real_positions,
    real_token_ids,
    row_lengths,
    unique_small_keys,
)

__all__ = ["PAPER_DEFAULTS", "QWEN_ENDOFTEXT_ID", "RUNTIME_DEFAULTS", "KeyTokenTable",
           "key_token_table", "ktae_advantages"]

#: Real tokens per chunk (see ``chunk_tokens``): measured fastest on CPU with memory below
#: the input's (spans, with about one distinct unit per token against a quarter for single
#: tokens, run fastest in chunks half as large); accelerators prefer fewer, larger launches.
CPU_CHUNK_TOKENS = 1 << 18
CPU_SPAN_CHUNK_TOKENS = 1 << 17
DEVICE_CHUNK_TOKENS = 1 << 23

#: How the advantages count the tokens of a chunk: ``"scatter"`` (dense ids and scatters
#: into per-chunk tables, :mod:`ktae.core.scatter_counts`, spans by representatives; huge
#: groups and keys beyond 62 bits take the sort), ``"sort"`` (one sort of the chunk's
#: keys, :func:`ktae.core.token_counts.count_units`) or ``"auto"`` (the default: the
#: scatters where the chunk's token ids and (group, token) pairs get dense ids from a
#: presence bitmap, :func:`ktae.core.scatter_counts.is_dense`; else the sort, faster than
#: hashed ids at every kernel level measured, where the bitmaps beat the sort:
#: ``benchmarks/bench_counting.py``, docs/speed.md). Spans take the scatters in "auto".
#: Same values every way; ``benchmarks/bench_advantages.py --compare`` times the sort
#: beside the default. Where numba is installed (``ktae[fast]``), ``"jit"`` (and "auto",
#: for single tokens on CPU) counts each chunk and writes its output in compiled loops
#: instead (:mod:`ktae.core.jit_counts`), for ids dense enough for a table over their
#: range; others take the paths above.
COUNTING = "auto"
#: "auto" runs the compiled loops on batches of at least this many ``[B, T]`` positions.
#: Below, a call takes milliseconds on either path, and numba's import and cache load
#: (about 1 s once per process) would cost a short run more than the loops save
#: (``benchmarks/bench_advantages.py --compare`` times the loops forced on such a batch).
JIT_MIN_POSITIONS = 1 << 20
COUNTINGS = ("auto", "scatter", "sort", *(("jit",) if jit_counts.AVAILABLE else ()))


# ------------------------------------------------------------------ statistics per pair


def _distinct_tables(cnt: TokenCounts):
    """Distinct 2x2 tables of the batch: ``(a, b, c, d)`` each ``[D]`` and the ``[U]`` map."""
    a, b = cnt.a, cnt.b
    base = int(max(cnt.group_n_correct.max(), cnt.group_n_incorrect.max())) + 1
    group_key = cnt.group_n_correct * base + cnt.group_n_incorrect
    tkey = (a * base + b) * base**2 + group_key[cnt.group]
    uniq, inv = unique_small_keys(tkey, base**4)
    ua = uniq // base**3
    ub = (uniq // base**2) % base
    unt = (uniq // base) % base
    unf = uniq % base
    return (ua, ub, unt - ua, unf - ub), inv


def _term_frequencies(cnt: TokenCounts, k1: float, b: float):
    """TF_T and TF_F ``[U]`` (Eq. 8): the per-group parts once per group, then gathered.

    Same formula as :func:`ktae.core.stats.bm25_term_frequency`, arranged for the hot path.
    """
    def one(count, length, other):
        length = length.to(torch.float64)
        inv_len = torch.where(length > 0, 1.0 / length.clamp_min(1), 0.0)
        sat = k1 * (1 - b + b * length / ((length + other) / 2).clamp_min(1e-12))
        f = count * inv_len.index_select(0, cnt.group)
        return f * (k1 + 1) / (f + sat.index_select(0, cnt.group)).clamp_min(1e-300)

    lc, li = cnt.group_len_correct, cnt.group_len_incorrect
    return one(cnt.count_correct, lc, li), one(cnt.count_incorrect, li, lc)


def _pair_tables(cnt: TokenCounts, tables: TableStats | None):
    """``(p, F, IG, h)`` per pair: rows of the call's :class:`TableStats`, or (without one)
    each distinct table of the chunk evaluated once."""
    if tables is not None:
        rows = tables.rows(cnt.a, cnt.b, cnt.group, cnt.group_n_correct, cnt.group_n_incorrect)
        return tuple(x.index_select(0, rows) for x in (tables.p_value, tables.fisher,
                                                        tables.info_gain, tables.cohens_h))
    distinct, inv = _distinct_tables(cnt)
    p = stats.fisher_exact_pvalue(*distinct)
    return (p[inv], stats.fisher_score(p)[inv], stats.information_gain(*distinct)[inv],
            stats.cohens_h(*distinct)[inv])


def _exact_values(cnt: TokenCounts, tables: TableStats | None, *, h1, h2, h3, k1, b, top,
                  variant) -> torch.Tensor:
    """``[U]`` key-token values (Eq. 9-10)."""
    if tables is not None:  # the weight of each table once, then one gather per pair
        rows = tables.rows(cnt.a, cnt.b, cnt.group, cnt.group_n_correct, cnt.group_n_incorrect)
        weight = ((h1 * tables.fisher + h2 * tables.info_gain) / (h1 + h2)).index_select(0, rows)
        h = tables.cohens_h.index_select(0, rows)
    else:
        _, fisher, ig, h = _pair_tables(cnt, None)
        weight = (h1 * fisher + h2 * ig) / (h1 + h2)
    tf_t, tf_f = _term_frequencies(cnt, k1, b)
    return stats.scale_key_value(weight * stats.direction(h, tf_t, tf_f, h3), top, variant)


def _exact_table(cnt: TokenCounts, tables: TableStats | None, *, h1, h2, h3, k1, b, top,
                 variant) -> KeyTokenTable:
    p, fisher, ig, h = _pair_tables(cnt, tables)
    tf_t, tf_f = _term_frequencies(cnt, k1, b)
    dirn = stats.direction(h, tf_t, tf_f, h3)
    value = stats.scale_key_value((h1 * fisher + h2 * ig) * dirn / (h1 + h2), top, variant)
    a, bb = cnt.a, cnt.b
    c, d = cnt.n_correct - a, cnt.n_incorrect - bb
    return KeyTokenTable(cnt.group, cnt.token, a, bb, c, d, p, fisher, ig, tf_t, tf_f, dirn, value)


def _keep(cnt: TokenCounts, opts: KTAEOptions) -> torch.Tensor:
    """Pairs that get a value: groups with both classes, tokens not ignored (spans never
    contain an ignored token)."""
    both = (cnt.group_n_correct > 0) & (cnt.group_n_incorrect > 0)
    keep = both.index_select(0, cnt.group)
    if opts.ngram == 1 and opts.ignore_token_ids:
        ids = torch.tensor(opts.ignore_token_ids, dtype=cnt.token.dtype, device=cnt.token.device)
        keep &= ~torch.isin(cnt.token, ids)
    return keep


def _table(cnt: TokenCounts, opts: KTAEOptions, tables: TableStats | None) -> KeyTokenTable:
    if opts.mode == "reference":
        table = reference_table(cnt, **opts.stats_kwargs(), tables=tables)
    else:
        table = _exact_table(cnt, tables, **opts.stats_kwargs())
    value = torch.where(_keep(cnt, opts), table.value, torch.zeros_like(table.value))
    return dataclasses.replace(table, value=value)


def _values(cnt: TokenCounts, opts: KTAEOptions, tables: TableStats | None) -> torch.Tensor:
    if opts.mode == "reference":
        return _table(cnt, opts, tables).value
    value = _exact_values(cnt, tables, **opts.stats_kwargs())
    return torch.where(_keep(cnt, opts), value, torch.zeros_like(value))


def _values_once_by_class(cnt: TokenCounts, opts: KTAEOptions, tables: TableStats | None
                          ) -> torch.Tensor:
    """:func:`_values` of the pairs of ``cnt`` (exact mode), each pair that occurs once
    (most spans) valued once per (group, class): its table is ``a = 1`` or ``b = 1`` and
    its counts one occurrence in that class, so nothing else sets its value; the other
    pairs (``run_length > 1``) as usual. Pairs that do not occur get arbitrary values."""
    P, device = cnt.group_n_correct.numel(), cnt.group.device
    if opts.ngram == 1 and opts.ignore_token_ids:  # the joined pairs' tokens are not ids
        value = _values_once_by_class(cnt, dataclasses.replace(opts, ignore_token_ids=()),
                                      tables)
        ids = torch.tensor(opts.ignore_token_ids, dtype=cnt.token.dtype, device=device)
        return value.masked_fill_(torch.isin(cnt.token, ids), 0)
    many = (cnt.run_length > 1).nonzero().squeeze(1)
    # one call for both: the pairs (group g, class) at 2 g + class, then the others
    wrong = torch.arange(2, device=device).repeat(P)
    ones = torch.ones_like(wrong)

    def joined(once: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([once, x.index_select(0, many)])

    both = dataclasses.replace(
        cnt, group=joined(torch.arange(P, device=device).repeat_interleave(2), cnt.group),
        token=joined(wrong, cnt.token), a=joined(1 - wrong, cnt.a), b=joined(wrong, cnt.b),
        count_correct=joined(1 - wrong, cnt.count_correct),
        count_incorrect=joined(wrong, cnt.count_incorrect),
        run_length=joined(ones, cnt.run_length), order=None, pair=None)
    value = _values(both, opts, tables)
    # once: b = 1 exactly for an incorrect response's pair; other pairs read any entry
    at = (cnt.group * 2).add_(cnt.b.clamp_max(1))
    return value[: 2 * P].index_select(0, at).index_copy_(0, many, value[2 * P:])


def _call_tables(batch: AdvantageBatch, correct: torch.Tensor, opts: KTAEOptions
                 ) -> TableStats | None:
    """The :class:`TableStats` of the batch's group compositions, in the options' mode (one
    task: one thread, so that the values do not depend on the thread count)."""
    if opts.split == "graded":
        return None
    sizes = torch.bincount(batch.gid, minlength=batch.num_groups)
    n_c = torch.zeros_like(sizes).index_add_(0, batch.gid, correct.long())
    make = reference_table_stats if opts.mode == "reference" else table_stats
    return run_tasks(lambda _: make(n_c, sizes - n_c), [None], device=batch.device)[0]


# ------------------------------------------------------------------ chunks of groups


@dataclass(frozen=True)
class _Chunk:
    """Consecutive groups of a batch: their rows (a slice when the batch stores its groups
    contiguously, the usual layout, so that inputs are views; else row indices), inputs and
    first group. ``token_ids`` and ``mask`` are the batch's rows, taken when read: inside
    the chunk's task, so that their copies (row indices) run on the task threads and the
    ids' copy lives only while the chunk counts (read it once)."""

    rows: slice | torch.Tensor
    first_group: int  # the batch's id of group 0 of gid (with ``keep``: its first kept group)
    batch: AdvantageBatch
    row_len: torch.Tensor
    gid: torch.Tensor
    num_groups: int
    correct: torch.Tensor

    @property
    def token_ids(self) -> torch.Tensor:
        return self.batch.token_ids[self.rows]

    @functools.cached_property
    def mask(self) -> torch.Tensor:
        return self.batch.mask[self.rows]

    def batch_positions(self, flat: torch.Tensor, row: torch.Tensor) -> torch.Tensor | None:
        """``[M]`` positions in the flattened ``[B, T]`` batch of the chunk's real tokens
        (``flat``, ``row``: their positions and rows in the chunk), or None when the batch's
        ``token_ids`` are not contiguous. Reading the ids and writing the output there
        skips a copy of the chunk's rows, padding included, when its rows are not a slice."""
        if not self.batch.token_ids.is_contiguous():
            return None
        width = self.batch.mask.shape[1]
        if isinstance(self.rows, slice):
            return flat + (self.rows.start or 0) * width
        shift = (self.rows - torch.arange(self.rows.numel(), device=flat.device)).mul_(width)
        return shift.index_select(0, row).add_(flat)  # each row's move, per row

    def count(self, opts: KTAEOptions, flat: torch.Tensor, row: torch.Tensor,
              counting: str = "sort", at: torch.Tensor | None = None
              ) -> tuple[TokenCounts, Spans | None]:
        """Counts per (group, token), or per (group, span) with their spans; ``flat`` and
        ``row`` from :func:`ktae.core.token_counts.real_positions` of the chunk, ``at``
        (optional) from :meth:`batch_positions`; ``counting``: see :data:`COUNTING`
        (``"sort"``: pairs sorted by group, then unit)."""
        if opts.ngram == 1:
            tok = (real_token_ids(self.token_ids, flat) if at is None
                   else real_token_ids(self.batch.token_ids, at))
            cnt = None
            if counting != "sort" and tok.numel():
                cnt = count_units_scatter(tok, int(tok.max()) + 1, row, self.row_len,
                                          self.gid, self.num_groups, self.correct,
                                          hashed=counting == "scatter")
            if cnt is None:
                cnt = count_units(tok, row, self.row_len, self.gid, self.num_groups,
                                  self.correct)
            return cnt, None
        spans, key = find_spans(self.token_ids, self.mask, opts.ngram, opts.ignore_token_ids,
                                flat=flat, row=row, dense=counting == "sort")
        cnt = None
        if counting != "sort" and key.numel():
            cnt = count_spans_scatter(key, int(key.max()) + 1, spans.row, spans.row_len,
                                      self.gid, self.num_groups, self.correct)
        if cnt is None:
            cnt = count_units(key, spans.row, spans.row_len, self.gid, self.num_groups,
                              self.correct)
        return cnt, spans


def _chunks(batch: AdvantageBatch, correct: torch.Tensor, chunk_tokens: int | None,
            keep: torch.Tensor | None = None, ngram: int = 1) -> list[_Chunk]:
    if chunk_tokens is None and batch.device.type != "cpu":
        chunk_tokens = DEVICE_CHUNK_TOKENS
    elif chunk_tokens is None:
        chunk_tokens = CPU_CHUNK_TOKENS if ngram == 1 else CPU_SPAN_CHUNK_TOKENS
    row_len = row_lengths(batch.mask)
    if keep is None:
        return [_Chunk(rows, g0, batch, row_len[rows], batch.gid[rows] - g0, n_groups,
                       correct[rows])
                for rows, g0, n_groups in group_chunks(batch.gid, batch.num_groups, row_len,
                                                        chunk_tokens)]
    # a chunk's kept groups numbered 0, 1, ... without the left-out groups between them:
    # its (group, token) keys then span only the groups it counts
    rank = torch.cumsum(keep, 0) - 1
    chunks = []
    for rows, g0, n_groups in group_chunks(batch.gid, batch.num_groups, row_len,
                                           chunk_tokens, keep):
        r0 = int(rank[g0])
        chunks.append(_Chunk(rows, g0, batch, row_len[rows],
                             rank.index_select(0, batch.gid[rows]) - r0,
                             int(rank[g0 + n_groups - 1]) - r0 + 1, correct[rows]))
    return chunks


def _mixed_groups(batch: AdvantageBatch, correct: torch.Tensor) -> torch.Tensor | None:
    """``[P]`` groups with both a correct and an incorrect response, or None when every
    group is (the others' key-token values are 0: their rows need no pass at all)."""
    n_c = torch.zeros(batch.num_groups, dtype=torch.int64, device=batch.device).index_add_(
        0, batch.gid, correct.long())
    sizes = torch.bincount(batch.gid, minlength=batch.num_groups)
    mixed = (n_c > 0) & (n_c < sizes)
    return None if bool(mixed.all()) else mixed


# ------------------------------------------------------------------ public functions


def _jit_chunk(chunk: _Chunk, opts: KTAEOptions, tables: TableStats | None,
               seq: torch.Tensor, out: torch.Tensor) -> bool:
    """Count a chunk's tokens or spans and write its rows of ``out`` in the compiled loops
    of :mod:`ktae.core.jit_counts`; False (nothing written) when its ids are too sparse
    (tokens) or too large (spans) for them."""
    rows = chunk.rows
    if isinstance(rows, slice):
        rows = torch.arange(rows.start or 0, rows.stop, rows.step or 1)
    order = torch.argsort(chunk.gid, stable=True)  # each group's rows one after the other
    rows = rows.index_select(0, order).numpy()
    read = (chunk.batch.token_ids, chunk.batch.mask, rows,
            chunk.gid.index_select(0, order).numpy(),
            chunk.correct.index_select(0, order).numpy())
    if opts.ngram == 1:
        counted = jit_counts.count_rows(*read)
        units_per_row = chunk.row_len
    else:
        per_group = torch.zeros(chunk.num_groups, dtype=torch.int64).index_add_(
            0, chunk.gid, chunk.row_len)
        counted = jit_counts.count_span_rows(
            *read, opts.ngram, np.asarray(opts.ignore_token_ids, dtype=np.int64),
            int(per_group.max()))
        if counted is not None:
            span_at, spans_read, *counted = counted
            units_per_row = torch.empty_like(spans_read).index_copy_(0, order, spans_read)
    if counted is None:
        return False
    pair, group, token, a, b, count_correct, count_incorrect = (
        (counted[0], *counted[1:]) if opts.ngram == 1 else (None, *counted))
    sizes = torch.bincount(chunk.gid, minlength=chunk.num_groups)
    cnt = TokenCounts(group=group, token=token, a=a, b=b, count_correct=count_correct,
                      count_incorrect=count_incorrect, run_length=count_correct + count_incorrect,
                      order=None, pair=pair,
                      **_group_totals(chunk.gid, chunk.num_groups, sizes, chunk.correct,
                                      units_per_row))
    by_pair = (_values_once_by_class(cnt, opts, tables) if opts.mode == "exact"
               else _values(cnt, opts, tables))
    base = seq.index_select(0, torch.from_numpy(rows))
    if opts.ngram == 1:
        jit_counts.write_rows(out, chunk.batch.mask, rows, base,
                              by_pair.to(out.dtype).contiguous(), pair)
    else:  # the spans' values in their own dtype, reduced, then in the output's
        jit_counts.write_span_rows(out, chunk.batch.mask, rows, base, by_pair.contiguous(),
                                   span_at, opts.ngram, opts.ngram_reduce,
                                   1.0 + MAXABS_RTOL)
    return True


def _prepare(batch: AdvantageBatch, correct, options: dict) -> tuple[KTAEOptions, torch.Tensor]:
    """Validate the options; return them and the ``[B]`` correctness of each response."""
    if batch.token_ids is None:
        raise ValueError("token_ids: required by the 'ktae' estimator")
    opts = resolve_options(**options)
    if opts.split == "graded":
        if correct is not None:
            raise ValueError("correct: split='graded' takes each response's membership from "
                             "its reward; remove correct or use split='threshold'")
        return opts, soft_membership(batch.rewards, batch.gid, batch.num_groups)
    if opts.mode == "reference" and correct is None:
        # The runtime's rule is float32 score > 0 (1e-50 is not > 0 there); an explicit
        # ``correct`` replaces it, e.g. a verifier's accuracy when the reward also holds
        # shaping terms (what the trainer passes).
        return opts, batch.rewards.to(torch.float32) > 0
    if correct is None:
        return opts, threshold_membership(batch.rewards, batch.gid, batch.num_groups,
                                          opts.reward_threshold)
    correct = as_tensor(correct, "correct", device=batch.device)
    if correct.shape != batch.rewards.shape:
        raise ValueError(f"correct: expected shape {tuple(batch.rewards.shape)}, "
                         f"got {tuple(correct.shape)}")
    if correct.dtype != torch.bool:
        if correct.is_floating_point() or not ((correct == 0) | (correct == 1)).all():
            raise ValueError("correct: expected booleans (or 0/1 integers)")
        correct = correct != 0
    return opts, correct


APPLY = ("all", "wrong", "right")
"""``apply``: which responses get key-token values (the others keep their base advantage)."""


def _check_apply(apply) -> None:
    if apply not in APPLY:
        raise ValueError(f"apply: expected one of {', '.join(APPLY)}, got {apply!r}")


def _check_base(base) -> None:
    if not isinstance(base, str) or base not in SEQUENCE_BASELINES:
        raise ValueError(f"base: expected one of {sorted(SEQUENCE_BASELINES)}, got {base!r}")


#: KTAE's options that :func:`key_token_table` takes too: ``ktae explain`` and the audit
#: build the table of a KTAE run with them.
TABLE_OPTIONS = ("correct", "reward_threshold", "h1", "h2", "h3", "k1", "b", "top",
                 "ignore_token_ids", "mode", "variant", "ngram", "split")


@ADVANTAGE_ESTIMATORS.register("ktae", needs=("token_ids",), correct_unless={"split": "graded"},
                               aliases=KTAE_ALIASES, table_options=TABLE_OPTIONS)
def ktae_advantages(batch: AdvantageBatch, *, base: str = "grpo", correct=None,
                    reward_threshold: float | None = None, h1: float | None = None,
                    h2: float | None = None, h3: float | None = None, k1: float = 2.0,
                    b: float = 0.5, top: float = 1.0, ignore_token_ids=None,
                    mode: str = "exact", variant: str = "runtime", ngram: int = 1,
                    ngram_reduce: str = "mean", chunk_tokens: int | None = None,
                    split: str = "threshold", apply: str = "all") -> torch.Tensor:
    """Token-level KTAE advantages ``[B, T]`` (Eq. 10), zero on padding.

    Options (see :func:`ktae.compute_advantages`): ``base`` ("grpo", "drgrpo", "rloo"),
    ``correct`` (bool ``[B]``) or ``reward_threshold`` (correct = reward > threshold,
    default 0), ``h1``, ``h2``, ``h3`` (defaults 1, 1, 1; ``variant="paper"``: 1, 2, 1;
    set one to 0 for the paper's ablations), ``k1`` (2.0), ``b`` (0.5), ``top`` (1.0),
    ``ignore_token_ids`` (value 0; none by default, 151643 in reference mode; in reference
    mode ``correct`` replaces the runtime's float32 ``reward > 0`` rule when given),
    ``mode`` ("exact" or "reference"), ``variant`` ("runtime": ``top (2 sigmoid(k) - 1)``,
    or "paper": ``top (sigmoid(k) - 0.5)``), ``ngram`` (1: key tokens; N > 1: key spans
    of N tokens, exact mode only) and ``ngram_reduce`` ("mean": a token gets the mean
    value of the spans covering it; "maxabs": the value of largest magnitude among them),
    ``chunk_tokens``
    (groups are processed in chunks of about this many real tokens, which bounds memory and
    keeps sorts in cache; results do not depend on it, bit for bit; default 2**18 on CPU
    (2**17 for spans), 2**23 on accelerators; on CPU the chunks run as single-threaded tasks in parallel,
    :mod:`ktae.core.chunk_pool`), ``split`` ("threshold": correct = reward > threshold, docs/method.md §3;
    "graded": each response belongs to the correct class with weight
    ``(r - min_g r) / (max_g r - min_g r)`` and every statistic is its graded counterpart,
    :mod:`ktae.core.ktae_graded`; exact mode, without ``correct``/``reward_threshold``),
    ``apply`` ("all", the default; "wrong": only the incorrect responses get key-token
    values, the correct ones keep their base advantage on every token, so no positive
    credit is moved onto a right answer's tokens; "right": the reverse; a response's class
    is the one KTAE's statistics use, so ``split="graded"`` takes "all" only).
    Bounds: :mod:`ktae.core.ktae_options`.

    Degenerate input: a group of one gets its base advantage (GRPO: mean 0, std 1) and no
    key-token values; a group that is all correct or all incorrect gets values 0; empty
    responses are all padding and get 0; a class whose responses are all empty has
    f = TF = 0 for every token. With ``ngram = N > 1``, a token covered by no span (in a
    run of fewer than N real tokens between padding or ignored tokens, or an ignored token)
    gets value 0, i.e. its base advantage. A group whose rewards are equal up to float
    rounding (:func:`ktae.core.baselines.equal_reward_groups`) gets base advantage 0 and,
    unless ``correct`` is given, key-token values 0.

    Raises:
        ValueError: an unknown option (the message lists the valid ones) or an invalid value.
    """
    _check_base(base)
    _check_apply(apply)
    opts, is_correct = _prepare(batch, correct, dict(
        reward_threshold=reward_threshold, h1=h1, h2=h2, h3=h3, k1=k1, b=b, top=top,
        ignore_token_ids=ignore_token_ids, mode=mode, variant=variant, ngram=ngram,
        ngram_reduce=ngram_reduce, split=split))
    if apply != "all" and opts.split == "graded":
        raise ValueError(f"apply: split='graded' has no right and wrong responses; "
                         f"expected apply='all', got {apply!r}")
    chunk_tokens = check_chunk_tokens(chunk_tokens)
    rewards = batch.rewards.to(torch.float32) if opts.mode == "reference" else batch.rewards
    out_dtype = torch.float64 if batch.rewards.dtype == torch.float64 else torch.float32
    seq = SEQUENCE_BASELINES[base](rewards, batch.gid, batch.num_groups).to(out_dtype)
    keep = None if opts.split == "graded" else _mixed_groups(batch, is_correct)
    # every element of ``out`` is written by one task: a chunk's rows by the chunk, the
    # others by :func:`ktae.core.chunk_pool.outside_rows_tasks`
    out = new_output(batch.mask.shape, out_dtype, batch.device)

    tables = _call_tables(batch, is_correct, opts)

    tokens = opts.ngram == 1 and opts.split != "graded"
    jit = (opts.split != "graded"
           and (COUNTING == "jit" or (COUNTING == "auto"
                                      and batch.mask.numel() >= JIT_MIN_POSITIONS))
           and jit_counts.usable(batch.token_ids, batch.mask) and out.is_contiguous()
           and not batch.rewards.requires_grad)  # the loops write plain numbers

    def one_chunk(chunk: _Chunk) -> None:  # a task: writes its own rows of ``out``
        if jit and _jit_chunk(chunk, opts, tables, seq, out):
            return
        flat, row, _ = real_positions(chunk.mask, chunk.row_len)
        at = chunk.batch_positions(flat, row) if tokens else None
        if opts.split == "graded":  # chunk.correct holds the memberships w
            per_token = graded_token_values(chunk.token_ids, chunk.mask, chunk.gid,
                                            chunk.num_groups, chunk.correct, opts, out_dtype)
        else:
            cnt, spans = chunk.count(opts, flat, row, COUNTING, at)
            if spans is None:
                once = cnt.order is None and opts.mode == "exact"
                by_pair = (_values_once_by_class(cnt, opts, tables) if once
                           else _values(cnt, opts, tables))
                per_token = cnt.spread(by_pair.to(out_dtype))
            else:
                by_pair = (_values_once_by_class(cnt, opts, tables) if cnt.order is None
                           else _values(cnt, opts, tables))
                by_start = cnt.spread_at(by_pair, spans.start, flat.numel())
                per_token = reduce_from_starts(by_start, spans, opts.ngram_reduce).to(out_dtype)
        per_token = per_token + seq[chunk.rows].index_select(0, row)  # padding keeps 0
        if at is not None:  # ``out`` is contiguous
            zero_rows(out, chunk.rows)
            out.view(-1).index_copy_(0, at, per_token)
        elif isinstance(chunk.rows, slice):
            zero_rows(out, chunk.rows)
            out[chunk.rows].view(-1).index_copy_(0, flat, per_token)
        else:
            block = torch.zeros(chunk.mask.shape, dtype=out_dtype, device=out.device)
            out.index_copy_(0, chunk.rows, block.view(-1).index_copy_(0, flat, per_token)
                            .view(chunk.mask.shape))

    chunks = _chunks(batch, is_correct, chunk_tokens, keep, opts.ngram)
    run_tasks(lambda task: task(), [*(functools.partial(one_chunk, c) for c in chunks),
                                    *outside_rows_tasks(out, batch.mask, batch.gid, keep, seq)],
              device=batch.device)
    if apply != "all":
        chosen = ~is_correct if apply == "wrong" else is_correct
        base_only = torch.where(batch.mask, seq[:, None], torch.zeros((), dtype=out_dtype))
        out = torch.where(chosen[:, None], out, base_only)
    return out


def _span_columns(table: KeyTokenTable, cnt: TokenCounts, spans: Spans) -> KeyTokenTable:
    """Add the token ids of each row's span (from its first occurrence)."""
    first = torch.cumsum(cnt.run_length, 0) - cnt.run_length  # sorted index of each run
    return dataclasses.replace(table, span=spans.token_ids(cnt.order[first]))


@one_thread_caller
@checked_keywords("key_token_table")
def key_token_table(*, rewards, group, token_ids, mask=None, base: str | None = None,
                    correct=None, reward_threshold: float | None = None,
                    h1: float | None = None, h2: float | None = None,
                    h3: float | None = None, k1: float = 2.0, b: float = 0.5,
                    top: float = 1.0, ignore_token_ids=None, mode: str = "exact",
                    variant: str = "runtime", ngram: int = 1, ngram_reduce: str = "mean",
                    chunk_tokens: int | None = None, split: str = "threshold",
                    apply: str = "all") -> KeyTokenTable:
    """Diagnostics: KTAE's statistics for every (group, distinct token) of a batch.

    Takes the same arguments and options as ``compute_advantages("ktae", ...)`` (``base``,
    ``ngram_reduce`` and ``apply`` are checked and do not change the table: every class's
    statistics are computed whichever responses receive the values) and returns a
    :class:`KeyTokenTable`: the counts a, b, c, d, the p-value, F, IG, TF_T, TF_F, D and
    the key-token value of each token in each group. With ``ngram = N > 1`` the rows are
    (group, distinct span of N tokens) and the table's ``span`` column holds the token
    ids of each span. With ``split="graded"`` the table holds the graded statistics:
    soft counts a, b, c, d, the interpolated p-value and F, and the weighted IG, TF and D
    (:mod:`ktae.core.ktae_graded`).

    Example:
        >>> t = key_token_table(rewards=[1., 0.], group=[0, 0], token_ids=[[5, 6], [5, 7]])
        >>> t.lookup(0, 6)["a"], t.lookup(0, 6)["b"]
        (1, 0)
        >>> t2 = key_token_table(rewards=[1., 0.], group=[0, 0], token_ids=[[5, 6], [5, 7]],
        ...                      ngram=2)
        >>> t2.lookup(0, span=[5, 6])["a"], t2.lookup(0, span=[5, 6])["value"] > 0
        (1, True)
    """
    if base is not None:
        _check_base(base)
    _check_apply(apply)
    batch = make_batch(rewards=rewards, group=group, token_ids=token_ids, mask=mask)
    opts, is_correct = _prepare(batch, correct, dict(
        reward_threshold=reward_threshold, h1=h1, h2=h2, h3=h3, k1=k1, b=b, top=top,
        ignore_token_ids=ignore_token_ids, mode=mode, variant=variant, ngram=ngram,
        ngram_reduce=ngram_reduce, split=split))
    chunk_tokens = check_chunk_tokens(chunk_tokens)
    tables = _call_tables(batch, is_correct, opts)

    def one_chunk(chunk: _Chunk) -> KeyTokenTable:
        if opts.split == "graded":
            table, cnt, spans = graded_table(chunk.token_ids, chunk.mask, chunk.gid,
                                             chunk.num_groups, chunk.correct, opts)
        else:
            flat, row, _ = real_positions(chunk.mask, chunk.row_len)
            cnt, spans = chunk.count(opts, flat, row)
            table = _table(cnt, opts, tables)
        if spans is not None:
            table = _span_columns(table, cnt, spans)
        if chunk.first_group:
            table = dataclasses.replace(table, group=table.group + chunk.first_group)
        return table

    parts = run_tasks(one_chunk, _chunks(batch, is_correct, chunk_tokens, ngram=opts.ngram),
                      device=batch.device)
    if len(parts) == 1:
        table = parts[0]
    else:
        table = KeyTokenTable(**{f.name: None if getattr(parts[0], f.name) is None else
                                 torch.cat([getattr(p, f.name) for p in parts])
                                 for f in dataclasses.fields(KeyTokenTable)})
    if table.span is not None:  # span ids: lexicographic rank over the whole table
        ids = torch.unique(table.span, dim=0, return_inverse=True)[1] if len(table) else table.token
        table = dataclasses.replace(table, token=ids.reshape(-1))
    return table
