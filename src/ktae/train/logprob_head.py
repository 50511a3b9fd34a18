"""How the trainer turns the policy's last hidden states into per-token log-probabilities.

TRL 1.16 computes every policy pass's log-probabilities (and entropies) with a fused LM
head (``trl.trainer.utils.add_fused_lm_head``): the vocabulary projection runs in tiles
and is recomputed in the backward pass, so the ``[rows, length, vocab]`` logits never
exist at once. On a GPU, with Triton, it scores only the completion positions. Without
Triton (on the CPU) it projects *every* position, prompt included, and folds each tile
into its statistics with a dozen elementwise torch passes, forward and backward.

The ``full`` head asks the model's own forward for the logits of the completion
positions only (``logits_to_keep``) and takes their log-softmax a few positions at a
time (:class:`TokenLogProbs`): one projection of the tokens that are scored, no
recomputation of it. It holds the micro-batch's logits and, in the backward pass, their
gradient (:func:`full_head_peak_bytes`), so it is chosen (``auto``) on the CPU while that
peak fits in :data:`FULL_HEAD_BUDGET`; elsewhere, or for a model whose forward takes no
``logits_to_keep``, TRL's head runs unchanged. docs/step-time.md measures both.

Three things keep the full head's passes over the logits few, each without changing a
value beyond float rounding: the LM head gets its input contiguous
(:func:`ktae.models.generate.contiguous_head`: one matrix product instead of one per row);
the log-softmax, the target's log-probability and the entropy are taken chunk by chunk
in a buffer that stays in the CPU's caches, and the backward pass writes the gradient of
the logits in one pass from the logits and the saved log-sum-exp (:class:`TokenLogProbs`),
instead of a zero-filled gather gradient, the log-softmax's backward, the temperature's
and a zero-padded copy; each micro-batch runs each of its distinct prompts once
(:func:`shared_prefix_logits`). A LoRA model's plain adapters run
:func:`ktae.train.lora_forward.fused_lora_forward` in these passes.
"""

from __future__ import annotations

import inspect

import torch

from ktae.core.entropy import categorical_entropy
from ktae.models.generate import cache_argument, contiguous_head
from ktae.runs.config import LOGPROB_HEADS as HEADS
from ktae.train.lora_forward import fused_lora

FULL_HEAD_BUDGET = 1 << 30
"""Bytes of the full head's peak (:func:`full_head_peak_bytes`) up to which ``auto`` runs it."""

CHUNK_BYTES = 4 << 20
"""Float32 bytes of the logits :class:`TokenLogProbs` works on at once: a few positions'
vocabulary, held in the CPU's caches while every pass over them runs."""


