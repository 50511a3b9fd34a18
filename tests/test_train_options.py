"""Every advertised trainer option runs: reference-mode KTAE, calibrations with their own
options, truncation masking, TRL settings from the command line, LoRA; the trainer's
start-up checks, model card and full-disk report."""

from __future__ import annotations

import errno
import json
import warnings

import pytest
import torch
from test_train_helpers import Recorder, contains_digit, read_jsonl, tiny_config

import ktae
from ktae.train.session import train
from ktae.train.trainer import KTAEGRPOTrainer

pytestmark = pytest.mark.slow


def _train(tiny_model, out, reward_funcs=(contains_digit,), **overrides):
    seen: list = []
    cls = type("R", (Recorder,), {"seen": seen})
    cfg = tiny_config(tiny_model, out, **overrides)
    summary = train(cfg, trainer_cls=cls, reward_funcs=list(reward_funcs) or None)
    return cfg, summary, seen


@pytest.mark.parametrize("overrides", [
    dict(algo="dapo", credit="ktae", ktae_mode="reference"),
    dict(algo="grpo", credit="taco-hard", taco_alpha=0.5),
    dict(algo="grpo", credit="ktae+forking-tokens", calibration_options={"top_fraction": 0.3}),
    dict(algo="grpo", credit="ktae+taco", taco_lambda=0.5, estimator_options={"top": 0.5}),
], ids=["reference", "taco-hard", "forking-options", "ktae-taco-options"])
def test_advertised_credit_options_run(tiny_model, tmp_path, overrides):
    cfg, summary, seen = _train(tiny_model, tmp_path / "run", max_steps=1, **overrides)
    m = read_jsonl(tmp_path / "run" / "metrics.jsonl")[0]
    assert summary["steps"] == 1 and torch.isfinite(torch.tensor(m["loss"]))
    if cfg.credit.startswith("ktae"):
        rec = seen[0]
        group = torch.arange(rec["rewards"].numel()) // cfg.num_generations
        options = {"mode": cfg.ktae_mode, **cfg.estimator_options}
        expected = ktae.compute_advantages("ktae", rewards=rec["rewards"], group=group,
                                           token_ids=rec["ids"], mask=rec["token_mask"].bool(),
                                           correct=rec["correct"], ignore_token_ids=rec["ignore"],
                                           **options)
        torch.testing.assert_close(rec["adv"], expected * rec["loss_mask"])


def test_truncation_masking_keeps_tokens_in_ktae_statistics(tiny_model, tmp_path):
    """With mask_truncated_completions the truncated rows leave the loss, but KTAE still
    counts their tokens (they are real responses of their group)."""
    from ktae.models.warmstart import default_model_path

    def has_one(completions, **_):  # about half the hot samples: mixed groups
        return [1.0 if "1" in c else 0.0 for c in completions]

    # at temperature 2 the shipped model finishes some answers within 20 tokens and is
    # cut on the others
    cfg, _, seen = _train(default_model_path(), tmp_path / "run", reward_funcs=(has_one,),
                          algo="grpo", credit="ktae", max_steps=1, max_new_tokens=20,
                          num_prompts=8, temperature=2.0, seed=1,
                          trl={"mask_truncated_completions": True})
    rec = seen[0]
    truncated = (rec["loss_mask"].sum(1) == 0) & (rec["token_mask"].sum(1) > 0)
    # what the test needs of the sampled batch (seed 1): a group with both rewards that
    # holds a truncated and a kept response
    right = rec["rewards"].view(-1, cfg.num_generations)
    mixed = (right.max(1).values > right.min(1).values).repeat_interleave(cfg.num_generations)
    cut = truncated.view(-1, cfg.num_generations)
    both = (cut.any(1) & ~cut.all(1)).repeat_interleave(cfg.num_generations)
    assert (mixed & both).any()
    assert (rec["adv"][truncated] == 0).all()
    group = torch.arange(rec["rewards"].numel()) // cfg.num_generations
    full = ktae.compute_advantages("ktae", rewards=rec["rewards"], group=group,
                                   token_ids=rec["ids"], mask=rec["token_mask"].bool(),
                                   correct=rec["correct"], ignore_token_ids=rec["ignore"])
    torch.testing.assert_close(rec["adv"], full * rec["loss_mask"])
    # what the old code did (statistics on the emptied mask) gives other values
    emptied = ktae.compute_advantages("ktae", rewards=rec["rewards"], group=group,
                                      token_ids=rec["ids"], mask=rec["loss_mask"].bool(),
                                      correct=rec["correct"], ignore_token_ids=rec["ignore"])
    assert not torch.allclose(emptied * rec["loss_mask"], rec["adv"])


