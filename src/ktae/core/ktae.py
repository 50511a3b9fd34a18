"""KTAE: Key-token Advantage Estimation (SPEC section 2; paper section 3, Eq. 4-10).

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
reproduces the authors' released runtime including its float32 quirks (SPEC 2b, see
:mod:`ktae.core.ktae_reference`). Both run as one vectorised pass over the batch
(:func:`ktae.core.token_counts.count_tokens`): no Python loop over groups or tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

import torch

from ktae.core import stats
from ktae.core.advantages import ADVANTAGE_ESTIMATORS, AdvantageBatch, make_batch
from ktae.core.baselines import SEQUENCE_BASELINES
from ktae.core.checks import as_tensor
from ktae.core.token_counts import TokenCounts, count_tokens, unique_small_keys

#: Qwen2.5's ``<|endoftext|>`` (its EOS and pad), ignored by the released runtime.
QWEN_ENDOFTEXT_ID = 151643

#: Real tokens per chunk (see ``chunk_tokens``): measured fastest on CPU with memory below
#: the input's; accelerators prefer fewer, larger launches.
CPU_CHUNK_TOKENS = 1 << 19
DEVICE_CHUNK_TOKENS = 1 << 23

#: Default hyper-parameters of the released runtime (SPEC 2) and of the paper variant.
RUNTIME_DEFAULTS = {"h1": 1.0, "h2": 1.0, "h3": 1.0}
PAPER_DEFAULTS = {"h1": 1.0, "h2": 2.0, "h3": 1.0}


@dataclass(frozen=True)
class KeyTokenTable:
    """Per (group, distinct token) statistics of KTAE: one row per pair, 1-D tensors.

    ``group`` is the dense group index (groups numbered in order of first appearance in
    the batch); ``token`` the token id; ``a, b, c, d`` the 2x2 table (present/absent x
    correct/incorrect); ``p_value`` and ``fisher`` (F), ``info_gain`` (bits),
    ``tf_correct``/``tf_incorrect`` (Eq. 8), ``direction`` (D, Eq. 9) and ``value``
    (the key-token value added to the base advantage). Groups lacking a correct or an
    incorrect response, and ignored tokens, have ``value == 0``.
    """

    group: torch.Tensor
    token: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    d: torch.Tensor
    p_value: torch.Tensor
    fisher: torch.Tensor
    info_gain: torch.Tensor
    tf_correct: torch.Tensor
    tf_incorrect: torch.Tensor
    direction: torch.Tensor
    value: torch.Tensor

    def __len__(self) -> int:
        return int(self.group.numel())

    def to_rows(self) -> list[dict]:
        """The table as a list of plain dicts (ints and floats), one per pair."""
        cols = {f.name: getattr(self, f.name).detach().cpu().tolist() for f in fields(self)}
        return [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]

    def format(self, top: int = 20, decode=None) -> str:
        """A plain-text table of the ``top`` pairs with the largest ``|value|``.

        ``decode``: optional ``token id -> str`` (e.g. ``tokenizer.decode``) for a text column.
        """
        order = torch.argsort(self.value.abs(), descending=True, stable=True)[:top].tolist()
        head = ["group", "token"] + (["text"] if decode else []) + [
            "a", "b", "c", "d", "p", "F", "IG", "TF_T", "TF_F", "D", "value"]
        lines = ["  ".join(f"{h:>9}" for h in head)]
        for i in order:
            cells = [str(int(self.group[i])), str(int(self.token[i]))]
            if decode:
                cells.append(repr(decode(int(self.token[i])))[:9])
            cells += [str(int(getattr(self, k)[i])) for k in "abcd"]
            cells += [f"{float(getattr(self, k)[i]):.3g}" for k in (
                "p_value", "fisher", "info_gain", "tf_correct", "tf_incorrect", "direction", "value")]
            lines.append("  ".join(f"{c:>9}" for c in cells))
        return "\n".join(lines)

    def lookup(self, group: int, token: int) -> dict:
        """The row of one (dense group, token id): "why did this token get this credit?"."""
        hit = ((self.group == group) & (self.token == token)).nonzero()
        if hit.numel() == 0:
            raise KeyError(f"token {token} does not occur in group {group}")
        i = int(hit[0, 0])
        return {f.name: getattr(self, f.name)[i].item() for f in fields(self)}


def _resolve_options(mode: str, variant: str, h1, h2, h3, k1: float, b: float, top: float):
    if mode not in ("exact", "reference"):
        raise ValueError(f"mode: expected 'exact' or 'reference', got {mode!r}")
    if variant not in ("runtime", "paper"):
        raise ValueError(f"variant: expected 'runtime' or 'paper', got {variant!r}")
    defaults = PAPER_DEFAULTS if variant == "paper" else RUNTIME_DEFAULTS
    h1 = defaults["h1"] if h1 is None else float(h1)
    h2 = defaults["h2"] if h2 is None else float(h2)
    h3 = defaults["h3"] if h3 is None else float(h3)
    for name, val in (("h1", h1), ("h2", h2), ("h3", h3), ("top", top), ("k1", k1)):
        if not val >= 0:
            raise ValueError(f"{name}: expected a non-negative number, got {val}")
    if h1 + h2 <= 0:
        raise ValueError("h1, h2: expected h1 + h2 > 0 (at least one of F and IG on)")
    if not 0.0 <= b <= 1.0:
        raise ValueError(f"b: expected 0 <= b <= 1, got {b}")
    return h1, h2, h3


def _correctness(batch: AdvantageBatch, correct, reward_threshold: float) -> torch.Tensor:
    if correct is None:
        return batch.rewards > reward_threshold
    correct = as_tensor(correct, "correct", device=batch.device)
    if correct.shape != batch.rewards.shape:
        raise ValueError(f"correct: expected shape {tuple(batch.rewards.shape)}, "
                         f"got {tuple(correct.shape)}")
    if correct.dtype != torch.bool:
        if correct.is_floating_point() or not ((correct == 0) | (correct == 1)).all():
            raise ValueError("correct: expected booleans (or 0/1 integers)")
        correct = correct != 0
    return correct


def _ignored(token: torch.Tensor, ignore_token_ids: Iterable[int] | None) -> torch.Tensor:
    ids = [] if ignore_token_ids is None else [int(i) for i in ignore_token_ids]
    if not ids:
        return torch.zeros_like(token, dtype=torch.bool)
    return torch.isin(token, torch.tensor(ids, dtype=token.dtype, device=token.device))


def _scale(k: torch.Tensor, top: float, variant: str) -> torch.Tensor:
    if variant == "paper":  # paper Eq. 10: sigmoid(k) - 0.5
        return top * (torch.sigmoid(k) - 0.5)
    return top * (2.0 * torch.sigmoid(k) - 1.0)


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
        f = count * inv_len[cnt.group]
        return f * (k1 + 1) / (f + sat[cnt.group]).clamp_min(1e-300)

    lc, li = cnt.group_len_correct, cnt.group_len_incorrect
    return one(cnt.count_correct, lc, li), one(cnt.count_incorrect, li, lc)


def _exact_values(cnt: TokenCounts, *, h1, h2, h3, k1, b, top, variant) -> torch.Tensor:
    """``[U]`` key-token values; F, IG and Cohen's h evaluated once per distinct table."""
    tables, inv = _distinct_tables(cnt)
    p = stats.fisher_exact_pvalue(*tables)
    weight = (h1 * stats.fisher_score(p) + h2 * stats.information_gain(*tables)) / (h1 + h2)
    h = stats.cohens_h(*tables)
    tf_t, tf_f = _term_frequencies(cnt, k1, b)
    return _scale(weight[inv] * stats.direction(h[inv], tf_t, tf_f, h3), top, variant)


