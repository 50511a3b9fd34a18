"""One prompt prefill per group of samples instead of one per sample.

TRL 1.15-1.16 repeat every prompt ``num_generations`` times before sampling, and
``model.generate`` (transformers 5) prefills each row on its own: a group of 8 responses
runs its prompt through the model 8 times. :func:`shared_prefill_generate` runs each
distinct prompt once (all its tokens but the last), copies its KV cache to every row of
its group (``DynamicCache.batch_select_indices``) and lets ``generate`` continue from
there: it feeds each row's last prompt token and samples as before, with the same random
draws in the same order. The samples are those of the plain call up to the float
rounding of the prefill's logits (a batch of 4 rows instead of 32, the last prompt token
in the first decoding step instead of the prefill), which a draw notices only on a
boundary of the sampling distribution: ``tests/test_shared_prefill.py`` finds them equal
on a small model, and on SmolLM2-135M-Instruct the recipe's 32 x 64 sampled tokens were
equal for the seeds tried (studies/step-time/report.md).

:func:`shared_prefill` switches it on for a block (the trainer's text-only generation);
any call it does not cover runs ``generate`` unchanged: inputs other than ``input_ids``
and ``attention_mask``, a cache given or a non-dynamic cache asked for, beams or several
return sequences, no row repeating the one before it, prompts shorter than 2 tokens, a
model whose forward takes no ``logits_to_keep``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import DynamicCache

from ktae.models.generate import cache_argument
from ktae.train.logprob_head import takes_logits_to_keep, unwrapped


def repeated_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[rows]`` index of each row's group: consecutive equal rows (ids and mask) share one.

    >>> repeated_rows(torch.tensor([[1, 2], [1, 2], [3, 4]]), torch.ones(3, 2)).tolist()
    [0, 0, 1]
    """
    same = torch.zeros(input_ids.size(0), dtype=torch.bool, device=input_ids.device)
    same[1:] = ((input_ids[1:] == input_ids[:-1]).all(1)
                & (attention_mask[1:] == attention_mask[:-1]).all(1))
    return (~same).cumsum(0) - 1


def _covered(model, kwargs: dict) -> bool:
    config = kwargs.get("generation_config") or model.generation_config
    return (set(kwargs) <= {"input_ids", "attention_mask", "generation_config"}
            and {"input_ids", "attention_mask"} <= set(kwargs)
            and kwargs["input_ids"].size(1) >= 2
            and getattr(config, "cache_implementation", None) in (None, "dynamic")
            and (getattr(config, "num_beams", None) or 1) == 1  # transformers 5: None = 1
            and (getattr(config, "num_return_sequences", None) or 1) == 1
            and takes_logits_to_keep(model))


def shared_prefill_generate(model, generate, **kwargs):
    """``generate(**kwargs)`` with each distinct prompt's prefill run once (module
    docstring); ``generate`` is ``model``'s own, unpatched."""
    if not _covered(model, kwargs):
        return generate(**kwargs)
    ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
    group = repeated_rows(ids, mask)
    if int(group[-1]) + 1 == ids.size(0):  # no repeated row
        return generate(**kwargs)
    first = torch.ones_like(group, dtype=torch.bool)
    first[1:] = group[1:] != group[:-1]
    head_ids, head_mask = ids[first, :-1], mask[first, :-1]
    # generate's own position ids: the count of real tokens before, padding at 1
    positions = (head_mask.long().cumsum(-1) - 1).masked_fill(head_mask == 0, 1)
    cache = DynamicCache(config=model.config)
    key = cache_keyword(model)
    with torch.no_grad():
        model(input_ids=head_ids, attention_mask=head_mask, position_ids=positions,
              use_cache=True, logits_to_keep=1, **{key: cache})
    cache.batch_select_indices(group)
    return generate(**kwargs, **{key: cache})


def cache_keyword(model) -> str:
    """``cache``, where the (PEFT-unwrapped) model's forward takes it (transformers 5.25
    deprecates ``past_key_values``), else ``past_key_values``."""
    return cache_argument(unwrapped(model))


@contextmanager
def shared_prefill(model) -> Iterator[None]:
    """Within the block, ``model.generate`` shares each group's prefill
    (:func:`shared_prefill_generate`); the class's ``generate`` comes back after."""
    generate = model.generate
    own = vars(model).get("generate")  # an instance's own generate, put back after

    def shared(*args, **kwargs):
        if args:
            return generate(*args, **kwargs)
        return shared_prefill_generate(model, generate, **kwargs)

    model.generate = shared
    try:
        yield
    finally:
        if own is None:
            del model.generate
        else:
            model.generate = own
