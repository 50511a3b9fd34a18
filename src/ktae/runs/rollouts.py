"""Sampled rollouts kept in the run directory for ``ktae explain`` (``rollouts.jsonl``).

Every ``rollout_every`` steps (steps 1, 1 + N, 1 + 2N, ...) the trainer's main process
keeps the first ``rollout_groups`` groups of the global batch: the prompt, each response's
token ids, rewards, correctness and the advantages the loss reads, and, when a loss-time
calibration (TACO, docs/method.md §8) runs, each token's log-prob, entropy, weight and flag; and
which tokens reach the loss when some do not (responses the trainer masks out, a
calibration's loss mask).

File format (JSON Lines, one object per line; docs/explain.md)::

    {"kind": "header", "format": "ktae-rollouts", "version": 1, "estimator": "ktae",
     "estimator_options": {...}, "calibration": "taco" | null, "calibration_options": {...},
     "ignore_token_ids": [0, 2], "num_generations": 8}
    {"kind": "group", "step": 11, "group": 0, "prompt": "Q:37+45-18 A:",
     "responses": [[ids], ...], "rewards": [...], "correct": [...],
     "advantages": [[per-token floats], ...],
     "logprobs": [[...] | null, ...], "entropies": ..., "weights": ...,
     "flagged": [[0/1, ...] | null, ...],                          (calibration only)
     "old_entropies": [[...], ...],       (estimators that read entropies, e.g. gtpo)
     "input_grad_importance": [[...], ...],   (estimators that read it, e.g. oar-g)
     "loss_mask": [[0/1, ...] | null, ...]}          (only when a token is left out)

``responses[i]`` holds the response's real tokens only (EOS included); every per-token
list has the same length. ``advantages`` are the estimator's (before the calibration);
the loss reads ``weights * advantages`` on the tokens where ``loss_mask`` is 1 (all of
them when it is absent). ``old_entropies`` are the rollout policy's per-token entropies
that the estimator read (GTPO); ``entropies`` are the current policy's, which the
calibration read. ``input_grad_importance`` is the per-token importance the estimator
read (OAR-G, docs/method.md §16): each need the estimator read that its record marks
``recorded`` (:class:`ktae.core.needs.Need`), under the need's first field. Floats carry
6 significant digits. A calibration or loss-mask
list is ``null`` for a row the main process does not hold (a group split across
processes).

Crash safety: the file is append-only; each record is one ``write`` of a whole line, so
a kill can at worst cut the last line short, and :func:`read_rollouts` ignores such a
line. A resumed run first drops records past its checkpoint's step (atomic rewrite).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ktae.core.needs import get_need

ROLLOUTS_FILE = "rollouts.jsonl"
"""Name of the rollout file in the run directory."""
FORMAT = "ktae-rollouts"
VERSION = 1
_CALIBRATION_KEYS = ("logprobs", "entropies", "weights", "flagged")


def is_recorded_step(step: int, every: int) -> bool:
    """True for steps 1, 1 + every, 1 + 2 every, ... (never when ``every == 0``)."""
    return every > 0 and step >= 1 and (step - 1) % every == 0


def _floats(row: torch.Tensor) -> list[float]:
    return [float(f"{v:.6g}") for v in row.double().tolist()]


def _bits(row: torch.Tensor) -> list[int]:
    return [int(v) for v in row.bool().tolist()]


def _tokenizer(trainer):
    return getattr(trainer, "_tokenizer", None) or trainer.processing_class


def _clean_options(options: dict) -> dict:
    """JSON-safe copy of estimator/calibration options (tensors and the like as strings)."""
    return json.loads(json.dumps(options, default=str))


class RolloutRecorder:
    """Writes ``rollouts.jsonl`` for one run (only on the main process).

    Args:
        path: the file (``<run dir>/rollouts.jsonl``).
        every: record steps 1, 1 + every, ... (0 = never).
        groups: how many groups of a recorded step to keep (the first ones of the batch).
        keep_until_step: records with a larger step already in ``path`` are dropped
            (a resumed run passes its checkpoint's step and keeps the header; a fresh run
            passes 0 and starts the file over).

    The trainer calls :meth:`on_advantages` where it sets the advantages and
    :meth:`on_calibration` where it applies a calibration; :meth:`close` writes what is
    still pending. Nothing here draws random numbers or talks to other processes, so
    recording never changes a run.
    """

    def __init__(self, path: str | os.PathLike, *, every: int, groups: int,
                 keep_until_step: int = 0):
        for name, value in (("every", every), ("groups", groups),
                            ("keep_until_step", keep_until_step)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: expected a non-negative integer, got {value!r}")
        self.path = Path(path)
        self.every, self.groups = every, groups
        self._header_written = False
        self._pending: dict | None = None
        self._truncate(keep_until_step)

    # ------------------------------------------------------------------ file

    def _truncate(self, keep_until_step: int) -> None:
        if not self.path.exists():
            return
        lines = self.path.read_text(encoding="utf-8").splitlines()
        keep = []
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if keep_until_step and (rec.get("kind") == "header"
                                    or rec.get("step", 0) <= keep_until_step):
                keep.append(line)
                # a resumed run (same settings) goes on under the header already there
                self._header_written |= rec.get("kind") == "header"
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(ln + "\n" for ln in keep))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _append(self, record: dict) -> None:
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def _write_header(self, trainer) -> None:
        credit = trainer.credit
        tok = _tokenizer(trainer)
        self._append({
            "kind": "header", "format": FORMAT, "version": VERSION,
            "estimator": credit.estimator,
            "estimator_options": _clean_options(credit.estimator_options),
            "calibration": credit.calibration,
            "calibration_options": _clean_options(credit.calibration_options),
            "ignore_token_ids": list(getattr(trainer, "ignore_token_ids", [])),
            "num_generations": int(trainer.num_generations),
            "tokenizer": getattr(tok, "name_or_path", None),
        })
        self._header_written = True

    # ------------------------------------------------------------------ hooks

    def on_advantages(self, trainer, *, batch: dict, ids: torch.Tensor, mask: torch.Tensor,
                      rewards: torch.Tensor, correct: torch.Tensor, advantages: torch.Tensor,
                      loss_mask: torch.Tensor | None = None,
                      scores: dict[str, torch.Tensor] | None = None) -> None:
        """Keep the first groups of a recorded training step.

        ``batch``: this process's generation batch (``prompt_ids``, ``prompt_mask``,
        ``completion_ids``); ``ids``, ``mask`` (real tokens), ``rewards``, ``correct``,
        ``advantages``: the gathered global batch (``[B, T]`` / ``[B]``) the advantages
        were computed on; ``loss_mask``: this process's ``[b, T]`` tokens that reach the
        loss (e.g. without truncated responses), or None when every real token does;
        ``scores``: the gathered ``[B, T]`` values of the needs the estimator read, by need
        name (the rollout policy's ``entropies``, the ``input_grad_importance``); those
        whose record is ``recorded`` are kept, each under its first field
        (``old_entropies``, ``input_grad_importance``).
        """
        if not trainer.model.training or not trainer.accelerator.is_main_process:
            return
        self.flush()
        step = int(trainer.state.global_step) + 1  # the step this batch trains
        if not is_recorded_step(step, self.every) or self.groups == 0:
            return
        if not self._header_written:
            self._write_header(trainer)
        G = int(trainer.num_generations)
        local = batch["completion_ids"].shape[0]  # rows 0..local-1 are the main process's
        n_groups = min(self.groups, rewards.numel() // G, -(-local // G))
        rows = torch.arange(n_groups * G)
        tok = _tokenizer(trainer)
        records = []
        if loss_mask is not None:
            loss_mask = loss_mask.bool().cpu()
        kept = {get_need(name).fields[0]: value for name, value in (scores or {}).items()
                if value is not None and get_need(name).recorded}
        for g in range(n_groups):
            first = g * G
            pmask = batch["prompt_mask"][first].bool()
            prompt_ids = batch["prompt_ids"][first][pmask].tolist()
            rec: dict[str, Any] = {
                "kind": "group", "step": step, "group": g,
                "prompt": tok.decode(prompt_ids, skip_special_tokens=True),
                "responses": [], "rewards": [], "correct": [], "advantages": [],
                "loss_mask": []}
            for key in kept:
                rec[key] = []
            for r in range(first, first + G):
                m = mask[r].bool().cpu()
                n = int(m.sum())
                rec["responses"].append(ids[r].cpu()[m].tolist())
                rec["rewards"].append(float(f"{float(rewards[r]):.6g}"))
                rec["correct"].append(bool(correct[r]))
                adv = advantages[r].cpu()
                rec["advantages"].append(_floats(adv[m] if adv.dim() else adv.expand(n)))
                for key, value in kept.items():
                    rec[key].append(_floats(value[r].cpu()[m]))
                # real tokens are a prefix of the row (right padding)
                in_loss = _bits(loss_mask[r][:n]) if loss_mask is not None and r < local else None
                rec["loss_mask"].append(in_loss)
            records.append(rec)
        if trainer.credit.calibration is None:
            for rec in records:
                self._append(_finished(rec))
            return
        local_rows = rows[rows < local]
        keys = torch.cat([batch["prompt_ids"][local_rows].cpu(),
                          batch["completion_ids"][local_rows].cpu()], dim=1)
        self._pending = {"records": records, "rows": local_rows.tolist(), "keys": keys,
                         "seen": set(), "G": G}
        for rec in records:
            for key in _CALIBRATION_KEYS:
                rec[key] = [None] * G

    def on_calibration(self, trainer, *, inputs: dict, logprobs: torch.Tensor,
                       entropies: torch.Tensor, result) -> None:
        """Attach a calibration's per-token data to the pending step's recorded rows.

        ``inputs``: the micro-batch the loss runs on (rows shuffled by TRL, so recorded
        rows are found by their prompt and completion ids); ``result``: the
        :class:`ktae.CalibrationResult` (``weights``, ``flagged``, and ``loss_mask`` when
        it has one).
        """
        pending = self._pending
        if pending is None or not trainer.model.training:
            return
        keys = pending["keys"]
        here = torch.cat([inputs["prompt_ids"].cpu(), inputs["completion_ids"].cpu()], dim=1)
        if here.shape[1] != keys.shape[1]:
            return  # not this generation batch
        match = (keys[:, None, :] == here[None, :, :]).all(dim=2)  # [recorded, micro-batch]
        loss_mask = getattr(result, "loss_mask", None)
        columns = {"logprobs": logprobs, "entropies": entropies, "weights": result.weights,
                   "flagged": result.flagged}
        G = pending["G"]
        for k, j in match.nonzero().tolist():
            row = pending["rows"][k]
            if row in pending["seen"]:
                continue  # identical responses in a group: each recorded row filled once
            rec = pending["records"][row // G]
            n = len(rec["responses"][row % G])  # real tokens are a prefix of the row
            for key, value in columns.items():
                v = value[j].detach().cpu()[:n]
                rec[key][row % G] = _bits(v) if key == "flagged" else _floats(v)
            if loss_mask is not None:
                bits = _bits(loss_mask[j].detach().cpu()[:n])
                before = rec["loss_mask"][row % G] or [1] * n
                rec["loss_mask"][row % G] = [a & b for a, b in zip(before, bits, strict=True)]
            pending["seen"].add(row)
        if len(pending["seen"]) == len(pending["rows"]):
            self.flush()

    def flush(self) -> None:
        """Write the pending step's records (rows never scored keep ``null``)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        for rec in pending["records"]:
            self._append(_finished(rec))

    def close(self) -> None:
        """Write anything still pending (end of training)."""
        self.flush()


def _finished(rec: dict) -> dict:
    """Drop ``loss_mask`` when no recorded token is known to be left out of the loss."""
    if not any(row is not None and not all(row) for row in rec["loss_mask"]):
        del rec["loss_mask"]
    return rec


# --------------------------------------------------------------------------- reading


def read_rollouts(path: str | os.PathLike) -> tuple[dict, list[dict]]:
    """``(header, records)`` of a rollout file, records sorted by (step, group).

    A record repeated for the same (step, group) (a resumed run that re-recorded a step)
    keeps its last copy. A last line cut short by a kill is ignored; any other line that
    is not JSON raises ValueError naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"rollouts: file not found: {path}")
    lines = path.read_text(encoding="utf-8").splitlines()
    header: dict = {}
    by_key: dict[tuple[int, int], dict] = {}
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as err:
            if i == len(lines) - 1:
                break  # cut short by a kill
            raise ValueError(f"rollouts: {path} line {i + 1} is not JSON ({err})") from err
        if rec.get("kind") == "header":
            if rec.get("format") != FORMAT:
                raise ValueError(f"rollouts: {path} line {i + 1}: not a {FORMAT} header")
            header = rec
        elif rec.get("kind") == "group":
            by_key[(int(rec["step"]), int(rec["group"]))] = rec
    return header, [by_key[k] for k in sorted(by_key)]