def _exact_table(cnt: TokenCounts, *, h1, h2, h3, k1, b, top, variant) -> KeyTokenTable:
    tables, inv = _distinct_tables(cnt)
    p_u = stats.fisher_exact_pvalue(*tables)
    p, ig, h = p_u[inv], stats.information_gain(*tables)[inv], stats.cohens_h(*tables)[inv]
    fisher = stats.fisher_score(p)
    tf_t, tf_f = _term_frequencies(cnt, k1, b)
    dirn = stats.direction(h, tf_t, tf_f, h3)
    value = _scale((h1 * fisher + h2 * ig) * dirn / (h1 + h2), top, variant)
    a, bb = cnt.a, cnt.b
    c, d = cnt.n_correct - a, cnt.n_incorrect - bb
    return KeyTokenTable(cnt.group, cnt.token, a, bb, c, d, p, fisher, ig, tf_t, tf_f, dirn, value)


@dataclass(frozen=True)
class _Settings:
    h1: float
    h2: float
    h3: float
    k1: float
    b: float
    top: float
    variant: str
    mode: str
    ignore_token_ids: tuple[int, ...]

    def stats_kwargs(self) -> dict:
        return dict(h1=self.h1, h2=self.h2, h3=self.h3, k1=self.k1, b=self.b, top=self.top,
                    variant=self.variant)


