"""Test-only harness that lets stock verl 0.9.1 run ``verl.trainer.main_ppo`` on a CPU.

verl 0.9.1 has no CPU path. This module fills the gaps through verl's own extension
points, so neither verl nor the plugin is edited. It is loaded by ``import verl`` in the
driver and in every Ray worker through ``VERL_USE_EXTERNAL_MODULES=ktae_verl_cpu`` (its
folder on ``PYTHONPATH``), before verl's entry-point plugins (ktae's among them):

1. a ``cpu`` platform in verl's platform registry (device ``cpu``, backend ``gloo``),
   selected with ``VERL_PLATFORM=cpu``; its device module is ``torch.cpu`` plus no-op
   stand-ins for the CUDA-only calls of verl's FLOPs counter and memory logging, and its
   current device is ``"cpu"`` so that verl's ``.to(get_device_id())`` stays on the CPU;
2. the process group: verl asks for ``cpu:gloo,<device>:<backend>``, which on this
   platform names the CPU twice (torch refuses "Duplicate device type cpu"); the wrapper
   of ``initialize_global_process_group_ray`` passes ``cpu:gloo`` once;
3. a rollout named ``hf`` (rollout registry and replica registry): one Ray actor per
   replica generates token-in/token-out with transformers on the CPU, and receives the
   trainer's weights through verl's ``naive`` checkpoint-engine path (the adapter in the
   trainer worker forwards the weights to its replica's actor);
4. with ``KTAE_LOOP_RECORD=<file>``, a record of the plugin's calls: one JSON line per
   ``ktae.compute_advantages`` / ``ktae.calibrate_advantages`` call, with the process, the
   verl code path that provided the inputs, the shapes, and what the estimator read as
   correctness.

What the run still needs from its environment and command line (``loop_run.py`` passes
these): the FSDP engine selected on the CPU (verl's own ``VERL_ENGINE_DEVICE=cuda``
override: the engine is registered for cuda and npu only), ``sdpa`` attention
(``override_config.attn_implementation``; ``flash_attention_2`` is the default), fake GPUs
for Ray's resource pools, which count GPUs and NPUs only (``+ray_kwargs.ray_init.num_gpus``),
and a tokenizer with a chat template.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import types
import zlib

import torch

logger = logging.getLogger(__name__)

PLATFORM = "cpu"
ROLLOUT = "hf"


# -- 1. the platform --------------------------------------------------------------------

def _noop(*args, **kwargs):
    return None


def _zero(*args, **kwargs):
    return 0


def _device_module() -> types.ModuleType:
    """``torch.cpu`` with no-op versions of the CUDA calls verl makes unconditionally."""
    module = types.ModuleType("ktae_verl_cpu.device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(module, name, getattr(torch.cpu, name))
    module.current_device = lambda: "cpu"
    module.set_device = _noop
    module.synchronize = _noop
    module.empty_cache = _noop
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    module.is_available = lambda: True
    module.device_count = lambda: 1
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated",
                 "max_memory_reserved"):
        setattr(module, name, _zero)
    module.reset_peak_memory_stats = _noop
    module.mem_get_info = lambda *a, **k: (0, 0)
    module.get_device_name = lambda *a, **k: "cpu"
    module.get_device_properties = lambda *a, **k: types.SimpleNamespace(
        name="cpu", total_memory=0, major=0, minor=0)
    module.get_rng_state = lambda *a, **k: torch.get_rng_state()
    module.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    module.memory = types.SimpleNamespace(_set_allocator_settings=_noop)
    return module


def _register_platform() -> None:
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    device_module = _device_module()

    class PlatformCPU(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"

        @property
        def device_module(self):
            return device_module

        def is_available(self) -> bool:
            return True

        def current_device(self):
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index) -> None:
            return None

        def synchronize(self, device_index=None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # Ray sets it for the fake GPUs; torch ignores it

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    PlatformRegistry.register(PLATFORM)(PlatformCPU)


# -- 2. the process group ---------------------------------------------------------------

def _wrap_process_group() -> None:
    import functools

    from verl.utils import distributed

    upstream = distributed.initialize_global_process_group_ray
    if getattr(upstream, "_ktae_cpu", False):
        return

    @functools.wraps(upstream)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None or backend == "cpu:gloo,cpu:gloo":
            backend = "cpu:gloo"
        return upstream(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray._ktae_cpu = True
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


# -- 3. the hf rollout --------------------------------------------------------------------

def _server_name(replica_rank: int) -> str:
    return f"ktae_hf_rollout_server_{replica_rank}_{os.environ.get('KTAE_LOOP_RUN', '')}"


class HFServer:
    """One replica's generator: transformers on the CPU, token ids in, token ids out."""

    def __init__(self, model_path: str, max_model_len: int, response_length: int,
                 replica_rank: int = 0):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                          attn_implementation="sdpa")
        self.model.eval()
        self.eos = self.model.generation_config.eos_token_id
        self.max_model_len = max_model_len
        self.response_length = response_length
        self.global_steps = None
        self.weight_updates = 0
        # seeds: a prompt's k-th request in a step on this replica, so that one replica
        # samples the same tokens in every run and two replicas never sample the same
        self.replica_rank = replica_rank
        self.requests: dict[tuple, int] = {}

    def update_weights(self, state_dict: dict, global_steps=None) -> int:
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        unexpected = [k for k in unexpected if not k.endswith("rotary_emb.inv_freq")]
        if unexpected:
            raise ValueError(f"hf rollout: unexpected weights {unexpected[:3]}")
        real_missing = [k for k in missing if k != "lm_head.weight"]
        if real_missing:
            raise ValueError(f"hf rollout: missing weights {real_missing[:3]}")
        self.model.tie_weights()
        self.global_steps = global_steps
        self.weight_updates += 1
        return self.weight_updates

    def stats(self) -> dict:
        return {"weight_updates": self.weight_updates, "global_steps": self.global_steps}

    async def generate(self, request_id=None, prompt_ids=None, sampling_params=None,
                       image_data=None, video_data=None, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        params = dict(sampling_params or {})
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", self.response_length))
        max_tokens = max(1, min(int(max_tokens), self.response_length,
                                self.max_model_len - len(prompt_ids)))
        temperature = float(params.get("temperature", 1.0))
        top_k = int(params.get("top_k", -1) or -1)
        top_p = float(params.get("top_p", 1.0))
        want_logprobs = bool(params.get("logprobs", False))
        key = (self.global_steps, tuple(prompt_ids))
        self.requests[key] = self.requests.get(key, 0) + 1
        seed = zlib.crc32(repr((self.replica_rank, key, self.requests[key])).encode())
        ids, logps = self._sample(list(prompt_ids), max_tokens, temperature, top_k, top_p,
                                  torch.Generator().manual_seed(seed))
        await asyncio.sleep(0)
        return TokenOutput(token_ids=ids, log_probs=logps if want_logprobs else None,
                           stop_reason="completed",
                           extra_fields={"global_steps": self.global_steps})

    @torch.no_grad()
    def _sample(self, prompt: list[int], max_tokens: int, temperature: float, top_k: int,
                top_p: float, generator: torch.Generator) -> tuple[list[int], list[float]]:
        eos = {self.eos} if isinstance(self.eos, int) else set(self.eos or [])
        inputs = torch.tensor([prompt])
        out = self.model(input_ids=inputs, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1]
        ids: list[int] = []
        logps: list[float] = []
        for _ in range(max_tokens):
            raw = torch.log_softmax(logits.float(), -1)
            if temperature <= 0:
                token = int(raw.argmax())
            else:
                scores = logits.float() / temperature
                if top_k > 0:
                    kth = torch.topk(scores, min(top_k, scores.numel())).values[-1]
                    scores = scores.masked_fill(scores < kth, float("-inf"))
                if top_p < 1.0:
                    sorted_scores, order = torch.sort(scores, descending=True)
                    cumulative = torch.softmax(sorted_scores, -1).cumsum(-1)
                    drop = cumulative - torch.softmax(sorted_scores, -1) > top_p
                    scores[order[drop]] = float("-inf")
                token = int(torch.multinomial(torch.softmax(scores, -1), 1, generator=generator))
            ids.append(token)
            logps.append(float(raw[token]))
            if token in eos:
                break
            out = self.model(input_ids=torch.tensor([[token]]), past_key_values=past,
                             use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1]
        return ids, logps

    # the control calls verl makes on a rollout server: nothing to do on the CPU
    async def wake_up(self, *args, **kwargs):
        return None

    async def sleep(self, *args, **kwargs):
        return None

    async def abort_all_requests(self, *args, **kwargs):
        return None

    async def resume_generation(self, *args, **kwargs):
        return None

    async def clear_kv_cache(self, *args, **kwargs):
        return None

    async def release_kv_cache(self, *args, **kwargs):
        return None

    async def resume_kv_cache(self, *args, **kwargs):
        return None

    async def start_profile(self, *args, **kwargs):
        return None

    async def stop_profile(self, *args, **kwargs):
        return None


def _register_rollout() -> None:
    import ray
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry

    class HFReplica(RolloutReplica):
        """A replica whose server is one :class:`HFServer` actor (no GPUs, no HTTP)."""

        async def launch_servers(self):
            model_path = self.model_config.local_path if hasattr(self.model_config, "local_path") \
                else self.model_config.path
            server = ray.remote(HFServer).options(
                name=_server_name(self.replica_rank), num_cpus=0,
                max_concurrency=self.max_concurrency,
            ).remote(model_path, self.config.max_model_len or 10**9, self.config.response_length,
                     self.replica_rank)
            await server.stats.remote()
            self.servers = [server]
            self._server_handle = server
            self._server_address = f"hf-rollout-{self.replica_rank}"

    class HFServerAdapter(base.BaseRollout):
        """In the trainer worker: forwards the naive checkpoint engine's weights to the
        replica's server (verl calls ``update_weights`` with a generator of full tensors)."""

        def __init__(self, config, model_config, device_mesh, *args, **kwargs):
            super().__init__(config, model_config, device_mesh)
            rank = int(os.environ.get("RANK", 0))
            world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                     * self.config.pipeline_model_parallel_size)
            self.replica_rank = rank // world
            self.is_leader = rank % world == 0

        async def resume(self, tags):
            return None

        async def release(self):
            return None

        async def update_weights(self, weights, wire_format="named_tensors", **kwargs):
            state = {name: tensor.detach().to("cpu", torch.float32).clone()
                     for name, tensor in weights}
            if self.is_leader:
                server = ray.get_actor(_server_name(self.replica_rank))
                await server.update_weights.remote(state, kwargs.get("global_steps"))

    RolloutReplicaRegistry.register(ROLLOUT, lambda: HFReplica)
    base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = f"{__name__}.HFServerAdapter"
    globals()["HFServerAdapter"] = HFServerAdapter


