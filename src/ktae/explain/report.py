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

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ktae.core import methods
from ktae.core.advantages import estimator_needs_entropies
from ktae.core.methods import Method
from ktae.viz.page import GroupReport, Report, ResponseReport
from ktae.viz.tokens import TokenPiece, token_label, token_pieces

_TABLE_OPTIONS = ("correct", "reward_threshold", "h1", "h2", "h3", "k1", "b", "top",
                  "ignore_token_ids", "mode", "variant", "ngram", "split")


# --------------------------------------------------------------------------- inputs


@dataclass
class GroupInput:
    """One prompt and its sampled responses (token ids), as read from a source.

    ``correct`` defaults to ``reward > 0``. ``logprobs``/``entropies`` (per token) feed a
    calibration. ``old_entropies``: the rollout policy's per-token entropies, for an
    estimator that reads them (GTPO); when absent, ``entropies`` stand in for them (a
    model scoring its own samples is the rollout policy). ``trained``, ``weights``,
    ``flagged``, ``loss_mask``: what a training
    run recorded (the estimator's advantages and the calibration applied to them); a
    row may be None where nothing was recorded.
    """

    prompt: str
    responses: list[list[int]]
    rewards: list[float]
    correct: list[bool] | None = None
    label: str = ""
    answer: str | None = None
    logprobs: list | None = None
    entropies: list | None = None
    old_entropies: list | None = None
    input_grad_importance: list | None = None
    """Per response (or None): the model's input-gradient importance of each token, for
    an estimator that reads it (``oar-g``; :func:`ktae.explain.sources.score_groups`)."""
    trained: list | None = None
    weights: list | None = None
    flagged: list | None = None
    loss_mask: list | None = None
    labels: list | None = None
    """Per response (or None): local-error labels of each character of its decoded text
    (``"w"`` locally wrong, ``"r"`` right, ``"."`` not judged;
    :func:`ktae.tasks.label_response`), outlined on the page."""


# --------------------------------------------------------------------------- building


def _check_groups(groups: Sequence[GroupInput]) -> None:
    if not groups:
        raise ValueError("groups: expected at least one group, got none")
    for i, g in enumerate(groups):
        name = g.label or f"group {i}"
        if len(g.responses) < 2:
            raise ValueError(f"{name}: expected at least 2 responses (credit compares the "
                             f"responses of one prompt), got {len(g.responses)}")
        if len(g.rewards) != len(g.responses):
            raise ValueError(f"{name}: expected one reward per response "
                             f"({len(g.responses)}), got {len(g.rewards)}")
        if not all(isinstance(r, (int, float)) and math.isfinite(r) for r in g.rewards):
            raise ValueError(f"{name}: rewards must be finite numbers, got {g.rewards}")
        if g.correct is not None and len(g.correct) != len(g.responses):
            raise ValueError(f"{name}: expected one correctness flag per response "
                             f"({len(g.responses)}), got {len(g.correct)}")


def _pad(rows: list, T: int, dtype, fill) -> torch.Tensor:
    """``rows`` (lists, or None for a missing row) as ``[len(rows), T]``."""
    out = torch.full((len(rows), T), fill, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, :len(row)] = torch.tensor(row, dtype=dtype)
    return out


def _in_loss(rows: list | None, mask: torch.Tensor) -> torch.Tensor:
    """Recorded loss-mask rows as ``[B, T]`` bool; a missing row keeps every real token."""
    out = mask.clone()
    for i, row in enumerate(rows or []):
        if row is not None:
            out[i, :len(row)] = torch.tensor([bool(x) for x in row], dtype=torch.bool)
    return out & mask


def _per_response(groups, attr: str) -> list | None:
    """The per-response lists of ``attr`` over all groups, or None if no group has any."""
    if all(getattr(g, attr) is None for g in groups):
        return None
    out = []
    for g in groups:
        rows = getattr(g, attr)
        out.extend(rows if rows is not None else [None] * len(g.responses))
    return out


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