def _prepare(batch: AdvantageBatch, *, correct=None, reward_threshold: float = 0.0, h1=None,
             h2=None, h3=None, k1: float = 2.0, b: float = 0.5, top: float = 1.0,
             ignore_token_ids: Iterable[int] | None = None, mode: str = "exact",
             variant: str = "runtime") -> tuple[_Settings, torch.Tensor]:
    """Validate the options; return them and the ``[B]`` correctness of each response."""
    if batch.token_ids is None:
        raise ValueError("token_ids: required by the 'ktae' estimator")
    h1, h2, h3 = _resolve_options(mode, variant, h1, h2, h3, k1, b, top)
    if mode == "reference":
        if ignore_token_ids is None:
            ignore_token_ids = (QWEN_ENDOFTEXT_ID,)
        # The runtime's rule is float32 score > 0 (1e-50 is not > 0 there); an explicit
        # ``correct`` replaces it, e.g. a verifier's accuracy when the reward also holds
        # shaping terms (what the trainer passes).
        if correct is not None:
            is_correct = _correctness(batch, correct, reward_threshold)
        else:
            is_correct = batch.rewards.to(torch.float32) > 0
    else:
        is_correct = _correctness(batch, correct, reward_threshold)
    ignored = tuple(int(i) for i in (ignore_token_ids or ()))
    return _Settings(h1, h2, h3, float(k1), float(b), float(top), variant, mode, ignored), is_correct


def _count(batch: AdvantageBatch, **options) -> tuple[TokenCounts, _Settings]:
    settings, is_correct = _prepare(batch, **options)
    cnt = count_tokens(batch.token_ids, batch.mask, batch.gid, batch.num_groups, is_correct)
    return cnt, settings


def _group_chunks(gid: torch.Tensor, num_groups: int, row_len: torch.Tensor, max_tokens: int):
    """Split the groups into consecutive ranges of about ``max_tokens`` real tokens.

    Yields ``(rows, first_group, num_groups_in_chunk)``. Key-token statistics never cross
    groups, so chunks are independent; they bound the memory of the sort and its
    companions (and shorter sorts are cheaper per element). A handful of chunks per batch:
    this is not a loop over groups.
    """
    per_group = torch.zeros(num_groups, dtype=torch.int64, device=gid.device).index_add_(0, gid, row_len)
    before = torch.cumsum(per_group, 0) - per_group
    chunk_of_group = before // max(1, max_tokens)
    if int(chunk_of_group[-1]) == 0:
        yield None, 0, num_groups
        return
    chunk_of_row = chunk_of_group[gid]
    order = torch.argsort(chunk_of_row, stable=True)
    bounds = torch.searchsorted(chunk_of_row[order], torch.unique(chunk_of_group), right=True)
    first_groups = torch.searchsorted(chunk_of_group, torch.unique(chunk_of_group))
    start = 0
    for i, end in enumerate(bounds.tolist()):
        g0 = int(first_groups[i])
        g1 = int(first_groups[i + 1]) if i + 1 < first_groups.numel() else num_groups
        yield order[start:end], g0, g1 - g0
        start = end


def _keep(cnt: TokenCounts, settings: _Settings) -> torch.Tensor:
    """Pairs that get a value: groups with both classes, tokens not ignored."""
    both = (cnt.group_n_correct > 0) & (cnt.group_n_incorrect > 0)
    return both[cnt.group] & ~_ignored(cnt.token, settings.ignore_token_ids)


def _table(cnt: TokenCounts, settings: _Settings) -> KeyTokenTable:
    if settings.mode == "reference":
        from ktae.core.ktae_reference import reference_table

        table = reference_table(cnt, **settings.stats_kwargs())
    else:
        table = _exact_table(cnt, **settings.stats_kwargs())
    value = torch.where(_keep(cnt, settings), table.value, torch.zeros_like(table.value))
    return KeyTokenTable(**{**{f.name: getattr(table, f.name) for f in fields(table)}, "value": value})


def _values(cnt: TokenCounts, settings: _Settings) -> torch.Tensor:
    if settings.mode == "reference":
        return _table(cnt, settings).value
    value = _exact_values(cnt, **settings.stats_kwargs())
    return torch.where(_keep(cnt, settings), value, torch.zeros_like(value))


