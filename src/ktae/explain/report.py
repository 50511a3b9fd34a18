"""The data behind ``ktae explain``: groups of responses, their credit views and statistics.

:func:`build_report` takes groups of tokenised responses with rewards and computes, in one
vectorised pass over all groups:

* the sequence-level advantage (the ``seq`` view: GRPO, Dr.GRPO or RLOO, docs/method.md §2);
* the token-level credit of the chosen estimator (the ``token`` view: KTAE, docs/method.md §3, Eq. 10);
* a loss-time calibration of it (the ``final`` view: e.g. TACO, docs/method.md §8), from per-token
  log-probs and entropies, with each token's weight and flag;
* ``diff``: the final credit minus the sequence advantage (what token credit changes);
* for every real token, its row of :func:`ktae.key_token_table` (a, b, c, d, p, F, IG,
  TF_T, TF_F, D, value) in its group; with KTAE over spans (``ngram > 1``), the row of the
  covering span of largest ``|value|`` (None for a token no span covers).

The result is a :class:`ktae.viz.page.Report`; the renderers (:mod:`ktae.viz.report_html`,
:mod:`ktae.viz.report_terminal`, :mod:`ktae.viz.report_png`) only read it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ktae.core.ktae import key_token_table
from ktae.core.methods import Method
from ktae.groups.credit import credit_values, in_loss_mask, per_response
from ktae.groups.input import GroupInput
from ktae.viz.page import GroupReport, Report, ResponseReport
from ktae.viz.tokens import TokenPiece, token_label, token_pieces


def _row_mapping(table, gid: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """For each real token, the index of its (group, token) row in ``table`` ([B, T], -1 pad)."""
    if len(table) == 0:  # every response is empty
        return torch.full(ids.shape, -1, dtype=torch.long)
    span = max(int(ids.max()), int(table.token.max())) + 1
    keys = table.group * span + table.token
    order = torch.argsort(keys)
    tok_keys = gid[:, None] * span + ids
    pos = torch.searchsorted(keys[order], tok_keys.clamp_min(0)).clamp_max(max(len(table) - 1, 0))
    return torch.where(mask, order[pos], torch.full_like(pos, -1))


def build_report(groups: Sequence[GroupInput], *, credit: Method, tokenizer,
                 title: str = "Token credit", meta: Sequence[str] = (),
                 use_recorded: bool = False, top_rows: int = 10) -> Report:
    """Compute every view and statistic of ``groups`` (see the module docstring).

    Args:
        groups: the groups (each with at least two responses).
        credit: the estimator (and calibration) to explain.
        tokenizer: decodes token ids into per-token text (:func:`token_pieces`).
        title, meta: page title and extra header lines.
        use_recorded: show the advantages and calibration a run recorded
            (``GroupInput.trained``/``weights``/``flagged``/``loss_mask``) instead of
            recomputed ones; the largest difference from the recomputation is noted.
        top_rows: key-token rows kept per sign and group.

    Raises:
        ValueError: a group with fewer than two responses, mismatched lengths, a
            calibration without log-probs and entropies, or ids outside the tokenizer.
    """
    c = credit_values(groups, credit, use_recorded=use_recorded)
    notes = [*meta, *c.notes]
    views, cal, mask, gid, ids = c.views, c.calibration, c.mask, c.group, c.token_ids
    responses, rewards, correct, seq_b, final = c.responses, c.rewards, c.correct, c.seq, c.final
    sizes, lengths, table_opts = c.sizes, c.lengths, c.table_options
    seq = views["seq"]
    batch = dict(rewards=rewards, group=gid, token_ids=ids, mask=mask)

    recorded_mask = per_response(groups, "loss_mask") if use_recorded else None
    in_loss_rows = in_loss_mask(recorded_mask, mask).tolist() if recorded_mask and not cal else None
    table = key_token_table(**batch, **table_opts)
    rows = table.to_rows()
    if table.span is None:
        row_of = _row_mapping(table, gid, ids, mask)
    else:  # ngram > 1: each token shows the covering span of largest |value|
        row_of = table.token_rows(gid, ids, mask, table_opts.get("ignore_token_ids", ()))
    abs_diff = torch.where(mask, (final - seq).abs(), 0.0).double()
    n_tok = torch.zeros(len(groups)).index_add_(0, gid, lengths.float()).clamp_min(1)
    divergence = (torch.zeros(len(groups), dtype=torch.float64)
                  .index_add_(0, gid, abs_diff.sum(1)) / n_tok).tolist()
    scale = torch.zeros(len(groups), dtype=torch.float64)
    for v in views.values():
        scale = torch.maximum(scale, torch.zeros_like(scale).scatter_reduce_(
            0, gid, torch.where(mask, v, 0.0).abs().amax(1).double(), "amax"))
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).tolist()

    labels: dict[int, str] = {}
    by_group: list[list[dict]] = [[] for _ in groups]
    for row in rows:
        for tok in row.get("span", (row["token"],)):
            if tok not in labels:
                labels[tok] = token_label(tokenizer, tok)
        row["text"] = "".join(labels[t] for t in row.get("span", (row["token"],)))
        by_group[row["group"]].append(row)
    per_view = {k: v.tolist() for k, v in views.items()}
    row_idx = row_of.tolist()
    keys = [k for k in ("seq", "token", "final", "diff") if k in views]
    out_groups = []
    r = first = 0
    for gi, g in enumerate(groups):
        resp_reports = []
        for j in range(len(g.responses)):
            n = len(responses[r])
            rep = ResponseReport(
                index=j, reward=float(rewards[r]), correct=bool(correct[r]),
                token_ids=responses[r], pieces=token_pieces(tokenizer, responses[r]),
                values={k: per_view[k][r][:n] for k in keys},
                stats=[rows[i] if i >= 0 else None for i in row_idx[r][:n]])
            rep.labels = _token_char_labels(g.labels[j] if g.labels else None, rep.pieces)
            if cal:
                for name, key in (("logprobs", "logprobs"), ("entropies", "entropies"),
                                  ("weights", "weights"), ("flagged", "flagged"),
                                  ("in_loss", "loss_mask")):
                    setattr(rep, name, cal["rows"][key][r][:n] if cal["has"][r] else None)
            elif in_loss_rows is not None:
                rep.in_loss = in_loss_rows[r][:n]
            resp_reports.append(rep)
            r += 1
        mine = by_group[gi]
        positive = sorted((x for x in mine if x["value"] > 0), key=lambda x: -x["value"])
        negative = sorted((x for x in mine if x["value"] < 0), key=lambda x: x["value"])
        out_groups.append(GroupReport(
            label=g.label or f"group {gi}", anchor=f"g{gi}", prompt=g.prompt, answer=g.answer,
            responses=resp_reports, positive=positive[:top_rows], negative=negative[:top_rows],
            zero_tokens=sum(x["value"] == 0 for x in mine), divergence=divergence[gi],
            scale=scale[gi], sequence=seq_b[first:first + sizes[gi]].tolist()))
        first += sizes[gi]
    view_list = [(k, credit.label(k)) for k in keys]
    default = "final" if "final" in views else "token" if "token" in views else "seq"
    partial = any(r.in_loss is not None and not all(r.in_loss)
                  for g in out_groups for r in g.responses)
    return Report(title=title, views=view_list, default_view=default, groups=out_groups,
                  meta=notes, calibrated=bool(cal), partial_loss=partial)


def _token_char_labels(labels: str | None, pieces: list[TokenPiece]) -> list[str] | None:
    """Split a response's character labels over its tokens (None when they do not fit)."""
    if labels is None or sum(len(p.text) for p in pieces) != len(labels):
        return None
    out, pos = [], 0
    for p in pieces:
        out.append(labels[pos:pos + len(p.text)])
        pos += len(p.text)
    return out
