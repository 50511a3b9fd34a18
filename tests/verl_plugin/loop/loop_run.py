"""Build the inputs of a CPU run of verl's ``main_ppo`` and run it (test-only).

:func:`prepare` writes, under one folder: a copy of ktae's shipped tiny model whose
tokenizer has a chat template (verl applies one to every prompt), train and validation
parquet files of the embedded arithmetic task in verl's RLHF dataset layout, and a reward
function file (``reward.custom_reward_function``) that scores with ktae's verifier of the
task and reports ``acc``. :func:`run_main_ppo` runs ``python -m verl.trainer.main_ppo``
in a fresh interpreter with the CPU harness (:mod:`ktae_verl_cpu`) loaded in every process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

# the tokenizer starts every text with <bos>, as the model was trained; the template keeps it
CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"

REWARD_FUNCTION = '''\
"""Reward of the embedded task for verl: +1 / -1 by ktae's verifier, and its accuracy."""
from ktae.models.warmstart import extract_boxed_int


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    value = extract_boxed_int(solution_str)
    acc = value is not None and str(value) == str(ground_truth)
    return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": "" if value is None else str(value)}
'''


@dataclass
class LoopInputs:
    root: Path
    model: Path
    train: Path
    val: Path
    reward: Path


def prepare(root: Path, *, train_size: int = 64, val_size: int = 8) -> LoopInputs:
    import pandas as pd

    from ktae.models.warmstart import default_model_path
    from ktae.tasks import embedded

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    model = root / "model"
    if not model.exists():
        shutil.copytree(default_model_path(), model)
        config_path = model / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["chat_template"] = CHAT_TEMPLATE
        config_path.write_text(json.dumps(config, indent=1))

    def rows(split: str, n: int):
        out = []
        for p in embedded.generate(n, split=split, seed=0):
            out.append({
                "data_source": "ktae/embedded",
                "prompt": [{"role": "user", "content": embedded.format_prompt(p)}],
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": p.answer},
                "extra_info": {"id": p.id, "level": p.level},
            })
        return pd.DataFrame(out)

    train, val = root / "train.parquet", root / "val.parquet"
    rows("train", train_size).to_parquet(train)
    rows("test", val_size).to_parquet(val)
    reward = root / "reward.py"
    reward.write_text(REWARD_FUNCTION)
    return LoopInputs(root, model, train, val, reward)


def base_overrides(inputs: LoopInputs, *, steps: int = 2, prompts: int = 4, n: int = 4,
                   dp: int = 1) -> list[str]:
    """verl overrides of a ``steps``-step CPU run: ``prompts`` x ``n`` responses per step."""
    return [
        f"data.train_files={inputs.train}",
        f"data.val_files={inputs.val}",
        "data.prompt_key=prompt",
        "data.max_prompt_length=24",
        "data.max_response_length=40",
        f"data.train_batch_size={prompts}",
        "data.dataloader_num_workers=0",
        "data.shuffle=false",
        f"actor_rollout_ref.model.path={inputs.model}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.fsdp_config.param_offload=false",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false",
        "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.rollout.n={n}",
        # the warm-started model is confident: at temperature 1 the 4 responses to a prompt
        # are often identical, and a group needs a right and a wrong one for token credit
        "actor_rollout_ref.rollout.temperature=1.5",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        f"reward.custom_reward_function.path={inputs.reward}",
        "reward.num_workers=1",
        "algorithm.use_kl_in_reward=false",
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={dp}",
        "trainer.nnodes=1",
        "trainer.logger=[console]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1",
        f"trainer.default_local_dir={inputs.root / 'checkpoints'}",
        "trainer.project_name=ktae-cpu-loop",
        "trainer.experiment_name=loop",
        "+ray_kwargs.ray_init.num_cpus=16",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        f"+ray_kwargs.ray_init.num_gpus={dp}",
        "+ray_kwargs.ray_init.include_dashboard=false",
    ]


@dataclass
class LoopResult:
    returncode: int
    output: str
    seconds: float
    record: list[dict]
    metrics: list[dict]  # verl's console metrics per step


NUMPY_SCALAR = re.compile(r"^np\.\w+\((.*)\)$")


def parse_console_metrics(output: str) -> list[dict]:
    """verl's console logger prints ``step:N - key:value - ...`` once per step."""
    steps = []
    for line in output.splitlines():
        start = line.find("step:")
        if start < 0 or " - " not in line[start:]:
            continue
        metrics = {}
        for part in line[start:].split(" - "):
            key, sep, value = part.partition(":")
            if not sep:
                continue
            value = NUMPY_SCALAR.sub(r"\1", value.strip())  # np.float64(0.5) -> 0.5
            try:
                metrics[key.strip()] = float(value)
            except ValueError:
                metrics[key.strip()] = value.strip()
        if "step" in metrics:
            steps.append(metrics)
    return steps


def run_main_ppo(inputs: LoopInputs, overrides: list[str], *, timeout: float = 900,
                 name: str = "run") -> LoopResult:
    record = inputs.root / f"{name}.record.jsonl"
    record.unlink(missing_ok=True)
    src = Path(__import__("ktae").__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(src), os.environ.get("PYTHONPATH", "")]),
        "VERL_USE_EXTERNAL_MODULES": "ktae_verl_cpu",
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",  # the FSDP engine is registered for cuda and npu only
        "KTAE_LOOP_RECORD": str(record),
        "KTAE_LOOP_RUN": name,
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        # a Ray instance of its own, not one this process may hold (ray.init exports its
        # address to child processes)
        "RAY_ADDRESS": "local",
        "RAY_DEDUP_LOGS": "0",
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
    }
    log = inputs.root / f"{name}.log"
    start = time.monotonic()
    with open(log, "w") as out:
        # its own session, so that Ray's processes go with it if it has to be stopped
        proc = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *overrides],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=inputs.root,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the run
            proc.wait()
    seconds = time.monotonic() - start
    output = log.read_text(errors="replace")
    calls = [json.loads(line) for line in record.read_text().splitlines()] \
        if record.exists() else []
    return LoopResult(proc.returncode, output, seconds, calls, parse_console_metrics(output))


if __name__ == "__main__":  # manual runs: python loop_run.py ROOT [overrides...]
    inputs = prepare(Path(sys.argv[1]))
    result = run_main_ppo(inputs, base_overrides(inputs) + sys.argv[2:], name="manual")
    print(result.output[-20000:])
    print("rc", result.returncode, "seconds", round(result.seconds, 1))
    for step in result.metrics:
        print(step)
    for call in result.record:
        print(call)
