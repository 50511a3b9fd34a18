"""The colocated engine's cheaper step (:mod:`ktae.train.vllm_colocate`): the LoRA
policy's merged weights synced without its frozen embeddings, TRL's old-policy pass
skipped where vLLM's float32 log-probs are the policy's, and the backend choice.

The training run is a child process: a colocated engine sets up vLLM's distributed state
in its process, once (see test_vllm_train.py)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from ktae.train.vllm_colocate import (
    SAMPLED_LOGP_TOLERANCE,
    checks_old_policy_pass,
    merged_policy_weights,
    preferred_generation_backend,
    sampled_logp_difference,
    skip_old_policy_pass_when_exact,
)

TESTS = Path(__file__).resolve().parent.parent


def _tiny_lora(seed: int = 0):
    from peft import LoraConfig, get_peft_model

    from ktae.models import build_char_tokenizer, build_tiny_model

    base = build_tiny_model(build_char_tokenizer(), hidden_size=64, num_layers=2,
                            intermediate_size=128, num_heads=2, seed=seed)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                            task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g))
    return model


def test_merged_weights_equal_peft_merge_and_leave_the_policy_alone():
    model = _tiny_lora()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    expected = dict(copy.deepcopy(model).merge_and_unload().named_parameters())
    every = dict(merged_policy_weights(model, changing_only=False))
    assert set(every) == set(expected)  # vLLM's checkpoint names, no adapter tensors
    for name, tensor in every.items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-6, atol=1e-6)
    adapted = [n for n in every if "q_proj" in n]
    assert adapted and not torch.equal(every[adapted[0]],
                                       before["base_model.model." + adapted[0].replace(
                                           ".weight", ".base_layer.weight")])
    for key, value in model.state_dict().items():  # merged out of place: W untouched
        assert torch.equal(value, before[key]), key
    changing = dict(merged_policy_weights(model, changing_only=True))
    assert set(every) - set(changing) == {"model.embed_tokens.weight"}  # frozen, tied


def test_merged_weights_of_a_full_fine_tune_keep_its_embeddings():
    from ktae.models import build_char_tokenizer, build_tiny_model

    model = build_tiny_model(build_char_tokenizer(), hidden_size=64, num_layers=1,
                             intermediate_size=128, num_heads=2)
    names = [n for n, _ in merged_policy_weights(model, changing_only=True)]
    assert names == [n for n, _ in model.named_parameters()]


def _fake_trainer(differences: list[float]):
    """A trainer whose batches' old-policy log-probs are off vLLM's by ``differences[i]``
    at step i; records the correction setting each generation saw."""
    trainer = types.SimpleNamespace(model=types.SimpleNamespace(training=True),
                                    state=types.SimpleNamespace(global_step=0),
                                    vllm_importance_sampling_correction=True, seen=[])

    def generate_and_score(inputs):
        trainer.seen.append(trainer.vllm_importance_sampling_correction)
        sampling = torch.zeros(2, 3)
        out = {"sampling_per_token_logps": sampling,
               "completion_mask": torch.tensor([[1, 1, 0], [1, 1, 1]])}
        if trainer.vllm_importance_sampling_correction:
            old = sampling.clone()
            old[1, 1] = differences[trainer.state.global_step]
            old[0, 2] = 5.0  # masked out
            out["old_per_token_logps"] = old
        return out

    trainer._generate_and_score_completions = generate_and_score
    return trainer


def _run(trainer, steps: int) -> None:
    for step in range(steps):
        trainer.state.global_step = step
        trainer._generate_and_score_completions([])


def test_old_policy_pass_skipped_between_checks_while_exact():
    trainer = _fake_trainer([1e-5] * 5)
    said = []
    skip_old_policy_pass_when_exact(trainer, check_every=2, report=said.append)
    _run(trainer, 5)
    assert trainer.seen == [True, False, True, False, True]  # checks on steps 0, 2, 4
    assert [c["step"] for c in trainer.ktae_sampled_logp_checks] == [0, 2, 4]
    assert trainer.ktae_sampled_logp_checks[0]["max"] == pytest.approx(1e-5)
    assert trainer.ktae_sampled_logp_checks[0]["tokens"] == 5
    assert not trainer.vllm_importance_sampling_correction and len(said) == 3


def test_old_policy_pass_kept_once_vllm_is_off():
    trainer = _fake_trainer([1e-5, 0.0, 0.5, 0.0, 0.0, 0.0])
    said = []
    skip_old_policy_pass_when_exact(trainer, check_every=2, report=said.append)
    _run(trainer, 6)
    assert trainer.seen == [True, False, True, True, True, True]
    assert "stay on" in said[-1] and len(said) == 2
    assert trainer.vllm_importance_sampling_correction


def test_old_policy_pass_kept_without_log_probs_to_compare():
    trainer = _fake_trainer([0.0] * 3)
    plain = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: {
        k: v for k, v in plain(inputs).items() if k != "sampling_per_token_logps"}
    skip_old_policy_pass_when_exact(trainer, check_every=2, report=lambda line: None)
    _run(trainer, 3)
    assert trainer.seen == [True, True, True] and trainer.ktae_sampled_logp_checks == []


def test_eval_batches_neither_check_nor_change_the_setting():
    trainer = _fake_trainer([0.5])
    trainer.model.training = False
    skip_old_policy_pass_when_exact(trainer, report=lambda line: None)
    _run(trainer, 1)
    assert trainer.ktae_sampled_logp_checks == [] and trainer.vllm_importance_sampling_correction


def test_which_engines_get_the_skip():
    assert checks_old_policy_pass({"use_vllm": True}, "float32")
    assert not checks_old_policy_pass({"use_vllm": True}, "bfloat16")
    assert not checks_old_policy_pass({"vllm_importance_sampling_correction": True}, "float32")
    with pytest.raises(ValueError, match="check_every"):
        skip_old_policy_pass_when_exact(_fake_trainer([0.0]), check_every=0)


def test_sampled_logp_difference_leaves_out_masked_and_nan_tokens():
    old = torch.tensor([[0.0, 0.2, float("nan")], [0.1, 9.0, 0.0]])
    found = sampled_logp_difference(old, torch.zeros(2, 3),
                                    torch.tensor([[1, 1, 1], [1, 0, 1]]))
    assert found["tokens"] == 4 and found["max"] == pytest.approx(0.2)


def test_preferred_backend():
    assert preferred_generation_backend("cpu", True) == "vllm"  # float32: no old-policy pass
    assert preferred_generation_backend("cpu", True, dtype="bfloat16") == "hf"
    assert preferred_generation_backend(
        "cpu", True, trl_settings={"vllm_importance_sampling_correction": True}) == "hf"
    assert preferred_generation_backend(
        "cpu", True, dtype="bfloat16",
        trl_settings={"vllm_importance_sampling_correction": False}) == "vllm"
    assert preferred_generation_backend("cpu", False) == "hf"
    assert preferred_generation_backend("mps", True) == "hf"
    assert preferred_generation_backend("cuda:0", True, dtype="bfloat16") == "vllm"
    assert preferred_generation_backend("cuda", False) == "hf"
    with pytest.raises(ValueError, match="device"):
        preferred_generation_backend("", True)


RUN = r'''
import json, sys
import torch
from test_train_helpers import contains_digit, tiny_config
from ktae.train.session import train
from ktae.train.trainer import KTAEGRPOTrainer


def logps(model, b):
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], dim=1)
    mask = torch.cat([b["prompt_mask"], b["completion_mask"]], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
    logits = logits[:, b["prompt_ids"].shape[1] - 1:-1]
    return torch.log_softmax(logits, -1).gather(-1, b["completion_ids"][..., None])[..., 0]


class Recorder(KTAEGRPOTrainer):
    steps = []

    def _finish_batch(self, batch, rewards, correct, mode, **kwargs):
        if mode == "train":
            m = batch["completion_mask"].bool()
            v = batch["sampling_per_token_logps"]
            model = self.accelerator.unwrap_model(self.model)
            now = (logps(model, batch) - v)[m].abs()
            with model.disable_adapter():
                base = (logps(model, batch) - v)[m].abs()
            self.steps.append({"now_max": now.max().item(), "now_mean": now.mean().item(),
                               "base_mean": base.mean().item(),
                               "old_pass": "old_per_token_logps" in batch})
        return super()._finish_batch(batch, rewards, correct, mode, **kwargs)


cfg = tiny_config(sys.argv[1], sys.argv[2], max_steps=3, num_prompts=2, num_generations=4,
                  max_new_tokens=8, temperature=1.0, learning_rate=0.05, lora_r=8,
                  trl={"use_vllm": True, "vllm_mode": "colocate"})
summary = train(cfg, trainer_cls=Recorder, reward_funcs=[contains_digit])
json.dump({"steps": Recorder.steps, "done": summary["steps"]}, open(sys.argv[3], "w"))
'''


@pytest.mark.slow
def test_lora_run_syncs_every_step_and_skips_the_old_pass(tmp_path):
    """A LoRA run on a random tiny Llama: each step vLLM's log-probs of its samples are the
    trainer's policy's (adapters merged in, embeddings not sent) and, after updates, not
    the base model's; the old-policy pass runs on step 0 (the check) only."""
    from ktae.models import build_char_tokenizer, build_tiny_model

    path = tmp_path / "model"
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=64, num_layers=1, intermediate_size=128,
                     num_heads=2, seed=0, max_position_embeddings=256).save_pretrained(path)
    tokenizer.save_pretrained(path)
    script = tmp_path / "run.py"
    script.write_text(RUN)
    dist = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
            "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in dist}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    result = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(script), str(path), str(tmp_path / "run"),
                           str(result)], capture_output=True, text=True, timeout=1800,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(result.read_text())
    steps = found["steps"]
    assert found["done"] == 3 and len(steps) == 3
    assert [s["old_pass"] for s in steps] == [True, False, False]
    assert "vllm: step 0: the sampled tokens' log-probs from vLLM equal" in done.stdout
    for s in steps:
        assert s["now_max"] < SAMPLED_LOGP_TOLERANCE, s
    assert steps[-1]["base_mean"] > 20 * steps[-1]["now_mean"] + 1e-3, steps[-1]
