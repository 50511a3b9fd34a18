"""A credit's values on groups of responses (:func:`credit_values`): the groups padded
into one batch, the sequence-level advantage, the estimator's token-level credit and a
calibration of it, computed with :mod:`ktae.core.methods` as the trainer does. ``ktae
explain`` draws them and ``ktae audit`` scores them against local-error labels."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ktae.core import methods
from ktae.core.methods import Method
from ktae.groups.input import GroupInput


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


def in_loss_mask(rows: list | None, mask: torch.Tensor) -> torch.Tensor:
    """Recorded loss-mask rows as ``[B, T]`` bool; a missing row keeps every real token."""
    out = mask.clone()
    for i, row in enumerate(rows or []):
        if row is not None:
            out[i, :len(row)] = torch.tensor([bool(x) for x in row], dtype=torch.bool)
    return out & mask


def per_response(groups, attr: str) -> list | None:
    """The per-response lists of ``attr`` over all groups, or None if no group has any."""
    if all(getattr(g, attr) is None for g in groups):
        return None
    out = []
    for g in groups:
        rows = getattr(g, attr)
        out.extend(rows if rows is not None else [None] * len(g.responses))
    return out


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
        ValueError: a group with fewer than two responses, mismatched lengths, a
            calibration without log-probs and entropies.
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
    opts = credit.table_options  # its options the key-token table takes (KTAE's)
    threshold = float(opts.get("reward_threshold", 0.0))
    correct = torch.tensor([flag for g in groups for flag in (
        [bool(c) for c in g.correct] if g.correct is not None
        else [float(r) > threshold for r in g.rewards])])
    table_opts = dict(opts)
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
        token = methods.estimator_credit(
            credit, rewards=rewards, group=gid, token_ids=ids, mask=mask, correct=correct,
            **{n.name: _need_rows(groups, n, credit.estimator, T)
               for n in credit.estimator_needs if n.per_token})
        if token.dim() == 1:
            token = torch.where(mask, token[:, None], 0.0)
        trained = per_response(groups, "trained") if use_recorded else None
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
        recorded_mask = per_response(groups, "loss_mask") if use_recorded else None
        in_loss = in_loss_mask(recorded_mask, mask)
    return CreditValues(responses=responses, sizes=sizes, token_ids=ids, mask=mask,
                        lengths=lengths, group=gid, rewards=rewards, correct=correct,
                        table_options=table_opts, seq=seq_b, views=views, final=final,
                        in_loss=in_loss, calibration=cal, notes=notes)


def _need_rows(groups, need, estimator: str, T: int) -> torch.Tensor:
    """``[B, T]`` float64 values of ``need`` (:class:`ktae.core.needs.Need`) for an
    estimator that reads it (``[B, T, H]`` float32 for a vector need): the first of its
    fields that every response holds."""
    for attr in need.fields:
        rows = per_response(groups, attr)
        if rows is not None and all(r is not None for r in rows):
            if not need.vector:
                return _pad(rows, T, torch.float64, 0.0)
            H = rows[0].shape[-1] if len(rows) else 0
            out = torch.zeros(len(rows), T, H)
            for i, row in enumerate(rows):
                out[i, :len(row)] = torch.as_tensor(row, dtype=torch.float32)
            return out
    how = ("a run trained with it records them; otherwise pass --model to compute them"
           if need.recorded else "pass --model to compute them")
    raise ValueError(f"credit: estimator {estimator!r} needs {need.what.split(' (')[0]}, for "
                     f"every response ({how})")


def _calibration(groups, credit: Method, adv: torch.Tensor, mask: torch.Tensor, T: int,
                 use_recorded: bool, notes: list) -> dict | None:
    """The calibration's advantages and per-token data ([B, T] tensors as row lists)."""
    if credit.calibration is None:
        return None
    B = mask.shape[0]
    weights = per_response(groups, "weights") if use_recorded else None
    logprobs = per_response(groups, "logprobs")
    entropies = per_response(groups, "entropies")
    lp = _pad(logprobs or [None] * B, T, torch.float64, 0.0)
    H = _pad(entropies or [None] * B, T, torch.float64, 0.0)
    if weights is not None:
        has = torch.tensor([w is not None for w in weights])
        w = _pad(weights, T, torch.float64, 1.0)
        flagged = _pad(per_response(groups, "flagged") or [None] * B, T, torch.bool, False)
        in_loss = in_loss_mask(per_response(groups, "loss_mask"), mask)
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