@dataclass
class CreditValues:
    """One credit's values on a batch of groups (:func:`credit_values`): the padded batch
    (``token_ids``, ``mask`` ``[B, T]``, ``group`` ``[B]``, ...), the views (``seq``,
    ``token``, ``final``, ``diff``: ``[B, T]``), ``final`` (what the loss reads per token
    before the loss mask) and ``in_loss`` (``[B, T]`` bool: the tokens that reach the loss),
    the calibration's per-token data (or None) and notes about recorded values."""

    responses: list[list[int]]
    sizes: list[int]
    token_ids: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    group: torch.Tensor
    rewards: torch.Tensor
    correct: torch.Tensor
    table_options: dict
    seq: torch.Tensor
    views: dict
    final: torch.Tensor
    in_loss: torch.Tensor
    calibration: dict | None
    notes: list


def credit_values(groups: Sequence[GroupInput], credit: Method, *,
                  use_recorded: bool = False) -> CreditValues:
    """Compute ``credit`` on ``groups`` in one vectorised call: pad the groups into a
    batch and compute it with :mod:`ktae.core.methods` as the trainer does (the
    verifier's ``correct`` to every estimator that takes it, each response's recorded or
    scored log-probs and entropies to the rules and the calibration that read them); with
    ``use_recorded``, what the run recorded replaces the recomputation. Shared by ``ktae
    explain`` and ``ktae audit``.

    Raises:
        ValueError: as :func:`build_report`.
    """
    _check_groups(groups)
    sizes = [len(g.responses) for g in groups]
    responses = [list(map(int, r)) for g in groups for r in g.responses]
    B, T = len(responses), max(1, max(len(r) for r in responses))
    ids = _pad(responses, T, torch.long, 0)
    lengths = torch.tensor([len(r) for r in responses])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    gid = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor(sizes))
    rewards = torch.tensor([float(r) for g in groups for r in g.rewards], dtype=torch.float64)
    opts = dict(credit.estimator_options) if credit.estimator == "ktae" else {}
    threshold = float(opts.get("reward_threshold", 0.0))
    correct = torch.tensor([flag for g in groups for flag in (
        [bool(c) for c in g.correct] if g.correct is not None
        else [float(r) > threshold for r in g.rewards])])
    table_opts = {k: v for k, v in opts.items() if k in _TABLE_OPTIONS}
    table_opts.setdefault("ignore_token_ids", list(credit.ignore_token_ids))
    # the graded split takes its classes from the rewards, as the trainer gives them
    if table_opts.get("mode", "exact") != "reference" and table_opts.get("split") != "graded":
        table_opts["correct"] = correct
        table_opts.pop("reward_threshold", None)

    seq_b = methods.sequence_credit(credit, rewards=rewards, group=gid)  # [B]
    seq = torch.where(mask, seq_b[:, None], 0.0)
    views = {"seq": seq}
    notes: list = []
    if credit.token_level:
        logprobs = _per_response(groups, "logprobs")
        entropies = (_rollout_entropies(groups, credit.estimator, T)
                     if estimator_needs_entropies(credit.estimator) else None)
        token = methods.estimator_credit(
            credit, rewards=rewards, group=gid, token_ids=ids, mask=mask, correct=correct,
            logprobs=None if logprobs is None or None in logprobs
            else _pad(logprobs, T, torch.float64, 0.0),
            entropies=entropies,
            input_grad_importance=(_input_grad_importance(groups, credit.estimator, T)
                                   if credit.needs_input_grad else None))
        if token.dim() == 1:
            token = torch.where(mask, token[:, None], 0.0)
        trained = _per_response(groups, "trained") if use_recorded else None
        if trained is not None and all(r is not None for r in trained):
            recorded = _pad(trained, T, torch.float64, 0.0)
            diff = float((recorded - token).abs().max()) if B else 0.0
            notes.append(f"advantages as recorded by the run (recomputed from the recorded tokens: "
                         f"largest difference {diff:.2g})")
            token = recorded
        views["token"] = token
    base_for_cal = views.get("token", seq)
    cal = _calibration(groups, credit, base_for_cal, mask, T, use_recorded, notes)
    final = cal["advantages"] if cal else base_for_cal
    if cal:
        views["final"] = final
    if credit.token_level or cal:
        views["diff"] = torch.where(mask, final - seq, 0.0)
    if cal:
        in_loss = torch.tensor(cal["rows"]["loss_mask"], dtype=torch.bool).reshape(mask.shape)
    else:
        recorded_mask = _per_response(groups, "loss_mask") if use_recorded else None
        in_loss = _in_loss(recorded_mask, mask)
    return CreditValues(responses=responses, sizes=sizes, token_ids=ids, mask=mask,
                        lengths=lengths, group=gid, rewards=rewards, correct=correct,
                        table_options=table_opts, seq=seq_b, views=views, final=final,
                        in_loss=in_loss, calibration=cal, notes=notes)


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
    import ktae

    c = credit_values(groups, credit, use_recorded=use_recorded)
    notes = [*meta, *c.notes]
    views, cal, mask, gid, ids = c.views, c.calibration, c.mask, c.group, c.token_ids
    responses, rewards, correct, seq_b, final = c.responses, c.rewards, c.correct, c.seq, c.final
    sizes, lengths, table_opts = c.sizes, c.lengths, c.table_options
    seq = views["seq"]
    batch = dict(rewards=rewards, group=gid, token_ids=ids, mask=mask)

    recorded_mask = _per_response(groups, "loss_mask") if use_recorded else None
    in_loss_rows = _in_loss(recorded_mask, mask).tolist() if recorded_mask and not cal else None
    table = ktae.key_token_table(**batch, **table_opts)
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


