"""SDPO's EMA teacher: the self-teacher as a moving average of the policy's weights.

``ktae train --self-distill sdpo|sdpo-token --self-distill-option teacher_update_rate=R``
(docs/method.md §17). SDPO's default teacher (``teacher_regularization: ema``,
``teacher_update_rate: 0.05``; ``lasgroup/SDPO``, ``verl/workers/fsdp_workers.py`` and
``dp_actor.py: _update_teacher``) starts as the reference model, the starting policy, and
after each policy update moves towards it by :func:`ktae.core.self_distill.ema_update_`.
The teacher's pass of the loss term runs the policy's module with the teacher's weights
swapped in (:meth:`EmaTeacher.applied`), so no second model is built.

Only the trainable parameters are averaged: a frozen parameter's average is itself (under
LoRA, the base weights; the teacher is the base model with the averaged adapter). The
average is saved in each checkpoint (:data:`FILE`) and read back on resume.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from ktae.core.self_distill import ema_update_

FILE = "ktae_ema_teacher.pt"
"""The average's file in a checkpoint folder: ``{parameter name: tensor}``."""


class EmaTeacher:
    """The moving average of ``model``'s trainable parameters, starting at their values now.

    Args:
        model: the policy (a ``torch.nn.Module``; under LoRA the adapted model).
        rate: SDPO's ``teacher_update_rate`` in ``(0, 1]``.
    """

    def __init__(self, model: torch.nn.Module, rate: float):
        if not 0 < float(rate) <= 1:
            raise ValueError(f"teacher_update_rate: expected a number in (0, 1], got {rate!r}")
        self.rate = float(rate)
        self.weights = {n: p.detach().clone() for n, p in model.named_parameters()
                        if p.requires_grad}
        if not self.weights:
            raise ValueError("model: the EMA teacher needs trainable parameters, found none")

    def _pairs(self, model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.nn.Parameter]]:
        params = dict(model.named_parameters())
        missing = sorted(set(self.weights) - set(params))
        if missing:
            raise ValueError(f"model: the EMA teacher's parameter {missing[0]!r} is not one "
                             "of the model's")
        return [(self.weights[n], params[n]) for n in self.weights]

    def update(self, model: torch.nn.Module) -> None:
        """One step of the average towards ``model``'s current parameters."""
        teacher, student = zip(*self._pairs(model), strict=True)
        ema_update_(teacher, student, self.rate)

    @contextlib.contextmanager
    def applied(self, model: torch.nn.Module):
        """``model`` with the teacher's weights inside the block, its own after it (the
        storages are swapped, not copied; nothing may train inside the block)."""
        pairs = self._pairs(model)
        own = [p.data for _, p in pairs]
        try:
            for w, p in pairs:
                p.data = w
            yield model
        finally:
            for (_, p), data in zip(pairs, own, strict=True):
                p.data = data

    def save(self, folder: str | Path) -> Path:
        path = Path(folder) / FILE
        torch.save({n: w.cpu() for n, w in self.weights.items()}, path)
        return path

    def load(self, folder: str | Path) -> None:
        """Reads the average a checkpoint saved; a one-line error when it has none."""
        path = Path(folder) / FILE
        if not path.is_file():
            raise ValueError(f"resume: {folder} holds no EMA teacher ({FILE}); it was saved "
                             "without --self-distill-option teacher_update_rate")
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if set(saved) != set(self.weights):
            raise ValueError(f"resume: the EMA teacher in {path} has other parameters than "
                             "the model's")
        for n, w in self.weights.items():
            w.copy_(saved[n].to(dtype=w.dtype))