def chunk_positions(positions: int, vocab: int) -> int:
    """Positions per chunk of :class:`TokenLogProbs`: at most :data:`CHUNK_BYTES` of
    float32 logits (at least one position), spread evenly over the ``positions``."""
    most = max(1, CHUNK_BYTES // (4 * vocab))
    chunks = -(-positions // most)
    return -(-positions // chunks) if positions else 1


PEAK_LOGITS_TENSORS = {"no_grad": 1.0, "grad": 2.0, "entropy_grad": 5.25}
"""The full head's peak in float32 logits tensors (a boolean mask counts a quarter), by pass:

* ``no_grad`` (the old-policy and reference passes): the logits, read a few positions at a
  time (:class:`TokenLogProbs`);
* ``grad`` (a pass with gradients whose entropy has none), through the backward pass: the
  logits, kept for the backward pass, and their gradient;
* ``entropy_grad`` (a pass whose entropy keeps its gradient, as the trainer's policy pass
  asks): the forward pass keeps the log-softmax, the probabilities and the product's other
  factor for the backward pass, which adds their gradients.

The first two add :class:`TokenLogProbs`'s float32 buffers of one chunk's positions: two
in the forward pass (with the entropy), one in the backward pass.
``tests/test_logprob_head.py`` measures each against the estimate.
"""


def check_head(head: str) -> str:
    if head not in HEADS:
        raise ValueError(f"logprob_head: expected one of {', '.join(HEADS)}, got {head!r}")
    return head


def unwrapped(model):
    """The transformers model under a PEFT wrapper (``model`` itself without one)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def takes_logits_to_keep(model) -> bool:
    """Whether the (PEFT-unwrapped) model's forward accepts ``logits_to_keep``."""
    return "logits_to_keep" in inspect.signature(type(unwrapped(model)).forward).parameters


def full_head_peak_bytes(rows: int, length: int, vocab: int, *, grad: bool = True,
                         entropy_grad: bool = False) -> int:
    """The most memory :func:`full_logps` holds at once, in bytes, for ``rows`` x ``length``
    scored positions of a ``vocab``-sized vocabulary: :data:`PEAK_LOGITS_TENSORS` tensors
    of ``rows x (length + 1) x vocab`` float32 (the model's forward returns one position
    more), and where :class:`TokenLogProbs` runs its chunk buffers (two in a pass without
    gradients, one in the backward pass). ``grad``: a pass with gradients, counted through
    its backward pass; ``entropy_grad``: the entropy keeps its gradient too."""
    kind = "entropy_grad" if grad and entropy_grad else "grad" if grad else "no_grad"
    buffers = {"no_grad": 2, "grad": 1, "entropy_grad": 0}[kind]
    chunk = chunk_positions(length, vocab) * vocab * 4
    return int(PEAK_LOGITS_TENSORS[kind] * rows * (length + 1) * vocab * 4 + buffers * chunk)


def trl_head_runs(device: torch.device, trl_version: str | None = None) -> bool:
    """Whether TRL's fused LM head computes log-probs on ``device``: TRL 1.16's on any
    device; TRL 1.15's only with Triton installed and a CUDA or XPU device (its
    ``ChunkedLogProbFunction`` has Triton kernels and no torch path, so on the CPU it fails
    with ``'NoneType' object has no attribute 'apply'``).

    Args:
        trl_version: by default the imported ``trl``'s.
    """
    import importlib.util

    from packaging.version import Version

    if trl_version is None:
        import trl

        trl_version = trl.__version__
    if Version(trl_version) >= Version("1.16.0"):
        return True
    return device.type in ("cuda", "xpu") and importlib.util.find_spec("triton") is not None


def choose_head(head: str, device: torch.device, rows: int, length: int, vocab: int, *,
                grad: bool = True, entropy_grad: bool = False, trl_head: bool = True) -> str:
    """The head a pass over ``rows`` x ``length`` scored positions runs (``full`` or
    ``chunked``); ``auto``: ``full`` on the CPU while its peak (:func:`full_head_peak_bytes`
    with ``grad`` and ``entropy_grad``) fits in :data:`FULL_HEAD_BUDGET`, and always where
    TRL's head cannot run (``trl_head`` False: :func:`trl_head_runs`)."""
    if check_head(head) != "auto":
        return head
    if device.type != "cpu":
        return "chunked"
    peak = full_head_peak_bytes(rows, length, vocab, grad=grad, entropy_grad=entropy_grad)
    return "full" if peak <= FULL_HEAD_BUDGET or not trl_head else "chunked"


class TokenLogProbs(torch.autograd.Function):
    """``log softmax(logits[:, :-1] / T)`` at the target tokens and, when asked, the
    softmax's entropy, a few positions at a time.

    Forward: ``logits`` ``[rows, k + 1, vocab]`` (position t predicts token t + 1; the last
    position predicts nothing), ``targets`` ``[rows, k]``, ``temperature`` T, ``entropy``
    (bool). Returns the target tokens' log-probabilities ``[rows, k]`` (float32) and their
    entropies ``[rows, k]`` (float32, without gradient; None unless ``entropy``). The
    positions are taken in chunks of :func:`chunk_positions` (a row's next few): each
    chunk's logits are copied into one float32 buffer and divided by T there (as
    ``.float() / T``), and its log-sum-exp ``m + log sum exp(x - m)`` (``m`` the
    maximum), target log-probability ``x_y - lse`` and entropy
    ``lse - sum(exp(x - m) x) / sum exp(x - m)`` come from that buffer while it sits in
    the CPU's caches: no logits-sized float32 tensor is made. A position whose entropy is
    NaN (a ``-inf`` logit, whose ``0 * -inf`` the sum meets) takes
    :func:`ktae.core.entropy.categorical_entropy` of its log-softmax (``0 log 0 = 0``).
    Only the log-sum-exp ``[rows, k]`` is kept for the backward pass.

    Backward: with ``g`` the gradient of the gathered log-probabilities, the gradient of
    the logits at position t is ``g_t (onehot(y_t) - softmax_t) / T`` (the derivative of
    ``log softmax``), 0 at the last position. Chunk by chunk, the softmax is taken again
    from the logits and the saved log-sum-exp, scaled and scatter-added in float32, and
    written once into the gradient, in the logits' dtype: one pass over the logits and one
    over their gradient, where autograd's chain (a zero-filled gather gradient, the
    log-softmax's backward, the division's, the slice's zero padding) makes four
    logits-sized tensors. Equal to autograd's within float rounding
    (``tests/test_lora_update.py``).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                entropy: bool):
        rows, keep, vocab = logits.size(0), logits.size(1) - 1, logits.size(2)
        per = chunk_positions(keep, vocab)
        logp = logits.new_empty(rows, keep, dtype=torch.float32)
        lse = torch.empty_like(logp)
        h = torch.empty_like(logp) if entropy else None
        x = logits.new_empty(per, vocab, dtype=torch.float32)
        e = torch.empty_like(x) if entropy else None
        for r, at, xs in _scaled_chunks(logits, x, temperature):
            if entropy:
                es = e[:len(xs)]
                top = xs.amax(-1, keepdim=True)
                torch.sub(xs, top, out=es).exp_()
                total = es.sum(-1)
                lse[r, at] = top.squeeze(-1) + total.log()
                h[r, at] = lse[r, at] - es.mul_(xs).sum(-1).div_(total)
            else:
                lse[r, at] = torch.logsumexp(xs, -1)
            logp[r, at] = xs.gather(-1, targets[r, at, None]).squeeze(-1) - lse[r, at]
            if entropy and (bad := torch.isnan(h[r, at])).any():
                h[r, at][bad] = categorical_entropy(xs[bad] - lse[r, at][bad, None])
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        if entropy:
            ctx.mark_non_differentiable(h)
        ctx.set_materialize_grads(False)
        return logp, h

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _entropy):
        if grad is None:
            return None, None, None, None
        logits, targets, lse = ctx.saved_tensors
        vocab = logits.size(2)
        out = torch.empty_like(logits)
        out[:, -1].zero_()
        scale = grad / ctx.temperature
        x = logits.new_empty(chunk_positions(logits.size(1) - 1, vocab), vocab,
                             dtype=torch.float32)
        for r, at, xs in _scaled_chunks(logits, x, ctx.temperature):
            xs.sub_(lse[r, at, None]).exp_().mul_(scale[r, at, None].neg())
            xs.scatter_add_(-1, targets[r, at, None], scale[r, at, None])
            out[r, at].copy_(xs)
        return out, None, None, None


def _scaled_chunks(logits: torch.Tensor, buffer: torch.Tensor, temperature: float):
    """:class:`TokenLogProbs`'s chunks: each row's scored positions (all but the last),
    ``buffer.size(0)`` at a time, copied into ``buffer`` in float32 and divided by the
    temperature there (as ``.float() / T``). Yields ``(row, positions, chunk)``, the chunk
    a view of ``buffer``, overwritten by the next."""
    keep, per = logits.size(1) - 1, buffer.size(0)
    for r in range(logits.size(0)):
        for start in range(0, keep, per):
            at = slice(start, min(keep, start + per))
            chunk = buffer[:at.stop - start]
            chunk.copy_(logits[r, at]).div_(temperature)
            yield r, at, chunk


def prefix_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  split: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first, group)`` for rows whose first ``split`` tokens (ids and mask) repeat:
    ``first`` the index of one row of each distinct prefix, ``group`` ``[rows]`` each
    row's entry in ``first``; ``None`` when no prefix repeats (or ``split`` < 1).

    >>> ids = torch.tensor([[5, 6, 1], [7, 8, 2], [5, 6, 3]])
    >>> [t.tolist() for t in prefix_groups(ids, torch.ones_like(ids), 2)]
    [[0, 1], [0, 1, 0]]
    """
    if split < 1:
        return None
    key = torch.cat([input_ids[:, :split], attention_mask[:, :split].to(input_ids.dtype)], 1)
    distinct, group = torch.unique(key, dim=0, return_inverse=True)
    if distinct.size(0) == key.size(0):
        return None
    rows = torch.arange(key.size(0), device=key.device)
    first = torch.full((distinct.size(0),), key.size(0), dtype=torch.long, device=key.device)
    first.scatter_reduce_(0, group, rows, reduce="amin")
    return first, group


def _shares_prefix(model) -> bool:
    base = unwrapped(model)
    params = inspect.signature(type(base).forward).parameters
    checkpointing = ("is_activation_checkpointing" if hasattr(type(base), "is_activation_checkpointing")
                     else "is_gradient_checkpointing")  # transformers 5 renames it
    return (("cache" in params or "past_key_values" in params)
            and not getattr(base, checkpointing, False))


def shared_prefix_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         keep: int) -> torch.Tensor:
    """The logits ``[rows, keep, vocab]`` of the last ``keep`` positions of ``input_ids``,
    as ``model(input_ids, attention_mask, logits_to_keep=keep)`` gives them, with each
    distinct prefix (every token before those ``keep``) run through the model once.

    GRPO scores several responses to each prompt, and a micro-batch usually holds more than
    one response to the same prompt (left-padded alike): their prompt tokens' hidden
    states, keys and values are the same. Here each distinct prefix runs once, its KV cache
    (with its autograd history) is indexed out to every row that shares it, and the kept
    positions run on top of it, at the positions the whole forward gives them. The
    backward pass sums the rows' gradients into the shared prefix, which is what the whole
    forward's gradient is. Values equal the whole forward's up to float rounding (other
    kernels' summation order); ``tests/test_lora_update.py`` compares them, the loss and
    every adapter's gradient.

    The whole forward runs instead where nothing repeats, or for a model whose forward
    takes no cache, or under gradient checkpointing (which switches the cache off).
    """
    from transformers import DynamicCache

    split = input_ids.size(1) - keep
    groups = prefix_groups(input_ids, attention_mask, split) if _shares_prefix(model) else None
    if groups is None:
        return model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep,
                     use_cache=False).logits
    first, group = groups
    cache = DynamicCache(config=model.config)
    key = cache_argument(unwrapped(model))
    model(input_ids=input_ids[first, :split], attention_mask=attention_mask[first, :split],
          use_cache=True, logits_to_keep=1, **{key: cache})
    if cache.get_seq_length() != split:  # the model kept no cache: the whole forward
        return model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep,
                     use_cache=False).logits
    cache.batch_select_indices(group)
    return model(input_ids=input_ids[:, split:], attention_mask=attention_mask,
                 use_cache=True, logits_to_keep=keep, **{key: cache}).logits