@ADVANTAGE_ESTIMATORS.register("ktae")
def ktae_advantages(batch: AdvantageBatch, *, base: str = "grpo", chunk_tokens: int | None = None,
                    **options) -> torch.Tensor:
    """Token-level KTAE advantages ``[B, T]`` (Eq. 10), zero on padding.

    Options (see :func:`ktae.compute_advantages`): ``base`` ("grpo", "drgrpo", "rloo"),
    ``correct`` (bool ``[B]``) or ``reward_threshold`` (correct = reward > threshold,
    default 0), ``h1``, ``h2``, ``h3`` (defaults 1, 1, 1; ``variant="paper"``: 1, 2, 1;
    set one to 0 for the paper's ablations), ``k1`` (2.0), ``b`` (0.5), ``top`` (1.0),
    ``ignore_token_ids`` (value 0; none by default, 151643 in reference mode; in reference
    mode ``correct`` replaces the runtime's float32 ``reward > 0`` rule when given),
    ``mode`` ("exact" or "reference"), ``variant`` ("runtime": ``top (2 sigmoid(k) - 1)``,
    or "paper": ``top (sigmoid(k) - 0.5)``), ``chunk_tokens`` (groups are processed in
    chunks of about this many real tokens, which bounds memory and keeps sorts in cache;
    results do not depend on it; default 2**19 on CPU, 2**23 on accelerators).

    Degenerate input: a group of one gets its base advantage (GRPO: mean 0, std 1) and no
    key-token values; a group that is all correct or all incorrect gets values 0; empty
    responses are all padding and get 0; a class whose responses are all empty has
    f = TF = 0 for every token.
    """
    if base not in SEQUENCE_BASELINES:
        raise ValueError(f"base: expected one of {sorted(SEQUENCE_BASELINES)}, got {base!r}")
    settings, is_correct = _prepare(batch, **options)
    if chunk_tokens is None:
        chunk_tokens = CPU_CHUNK_TOKENS if batch.device.type == "cpu" else DEVICE_CHUNK_TOKENS
    elif int(chunk_tokens) < 1:
        raise ValueError(f"chunk_tokens: expected a positive integer, got {chunk_tokens}")
    rewards = batch.rewards.to(torch.float32) if settings.mode == "reference" else batch.rewards
    out_dtype = torch.float64 if batch.rewards.dtype == torch.float64 else torch.float32
    seq = SEQUENCE_BASELINES[base](rewards, batch.gid, batch.num_groups).to(out_dtype)
    out = torch.zeros(batch.mask.shape, dtype=out_dtype, device=batch.device)
    row_len = batch.mask.sum(1, dtype=torch.int32).long()
    for rows, g0, n_groups in _group_chunks(batch.gid, batch.num_groups, row_len, chunk_tokens):
        if rows is None:  # one chunk: the whole batch, no copies
            cnt = count_tokens(batch.token_ids, batch.mask, batch.gid, n_groups, is_correct)
            out.masked_scatter_(batch.mask, cnt.spread(_values(cnt, settings).to(out_dtype)))
            continue
        mask = batch.mask[rows]
        cnt = count_tokens(batch.token_ids[rows], mask, batch.gid[rows] - g0, n_groups, is_correct[rows])
        per_token = cnt.spread(_values(cnt, settings).to(out_dtype))
        out.index_copy_(0, rows, torch.zeros_like(out[rows]).masked_scatter_(mask, per_token))
    return out.add_(seq[:, None]).masked_fill_(~batch.mask, 0.0)


def key_token_table(*, rewards, group, token_ids, mask=None, **options) -> KeyTokenTable:
    """Diagnostics: KTAE's statistics for every (group, distinct token) of a batch.

    Takes the same arguments and options as ``compute_advantages("ktae", ...)`` (``base``
    is accepted and ignored) and returns a :class:`KeyTokenTable`: the counts a, b, c, d,
    the p-value, F, IG, TF_T, TF_F, D and the key-token value of each token in each group.

    Example:
        >>> t = key_token_table(rewards=[1., 0.], group=[0, 0], token_ids=[[5, 6], [5, 7]])
        >>> t.lookup(0, 6)["a"], t.lookup(0, 6)["b"]
        (1, 0)
    """
    options.pop("base", None)
    batch = make_batch(rewards=rewards, group=group, token_ids=token_ids, mask=mask)
    return _table(*_count(batch, **options))
