"""Batched generation for evaluation: transformers (always) or vLLM (when installed; the
engine itself is in :mod:`ktae.eval.vllm_engine`).

Greedy decoding gives pass@1; with ``k > 1`` every prompt is sampled ``k`` times
(avg@k). Response length counts the generated tokens up to and including the first
end-of-sequence token (the whole continuation when none is generated); a response with
no end-of-sequence token ran out of budget (``truncated``).

Each backend's arguments come from one pure function of :class:`SamplingConfig`
(:func:`hf_generate_kwargs`, :func:`vllm_sampling_kwargs`), so what reaches the engine
is tested without it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

_CONTEXT_ATTRIBUTES = ("max_position_embeddings", "n_positions", "max_sequence_length",
                       "seq_length")


@dataclass(frozen=True)
class Generation:
    """One sampled response: decoded ``text``, its length in tokens, its token ids (up to
    and including the first end-of-sequence token), and whether it stopped at the budget
    (or the model's context) instead of an end-of-sequence token. ``logprobs`` and
    ``entropies``: per token, the model's log-probability of the token and the entropy of
    its distribution there, at the scoring temperature (:func:`generate_hf`'s ``scores``;
    None when not asked for)."""

    text: str
    num_tokens: int
    token_ids: tuple[int, ...] = ()
    truncated: bool = False
    logprobs: tuple[float, ...] | None = None
    entropies: tuple[float, ...] | None = None


@dataclass(frozen=True)
class SamplingConfig:
    """Decoding settings shared by both backends.

    ``temperature == 0`` is greedy (only with ``k == 1``); ``None`` picks 0 for ``k == 1``
    and 0.6 for ``k > 1``.
    """

    k: int = 1
    temperature: float | None = None
    top_p: float = 1.0
    max_new_tokens: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k: expected a positive integer, got {self.k!r}")
        if self.temperature is not None and not (isinstance(self.temperature, (int, float))
                                                 and 0 <= self.temperature < float("inf")):
            raise ValueError(f"temperature: expected a number >= 0, got {self.temperature!r}")
        if self.k > 1 and self.temperature == 0:
            raise ValueError("temperature: k > 1 samples need temperature > 0 (avg@k)")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p: expected a number in (0, 1], got {self.top_p!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected a positive integer, "
                             f"got {self.max_new_tokens!r}")

    @property
    def effective_temperature(self) -> float:
        if self.temperature is not None:
            return float(self.temperature)
        return 0.0 if self.k == 1 else 0.6


def hf_generate_kwargs(sampling: SamplingConfig) -> dict:
    """The decoding arguments of ``model.generate`` for ``sampling``: ``k`` return
    sequences, the budget, and sampling with ``temperature``/``top_p`` (``top_k`` off) or
    greedy search (sampling arguments unset) when the temperature is 0."""
    temperature = sampling.effective_temperature
    kwargs = dict(max_new_tokens=sampling.max_new_tokens, num_return_sequences=sampling.k)
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=temperature, top_p=sampling.top_p, top_k=0)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    return kwargs


def vllm_sampling_kwargs(sampling: SamplingConfig) -> dict:
    """The arguments of ``vllm.SamplingParams`` for ``sampling``, one to one:
    ``n = k``, ``temperature``, ``top_p``, ``max_tokens = max_new_tokens``, ``seed``
    (``top_k`` left at vLLM's default, off, as in the transformers backend). vLLM treats temperature 0 as
    greedy and then ignores ``top_p``; it is passed as 1.0 there, as greedy search has
    none."""
    temperature = sampling.effective_temperature
    return {"n": sampling.k, "temperature": temperature,
            "top_p": float(sampling.top_p) if temperature > 0 else 1.0,
            "max_tokens": sampling.max_new_tokens, "seed": sampling.seed}


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    return ids


def context_length(model) -> int | None:
    """The longest sequence (prompt + response) ``model`` takes, from its config; None if
    the config does not say."""
    config = getattr(model, "config", None)
    for name in _CONTEXT_ATTRIBUTES:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def prompt_budget(prompt_tokens: int, max_new_tokens: int, context: int | None) -> int:
    """New tokens a prompt of ``prompt_tokens`` tokens may generate: ``max_new_tokens``,
    cut to what is left of the model's ``context`` (None: no limit); 0 when the prompt
    fills the context."""
    if context is None:
        return max_new_tokens
    return max(0, min(max_new_tokens, context - prompt_tokens))


def context_cut_message(cut: Sequence[int], max_new_tokens: int, context: int) -> str:
    """The one warning of a generation call whose prompts of ``cut`` tokens (their token
    lengths) got less than ``max_new_tokens`` from the model's ``context``: how many, the
    longest, and its budget (0: the prompt fills the context and its response is empty)."""
    return (f"max_new_tokens={max_new_tokens} does not fit in the model's context of "
            f"{context} tokens after {len(cut)} prompt(s) of up to {max(cut)} tokens: "
            f"generating at most {prompt_budget(max(cut), max_new_tokens, context)} new "
            "tokens for the longest")


_PRE_PROCESSORS = {"repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0),
                   "no_repeat_ngram_size": (None, 0), "encoder_no_repeat_ngram_size": (None, 0),
                   "bad_words_ids": (None,), "min_length": (None, 0),
                   "min_new_tokens": (None, 0), "forced_bos_token_id": (None,),
                   "forced_eos_token_id": (None,), "exponential_decay_length_penalty": (None,),
                   "suppress_tokens": (None,), "begin_suppress_tokens": (None,),
                   "sequence_bias": (None,), "guidance_scale": (None, 1.0),
                   "watermarking_config": (None,)}
"""Generation settings under which transformers changes the logits before a caller's own
logits processor sees them, with their neutral values."""


def raw_logits_seen(model) -> bool:
    """Whether a logits processor passed to ``model.generate`` sees the model's own logits:
    no setting of its generation config (:data:`_PRE_PROCESSORS`) changes them first."""
    config = getattr(model, "generation_config", None)
    return config is None or all(getattr(config, k, None) in neutral
                                 for k, neutral in _PRE_PROCESSORS.items())


class _ScoreRecorder:
    """A logits processor that leaves the logits as they are and records, per step and
    row, the entropy of ``softmax(logits / temperature)`` and, one step later (when the
    token is known), the log-probability of the token sampled there."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.logprobs: list = []
        self.entropies: list = []
        self._last = None

    def __call__(self, input_ids, scores):
        import torch

        from ktae.core.entropy import categorical_entropy

        if self._last is not None:
            self.logprobs.append(self._last.gather(-1, input_ids[:, -1:]).squeeze(-1))
        logp = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        self.entropies.append(categorical_entropy(logp))
        self._last = logp
        return scores

    def finish(self, last_tokens):
        """``([B, steps], [B, steps])`` log-probs and entropies, given the last column of
        tokens generated."""
        import torch

        if self._last is not None:
            self.logprobs.append(self._last.gather(-1, last_tokens[:, None]).squeeze(-1))
            self._last = None
        return torch.stack(self.logprobs, dim=1), torch.stack(self.entropies, dim=1)


def standard_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of a freshly allocated row-major tensor of ``shape``.

    >>> standard_strides((1, 1, 576))
    (576, 576, 1)
    """
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def contiguous_head_input(module, args):
    """A forward pre-hook for the LM head: its input with standard strides. A model's
    forward slices the hidden states to ``logits_to_keep`` positions, a strided view that
    ``nn.Linear`` multiplies one row at a time: a batched product against the weight
    expanded to every row, which PyTorch copies out first (a ``[rows, hidden,
    vocabulary]`` tensor: 1.8 GB in bfloat16 for the recipe's 32 rows of SmolLM2, at the
    first decoding step of each ``generate`` call). With standard strides it is one matrix
    product, with the same values. ``contiguous()`` is not enough: a single row's last
    position (``[1, 1, hidden]``, the shared prefix's pass for one prompt) counts as
    contiguous with its parent's strides, and the product still takes the batched path,
    copying the whole weight (PyTorch 2.13's ``matmul`` folds by the strides themselves)."""
    x = args[0]
    if x.stride() != standard_strides(x.shape):
        x = x.new_empty(x.shape).copy_(x)  # a fresh tensor's strides; the copy keeps autograd
    return (x, *args[1:])


@contextmanager
def contiguous_head(model) -> Iterator[None]:
    """Within the block, ``model``'s LM head (``get_output_embeddings``) gets its input
    contiguous (:func:`contiguous_head_input`); nothing for a model without one."""
    inner = getattr(model, "module", model)  # the model inside a DistributedDataParallel
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    hook = head.register_forward_pre_hook(contiguous_head_input) if head is not None else None
    try:
        yield
    finally:
        if hook is not None:
            hook.remove()


def generate_hf(model, tokenizer, prompts: Sequence[str], sampling: SamplingConfig, *,
                batch_size: int = 16, add_special_tokens: bool = True,
                on_batch: Callable[[int], None] | None = None, warn: bool = True,
                scores: float | None = None, tails: Sequence[Sequence[int]] | None = None,
                on_tail: Callable | None = None) -> list[list[Generation]]:
    """``k`` generations per prompt with ``model.generate`` (left padding, no gradient).

    Returns ``out[i][j]``: sample ``j`` of prompt ``i``. ``on_batch(n)`` is called after
    each batch of ``n`` prompts (progress bars). The model's training mode and the
    tokenizer's padding side are restored afterwards.

    Every prompt has its own budget, whatever else is in its batch: a prompt of P tokens
    gets ``min(max_new_tokens, context - P)`` new tokens (:func:`prompt_budget`; the
    context from :func:`context_length`), so generation never runs past the model's
    context and one long prompt does not cut its neighbours' responses. Prompts of a
    batch with equal budgets are generated together (usually the whole batch); a prompt
    that fills the context gets an empty, truncated response. One warning per call names
    the prompts whose budget the context cut, unless ``warn`` is False
    (:func:`ktae.eval.runner.evaluate` counts them in its results instead).

    ``scores``: a temperature; each generation then carries its tokens' log-probabilities
    and entropies under ``softmax(logits / scores)``, read from the logits of the sampling
    steps themselves (a logits processor that changes nothing), so no forward pass over
    the responses is needed for them. They equal a forward pass's up to float rounding
    (the incremental decoding's sums are ordered differently). None (and a model whose
    generation config changes the logits before a caller's processor sees them,
    :func:`raw_logits_seen`) leaves them None.

    ``tails`` (one token list per prompt) with ``on_tail``: after each batch, every
    generation is continued by its prompt's tail from the sampling's own key/value cache
    (the prompt and response are not computed again), and ``on_tail(i, gens, logits)`` is
    called for prompt ``i`` with its generations and the ``[k, len(tail), V]`` logits at
    the tail's positions, as a forward pass over prompt + response + tail gives them (up
    to float rounding). A prompt whose budget is 0, or a model whose ``generate`` returns
    no cache (``use_cache`` off), gets no call.
    """
    import torch

    _check_generate_arguments(batch_size, scores)
    eos = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = min(eos) if eos else 0
    run = _Decoding(model, tokenizer, sampling, add_special_tokens, eos, pad_id,
                    device=next(model.parameters()).device, context=context_length(model),
                    scores=scores if scores is not None and raw_logits_seen(model) else None,
                    tails=tails, on_tail=on_tail)
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = pad_id
    out: list[list[Generation]] = []
    cut: list[int] = []  # token lengths of the prompts whose budget the context cut
    # Seeded sampling that leaves the caller's global RNG as it was (evaluating during
    # training must not change the training trajectory).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(sampling.seed)
        try:
            for start in range(0, len(prompts), batch_size):
                chunk = list(prompts[start:start + batch_size])
                out += _generate_batch(run, chunk, start, cut)
                if on_batch is not None:
                    on_batch(len(chunk))
        finally:
            model.train(was_training)
            tokenizer.padding_side = side
    if cut and warn:
        warnings.warn(context_cut_message(cut, sampling.max_new_tokens, run.context),
                      stacklevel=2)
    return out


def _check_generate_arguments(batch_size, scores) -> None:
    """Refuse a ``batch_size`` that is not a positive integer and a ``scores`` temperature
    that is not positive."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    if scores is not None and (isinstance(scores, bool) or not isinstance(scores, (int, float))
                               or not scores > 0):
        raise ValueError(f"scores: expected a positive temperature or None, got {scores!r}")


@dataclass(frozen=True)
class _Decoding:
    """What every ``model.generate`` call of one :func:`generate_hf` call shares."""

    model: object
    tokenizer: object
    sampling: SamplingConfig
    add_special_tokens: bool
    eos: set[int]
    pad_id: int
    device: object
    context: int | None
    """The model's context (:func:`context_length`); None: no limit."""
    scores: float | None
    """The temperature of the recorded log-probs and entropies; None: none recorded."""
    tails: Sequence[Sequence[int]] | None
    on_tail: Callable | None

    @property
    def kwargs(self) -> dict:
        """``model.generate``'s decoding arguments (the budget is set per call)."""
        return dict(hf_generate_kwargs(self.sampling), pad_token_id=self.pad_id,
                    eos_token_id=sorted(self.eos) or None)


def _generate_batch(run: _Decoding, chunk: list[str], start: int, cut: list[int]
                    ) -> list[list[Generation]]:
    """The generations of one batch of prompts (``start``: the first one's index), one
    ``model.generate`` call per budget; appends the prompts the context cut to ``cut``."""
    k, max_new_tokens = run.sampling.k, run.sampling.max_new_tokens
    lengths = [len(run.tokenizer(p, add_special_tokens=run.add_special_tokens,
                                 verbose=False)["input_ids"])
               for p in chunk]
    budgets = [prompt_budget(n, max_new_tokens, run.context) for n in lengths]
    cut += [n for n, b in zip(lengths, budgets, strict=True) if b < max_new_tokens]
    rows: list[list[list[int]]] = [[] for _ in chunk]
    row_scores: list[list | None] = [None for _ in chunk]
    row_tails: list = [None for _ in chunk]
    for budget in sorted(set(budgets), reverse=True):
        idx = [i for i, b in enumerate(budgets) if b == budget]
        if budget == 0:
            for i in idx:
                rows[i] = [[] for _ in range(k)]
            continue
        new, scored, tail_logits = _generate_group(run, [chunk[i] for i in idx], budget,
                                                   [start + i for i in idx])
        for pos, i in enumerate(idx):
            rows[i], row_scores[i], row_tails[i] = new[pos], scored[pos], tail_logits[pos]
    out = []
    for i, (samples, scored) in enumerate(zip(rows, row_scores, strict=True)):
        gens = _generations(run, samples, scored)
        if row_tails[i] is not None:
            run.on_tail(start + i, gens, row_tails[i])
        out.append(gens)
    return out


def _generate_group(run: _Decoding, texts: list[str], budget: int, which: list[int]):
    """One ``model.generate`` call for prompts of equal ``budget`` (``which``: their
    indices in the call's prompts): per prompt, its ``k`` rows of new tokens, their
    ``(log-prob, entropy)`` pairs (None when not recorded) and the logits at its tail's
    positions (None without ``on_tail`` or a cache)."""
    import torch

    k = run.sampling.k
    enc = run.tokenizer(texts, return_tensors="pt", padding=True,
                        add_special_tokens=run.add_special_tokens).to(run.device)
    width = enc["input_ids"].shape[1]
    extra, recorder = {}, None
    if run.scores is not None:
        from transformers import LogitsProcessorList

        recorder = _ScoreRecorder(run.scores)
        extra["logits_processor"] = LogitsProcessorList([recorder])
    if run.on_tail is not None:
        extra["return_dict_in_generate"] = True
    with torch.no_grad(), contiguous_head(run.model):
        seqs = run.model.generate(**enc, **{**run.kwargs, "max_new_tokens": budget}, **extra)
    tail_logits = [None for _ in texts]
    if run.on_tail is not None:
        seqs, tail_logits = _continue_tails(run, seqs, enc["attention_mask"], which)
    parts = [slice(pos * k, (pos + 1) * k) for pos in range(len(texts))]
    new = seqs[:, width:].tolist()
    scored = [None for _ in texts]
    if recorder is not None:
        lp, ent = recorder.finish(seqs[:, -1])
        lp, ent = lp.tolist(), ent.tolist()
        scored = [list(zip(lp[part], ent[part], strict=True)) for part in parts]
    return [new[part] for part in parts], scored, tail_logits


def _continue_tails(run: _Decoding, output, prompt_mask, which: list[int]):
    """``(sequences, per prompt its [k, len(tail), V] tail logits)`` from the output of a
    ``generate`` call with ``return_dict_in_generate`` over the prompts ``which`` (indices
    into ``run.tails``); the logits are None for every prompt when the output holds no
    key/value cache."""
    cache = getattr(output, "cache", None)
    seqs, cache = output.sequences, (getattr(output, "past_key_values", None)
                                     if cache is None else cache)
    if cache is None:
        return seqs, [None for _ in which]
    k, tails = run.sampling.k, [run.tails[i] for i in which]
    logits = _tail_logits(run.model, seqs, prompt_mask, cache, tails, k, run.eos, run.pad_id)
    return seqs, [logits[pos * k:(pos + 1) * k, :len(t)] for pos, t in enumerate(tails)]


def _generations(run: _Decoding, samples: list[list[int]], scored: list | None
                 ) -> list[Generation]:
    """One prompt's :class:`Generation` objects from its rows of new tokens, each cut
    after its first end-of-sequence token."""
    gens = []
    for j, row in enumerate(samples):
        stop = next((t + 1 for t, tok in enumerate(row) if tok in run.eos), None)
        n = len(row) if stop is None else stop
        lp = ent = None
        if scored is not None:
            lp, ent = tuple(scored[j][0][:n]), tuple(scored[j][1][:n])
        elif run.scores is not None:  # a prompt that fills the context: no tokens
            lp = ent = ()
        gens.append(Generation(
            run.tokenizer.decode(row[:n], skip_special_tokens=True), n,
            tuple(row[:n]), truncated=stop is None, logprobs=lp, entropies=ent))
    return gens


def cache_argument(model) -> str:
    """The forward's argument (and output) that holds the key/value cache: ``cache`` in
    recent transformers, ``past_key_values`` before (still taken, with a warning)."""
    import inspect

    return ("cache" if "cache" in inspect.signature(type(model).forward).parameters
            else "past_key_values")


def _tail_logits(model, seqs, prompt_mask, cache, tails, k: int, eos: set[int], pad_id: int):
    """``[R, K, V]`` logits at the positions of each row's tail (K its longest), the rows of
    one ``model.generate`` call (``seqs``: left-padded prompts then the generated columns;
    ``cache``: its key/value cache, which holds every column but the last) each continued
    by its prompt's tail right after its response's end (its first end-of-sequence token,
    or the budget). The generated columns past a response's end are masked, and the tail's
    positions follow the response's, as generation numbered them (the prompt's real
    tokens from 0)."""
    import torch

    R, width = seqs.shape[0], prompt_mask.shape[1]
    T = seqs.shape[1] - width
    device = seqs.device
    mask = prompt_mask.repeat_interleave(k, dim=0)
    gen = seqs[:, width:]
    is_eos = torch.zeros_like(gen, dtype=torch.bool)
    for e in eos:
        is_eos |= gen == e
    first = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, T)  # n per row
    col = torch.arange(T, device=device)[None]
    live = col < first[:, None]
    tails = [list(tails[r // k]) for r in range(R)]
    K = max(1, max(len(t) for t in tails))
    c = cache.get_seq_length() - width  # generated columns the cache holds (T - 1)
    if not 0 <= c <= T:
        raise RuntimeError(f"the sampling's cache holds {c} generated columns of {T}")
    ids = torch.full((R, T - c + K), pad_id, dtype=torch.long, device=device)
    tail_mask = torch.zeros((R, T - c + K), dtype=mask.dtype, device=device)
    ids[:, :T - c] = gen[:, c:]
    tail_mask[:, :T - c] = live[:, c:].to(mask.dtype)
    for r, t in enumerate(tails):
        ids[r, T - c:T - c + len(t)] = torch.tensor(t, dtype=torch.long)
        tail_mask[r, T - c:T - c + len(t)] = 1
    prompt_len = mask.sum(dim=1)
    pos = torch.empty((R, T - c + K), dtype=torch.long, device=device)
    pos[:, :T - c] = prompt_len[:, None] + torch.arange(c, T, device=device)[None]
    pos[:, T - c:] = (prompt_len + first)[:, None] + torch.arange(K, device=device)[None]
    full = torch.cat([mask, live[:, :c].to(mask.dtype), tail_mask], dim=1)
    name = cache_argument(model)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=full, position_ids=pos, use_cache=True,
                    **{name: cache}).logits
    return out[:, T - c:]


def vllm_available() -> bool:
    """True when vLLM is importable and a CUDA device is present: what ``--backend auto``
    picks vLLM on (on a CPU it keeps transformers, see ``ktae.eval.cli``)."""
    import importlib.util

    import torch

    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()
