"""One training run, wired from parts: config -> model, data, rewards, trainer, run dir.

:func:`train` is what ``ktae train`` calls; tests call it directly (optionally with a
trainer subclass that records what reaches the loss).
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import torch

from ktae.train.config import TrainConfig
from ktae.train.credit import credit_settings
from ktae.train.rollouts import ROLLOUTS_FILE, RolloutRecorder
from ktae.train.rundir import RunDir, checkpoint_step, latest_complete_checkpoint
from ktae.train.trainer import KTAEGRPOTrainer


def load_model(cfg: TrainConfig):
    """``(model, tokenizer, path)``; the default tiny model is built and cached on first use."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = cfg.model
    if path is None:
        from ktae.models.warmstart import default_model_path

        path = str(default_model_path())
    dtype = torch.bfloat16 if cfg.bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, path


def grpo_config(cfg: TrainConfig, num_processes: int):
    """TRL ``GRPOConfig`` for ``cfg`` (batch = num_prompts * num_generations responses)."""
    from trl import GRPOConfig

    total = cfg.num_prompts * cfg.num_generations
    if total % num_processes:
        raise ValueError(f"num_prompts: num_prompts * num_generations = {total} responses must "
                         f"split evenly over {num_processes} processes")
    return GRPOConfig(
        output_dir=cfg.output_dir, max_steps=cfg.max_steps, seed=cfg.seed,
        per_device_train_batch_size=total // num_processes, gradient_accumulation_steps=1,
        steps_per_generation=1, num_iterations=1, num_generations=cfg.num_generations,
        max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature, top_p=1.0,
        learning_rate=cfg.learning_rate, lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=cfg.warmup_steps, beta=cfg.beta, epsilon=cfg.clip_low,
        epsilon_high=cfg.clip_high, loss_type=cfg.loss_type, bf16=cfg.bf16,
        use_cpu=not torch.cuda.is_available(), logging_steps=1, report_to="none",
        save_strategy="steps", save_steps=cfg.save_every or cfg.max_steps, save_total_limit=2,
        disable_tqdm=True, log_completions=False, remove_unused_columns=False,
        dataloader_num_workers=0, shuffle_dataset=True,
    )


def _quiet() -> None:
    """Silence per-call deprecation warnings and weight-loading bars of transformers."""
    import transformers

    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def train(cfg: TrainConfig, *, trainer_cls=KTAEGRPOTrainer, extra_callbacks=(),
          reward_funcs=None) -> dict:
    """Run (or resume) the training described by a resolved ``cfg``; returns the summary.

    Args:
        cfg: a resolved :class:`TrainConfig`.
        trainer_cls: ``KTAEGRPOTrainer`` or a subclass.
        extra_callbacks: more ``transformers.TrainerCallback`` objects.
        reward_funcs: TRL reward functions replacing the task's (the first one's output
            > 0.5 marks a response correct); default: strict accuracy (+ overlong shaping).
    """
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from ktae.train.callbacks import EvalCallback, MetricsCallback, ProgressCallback
    from ktae.train.data import load_task
    from ktae.train.reward_funcs import make_reward_funcs

    _quiet()
    torch.set_num_threads(cfg.torch_threads)
    start = time.perf_counter()
    out = Path(cfg.output_dir)
    resume_from = latest_complete_checkpoint(out) if cfg.resume else None
    if not cfg.resume and (out / "metrics.jsonl").exists():
        raise ValueError(f"output_dir: {out} already holds a run; pass --resume to continue it "
                         "or choose another --output-dir")
    rundir = RunDir(out)
    if resume_from is not None:
        rundir.truncate(checkpoint_step(resume_from))
    elif cfg.resume:
        rundir.truncate(0)
        for path in (rundir.metrics_path, rundir.eval_path):
            path.unlink(missing_ok=True)
    cfg.save(out / "config.yaml")

    model, tokenizer, model_path = load_model(cfg)
    template = cfg.template or ("compact" if len(tokenizer) < 1000 else "qwen-math")
    train_rows, eval_rows = load_task(cfg.task, template=template, train_size=cfg.train_size,
                                      eval_size=cfg.eval_size, seed=cfg.seed)
    rewards = reward_funcs if reward_funcs is not None else make_reward_funcs(
        max_new_tokens=cfg.max_new_tokens, overlong_buffer=cfg.overlong_buffer,
        overlong_factor=cfg.overlong_factor)
    num_processes = int(os.environ.get("WORLD_SIZE", "1"))
    args = grpo_config(cfg, num_processes)
    metrics_cb = MetricsCallback(rundir)
    eval_cb = EvalCallback(rundir, eval_rows, every=cfg.eval_every,
                           max_new_tokens=cfg.max_new_tokens, tokenizer=tokenizer)
    callbacks = [metrics_cb, eval_cb, *extra_callbacks]
    if cfg.progress:
        callbacks.append(ProgressCallback(metrics_cb, eval_cb))
    trainer = trainer_cls(model=model, reward_funcs=rewards, args=args,
                          train_dataset=Dataset.from_list(train_rows), processing_class=tokenizer,
                          callbacks=callbacks, credit=credit_settings(cfg))
    trainer.remove_callback(PrinterCallback)
    is_main = trainer.accelerator.is_main_process
    if is_main and cfg.rollout_every:
        trainer.rollouts = RolloutRecorder(
            out / ROLLOUTS_FILE, every=cfg.rollout_every, groups=cfg.rollout_groups,
            keep_until_step=checkpoint_step(resume_from) if resume_from else 0)
    evals = RunDir.read_jsonl(rundir.eval_path)
    if is_main and not any(e["step"] == 0 for e in evals):
        eval_cb.evaluate(trainer.model, 0)
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    if trainer.rollouts is not None:
        trainer.rollouts.close()
    step = trainer.state.global_step
    trainer.save_model(str(out / "final"))  # every process: may synchronise
    summary: dict = {"is_main": is_main, "steps": step}
    if is_main:
        evals = RunDir.read_jsonl(rundir.eval_path)
        if not any(e["step"] == step for e in evals):
            eval_cb.evaluate(trainer.accelerator.unwrap_model(trainer.model), step)
            evals = RunDir.read_jsonl(rundir.eval_path)
        tokenizer.save_pretrained(str(out / "final"))
        metrics = RunDir.read_jsonl(rundir.metrics_path)
        step_times = [m["step_time"] for m in metrics if m.get("step_time") is not None]
        adv = [m["advantage_seconds"] for m in metrics if m.get("advantage_seconds") is not None]
        by_step = {e["step"]: e for e in evals}
        summary.update({
            "model": model_path,
            "heldout_before": by_step.get(0, {}).get("accuracy"),
            "heldout_after": by_step[step]["accuracy"] if step in by_step else None,
            "heldout_carry_before": by_step.get(0, {}).get("accuracy_carry"),
            "heldout_carry_after": by_step.get(step, {}).get("accuracy_carry"),
            "final_response_length": by_step.get(step, {}).get("response_length"),
            "mean_step_seconds": sum(step_times) / len(step_times) if step_times else None,
            "advantage_share": sum(adv) / sum(step_times) if adv and sum(step_times) else None,
            "wall_seconds_this_invocation": time.perf_counter() - start,
            "resumed_from": str(resume_from) if resume_from else None,
        })
        rundir.write_json("summary.json", summary)
        rundir.plot()
    return summary
