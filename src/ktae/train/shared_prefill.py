"""One prompt prefill per group of samples instead of one per sample.

TRL 1.16 repeats every prompt ``num_generations`` times before sampling, and
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
equal for the seeds tried (docs/step-time.md).

:func:`shared_prefill` switches it on for a block (the trainer's text-only generation);
any call it does not cover runs ``generate`` unchanged: inputs other than ``input_ids``
and ``attention_mask``, a cache given or a non-dynamic cache asked for, beams or several
return sequences, no row repeating the one before it, prompts shorter than 2 tokens, a
model whose forward takes no ``logits_to_keep``.

The shared cache also stops growing by concatenation: ``DynamicCache`` concatenates
every layer's keys and values with the new token's at every decoding step, a copy of the
whole cache per layer and step, and a ``--bf16`` run's float32 attention
(:func:`ktae.train.precision.float32_attention`) then casts that whole bfloat16 cache to
float32 again. :class:`BufferedLayer` holds each layer's keys and values in one buffer
allocated for the prompt and every new token, in float32 where the model's attention
runs in float32: a step writes its token's keys and values into place (cast once) and
attention reads a view. The values attention sees are the same: a bfloat16 key cast to
float32 is exact, wherever the cast happens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ktae.models.generate import cache_argument
from ktae.train.logprob_head import takes_logits_to_keep, unwrapped
from ktae.train.precision import FLOAT32_ATTENTION


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
    config = kwargs.get("generation_config") or model.generation_config
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
    buffered(cache, ids.size(1) + new_tokens(config, ids.size(1)), stored=attention_dtype(model))
    return generate(**kwargs, **{key: cache})


class BufferedLayer(DynamicLayer):
    """transformers 5's ``DynamicLayer`` (``cache_utils``) whose keys and values are views
    of a buffer allocated once for ``capacity`` tokens, in ``stored`` dtype (module
    docstring); ``update`` writes the new tokens into place where ``DynamicLayer``
    concatenates. A cache the buffer cannot hold (more tokens, other rows after
    ``batch_select_indices``, a ``reset``) gets a new buffer, so every use of
    ``DynamicLayer`` stays correct."""

    def __init__(self, capacity: int, stored: torch.dtype | None = None):
        super().__init__()
        self.capacity, self.stored = capacity, stored
        self._keys = self._values = None

    @classmethod
    def of(cls, layer: DynamicLayer, capacity: int, stored: torch.dtype | None = None):
        """A :class:`BufferedLayer` holding ``layer``'s keys and values."""
        new = cls(capacity, stored)
        if layer.is_initialized:
            new.lazy_initialization(layer.keys, layer.values)
            new.keys, new.values = layer.keys, layer.values
            if layer.keys.numel():
                new._allocate(layer.keys, layer.values, layer.keys.size(-2))
        return new

    def _holds(self, tokens: int) -> bool:
        return (self._keys is not None and tokens <= self._keys.size(-2)
                and self.keys.data_ptr() == self._keys.data_ptr()
                and self.keys.shape[:2] == self._keys.shape[:2]
                and self.values.data_ptr() == self._values.data_ptr())

    def _allocate(self, keys: torch.Tensor, values: torch.Tensor, tokens: int) -> None:
        """A buffer for ``max(tokens, capacity)`` tokens holding the layer's cached ones."""
        past = self.get_seq_length()
        size = max(tokens, self.capacity)
        dtype = self.stored or keys.dtype
        self._keys = keys.new_empty((*keys.shape[:2], size, keys.size(-1)), dtype=dtype)
        self._values = values.new_empty((*values.shape[:2], size, values.size(-1)),
                                        dtype=self.stored or values.dtype)
        if past:
            self._keys[:, :, :past].copy_(self.keys)
            self._values[:, :, :past].copy_(self.values)
        self.keys, self.values = self._keys[:, :, :past], self._values[:, :, :past]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        past = self.get_seq_length()
        end = past + key_states.size(-2)
        if not self._holds(end):
            self._allocate(key_states, value_states, end)
        self._keys[:, :, past:end].copy_(key_states)
        self._values[:, :, past:end].copy_(value_states)
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values


def buffered(cache: DynamicCache, capacity: int, stored: torch.dtype | None = None) -> None:
    """Turn ``cache``'s full-attention ``DynamicLayer`` layers into :class:`BufferedLayer`
    for ``capacity`` tokens, in place; other layer kinds (sliding windows) stay."""
    cache.layers = [BufferedLayer.of(layer, capacity, stored) if type(layer) is DynamicLayer
                    else layer for layer in cache.layers]


def new_tokens(config, prompt_tokens: int) -> int:
    """The most tokens ``generate`` adds to a prompt of ``prompt_tokens`` under ``config``."""
    if getattr(config, "max_new_tokens", None) is not None:
        return int(config.max_new_tokens)
    return max(int(getattr(config, "max_length", None) or 0) - prompt_tokens, 1)


def attention_dtype(model) -> torch.dtype | None:
    """float32 where the (PEFT-unwrapped) model runs :data:`FLOAT32_ATTENTION`, else None
    (attention takes the keys in the dtype the model makes them)."""
    config = getattr(unwrapped(model), "config", None)
    if getattr(config, "_attn_implementation", None) == FLOAT32_ATTENTION:
        return torch.float32
    return None


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
