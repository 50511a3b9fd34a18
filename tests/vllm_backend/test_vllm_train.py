"""``ktae train --trl use_vllm=true --trl vllm_mode=colocate`` on vLLM's CPU build: the
run completes, and the policy's new weights reach the engine every step: the log-probs
vLLM reports for the tokens it sampled match the trainer's policy at that step, and not
the initial weights'."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_train_helpers import contains_digit, tiny_config

from ktae.train.session import train
from ktae.train.trainer import KTAEGRPOTrainer

pytestmark = pytest.mark.slow


class WeightsAtGeneration(KTAEGRPOTrainer):
    """Keeps, per step, the sampled batch with vLLM's log-probs and the policy's weights
    at generation time (TRL synchronised them into vLLM just before)."""

    steps: list

    def _finish_batch(self, batch, rewards, correct, mode, **kwargs):
        if mode == "train":
            self.steps.append({
                "prompt_ids": batch["prompt_ids"].clone(), "prompt_mask": batch["prompt_mask"].clone(),
                "completion_ids": batch["completion_ids"].clone(),
                "completion_mask": batch["completion_mask"].clone(),
                "vllm_logps": batch["sampling_per_token_logps"].clone(),
                "weights": copy.deepcopy(self.accelerator.unwrap_model(self.model).state_dict())})
        return super()._finish_batch(batch, rewards, correct, mode, **kwargs)


def _policy_logps(model, step) -> torch.Tensor:
    """log p(sampled token) under ``model`` (temperature 1), shaped like vLLM's."""
    ids = torch.cat([step["prompt_ids"], step["completion_ids"]], dim=1)
    mask = torch.cat([step["prompt_mask"], step["completion_mask"]], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
    width = step["prompt_ids"].shape[1]
    logits = logits[:, width - 1:-1]
    return torch.log_softmax(logits, -1).gather(-1, step["completion_ids"][..., None])[..., 0]


@pytest.fixture(scope="module")
def random_model(tmp_path_factory) -> str:
    """A random tiny Llama (character tokenizer; head size 32, which vLLM's CPU attention
    supports): its samples vary, so a reward on them does, and the policy moves."""
    from ktae.models import build_char_tokenizer, build_tiny_model

    path = tmp_path_factory.mktemp("random") / "model"
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=64, num_layers=1, intermediate_size=128,
                     num_heads=2, seed=0, max_position_embeddings=256).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_colocate_weights_reach_vllm_every_step(random_model, tmp_path):
    from transformers import AutoModelForCausalLM

    default_model = random_model
    cfg = tiny_config(default_model, tmp_path / "run", max_steps=3, num_prompts=2,
                      num_generations=4, max_new_tokens=8, temperature=1.0,
                      learning_rate=0.05, trl={"use_vllm": True, "vllm_mode": "colocate"})
    WeightsAtGeneration.steps = []
    # a reward the random tiny model earns on some responses only: the policy moves
    summary = train(cfg, trainer_cls=WeightsAtGeneration, reward_funcs=[contains_digit])
    assert summary["steps"] == 3
    steps = WeightsAtGeneration.steps
    assert len(steps) == 3
    model = AutoModelForCausalLM.from_pretrained(default_model, dtype=torch.float32).eval()
    initial = copy.deepcopy(model.state_dict())
    changed = max((steps[-1]["weights"][k] - initial[k]).abs().max().item() for k in initial)
    assert changed > 1e-2  # the policy moved

    for i, step in enumerate(steps):
        mask = step["completion_mask"].bool()
        model.load_state_dict(step["weights"])
        now = (_policy_logps(model, step) - step["vllm_logps"])[mask].abs()
        model.load_state_dict(initial)
        before = (_policy_logps(model, step) - step["vllm_logps"])[mask].abs()
        # vLLM sampled with this step's weights (float32 both sides: rounding only) ...
        assert now.max().item() < 1e-3, (i, now.max().item())
        if i > 0:  # ... and, after updates, not with the initial ones
            assert before.mean().item() > 20 * now.mean().item() + 1e-3, (i, before.mean())


def test_colocate_runs_from_the_cli_on_smollm2(smollm2, tmp_path):
    """In its own process, as users run it: a colocated engine sets up vLLM's distributed
    state in the training process, once per process."""
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    # as from a fresh shell: the in-process colocated engine of the test above set
    # torch.distributed's variables (RANK, WORLD_SIZE, MASTER_ADDR/PORT, ...) in this
    # process and still holds its port; inherited, they would make the child's accelerate
    # rendezvous as one rank of a group. TRL sets its own, on a free port, when unset.
    dist = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
            "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in dist}
    done = subprocess.run(
        [sys.executable, "-m", "ktae", "train", "--model", "smollm2-135m", "--output-dir",
         str(out), "--max-steps", "2", "--num-prompts", "2", "--num-generations", "4",
         "--max-new-tokens", "16", "--eval-size", "4", "--eval-every", "0",
         "--trl", "use_vllm=true", "--trl", "vllm_mode=colocate", "--no-progress"],
        capture_output=True, text=True, timeout=1800, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len([m for m in metrics if "step_time" in m]) == 2