# -- 4. the record of the plugin's calls ------------------------------------------------

def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays (verl's uids)
        return value.tolist()
    return value


def _append(record: dict) -> None:
    path = os.environ.get("KTAE_LOOP_RECORD")
    if not path:
        return
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write per line: lines from several processes never mix
    finally:
        os.close(fd)


def _install_recorder() -> None:
    import functools

    from ktae.core import calibration, estimators  # where the plugin reads them

    if getattr(estimators.compute_advantages, "_ktae_cpu", False):
        return
    estimate, calibrate = estimators.compute_advantages, calibration.calibrate_advantages

    @functools.wraps(estimate)
    def compute_advantages(name, **kwargs):
        from ktae.integrations.verl.fields import current_responses

        result = estimate(name, **kwargs)
        fields = current_responses()
        if fields is not None:
            inputs = {key: _plain(value) for key, value in kwargs.items()}
            _append({
                "call": "compute_advantages", "name": name, "pid": os.getpid(),
                "source": fields.source, "inputs": inputs,
                "acc": [float(v) for v in fields.extra_info["acc"]]
                if "acc" in fields.extra_info else None,
                "advantages": result.tolist(),
            })
        return result

    @functools.wraps(calibrate)
    def calibrate_advantages(name, advantages, **kwargs):
        from ktae.integrations.verl.fields import current_step

        result = calibrate(name, advantages, **kwargs)
        step = current_step()
        if step is not None:
            mask = kwargs["mask"].bool()
            keep = getattr(result, "loss_mask", None)
            keep = mask if keep is None else keep.bool() & mask
            _append({
                "call": "calibrate_advantages", "name": name, "pid": os.getpid(),
                "shape": list(advantages.shape),
                "entropies_from_forward": step.entropies is not None
                and kwargs.get("entropies") is step.entropies,
                "flag_rate": float(result.flag_rate),
                "tokens": int(mask.sum()), "kept": int(keep.sum()),
                "advantage_sum": float(advantages.double()[mask].sum()),
                "calibrated_sum": float(result.advantages.double()[keep].sum()),
                "weights_below_one": int((result.weights[mask] < 1).sum()),
                "positive": int((advantages[mask] > 0).sum()),
                # what the rule saw and returned, to recompute it outside verl
                "inputs": {"advantages": _plain(advantages),
                           **{key: _plain(value) for key, value in kwargs.items()
                              if key != "generator"}},
                "result": {"advantages": _plain(result.advantages),
                           "weights": _plain(result.weights),
                           "loss_mask": _plain(keep)},
            })
        return result

    compute_advantages._ktae_cpu = True
    estimators.compute_advantages = compute_advantages
    calibration.calibrate_advantages = calibrate_advantages


def install() -> None:
    _register_platform()
    _wrap_process_group()
    _register_rollout()
    _install_recorder()


install()