def full_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               logits_to_keep: int, temperature: float, *, compute_entropy: bool,
               entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities ``[rows, logits_to_keep]`` of the last ``logits_to_keep``
    tokens of ``input_ids`` under ``model`` at ``temperature``, and their entropies
    (``compute_entropy``; with gradients only when ``entropy_grad``). Positions whose
    ``attention_mask`` is 0 (padding) get 0 for both, as in TRL's head."""
    with contiguous_head(model), fused_lora(model):
        logits = shared_prefix_logits(model, input_ids, attention_mask, logits_to_keep + 1)
    targets = input_ids[:, -logits_to_keep:]
    padding = attention_mask[:, -logits_to_keep:] == 0
    if not (compute_entropy and entropy_grad and torch.is_grad_enabled()):
        per_token, entropy = TokenLogProbs.apply(logits, targets, temperature, compute_entropy)
        del logits
        per_token = per_token.masked_fill(padding, 0.0)
        return per_token, None if entropy is None else entropy.masked_fill_(padding, 0.0)
    # the entropy keeps its gradient: autograd's chain through the whole log-softmax;
    # position t's logits predict token t + 1: the last kept position predicts nothing
    logits = logits[:, :-1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    del logits
    per_token = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).masked_fill(padding, 0.0)
    return per_token, categorical_entropy(logp).masked_fill(padding, 0.0)