def test_trl_settings_reach_the_trainer(tiny_model, tmp_path):
    seen_args = []

    class Args(KTAEGRPOTrainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            seen_args.append(self.args)

    cfg = tiny_config(tiny_model, tmp_path / "run", algo="grpo", credit="none", max_steps=2,
                      trl={"logging_steps": 2, "gradient_checkpointing": True, "top_k": 3})
    train(cfg, trainer_cls=Args, reward_funcs=[contains_digit])
    args = seen_args[0]
    assert (args.logging_steps, args.gradient_checkpointing, args.top_k) == (2, True, 3)
    assert [m["step"] for m in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [2]


def test_gradient_accumulation_keeps_the_global_batch(tiny_model, tmp_path):
    from ktae.train.session import grpo_config

    cfg = tiny_config(tiny_model, tmp_path / "run", num_prompts=4, num_generations=4,
                      trl={"gradient_accumulation_steps": 2})
    args = grpo_config(cfg, 1)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps,
            args.steps_per_generation) == (8, 2, 2)
    with pytest.raises(ValueError, match="gradient_accumulation_steps=3"):
        grpo_config(tiny_config(tiny_model, tmp_path / "r", trl={"gradient_accumulation_steps": 3}),
                    1)


@pytest.mark.parametrize("pairs, match", [
    (["use_vlm=true"], "not a trl.GRPOConfig field; did you mean 'use_vllm'"),
    (["epsilon_high=0.3"], "use --clip-high"),
    (["logging_steps=often"], "trl: logging_steps: expected a number"),
    (["num_iterations=1.5"], "trl: num_iterations: expected an integer"),
    (["gradient_checkpointing=maybe"], "trl: gradient_checkpointing: expected true/false"),
    (["use_vllm"], "expected KEY=VALUE"),
])
def test_trl_refusals(pairs, match):
    from ktae.train.trl_args import parse_trl_pairs

    with pytest.raises(ValueError, match=match):
        parse_trl_pairs(pairs)


def test_trl_values_are_typed():
    from ktae.train.trl_args import check_trl_settings, parse_trl_pairs

    got = parse_trl_pairs(["use_vllm=true", "vllm_mode=colocate", "logging_steps=5",
                           "vllm_gpu_memory_utilization=0.3", "report_to=none",
                           "lr_scheduler_kwargs={min_lr: 1.0e-7}"])
    assert got == {"use_vllm": True, "vllm_mode": "colocate", "logging_steps": 5,
                   "vllm_gpu_memory_utilization": 0.3, "report_to": "none",
                   "lr_scheduler_kwargs": {"min_lr": 1e-7}}
    assert check_trl_settings({"top_k": 2.0, "use_vllm": False}) == {"top_k": 2, "use_vllm": False}
    with pytest.raises(ValueError, match="did you mean 'top_k'"):
        check_trl_settings({"topk": 2})
    with pytest.raises(ValueError, match="trl: use_vllm: expected true/false"):
        check_trl_settings({"use_vllm": "yes"})


def test_report_to_needs_a_known_installed_integration(monkeypatch):
    from transformers.integrations import integration_utils

    from ktae.train.trl_args import check_trl_settings

    monkeypatch.setattr(integration_utils, "is_wandb_available", lambda: False)
    with pytest.raises(ValueError, match=r"trl: report_to: 'wandb' needs its package installed"):
        check_trl_settings({"report_to": "wandb"})
    with pytest.raises(ValueError, match=r"'wandbb' is not a logging integration.*'wandb'"):
        check_trl_settings({"report_to": ["wandbb"]})
    monkeypatch.setattr(integration_utils, "is_wandb_available", lambda: True)
    assert check_trl_settings({"report_to": ["wandb"]}) == {"report_to": ["wandb"]}
    assert check_trl_settings({"report_to": "none"}) == {"report_to": "none"}


def test_layout_is_checked_before_trl_builds_anything(tiny_model, tmp_path, monkeypatch):
    from trl import GRPOTrainer

    from ktae.runs.credit import CreditSettings
    from ktae.train.session import grpo_config

    def never(*a, **kw):
        raise AssertionError("GRPOTrainer.__init__ must not run for a refused layout")

    monkeypatch.setattr(GRPOTrainer, "__init__", never)
    cfg = tiny_config(tiny_model, tmp_path / "run", num_prompts=3,
                      trl={"gradient_accumulation_steps": 3})
    args = grpo_config(cfg, 1)  # 12 rows, 4 per micro-batch, 12 per generation: fine
    args.per_device_train_batch_size, args.steps_per_generation = 3, 2  # 6 rows: not groups of 4
    with pytest.raises(ValueError, match="multiple of num_generations=4"):
        KTAEGRPOTrainer(model=None, reward_funcs=[contains_digit], args=args,
                        credit=CreditSettings(dynamic_sampling=True))


def test_settings_without_effect_warn_once(tiny_model, tmp_path):
    from ktae.train.trainer import warn_settings_without_effect

    cfg = tiny_config(tiny_model, tmp_path / "run", trl={"scale_rewards": "batch"})
    from ktae.train.session import grpo_config

    with pytest.warns(UserWarning, match="scale_rewards='batch' has no effect"):
        warn_settings_without_effect(grpo_config(cfg, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_settings_without_effect(grpo_config(tiny_config(tiny_model, tmp_path / "r"), 1))
    assert not [w for w in caught if "has no effect" in str(w.message)]


def test_model_card_and_generation_defaults(tiny_model, tmp_path):
    cfg, summary, _ = _train(tiny_model, tmp_path / "run", algo="grpo", credit="ktae",
                             max_steps=1)
    for folder in (tmp_path / "run", tmp_path / "run" / "final"):
        card = (folder / "README.md").read_text()
        assert "ktae train" in card and "[None]" not in card and "`ktae`" in card
        assert "config.yaml" in card
    gen = json.loads((tmp_path / "run" / "final" / "ktae_generation.json").read_text())
    assert gen == {"template": "compact", "max_new_tokens": cfg.max_new_tokens}
    ckpt = tmp_path / "run" / "checkpoint-1"
    assert json.loads((ckpt / "ktae_generation.json").read_text()) == gen
    assert not (ckpt / "README.md").exists()  # no TRL auto card


def test_lora_trains_only_adapters_and_eval_loads_them(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from ktae.cli import main

    cfg, _, _ = _train(tiny_model, tmp_path / "run", algo="grpo", credit="ktae", max_steps=2,
                       lora_r=4, learning_rate=1e-2)
    final = tmp_path / "run" / "final"
    assert (final / "adapter_model.safetensors").exists()
    assert not (final / "model.safetensors").exists()  # adapters only
    from safetensors.torch import load_file

    adapters = load_file(final / "adapter_model.safetensors")
    assert adapters and all("lora_" in k for k in adapters)
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    tuned = AutoModelForCausalLM.from_pretrained(final)  # base + adapters (peft)
    assert any("lora_" in n for n, _ in tuned.named_parameters())
    base_sd = base.state_dict()
    for name, p in tuned.named_parameters():
        if "lora_" in name or "base_layer" not in name:
            continue
        ref = base_sd[name.replace("base_layer.", "")]
        torch.testing.assert_close(p, ref)  # frozen base weights unchanged
    lora_b = [v for k, v in adapters.items() if "lora_B" in k]
    assert any(v.abs().sum() > 0 for v in lora_b)  # B starts at 0: it trained
    out = tmp_path / "eval"
    code = main(["eval", str(final), "--benchmarks", "embedded", "--limit", "4",
                 "--output-dir", str(out)])
    assert code == 0 and (out / "results.json").exists()


def test_full_disk_is_reported_in_words(tiny_model, tmp_path, capsys, monkeypatch):
    import transformers.modeling_utils as mu

    from ktae.checkpoints import latest_complete_checkpoint
    from ktae.cli import main

    real = mu.safe_save_file
    calls = []

    def filling_up(*a, **kw):
        calls.append(1)
        if len(calls) >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **kw)

    monkeypatch.setattr(mu, "safe_save_file", filling_up)
    run = tmp_path / "run"
    argv = ["train", "--model", str(tiny_model), "--output-dir", str(run), "--algo", "grpo",
            "--credit", "none", "--max-steps", "4", "--save-every", "2", "--num-prompts", "4",
            "--num-generations", "4", "--max-new-tokens", "8", "--train-size", "64",
            "--eval-size", "8", "--eval-every", "0", "--no-progress"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "no space left on the device" in err and "--resume" in err
    assert "Traceback" not in err
    assert latest_complete_checkpoint(run).name == "checkpoint-2"  # intact
    monkeypatch.setattr(mu, "safe_save_file", real)
    assert main([*argv, "--resume"]) == 0
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4]


def test_documented_gpu_recipe_parses():
    """The first GPU recipe of docs/training.md (KTAE's 7B run) is a valid ``ktae train``
    command: its config, option routing and TRL settings pass the start-up checks, and the
    batch splits over the 8 processes it launches."""
    import argparse
    import re
    import shlex
    from pathlib import Path

    from ktae.train.cli_train import add_arguments, config_from_args
    from ktae.train.session import grpo_config
    from ktae.train.trl_args import check_trl_settings

    root = Path(__file__).parents[1]
    text = (root / "docs" / "training.md").read_text()
    section = text[text.index("### GPU recipes"):]
    line = re.search(r"accelerate launch --num_processes 8 -m ktae train (.*)\n",
                     section).group(1)
    argv = [a if not a.startswith("configs/") else str(root / a) for a in shlex.split(line)]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = config_from_args(parser.parse_args(argv))
    assert cfg.model == "Qwen/Qwen2.5-Math-7B"
    assert (cfg.num_prompts, cfg.num_generations, cfg.max_new_tokens) == (128, 16, 3072)
    assert (cfg.ktae_h2, cfg.clip_high, cfg.overlong_buffer) == (2.0, 0.24, 512)
    trl = check_trl_settings(cfg.trl)
    assert trl["use_vllm"] is True and trl["gradient_accumulation_steps"] == 16
    args = grpo_config(cfg, 8, {k: v for k, v in trl.items() if not k.startswith("vllm")
                                and k != "use_vllm"})
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * 8 == 2048
    assert args.per_device_train_batch_size * args.steps_per_generation % 16 == 0


@pytest.mark.slow
def test_eval_steps_evaluate_exactly_there(tiny_model, tmp_path):
    """``--eval-steps``: the held-out evaluations at those steps only, none before or after
    training unless listed; the summary reads what there is."""
    cfg = tiny_config(tiny_model, tmp_path / "run", max_steps=3, eval_every=1, eval_steps=[2])
    summary = train(cfg, reward_funcs=[contains_digit])
    assert [e["step"] for e in read_jsonl(tmp_path / "run" / "eval.jsonl")] == [2]
    assert summary["heldout_before"] is None and summary["heldout_after"] is None
    cfg = tiny_config(tiny_model, tmp_path / "both", max_steps=2, eval_steps=[2, 0, 2])
    assert cfg.eval_steps == [0, 2]
    summary = train(cfg, reward_funcs=[contains_digit])
    assert [e["step"] for e in read_jsonl(tmp_path / "both" / "eval.jsonl")] == [0, 2]
    assert summary["heldout_before"] is not None and summary["heldout_after"] is not None


def test_eval_steps_are_read_and_checked():
    import argparse

    from ktae.runs.config import TrainConfig
    from ktae.train.cli_train import add_arguments, config_from_args

    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    cfg = config_from_args(parser.parse_args(["--eval-steps", "30,24", "--max-steps", "30"]))
    assert cfg.eval_steps == [24, 30]
    with pytest.raises(argparse.ArgumentError, match="eval_steps: expected a list"):
        parser.parse_args(["--eval-steps", "24,x"])
    with pytest.raises(ValueError, match=r"^eval_steps: expected steps from 0 to "
                                         r"max_steps=30, got \[31\]$"):
        TrainConfig(max_steps=30, eval_steps=[24, 31]).resolve()