def _rollout_entropies(groups, estimator: str, T: int) -> torch.Tensor:
    """``[B, T]`` rollout-policy entropies for an estimator that reads them."""
    for attr in ("old_entropies", "entropies"):
        rows = _per_response(groups, attr)
        if rows is not None and all(r is not None for r in rows):
            return _pad(rows, T, torch.float64, 0.0)
    raise ValueError(f"credit: estimator {estimator!r} needs the rollout policy's per-token "
                     "entropies of every response (a run trained with it records them; "
                     "otherwise pass --model to score the responses)")


def _input_grad_importance(groups, estimator: str, T: int) -> torch.Tensor:
    """``[B, T]`` input-gradient importance for an estimator that reads it."""
    rows = _per_response(groups, "input_grad_importance")
    if rows is None or any(r is None for r in rows):
        raise ValueError(f"credit: estimator {estimator!r} needs the model's input-gradient "
                         "importance of every response; pass --model to compute it")
    return _pad(rows, T, torch.float64, 0.0)


def _calibration(groups, credit: Method, adv: torch.Tensor, mask: torch.Tensor, T: int,
                 use_recorded: bool, notes: list) -> dict | None:
    """The calibration's advantages and per-token data ([B, T] tensors as row lists)."""
    if credit.calibration is None:
        return None
    B = mask.shape[0]
    weights = _per_response(groups, "weights") if use_recorded else None
    logprobs = _per_response(groups, "logprobs")
    entropies = _per_response(groups, "entropies")
    lp = _pad(logprobs or [None] * B, T, torch.float64, 0.0)
    H = _pad(entropies or [None] * B, T, torch.float64, 0.0)
    if weights is not None:
        has = torch.tensor([w is not None for w in weights])
        w = _pad(weights, T, torch.float64, 1.0)
        flagged = _pad(_per_response(groups, "flagged") or [None] * B, T, torch.bool, False)
        in_loss = _in_loss(_per_response(groups, "loss_mask"), mask)
        notes.append(f"calibration {credit.calibration} as applied during training")
        result_adv = torch.where(mask, w * adv, 0.0)
    else:
        has = torch.tensor([(a is not None and b is not None) for a, b in
                            zip(logprobs or [None] * B, entropies or [None] * B, strict=True)])
        if not bool(has.all()):
            raise ValueError(f"credit: calibration {credit.calibration!r} needs per-token "
                             "log-probs and entropies of every response (a training run that "
                             "used a calibration records them; otherwise pass --model to "
                             "score the responses)")
        # adv-reweight reads the rollout policy's log-probs: the scored ones are the
        # generating policy's for an on-policy run
        res = methods.calibrate(credit, adv.double(), logprobs=lp, entropies=H, mask=mask)
        w, flagged, result_adv = res.weights.double(), res.flagged, res.advantages.double()
        loss_mask = getattr(res, "loss_mask", None)
        in_loss = mask.clone() if loss_mask is None else loss_mask.bool()
    rows = {"logprobs": lp.tolist(), "entropies": H.tolist(), "weights": w.tolist(),
            "flagged": (flagged & mask).tolist(), "loss_mask": (in_loss & mask).tolist()}
    return {"advantages": result_adv, "rows": rows, "has": has.tolist()}
