"""One training run, wired from parts: config -> model, data, rewards, trainer, run dir.

:func:`preflight` checks everything that can be checked without a model (credit options,
TRL settings, LoRA, the task file, the output directory); :func:`train` runs it and then
the training. ``ktae train`` calls both; tests call :func:`train` directly (optionally with
a trainer subclass that records what reaches the loss).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ktae.checkpoints import checkpoint_step
from ktae.models.generation_defaults import save_generation_defaults
from ktae.models.model_path import resolve_model_path
from ktae.models.warmstart import default_model_path
from ktae.rewards.registry import get_reward
from ktae.runs.config import TrainConfig, resume_changes
from ktae.runs.credit import CreditSettings, credit_settings
from ktae.runs.rollouts import ROLLOUTS_FILE, RolloutRecorder
from ktae.runs.rundir import (
    RunDir,
    finished_steps,
    follow_umask,
    foreign_checkpoints,
    mark_run_finished,
    prepare_output_dir,
    start_segment,
)
from ktae.train.allocator import keep_freed_memory
from ktae.train.callbacks import (
    EvalCallback,
    MetricsCallback,
    NoSignalCallback,
    ProgressCallback,
)
from ktae.train.data import TaskRows, default_template, format_task, read_task
from ktae.train.flags import flag_names
from ktae.train.no_signal import find_no_signal
from ktae.train.precision import attention_in_float32, check_bf16, stored_dtype
from ktae.train.reward_funcs import make_reward_funcs
from ktae.train.step_timing import mean_step_seconds
from ktae.train.trainer import DiskFullError, KTAEGRPOTrainer, is_disk_full
from ktae.train.trl_args import check_trl_settings
from ktae.train.trl_version import check_trl
from ktae.train.vllm_colocate import (
    check_vllm_settings,
    colocated_engine_options,
    preferred_generation_backend,
)


@dataclass(frozen=True)
class Preflight:
    """What :func:`preflight` checked and built: credit settings, TRL settings, task rows."""

    credit: CreditSettings
    trl: dict
    task: TaskRows
    model: str | None
    """Where the model loads from (a local directory or a hub id); None = the default."""
    precision: str = "float32"
    """The arithmetic the run trains in, in words (:func:`ktae.train.precision.check_bf16`)."""
    generation: str = "hf"
    """Who samples the responses: ``hf`` or ``vllm`` (:func:`choose_generation`)."""


def choose_generation(cfg: TrainConfig, trl: dict) -> tuple[dict, str]:
    """``(trl settings, backend)``: the ``--trl`` settings with ``--generation``'s backend
    in them, and that backend (``hf`` or ``vllm``).

    ``vllm`` adds TRL's colocated engine (``use_vllm``, ``vllm_mode=colocate``, unless the
    settings name a mode); ``auto`` asks
    :func:`ktae.train.vllm_colocate.preferred_generation_backend` for this device, the
    policy's dtype and the settings, and prints the choice in one line. ``--trl
    use_vllm=true``, the way to ask for vLLM before ``--generation``, still means ``vllm``.
    """
    if trl.get("use_vllm"):
        return trl, "vllm"
    backend = cfg.generation
    if backend == "auto":
        from ktae.eval.vllm_engine import vllm_distribution

        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = str(stored_dtype(cfg.bf16, lora=cfg.lora_r > 0)).removeprefix("torch.")
        backend = preferred_generation_backend(device, vllm_distribution() is not None,
                                               dtype=dtype, trl_settings=trl)
        print(f"ktae train: --generation auto: {backend} on the {device} "
              f"({'colocated vLLM' if backend == 'vllm' else 'transformers'}; docs/vllm.md)",
              file=sys.stderr)
    if backend == "vllm":
        trl = {"use_vllm": True, "vllm_mode": "colocate", **trl}
    return trl, backend


def preflight(cfg: TrainConfig) -> Preflight:
    """Check a resolved config before any model loads.

    Raises:
        ValueError: the first problem found, naming the field (credit options, ``trl``
            settings, vLLM's among them (:mod:`ktae.train.vllm_colocate`), LoRA without
            peft, the task file, too few training problems).
        UnsupportedTRLError: the installed TRL is outside the supported range.
    """
    check_trl()
    credit = credit_settings(cfg)
    trl, backend = choose_generation(cfg, check_trl_settings(cfg.trl))
    check_vllm_settings(trl)  # vLLM installed; server mode only with CUDA
    model = None
    if cfg.model is not None:
        try:
            model = resolve_model_path(cfg.model)
        except ValueError as err:
            raise ValueError(str(err).replace("MODEL: ", "model: ", 1)) from None
    precision = "float32"
    if cfg.bf16:
        precision = check_bf16("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.lora_r:
        try:
            import peft  # noqa: F401
        except ImportError:
            raise ValueError("lora_r: LoRA needs peft: pip install 'ktae[peft]'") from None
    reward = get_reward(cfg.reward)
    check = None
    if reward.check_source is not None:
        def check(example):
            reward.check_source(example.data_source)
    task = read_task(cfg.task, train_size=cfg.train_size, eval_size=cfg.eval_size,
                     seed=cfg.seed, fields=cfg.task_fields, filters=cfg.task_filters,
                     eval_task=cfg.eval_task, check=check, eval_split=cfg.eval_split,
                     mix=cfg.task_mix)
    if len(task.train) < cfg.num_prompts:
        raise ValueError(f"task: {len(task.train)} training problem(s), fewer than "
                         f"num_prompts={cfg.num_prompts} per step")
    return Preflight(credit, trl, task, model, precision, backend)


@dataclass(frozen=True)
class RunPlan:
    """What an invocation of a run directory does (:func:`plan_run`)."""

    checkpoint: Path | None
    """The complete checkpoint to resume from; None = start at step 0."""
    complete: bool
    """The run already finished at ``max_steps``: nothing is left to do."""
    changes: dict
    """Settings a resume changes (field -> (run's, new)); only ones that cannot change
    the steps already trained (:data:`ktae.runs.config.RESUMABLE_FIELDS`)."""


def describe_changes(changes: dict) -> str:
    """``{"learning_rate": (3e-05, 0.01)}`` -> ``"lr 3e-05 -> 0.01"`` (flag names)."""
    names = flag_names()
    return ", ".join(f"{names.get(k, k)} {old} -> {new}" for k, (old, new) in changes.items())


def plan_run(cfg: TrainConfig) -> RunPlan:
    """Check the output directory (and, on resume, the run's settings); writes nothing.

    Raises:
        ValueError: the directory is not usable (:func:`prepare_output_dir`), or a resume
            changes settings that would change the run (one line naming them).
    """
    out = Path(cfg.output_dir)
    checkpoint = prepare_output_dir(out, resume=cfg.resume, write=False)
    saved = set(range(cfg.save_every, cfg.max_steps + 1, cfg.save_every or cfg.max_steps))
    in_the_way = [p for step, p in sorted(foreign_checkpoints(out).items())
                  if step in saved | {cfg.max_steps}]
    if in_the_way:
        raise ValueError(f"output_dir: {in_the_way[0]} was not written by ktae, and the run "
                         "would write its checkpoint there; move it out of the run directory")
    if not cfg.resume or not (out / "config.yaml").is_file():
        return RunPlan(checkpoint, False, {})
    run_cfg = TrainConfig.from_file(out / "config.yaml").resolve()
    refused, allowed = resume_changes(run_cfg, cfg)
    if refused:
        raise ValueError(f"--resume: settings differ from the run's: "
                         f"{describe_changes(refused)}")
    step = checkpoint_step(checkpoint) if checkpoint is not None else 0
    if step > cfg.max_steps:
        raise ValueError(f"--resume: max_steps {cfg.max_steps} is below the {step} steps the "
                         "run has trained")
    complete = finished_steps(out) == cfg.max_steps and step == cfg.max_steps
    return RunPlan(checkpoint, complete, allowed)


def load_model(cfg: TrainConfig, path: str | None = None):
    """``(model, tokenizer, path)`` from ``path`` (default ``cfg.model``); the default tiny
    model is built and cached on first use."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = cfg.model if path is None else path
    if path is None:
        path = str(default_model_path())
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=stored_dtype(cfg.bf16, lora=cfg.lora_r > 0))
    if cfg.bf16:
        attention_in_float32(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, path


def grpo_config(cfg: TrainConfig, num_processes: int, trl: dict | None = None):
    """TRL ``GRPOConfig`` for ``cfg`` (batch = num_prompts * num_generations responses),
    with the checked extra settings ``trl`` (see :mod:`ktae.train.trl_args`)."""
    from trl import GRPOConfig

    trl = dict(cfg.trl if trl is None else trl)
    accumulation = int(trl.pop("gradient_accumulation_steps", 1))
    total = cfg.num_prompts * cfg.num_generations
    if total % (num_processes * accumulation):
        raise ValueError(f"num_prompts: num_prompts * num_generations = {total} responses must "
                         f"split evenly over {num_processes} process(es) x "
                         f"gradient_accumulation_steps={accumulation}")
    settings = dict(
        output_dir=cfg.output_dir, max_steps=cfg.max_steps, seed=cfg.seed,
        per_device_train_batch_size=total // (num_processes * accumulation),
        gradient_accumulation_steps=accumulation, steps_per_generation=accumulation,
        num_iterations=1, num_generations=cfg.num_generations,
        max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature, top_p=1.0,
        learning_rate=cfg.learning_rate, lr_scheduler_type=cfg.lr_scheduler,
        # transformers reads a warmup_steps below 1 as a share of max_steps
        warmup_steps=cfg.warmup_ratio or cfg.warmup_steps, beta=cfg.beta,
        epsilon=cfg.clip_low,
        epsilon_high=cfg.clip_high, loss_type=cfg.loss_type, bf16=cfg.bf16,
        use_cpu=not torch.cuda.is_available(), logging_steps=1, report_to="none",
        save_strategy="steps", save_steps=cfg.save_every or cfg.max_steps,
        save_total_limit=cfg.save_total_limit or None,
        disable_tqdm=True, log_completions=False, remove_unused_columns=False,
        dataloader_num_workers=0, shuffle_dataset=True,
        # TRL 1.16 defaults to True, which recomputes the forward pass in the backward pass
        # (8 N T FLOPs instead of 6 N T): memory a small model does not need (docs/step-time.md)
        gradient_checkpointing=False,
    )
    settings.update(trl)
    return GRPOConfig(**settings)


def lora_config(cfg: TrainConfig):
    """A ``peft.LoraConfig`` for ``cfg`` (``lora_r > 0``)."""
    from peft import LoraConfig

    targets = cfg.lora_target_modules
    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets[0] if targets == ["all-linear"] else list(targets),
                      task_type="CAUSAL_LM")


def _quiet() -> None:
    """Silence per-call deprecation warnings and weight-loading bars of transformers."""
    import transformers

    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def model_card(cfg: TrainConfig, summary: dict) -> str:
    """A short markdown card: what was trained, how, what it scored, how to reproduce."""

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    lines = [
        f"# {Path(cfg.output_dir).name}", "",
        f"Trained with `ktae train` ({cfg.algo.upper()} with `{cfg.credit}` credit).", "",
        "| | |", "|---|---|",
        f"| base model | `{summary.get('model')}` |",
        f"| task | `{cfg.task}`{_task_options(cfg)} (template `{summary.get('template')}`, at most "
        f"{cfg.max_new_tokens} new tokens) |",
        f"| algorithm | {cfg.algo}: loss `{cfg.loss_type}`, clip {cfg.clip_low}/{cfg.clip_high}, "
        f"dynamic sampling {'on' if cfg.dynamic_sampling else 'off'} |",
        f"| credit | `{cfg.credit}` |",
        f"| reward | `{cfg.reward}` |",
        f"| precision | {summary.get('precision', 'float32')} |",
        f"| generation | {summary.get('generation', 'hf')} |",
        f"| steps | {summary.get('steps')} x {cfg.num_prompts} prompts x {cfg.num_generations} "
        "responses |",
        f"| held-out accuracy (greedy) | {pct(summary.get('heldout_before'))} -> "
        f"{pct(summary.get('heldout_after'))} |",
    ]
    if summary.get("heldout_carry_before") is not None:
        lines.append(f"| carry/borrow problems | {pct(summary.get('heldout_carry_before'))} -> "
                     f"{pct(summary.get('heldout_carry_after'))} |")
    if cfg.lora_r:
        lines.append(f"| LoRA | r={cfg.lora_r}, alpha={cfg.lora_alpha}, "
                     f"targets {', '.join(cfg.lora_target_modules)} |")
    lines += ["", "Reproduce with the resolved settings saved beside this card:", "",
              "```bash", f"ktae train --config {Path(cfg.output_dir) / 'config.yaml'} "
              "--output-dir NEW_DIR", "```", ""]
    return "\n".join(lines)


def _task_options(cfg: TrainConfig) -> str:
    parts = [f"{k}={v}" for k, v in cfg.task_fields.items()]
    parts += [f"{k} in {', '.join(v)}" for k, v in cfg.task_filters.items()]
    if cfg.eval_task:
        parts.append(f"held out: `{cfg.eval_task}`")
    return f" ({'; '.join(parts)})" if parts else ""


def train(cfg: TrainConfig, *, trainer_cls=KTAEGRPOTrainer, extra_callbacks=(),
          reward_funcs=None, checked: Preflight | None = None) -> dict:
    """Run (or resume) the training described by a resolved ``cfg``; returns the summary.

    A resume (``cfg.resume``) continues the run exactly where its newest complete checkpoint
    left it, with the run's own settings (:func:`plan_run`); a finished run is not trained
    further: its summary comes back with ``complete=True``.

    Args:
        cfg: a resolved :class:`TrainConfig`.
        trainer_cls: ``KTAEGRPOTrainer`` or a subclass.
        extra_callbacks: more ``transformers.TrainerCallback`` objects.
        reward_funcs: TRL reward functions replacing the task's (the first one's output
            > 0.5 marks a response correct); default: strict accuracy (+ overlong shaping).
        checked: the :func:`preflight` of ``cfg`` when the caller already ran it.

    Raises:
        ValueError: a setting or the output directory is unusable, or a resume changes
            settings that would change the run (before any model loads).
        DiskFullError: the disk filled up while writing a checkpoint or the final model.
    """
    _quiet()
    torch.set_num_threads(cfg.torch_threads)
    keep_freed_memory()  # the update's large tensors reuse freed pages (ktae.train.allocator)
    start = time.perf_counter()
    checked = checked if checked is not None else preflight(cfg)
    # Every process checks the directory (and a resume's settings) before any writes to
    # it (a check racing the main process's first write would see a half-made run and
    # fail alone, leaving the others waiting at a barrier); then the main process sets it
    # up.
    plan = plan_run(cfg)
    if plan.complete:  # read-only: the same answer on every process
        return _finished_summary(Path(cfg.output_dir))
    args = grpo_config(cfg, int(os.environ.get("WORLD_SIZE", "1")), checked.trl)
    state, resume_from = _set_up_run_dir(cfg, plan, args)
    is_main = state.is_main_process
    parts = _load_parts(cfg, checked, RunDir(Path(cfg.output_dir)), extra_callbacks,
                        reward_funcs)
    trainer = _make_trainer(cfg, checked, parts, args, trainer_cls)
    _record_rollouts(cfg, trainer, resume_from, is_main)
    _evaluate_before_training(parts, trainer, is_main)
    _train_and_save(cfg, trainer, parts, resume_from, is_main)
    summary: dict = {"is_main": is_main, "steps": trainer.state.global_step}
    if is_main:
        summary.update(_summary(cfg, checked, parts, trainer, resume_from, start))
        _write_run_files(cfg, parts.rundir, summary)
    state.wait_for_everyone()
    # Tear the process group down on every process. DDP's reducer holds the group: release
    # it first (free_memory drops the prepared models and collects them), so that the
    # group's last reference goes through torch's GIL-releasing destructor. Had the
    # reducer been last, gloo's destructor would join its worker threads with the GIL
    # held while a worker waits for the GIL to free a finished collective's tensors.
    accelerator = trainer.accelerator
    del trainer
    accelerator.free_memory()
    accelerator.end_training()
    return summary


def _finished_summary(out: Path) -> dict:
    """The summary of a run that already trained every step (nothing is written)."""
    import json

    summary = json.loads((out / "summary.json").read_text())
    return {**summary, "is_main": int(os.environ.get("RANK", "0")) == 0, "complete": True}


def _set_up_run_dir(cfg: TrainConfig, plan: RunPlan, args):
    """``(process state, checkpoint to resume from)``: the process group set up from
    ``args``, and the run directory prepared by the main process while the others wait."""
    from accelerate import PartialState

    out = Path(cfg.output_dir)
    args.world_size  # noqa: B018  (sets up the process group from the args' own settings)
    state = PartialState()  # the state the args set up
    resume_from = plan.checkpoint
    state.wait_for_everyone()
    if state.is_main_process:
        resume_from = prepare_output_dir(out, resume=cfg.resume, write=True)
        dataclasses.replace(cfg, resume=False).save(out / "config.yaml")  # a recipe to rerun
        start_segment(out, from_step=checkpoint_step(resume_from) if resume_from else 0,
                      changes={k: list(v) for k, v in plan.changes.items()})
    state.wait_for_everyone()
    return state, resume_from


@dataclass
class _Parts:
    """What the trainer is built from: the model, its data, its rewards and callbacks."""

    model: object
    tokenizer: object
    model_path: str
    template: str
    generation: dict
    """The generation defaults saved with the final model (template, budget)."""
    train_rows: list
    rewards: list
    rundir: RunDir
    eval_cb: EvalCallback
    callbacks: list


def _load_parts(cfg: TrainConfig, checked: Preflight, rundir: RunDir, extra_callbacks,
                reward_funcs) -> _Parts:
    """Load the model, format the task's rows, and make the rewards and callbacks."""
    model, tokenizer, model_path = load_model(cfg, checked.model)
    template = cfg.template or default_template(checked.task, tokenizer, cfg.reward)
    train_rows, eval_rows = format_task(checked.task, template, tokenizer, cfg.reward,
                                        model=model, max_new_tokens=cfg.max_new_tokens)
    generation = {"template": template, "max_new_tokens": cfg.max_new_tokens}
    rewards = reward_funcs if reward_funcs is not None else make_reward_funcs(
        max_new_tokens=cfg.max_new_tokens, overlong_buffer=cfg.overlong_buffer,
        overlong_factor=cfg.overlong_factor, reward=cfg.reward, cut_off=cfg.cut_off_answers)
    metrics_cb = MetricsCallback(rundir)
    eval_cb = EvalCallback(rundir, eval_rows, every=cfg.eval_every, steps=cfg.eval_steps,
                           max_new_tokens=cfg.max_new_tokens, tokenizer=tokenizer,
                           reward=cfg.reward, autocast=torch.bfloat16 if cfg.bf16 else None,
                           cut_off=cfg.cut_off_answers)
    callbacks = [metrics_cb, eval_cb,
                 NoSignalCallback(metrics_cb, steps=cfg.no_signal_steps,
                                  max_new_tokens=cfg.max_new_tokens, reward=cfg.reward),
                 *extra_callbacks]
    if cfg.progress:
        callbacks.append(ProgressCallback(metrics_cb, eval_cb))
    return _Parts(model, tokenizer, model_path, template, generation, train_rows, rewards,
                  rundir, eval_cb, callbacks)


def _make_trainer(cfg: TrainConfig, checked: Preflight, parts: _Parts, args, trainer_cls):
    """The trainer over ``parts`` (with colocated vLLM attached when the run uses it)."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    with colocated_engine_options(checked.trl, parts.model.dtype) as attach:  # vLLM as policy
        trainer = trainer_cls(model=parts.model, reward_funcs=parts.rewards, args=args,
                              train_dataset=Dataset.from_list(parts.train_rows),
                              processing_class=parts.tokenizer, callbacks=parts.callbacks,
                              credit=checked.credit, generation_defaults=parts.generation,
                              logprob_head=cfg.logprob_head,
                              peft_config=lora_config(cfg) if cfg.lora_r else None)
        attach(trainer)
    trainer.remove_callback(PrinterCallback)
    return trainer


def _record_rollouts(cfg: TrainConfig, trainer, resume_from: Path | None, is_main: bool):
    """Give the main process's trainer a rollout recorder (``--rollout-every``)."""
    if is_main and cfg.rollout_every:
        trainer.rollouts = RolloutRecorder(
            Path(cfg.output_dir) / ROLLOUTS_FILE, every=cfg.rollout_every,
            groups=cfg.rollout_groups,
            keep_until_step=checkpoint_step(resume_from) if resume_from else 0)


def _evaluate_before_training(parts: _Parts, trainer, is_main: bool) -> None:
    """Evaluate the untrained model (step 0) unless the run already has that evaluation
    or does not evaluate step 0 (``eval_steps``)."""
    evals = RunDir.read_jsonl(parts.rundir.eval_path)
    if is_main and parts.eval_cb.evaluates_before_training() \
            and not any(e["step"] == 0 for e in evals):
        parts.eval_cb.evaluate(trainer.model, 0)


def _train_and_save(cfg: TrainConfig, trainer, parts: _Parts, resume_from: Path | None,
                    is_main: bool) -> None:
    """Train to ``max_steps`` (or load a checkpoint that has every step) and save the final
    model, its tokenizer and generation defaults under ``final/``.

    Raises:
        DiskFullError: the disk filled up while writing a checkpoint or the final model.
    """
    out = Path(cfg.output_dir)
    final = out / "final"
    try:
        if resume_from is not None and checkpoint_step(resume_from) >= cfg.max_steps:
            # every step trained (killed while evaluating or saving the final model): the
            # checkpoint's weights are the final ones; transformers would train one step more
            trainer._load_from_checkpoint(str(resume_from))
            trainer.state.global_step = checkpoint_step(resume_from)
        else:
            trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        if trainer.rollouts is not None:
            trainer.rollouts.close()
        trainer.save_model(str(final))  # every process: may synchronise
        if is_main:
            parts.tokenizer.save_pretrained(str(final))
            save_generation_defaults(final, **parts.generation)
            follow_umask(final)
    except Exception as err:
        if is_disk_full(err) and not isinstance(err, DiskFullError):
            raise DiskFullError(28, f"no space left on the device while writing to {out}; "
                                "complete checkpoints are intact: free some space and run "
                                "again with --resume") from err
        raise


def _summary(cfg: TrainConfig, checked: Preflight, parts: _Parts, trainer,
             resume_from: Path | None, start: float) -> dict:
    """The main process's summary of the run: held-out accuracy before and after, step
    times, the no-signal finding; evaluates the final step first if the run evaluates it
    and has not yet."""
    step = trainer.state.global_step
    rundir = parts.rundir
    evals = RunDir.read_jsonl(rundir.eval_path)
    if parts.eval_cb.due(step, step) and not any(e["step"] == step for e in evals):
        parts.eval_cb.evaluate(trainer.accelerator.unwrap_model(trainer.model), step)
        evals = RunDir.read_jsonl(rundir.eval_path)
    metrics = RunDir.read_jsonl(rundir.metrics_path)
    step_times = [m["step_time"] for m in metrics if m.get("step_time") is not None]
    no_signal = find_no_signal(metrics, steps=cfg.no_signal_steps,
                               max_new_tokens=cfg.max_new_tokens, reward=cfg.reward)
    adv = [m["advantage_seconds"] for m in metrics if m.get("advantage_seconds") is not None]
    by_step = {e["step"]: e for e in evals}
    return {
        "model": parts.model_path,
        "template": parts.template,
        "precision": checked.precision,
        "generation": checked.generation,
        "heldout_before": by_step.get(0, {}).get("accuracy"),
        "heldout_after": by_step[step]["accuracy"] if step in by_step else None,
        "heldout_carry_before": by_step.get(0, {}).get("accuracy_carry"),
        "heldout_carry_after": by_step.get(step, {}).get("accuracy_carry"),
        "final_response_length": by_step.get(step, {}).get("response_length"),
        "mean_step_seconds": sum(step_times) / len(step_times) if step_times else None,
        "advantage_share": sum(adv) / sum(step_times) if adv and sum(step_times) else None,
        "step_seconds": mean_step_seconds(metrics),
        "no_signal": no_signal.to_dict() if no_signal is not None else None,
        "wall_seconds_this_invocation": time.perf_counter() - start,
        "resumed_from": str(resume_from) if resume_from else None,
    }


def _write_run_files(cfg: TrainConfig, rundir: RunDir, summary: dict) -> None:
    """Write ``summary.json``, the model card (run and ``final/``) and the plots, then mark
    the run finished (last: a kill before it leaves the run to resume)."""
    out = Path(cfg.output_dir)
    rundir.write_json("summary.json", summary)
    card = model_card(cfg, summary)
    for folder in (out, out / "final"):
        (folder / "README.md").write_text(card)
    rundir.plot()
    mark_run_finished(out, summary["steps"])
