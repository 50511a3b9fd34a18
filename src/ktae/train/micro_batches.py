"""Each micro-batch of the update holds whole prompt groups, where that leaves the gradient as it is.

TRL 1.15-1.16's ``_prepare_inputs`` shuffles the generation batch
(``trl.trainer.utils.shuffle_sequence_dict``) before it splits it into the
``steps_per_generation`` micro-batches of the update. Where one batch is generated per
optimizer step (``steps_per_generation = gradient_accumulation_steps``, as ``ktae train``
sets it), every micro-batch of a generation batch goes into the same optimizer step. The
shuffle then changes no gradient for a loss that sums over the micro-batches with weights
that do not depend on which rows share one (:func:`keeps_gradient`):

* ``grpo``: each row's token mean, averaged over the micro-batch's rows, divided by the
  number of micro-batches; every micro-batch holds as many rows (``split_tensor_dict``),
  so each row weighs ``1 / rows`` of the batch wherever it lands;
* ``dr_grpo``: the token sum over ``rows x max_completion_length``, the same;
* ``dapo``: the token sum over the generation batch's token count.

``bnpo`` divides by each micro-batch's own token count, a calibration (TACO, docs/method.md
§8) reads the micro-batch's own statistics, TRL's ``top_entropy_quantile`` takes its
quantile over the micro-batch, and the entropy bonus and a mixture of experts' auxiliary
loss are micro-batch means, and with several optimizer steps per generated batch the
shuffle decides which rows each step sees: each keeps TRL's shuffle.

What the shuffle does change is the work. GRPO's batch holds ``num_generations``
responses to each prompt in consecutive rows, and the log-prob head runs each distinct
prompt of a micro-batch once (:func:`ktae.train.logprob_head.shared_prefix_logits`). In
TRL's shuffled order a micro-batch of 8 rows drawn from 4 prompts of 8 responses holds
3.7 distinct prompts on average; in the generation batch's own order, one.
:func:`prompt_ordered` keeps that order; it draws the permutation TRL's shuffle draws
and leaves it unused, so that every later random draw (the next step's samples) comes
from the same generator state as under TRL's shuffle. The values change by float rounding
only (the order in which the micro-batches' gradients are summed);
``tests/test_micro_batches.py`` compares a step's loss, gradient norm and weights.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

KEEPS_GRADIENT = ("grpo", "dr_grpo", "dapo")
"""TRL loss types whose update's gradient does not depend on which rows share a micro-batch."""


def keeps_gradient(loss_type: str, *, one_step: bool, calibration: str | None,
                   top_entropy_quantile: float, entropy_bonus: bool, aux_loss: bool) -> bool:
    """Whether the update's gradient is the same however the generation batch is split
    into micro-batches (module docstring): a :data:`KEEPS_GRADIENT` loss type, one
    optimizer step per generated batch (``one_step``), no calibration, no entropy quantile
    mask, no entropy bonus, no auxiliary loss."""
    return (loss_type in KEEPS_GRADIENT and one_step and calibration is None
            and top_entropy_quantile >= 1.0 and not entropy_bonus and not aux_loss)


def prompt_ordered(seq_dict: dict[str, Sequence | None]) -> dict[str, Sequence | None]:
    """``seq_dict`` as it is, after drawing the permutation that TRL 1.15-1.16's
    ``shuffle_sequence_dict`` draws (``torch.randperm`` of the batch size, from the global
    generator)."""
    batch_size = len(next(v for v in seq_dict.values() if v is not None))
    torch.randperm(batch_size)
    return seq_dict


@contextmanager
def micro_batches_by_prompt(enabled: bool = True) -> Iterator[bool]:
    """Within the block, TRL 1.15-1.16's ``_prepare_inputs`` keeps the generation batch's row
    order (:func:`prompt_ordered`) instead of shuffling it; yields ``enabled``. TRL's
    shuffle comes back after, and when not ``enabled`` it stays."""
    from trl.trainer import grpo_trainer

    if not enabled:
        yield False
        return
    shuffle = grpo_trainer.shuffle_sequence_dict
    grpo_trainer.shuffle_sequence_dict = prompt_ordered
    try:
        yield True
    finally:
        grpo_trainer.shuffle_sequence_dict = shuffle
