"""``KTAEGRPOTrainer``: TRL's ``GRPOTrainer`` with our advantages, dynamic sampling and TACO.

Small overrides, each next to the TRL method it changes (TRL 1.15 and 1.16, the range of
:mod:`ktae.train.trl_version`; docs/contributing.md lists them with what TRL offers instead):

1. ``_generate_and_score_completions``: after TRL generates and scores a batch, the
   gathered rewards (kept by the ``_calculate_rewards`` override) and the gathered
   completion ids/mask go through :func:`ktae.compute_advantages` over the *whole*
   global batch, groups = contiguous blocks of ``num_generations`` rows (TRL's layout);
   the ``[B, T]`` token-level result replaces TRL's ``[B]`` advantages. Gathering the
   token ids makes the estimate correct however the global batch is split across
   processes. With dynamic sampling (docs/method.md §11) extra rounds are generated first and only
   informative groups are kept (:mod:`ktae.train.dynamic_sampling`); this needs every
   group on one process, and other layouts are refused before TRL builds anything.
   TRL's per-pass metrics move to ``generation/<key>``; the standard keys describe the
   batch trained on (:mod:`ktae.train.batch_metrics`), and so does the completion table.
   With ``mask_truncated_completions`` KTAE's statistics still see every generated token:
   TRL's masking is applied afterwards, to the loss mask only.
   Each need of the estimator that comes from a model (:class:`ktae.core.needs.Need`) is
   computed right after generation by its provider, only for estimators that declare
   it: the generating (old) policy's entropies (GTPO) and log-probs (a user's rule) from
   one extra no-grad forward pass, shared; the input-gradient importance (OAR-G) from one
   extra no-grad and one forward-and-backward pass of the generating policy on each
   response followed by a concluding text and the row's reference answer (dataset column
   ``answer``; :mod:`ktae.models.input_grad_importance`); the parameters get no gradient
   from it.
2. ``_compute_loss`` / ``_get_per_token_logps_and_entropies``: when a calibration (TACO,
   docs/method.md §8) is configured, the current policy's per-token log-probs and entropies computed
   inside ``_compute_loss`` (``compute_entropy=True``) calibrate a copy of the advantages,
   detached, before TRL's loss reads them, and the calibration's loss mask (STAPO and
   forking tokens remove tokens) becomes TRL's loss mask (see :meth:`_loss_inputs`).
   A result without the PPO clip (``CalibrationResult.ppo_clip``: KL-Cov, whose verl loss
   clips no token) widens TRL 1.15-1.16's ``epsilon_low``/``epsilon_high`` to infinity for that
   ``_compute_loss`` call, so that its clipped loss types (``grpo``, ``bnpo``, ``dr_grpo``,
   ``dapo``, ``luspo``; ``cispo``'s truncation too) clip no token; TRL's ``delta`` still
   applies when it is set. The old/ref log-prob passes (no entropy, outside
   ``_compute_loss``) are untouched.
3. ``_save_checkpoint``: writes the generation settings and a completion marker last, so a
   checkpoint half-written by a kill is never resumed from (:mod:`ktae.runs.rundir`); a
   full disk is reported in words; a ``checkpoint-N`` directory ktae did not start is
   never written into (:func:`ktae.runs.rundir.claim_checkpoint`). transformers' own
   rotation is switched off for the call (it runs before the marker exists and deletes any
   ``checkpoint-*`` directory); :func:`ktae.runs.rundir.rotate_checkpoints` then deletes
   only complete ktae checkpoints. Model files get the umask's mode (safetensors: 0600).
   ``create_model_card``: TRL's auto-generated card is not written (``ktae train`` writes
   its own).
4. Exact resume. ``_get_train_sampler``: TRL's ``RepeatSampler`` draws each epoch's order
   from one generator seeded once, so a run resumed in epoch e > 0 drew epoch 0's order
   again; :class:`EpochRepeatSampler` draws epoch e's order from the seed alone, the same
   order as an uninterrupted run (``_run_epoch`` sets the epoch). On resume
   transformers restores the logging/save steps of the checkpoint's ``trainer_state.json``;
   the resumed run's own settings (a changed ``--save-every``) are applied again, by a
   callback at ``on_train_begin``.

5. Step time (:mod:`ktae.train.step_timing`, docs/step-time.md): ``training_step``,
   ``_generate``, ``_calculate_rewards`` and ``_get_per_token_logps_and_entropies`` (the
   old/reference passes, outside ``_compute_loss``) are wrapped in timed parts, unchanged
   otherwise; a callback times the optimizer step and logs each part's seconds.
6. The log-prob head (:mod:`ktae.train.logprob_head`): every text-only log-prob pass
   (``_get_per_token_logps_and_entropies``: the loss's policy pass, the old and reference
   passes) runs the ``full`` head where it is chosen: the model's own logits of the
   completion positions and one ``log_softmax``, the same values as TRL's fused LM head.
   Vision inputs, MoE auxiliary losses and the ``chunked`` choice run TRL's own pass.
7. ``_generate_single_turn``: TRL's text-only ``transformers`` generation prefills each
   distinct prompt once for its group of samples (:mod:`ktae.train.shared_prefill`), not
   once per sample; vLLM, continuous batching and vision inputs run TRL's path unchanged.
   The draws use one uniform variate a row (:mod:`ktae.train.sampling`), and on the CPU a
   LoRA model samples with merged float32 weights, or a bfloat16 one through the update's
   fused adapter forward (:func:`ktae.train.lora_forward.lora_for_sampling`).
8. ``_prepare_inputs``: TRL shuffles the generation batch before splitting it into the
   update's micro-batches. Where the gradient does not depend on that split (a ``grpo``,
   ``dr_grpo`` or ``dapo`` loss, one optimizer step per batch, no calibration, entropy
   mask or bonus: :func:`ktae.train.micro_batches.keeps_gradient`), the batch keeps its
   order instead, each prompt's responses together, so that the log-prob head runs each
   micro-batch's few distinct prompts once (:mod:`ktae.train.micro_batches`).

Metrics (``ktae/*`` keys) go through TRL's ``_metrics`` so they reach every logger.
"""

from __future__ import annotations

import errno
import hashlib
import inspect
import math
import os
import warnings
from pathlib import Path

import torch
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl import __version__ as TRL_VERSION
from trl.trainer.utils import RepeatSampler

from ktae.core import calibration, estimators
from ktae.core.calibration import logged_metrics
from ktae.core.methods import estimator_credit
from ktae.core.needs import ModelResponses
from ktae.models.generate import contiguous_head
from ktae.models.generation_defaults import save_generation_defaults
from ktae.runs.credit import CreditSettings
from ktae.runs.rundir import (
    claim_checkpoint,
    follow_umask,
    mark_checkpoint_complete,
    rotate_checkpoints,
)
from ktae.train.batch_metrics import trained_batch_metrics, truncated_rows
from ktae.train.dynamic_sampling import (
    informative_groups,
    merge_rows,
    mergeable,
    need_key,
    select_groups,
)
from ktae.train.ema_teacher import EmaTeacher
from ktae.train.logprob_head import (
    check_head,
    choose_head,
    full_logps,
    takes_logits_to_keep,
    trl_head_runs,
)
from ktae.train.lora_forward import lora_for_sampling
from ktae.train.micro_batches import keeps_gradient, micro_batches_by_prompt
from ktae.train.sampling import fast_multinomial
from ktae.train.self_distill import (
    HAS_TEACHER,
    TEACHER_IDS,
    TEACHER_KEYS,
    TEACHER_MASK,
    distill_term,
    teacher_prompts,
)
from ktae.train.shared_prefill import shared_prefill
from ktae.train.step_timing import PART_KEYS, StepClock
from ktae.train.trl_version import check_trl

#: The real-token mask KTAE reads, carried through dynamic-sampling merges, then dropped.
_TOKEN_MASK = "ktae_token_mask"

#: GRPOConfig settings whose effect ktae replaces (TRL's advantage computation).
_NO_EFFECT = ("scale_rewards", "multi_objective_aggregation")

#: Key of the loss-input copy holding the completion part of the attention mask.
_ATTENTION_COMPLETION_MASK = "ktae_attention_completion_mask"
_TRL_LOGPS = inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies)
_MULTIMODAL = tuple(name for name in _TRL_LOGPS.parameters
                    if name not in ("self", "model", "input_ids", "attention_mask",
                                    "logits_to_keep", "batch_size", "compute_entropy",
                                    "compute_aux_loss"))
"""The vision inputs of TRL 1.15-1.16's log-prob pass: a pass given any of them runs TRL's own."""


def derived_seed(*parts: int) -> int:
    """A stable 63-bit seed from integers (same on every run and process, unlike ``hash``)."""
    digest = hashlib.sha256(",".join(str(int(p)) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class DiskFullError(OSError):
    """No space left on the device while writing a checkpoint or the final model."""


def is_disk_full(err: BaseException) -> bool:
    """True when ``err`` (or what caused it) is a "no space left on device" failure.

    torch and safetensors wrap the OS error in their own exceptions, so the chain and the
    message are both read.
    """
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
        seen += 1
    return False


def check_group_layout(args: GRPOConfig, num_processes: int, dynamic_sampling: bool) -> None:
    """Refuse a layout that would split a group across processes under dynamic sampling.

    Runs before ``GRPOTrainer.__init__``, so nothing (reference model, vLLM engine) is built
    for a run that cannot start.
    """
    G = args.num_generations
    rows = args.per_device_train_batch_size * args.steps_per_generation
    if dynamic_sampling and rows % G:
        raise ValueError(
            f"dynamic sampling keeps or drops whole groups on each process, so each process's "
            f"generation batch (per_device_train_batch_size * steps_per_generation = {rows}) "
            f"must be a multiple of num_generations={G} (with {num_processes} process(es)); "
            "adjust the batch size or the number of prompts, or turn dynamic sampling off")


def warn_settings_without_effect(args: GRPOConfig) -> None:
    """Warn (once) about GRPOConfig settings that ktae's advantages make irrelevant."""
    defaults = GRPOConfig.__dataclass_fields__
    for name in _NO_EFFECT:
        if getattr(args, name) != defaults[name].default:
            warnings.warn(f"{name}={getattr(args, name)!r} has no effect: the advantages come "
                          "from ktae.compute_advantages (credit settings)", stacklevel=3)


class EpochRepeatSampler(RepeatSampler):
    """TRL 1.15-1.16's ``RepeatSampler`` whose epoch ``e`` order depends on the seed and ``e``
    only: the generator is seeded and replayed through the ``e`` earlier epochs' draws before
    each pass, so every epoch's order is the one an uninterrupted TRL run draws, also in a
    run resumed in a later epoch. transformers calls :meth:`set_epoch` before each epoch;
    without it, passes count epochs 0, 1, 2, ...
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        if self.shuffle:
            self.generator.manual_seed(self.seed if self.seed is not None else 0)
            for _ in range(self.epoch):
                torch.randperm(self.num_samples, generator=self.generator)
        self.epoch += 1
        yield from super().__iter__()


class _StepClockCallback(TrainerCallback):
    """Starts and finishes the trainer's :class:`StepClock` with each optimizer step, times
    the optimizer step (transformers 5.24 calls ``on_pre_optimizer_step`` /
    ``on_optimizer_step`` around ``optimizer.step()``) and logs the step's seconds. It runs
    before the other callbacks, so a held-out evaluation at the step's end is not counted."""

    def __init__(self, trainer: KTAEGRPOTrainer):
        self.trainer = trainer

    def on_step_begin(self, args, state, control, **kwargs):
        self.trainer.step_clock.start_step()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.trainer.step_clock.begin("update")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.trainer.step_clock.end("update")

    def on_step_end(self, args, state, control, **kwargs):
        seconds = self.trainer.step_clock.finish_step()
        if seconds is None:
            return
        metrics = self.trainer._metrics["train"]
        for part, key in PART_KEYS.items():
            metrics[f"ktae/{key}"].append(seconds[part])
        metrics["ktae/step_seconds"].append(seconds["step"])


class _EmaTeacherCallback(TrainerCallback):
    """SDPO's EMA teacher (:mod:`ktae.train.ema_teacher`): one step of the average after
    each optimizer step (the authors' ``_update_teacher`` runs after each policy update);
    on resume, before the first step, the average the checkpoint saved."""

    def __init__(self, trainer: KTAEGRPOTrainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step > 0:
            folder = Path(self.trainer._get_output_dir(trial=None))
            self.trainer.ema_teacher.load(folder / f"checkpoint-{state.global_step}")

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.ema_teacher.update(self.trainer.accelerator.unwrap_model(self.trainer.model))


class _RunSettingsCallback(TrainerCallback):
    """On resume, transformers 5.24 restores the checkpoint's logging/eval/save steps
    (``trainer_state.json``); the resumed run's own settings (a changed ``--save-every``)
    are applied again at ``on_train_begin``, after the state is loaded and before the
    first step (transformers' public callback API: no override of ``_init_training_state``)."""

    def on_train_begin(self, args, state, control, **kwargs):
        state.compute_steps(args, state.max_steps)


class KTAEGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose advantages come from :func:`ktae.compute_advantages`.

    Args:
        credit: a :class:`CreditSettings`.
        generation_defaults: optional dict written as ``ktae_generation.json`` into every
            checkpoint (the prompt template and generation budget the model was trained
            with, which ``ktae eval`` reads).
        *args, **kwargs: as for ``trl.GRPOTrainer``.
    """

    rollouts = None
    ema_teacher = None
    """SDPO's EMA teacher (:class:`ktae.train.ema_teacher.EmaTeacher`) when the
    self-distillation term sets ``teacher_update_rate``, else None (the current policy)."""
    """A :class:`ktae.runs.rollouts.RolloutRecorder` that keeps sampled rollouts, or None."""
    logprob_head = "auto"
    """``auto``, ``full`` or ``chunked`` (:mod:`ktae.train.logprob_head`)."""
    _full_head_fits = False
    """Whether the model's forward takes ``logits_to_keep`` (set in ``__init__``)."""
    _trl_head_runs = True
    """Whether TRL's fused LM head runs on the trainer's device (set in ``__init__``)."""

    def __init__(self, *args, credit: CreditSettings, generation_defaults: dict | None = None,
                 logprob_head: str = "auto", **kwargs):
        check_trl()  # the overrides below are checked against these TRL releases only
        if not isinstance(credit, CreditSettings):
            raise ValueError(f"credit: expected CreditSettings, got {type(credit).__name__}")
        grpo_args = kwargs.get("args", args[2] if len(args) > 2 else None)
        if grpo_args is not None:
            # world_size sets up the process group from the args' own settings
            check_group_layout(grpo_args, grpo_args.world_size, credit.dynamic_sampling)
            warn_settings_without_effect(grpo_args)
        self.credit = credit
        self.generation_defaults = generation_defaults
        self.logprob_head = check_head(logprob_head)
        self._last_rewards_per_func: torch.Tensor | None = None
        self._pending_calibration: dict | None = None
        self.step_clock = StepClock()
        self._in_loss = False
        super().__init__(*args, **kwargs)
        self.callback_handler.callbacks.insert(0, _StepClockCallback(self))
        self.add_callback(_RunSettingsCallback())
        rate = (credit.self_distill.options.get("teacher_update_rate") or 0.0
                if credit.self_distill is not None else 0.0)
        self.ema_teacher = (EmaTeacher(self.accelerator.unwrap_model(self.model), rate)
                            if rate > 0 else None)
        if self.ema_teacher is not None:
            self.add_callback(_EmaTeacherCallback(self))
        self._full_head_fits = takes_logits_to_keep(self.model)
        self._micro_batches_by_prompt = keeps_gradient(
            self.loss_type, one_step=self.args.steps_per_generation
            == self.args.gradient_accumulation_steps,
            calibration=credit.calibration or getattr(credit.self_distill, "kind", None),
            top_entropy_quantile=self.top_entropy_quantile,
            entropy_bonus=self._entropy_bonus_enabled, aux_loss=self.aux_loss_enabled)
        if logprob_head == "full" and not self._full_head_fits:
            raise ValueError("logprob_head: 'full' needs a model whose forward takes "
                             "logits_to_keep; use 'chunked'")
        # TRL 1.15's fused LM head has Triton kernels only (logprob_head.trl_head_runs):
        # where it cannot run, every pass takes the full head, and a run that needs TRL's
        # is refused here rather than at its first log-prob pass
        self._trl_head_runs = trl_head_runs(self.accelerator.device)
        needs_trl_head = ("logprob_head='chunked'" if logprob_head == "chunked" else
                          "a model whose forward takes no logits_to_keep"
                          if not self._full_head_fits else
                          "an MoE auxiliary loss" if self.aux_loss_enabled else None)
        if needs_trl_head and not self._trl_head_runs:
            raise ValueError(f"logprob_head: {needs_trl_head} runs TRL's fused LM head, which "
                             f"trl {TRL_VERSION} computes with Triton on a CUDA or XPU device "
                             "only; use the full head or trl 1.16.0")
        if credit.correct_reward_index >= len(self.reward_funcs):
            raise ValueError(f"credit.correct_reward_index: expected < {len(self.reward_funcs)} "
                             f"(number of reward functions), got {credit.correct_reward_index}")
        tok = self._tokenizer
        ignore = {int(i) for i in getattr(self, "eos_token_ids", None) or ()}
        for i in (tok.pad_token_id, tok.eos_token_id):
            if i is not None:
                ignore.add(int(i))
        self.ignore_token_ids = sorted(ignore)
        for func in self.reward_funcs:  # ktae's accuracy reward tells cut-off responses
            if getattr(func, "stop_ids", False) is None:
                func.stop_ids = frozenset(int(i) for i in self._stop_ids() if i is not None)

    @property
    def _method(self):
        """The credit method (:mod:`ktae.core.methods`), KTAE ignoring pad and EOS."""
        import dataclasses

        return dataclasses.replace(self.credit.method,
                                   ignore_token_ids=tuple(self.ignore_token_ids))

    # ------------------------------------------------------------------ rewards

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # TRL 1.15-1.16's _calculate_rewards returns the gathered [B_global, n_funcs]
        # rewards, which _generate_and_score_completions's output does not carry: kept for
        # the advantages (module docstring, 1) and timed as scoring (5)
        with self.step_clock.part("scoring"):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions,
                                                          completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # [B_global, n_funcs], gathered
        return rewards_per_func

    def _local_slice(self, rows: int) -> slice:
        i = self.accelerator.process_index
        return slice(i * rows, (i + 1) * rows)

    def _one_round(self, inputs: list[dict]) -> dict:
        """One TRL generation+scoring pass, with local per-row ``rewards``, ``per_func`` and
        ``correct``. TRL's truncation masking is deferred (see the module docstring)."""
        masking, self.mask_truncated_completions = self.mask_truncated_completions, False
        try:
            out = super()._generate_and_score_completions(inputs)
        finally:
            self.mask_truncated_completions = masking
        out.update(self._rollout_needs(out, inputs))
        if self.credit.self_distill is not None:
            out.update(self._teacher_prompts(out, inputs))
        token_mask = out["completion_mask"]
        if "tool_mask" in out:
            token_mask = token_mask * out["tool_mask"]
        out[_TOKEN_MASK] = token_mask
        if masking:  # TRL's rule, applied to the loss mask only
            keep = ~truncated_rows(out["completion_ids"], out["completion_mask"],
                                   self._stop_ids())
            out["completion_mask"] = out["completion_mask"] * keep[:, None].to(token_mask.dtype)
        per_func = self._last_rewards_per_func[self._local_slice(len(inputs))]
        weights = self.reward_weights.to(per_func.device)
        rewards = torch.nan_to_num(per_func * weights[None, :], nan=0.0).sum(dim=1)
        idx = self.credit.correct_reward_index
        correct = per_func[:, idx] > 0.5
        global_correct = self._last_rewards_per_func[:, idx] > 0.5
        return {"batch": out, "rewards": rewards, "per_func": per_func, "correct": correct,
                "global_correct": global_correct, "inputs": inputs}

    def _stop_ids(self) -> list[int]:
        return [*self.eos_token_ids, self._tokenizer.pad_token_id]

    def _rollout_needs(self, batch: dict, inputs: list[dict]) -> dict:
        """The value of each need of the estimator that comes from a model, under the policy
        that generated ``batch``, by its batch key (:func:`need_key`): each computed by its
        provider (:attr:`ktae.core.needs.Need.provider`)."""
        needs = self._method.model_needs
        if not needs:
            return {}
        g = torch.Generator(device="cpu").manual_seed(derived_seed(
            self.credit.seed, self.state.global_step, -2, self.accelerator.process_index))
        b = batch["completion_ids"].shape[0]
        G = self.num_generations if self.model.training else self.num_generations_eval
        per_func = self._last_rewards_per_func[self._local_slice(b)]
        responses = ModelResponses(
            model=self.accelerator.unwrap_model(self.model), tokenizer=self._tokenizer,
            prompt_ids=batch["prompt_ids"], prompt_mask=batch["prompt_mask"],
            completion_ids=batch["completion_ids"], completion_mask=batch["completion_mask"],
            rows=inputs, generator=g, policy_pass=lambda: self._policy_pass(batch),
            correct=per_func[:, self.credit.correct_reward_index].cpu() > 0.5,
            group=(torch.arange(b) + self.accelerator.process_index * b) // G,
            options=dict(self._method.estimator_options), temperature=self.temperature)
        out = {}
        with self.step_clock.part("logprobs"):
            for need in needs:
                try:
                    out[need_key(need.name)] = need.load_provider()(responses)
                except ValueError as err:
                    raise ValueError(f"credit: estimator {self.credit.estimator!r} "
                                     f"{err}") from None
        return out

    def _teacher_prompts(self, batch: dict, inputs: list[dict]) -> dict:
        """The privileged prompts of the self-distillation term
        (:func:`ktae.train.self_distill.teacher_prompts`), from this round's verdicts."""
        b = batch["completion_ids"].shape[0]
        G = self.num_generations if self.model.training else self.num_generations_eval
        per_func = self._last_rewards_per_func[self._local_slice(b)]
        return teacher_prompts(
            self.credit.self_distill, self._tokenizer, batch["prompt_ids"], batch["prompt_mask"],
            batch["completion_ids"], batch["completion_mask"],
            correct=per_func[:, self.credit.correct_reward_index].cpu() > 0.5,
            group=(torch.arange(b) + self.accelerator.process_index * b) // G, rows=inputs)

    def _policy_pass(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """``([b, T] log-probs, [b, T] entropies)`` of the policy that generated ``batch``
        (GTPO's old-policy entropies): one no-grad pass like TRL 1.15-1.16's old log-prob pass in
        ``_generate_and_score_completions``, on the same inputs."""
        unknown = sorted(k for k in batch if not mergeable(k)
                         and k not in ("advantages", "num_items_in_batch", *TEACHER_KEYS))
        if unknown:
            raise ValueError("needs the old policy's entropies, which ktae computes for "
                             f"text-only batches; this batch also holds {unknown}")
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        size = (self.args.per_device_train_batch_size if self.model.training
                else self.args.per_device_eval_batch_size)
        with torch.no_grad():
            logps, entropies, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, attention, batch["completion_ids"].size(1), batch_size=size,
                compute_entropy=True)
        return logps.detach(), entropies.detach()

    # ------------------------------------------------------------------ step time

    def training_step(self, model, inputs, num_items_in_batch):
        # TRL 1.15-1.16's training_step (generation in _prepare_inputs, then loss and backward),
        # timed as the update part; the parts inside it are counted as themselves
        with self.step_clock.part("update"):
            return super().training_step(model, inputs, num_items_in_batch)

    def _prepare_inputs(self, generation_batch):
        # TRL 1.15-1.16's _prepare_inputs shuffles the generation batch before it splits it into
        # micro-batches: kept in prompt order where no gradient changes (module docstring, 8)
        with micro_batches_by_prompt(self.model.training and self._micro_batches_by_prompt):
            return super()._prepare_inputs(generation_batch)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args, **kwargs):
        # TRL 1.15-1.16's HF path samples with unwrapped_model.generate on each prompt repeated
        # num_generations times: text-only, each distinct prompt is prefilled once
        # (module docstring, 7)
        if (self.use_vllm or self.use_transformers_continuous_batching
                or images is not None or multimodal_fields):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields,
                                                 *args, **kwargs)
        model = self.accelerator.unwrap_model(self.model)
        with (shared_prefill(model), fast_multinomial(), contiguous_head(model),
              lora_for_sampling(model)):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields,
                                                 *args, **kwargs)

    def _generate(self, prompts: list):
        # TRL 1.15-1.16's _generate: prompts tokenized, responses sampled and decoded
        with self.step_clock.part("generation"):
            return super()._generate(prompts)

    # ------------------------------------------------------------------ generation

    def _generate_and_score_completions(self, inputs):
        # TRL 1.15-1.16's place for custom advantages (module docstring, 1): TRL's [B]
        # advantages are replaced by ktae's [B, T] ones after one or more rounds of its own
        mode = "train" if self.model.training else "eval"
        before = {k: len(v) for k, v in self._metrics[mode].items()}
        rounds = [self._one_round(inputs)]
        G = self.num_generations if mode == "train" else self.num_generations_eval
        first_informative = informative_groups(rounds[0]["global_correct"], G)
        if mode == "train" and self.credit.dynamic_sampling:
            rounds = self._dynamic_sampling(inputs, rounds)
            need = len(inputs) // G
            info = [informative_groups(r["correct"], G) for r in rounds]
            picks = select_groups(info, need)
            rows = [[] for _ in rounds]
            for r, g in picks:
                rows[r].extend(range(g * G, (g + 1) * G))
            rows = [torch.tensor(x, dtype=torch.long) for x in rows]
            batch = self._merge(rounds, rows)
            chosen = {key: torch.cat([r[key][i.to(r[key].device)] for r, i in
                                      zip(rounds, rows, strict=True)])
                      for key in ("rewards", "per_func", "correct")}
            chosen["prompts"] = [r["inputs"][j]["prompt"] for r, i in
                                 zip(rounds, rows, strict=True) for j in i.tolist()]
            kept = sum(bool(info[r][g]) for r, g in picks) / need
            self._metrics[mode]["ktae/informative_group_fraction"].append(
                self._mean_across_processes(kept))
        else:
            first = rounds[0]
            batch = first["batch"]
            chosen = {key: first[key] for key in ("rewards", "per_func", "correct")}
            chosen["prompts"] = [x["prompt"] for x in inputs]
        self._move_round_metrics(mode, before)
        self._metrics[mode]["ktae/generation_rounds"].append(float(len(rounds)))
        self._metrics[mode]["ktae/zero_variance_group_fraction"].append(
            1.0 - first_informative.float().mean().item())
        self._metrics[mode]["ktae/round1_accuracy"].append(
            rounds[0]["global_correct"].float().mean().item())
        return self._finish_batch(batch, chosen["rewards"], chosen["correct"], mode,
                                  per_func=chosen["per_func"], prompts=chosen["prompts"])

    def _move_round_metrics(self, mode: str, before: dict[str, int]) -> None:
        """TRL's values logged during this step's generation passes -> ``generation/<key>``
        (their mean); the standard keys are then logged from the trained batch."""
        metrics = self._metrics[mode]
        for key in list(metrics):
            if key == "num_tokens" or key.startswith(("generation/", "ktae/")):
                continue
            new = metrics[key][before.get(key, 0):]
            if not new:
                continue
            del metrics[key][before.get(key, 0):]
            if not metrics[key]:
                del metrics[key]
            metrics[f"generation/{key}"].append(sum(new) / len(new))

    def _dynamic_sampling(self, inputs: list[dict], rounds: list[dict]) -> list[dict]:
        G = self.num_generations
        need = len(inputs) // G
        while len(rounds) < self.credit.max_generation_rounds:
            have = sum(int(informative_groups(r["correct"], G).sum()) for r in rounds)
            # every process must run the same number of rounds (generation gathers)
            if not self._any_across_processes(have < need):
                break
            rounds.append(self._one_round(self._refill_inputs(need, len(rounds))))
        return rounds

    def _refill_inputs(self, num_prompts: int, round_index: int) -> list[dict]:
        """Fresh prompts for an extra round, drawn from the train set with a seed fixed by
        (seed, step, round, process), so a resumed run draws the same ones."""
        g = torch.Generator().manual_seed(derived_seed(
            self.credit.seed, self.state.global_step, round_index, self.accelerator.process_index))
        idx = torch.randint(len(self.train_dataset), (num_prompts,), generator=g).tolist()
        return [dict(self.train_dataset[i]) for i in idx for _ in range(self.num_generations)]

    def _merge(self, rounds: list[dict], rows: list[torch.Tensor]) -> dict:
        recomputed = ("advantages", "num_items_in_batch")
        unknown = sorted(k for k in rounds[0]["batch"]
                         if not mergeable(k) and k not in (*recomputed, _TOKEN_MASK, *TEACHER_KEYS))
        if unknown:
            raise ValueError(f"dynamic sampling: cannot merge generation batches holding {unknown} "
                             "(multimodal inputs); turn dynamic sampling off")
        pad = self._tokenizer.pad_token_id
        device = rounds[0]["batch"]["completion_ids"].device
        batch = merge_rows([r["batch"] for r in rounds], [i.to(device) for i in rows],
                           {"prompt_ids": pad, "completion_ids": pad, "tool_mask": 1},
                           extra={_TOKEN_MASK: "right", TEACHER_IDS: "left",
                                  TEACHER_MASK: "left", HAS_TEACHER: "right"})
        return batch

    # ------------------------------------------------------------------ advantages

    def _finish_batch(self, batch: dict, rewards: torch.Tensor, correct: torch.Tensor,
                      mode: str, *, per_func: torch.Tensor, prompts: list) -> dict:
        """Replace TRL's [b] advantages with ``[b, T]`` ones computed on the global batch,
        and log the trained batch's metrics."""
        with self.step_clock.part("advantages"):
            adv = self._advantages(batch, rewards, correct, mode, per_func=per_func,
                                   prompts=prompts)
        if self.rollouts is not None:
            self.rollouts.on_advantages(self, batch=batch, ids=adv["ids"], mask=adv["mask"],
                                        rewards=adv["rewards"], correct=adv["correct"],
                                        advantages=adv["advantages"],
                                        loss_mask=adv["loss_mask"],
                                        scores=adv["scores"])
        return batch

    def _advantages(self, batch: dict, rewards: torch.Tensor, correct: torch.Tensor,
                    mode: str, *, per_func: torch.Tensor, prompts: list) -> dict:
        """:meth:`_finish_batch` up to the rollout recording: sets ``batch["advantages"]``
        and returns the global tensors the recorder reads."""
        ids = batch["completion_ids"]
        mask = batch.pop(_TOKEN_MASK)
        loss_mask = batch["completion_mask"]
        scores = {n.name: batch.pop(need_key(n.name)) for n in self._method.model_needs
                  if need_key(n.name) in batch}
        if "tool_mask" in batch:
            loss_mask = loss_mask * batch["tool_mask"]
        batch["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        T = ids.shape[1]
        if self.accelerator.num_processes > 1:
            pad = self._tokenizer.pad_token_id
            ids = self.accelerator.pad_across_processes(ids, dim=1, pad_index=pad)
            mask = self.accelerator.pad_across_processes(mask, dim=1, pad_index=0)
            ids, mask = self.accelerator.gather(ids), self.accelerator.gather(mask)
            scores = {name: self.accelerator.gather(
                self.accelerator.pad_across_processes(value, dim=1, pad_index=0))
                for name, value in scores.items()}
            rewards = self.accelerator.gather(rewards)
            per_func = self.accelerator.gather(per_func)
            correct = self.accelerator.gather(correct.to(torch.uint8)).bool()  # gloo: no bool
        G = self.num_generations if mode == "train" else self.num_generations_eval
        if rewards.numel() % G:
            raise ValueError(f"global batch of {rewards.numel()} responses is not a whole number "
                             f"of groups of num_generations={G}")
        group = torch.arange(rewards.numel(), device=rewards.device) // G
        # one computation for every command: correct, logprobs, KTAE's ignored ids; through
        # the public compute_advantages (ktae.compute_advantages), looked up at call time
        adv = estimator_credit(self._method, rewards=rewards, group=group, token_ids=ids,
                               mask=mask.bool(), correct=correct,
                               compute=estimators.compute_advantages, **scores)
        local = adv[self._local_slice(batch["completion_ids"].shape[0])][:, :T]
        batch["advantages"] = local.to(torch.float32) * loss_mask.to(torch.float32)
        lengths = mask.sum(dim=1)
        truncated = truncated_rows(ids, mask, self._stop_ids())
        for key, value in trained_batch_metrics(
                rewards=rewards, per_func=per_func, func_names=list(self.reward_func_names),
                lengths=lengths, truncated=truncated, correct=correct,
                num_generations=G).items():
            self._metrics[mode][key].append(value)
        self._log_trained_completions(batch, adv, mask, per_func, prompts)
        return {"ids": ids, "mask": mask, "rewards": rewards, "correct": correct,
                "advantages": adv, "loss_mask": loss_mask, "scores": scores}

    def _log_trained_completions(self, batch: dict, adv: torch.Tensor, mask: torch.Tensor,
                                 per_func: torch.Tensor, prompts: list) -> None:
        """TRL's completion table, rebuilt from the trained batch: ``advantage`` is each
        response's mean token advantage (its sequence advantage under ``credit=none``)."""
        if not self.log_completions:
            return
        from accelerate.utils import gather_object

        texts = self._tokenizer.batch_decode(batch["completion_ids"], skip_special_tokens=True)
        m = mask.to(adv.dtype)
        mean_adv = (adv * m).sum(dim=1) / m.sum(dim=1).clamp_min(1)
        logs = self._logs
        for key in ("prompt", "completion", "advantages"):
            logs[key].clear()
        logs["rewards"].clear()
        logs["extra"].clear()
        logs["prompt"].extend(gather_object(list(prompts)))
        logs["completion"].extend(gather_object(texts))
        for i, name in enumerate(self.reward_func_names):
            logs["rewards"][name].extend(per_func[:, i].tolist())
        logs["advantages"].extend(mean_adv.tolist())

    # ------------------------------------------------------------------ calibration

    def _compute_loss(self, model, inputs):
        # the policy pass inside TRL 1.15-1.16's _compute_loss is the update's, not a log-prob pass
        self._in_loss = True
        clip_range = self.epsilon_low, self.epsilon_high
        try:
            if self.credit.calibration is None:
                loss = super()._compute_loss(model, inputs)
            else:
                inputs = self._loss_inputs(inputs)
                self._pending_calibration = inputs
                try:
                    loss = super()._compute_loss(model, inputs)
                finally:
                    self._pending_calibration = None
            if self.credit.self_distill is not None:
                loss = loss + self._self_distill_term(model, inputs)
            return loss
        finally:
            self._in_loss = False
            self.epsilon_low, self.epsilon_high = clip_range  # _calibrate may widen them

    def _self_distill_term(self, model, inputs: dict) -> torch.Tensor:
        """The self-distillation term of this micro-batch
        (:func:`ktae.train.self_distill.distill_term`), scaled as TRL 1.16 scales its
        ``grpo`` loss for gradient accumulation; its metrics logged."""
        mode = "train" if self.model.training else "eval"
        teacher = None if self.ema_teacher is None else (
            lambda m: self.ema_teacher.applied(self.accelerator.unwrap_model(m)))
        term, metrics = distill_term(self.credit.self_distill, model, inputs,
                                     temperature=self.temperature, loss_type=self.loss_type,
                                     step=self.state.global_step,
                                     total_steps=int(self.state.max_steps or 0),
                                     teacher=teacher)
        for key, value in metrics.items():
            self._metrics[mode][f"ktae/{key}"].append(self._mean_across_processes(value))
        return term / (self.current_gradient_accumulation_steps if mode == "train" else 1.0)

    def _loss_inputs(self, inputs: dict) -> dict:
        """A copy of ``inputs`` whose advantages and loss mask the calibration may change.

        TRL 1.15-1.16's ``_compute_loss`` takes its loss mask, ``completion_mask`` (times
        ``tool_mask``), before the policy pass that yields the log-probs and entropies a
        calibration needs. Without ``tool_mask`` that mask is the ``completion_mask``
        tensor itself, so the calibration narrows a private clone of it in place and every
        aggregation, metric and the KL term see the surviving tokens (the attention mask,
        built earlier by concatenation, is unaffected). With ``tool_mask`` the product is
        stored as ``completion_mask`` and ``tool_mask`` dropped from the copy; the policy
        pass gets the true attention mask back (``_get_per_token_logps_and_entropies``).
        Copies: the buffered batch is reused when ``num_iterations > 1``.
        """
        inputs = dict(inputs)
        inputs["completion_mask"] = inputs["completion_mask"].clone()
        if "tool_mask" in inputs:
            inputs[_ATTENTION_COMPLETION_MASK] = inputs["completion_mask"]
            inputs["completion_mask"] = inputs["completion_mask"] * inputs.pop("tool_mask")
        return inputs

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, *args,
                                           **kwargs):
        # TRL 1.15-1.16's log-prob pass (same signature in both): the full head where it is
        # chosen (module docstring, 6), the calibration of the loss's policy pass (2), timed (5)
        pending = self._pending_calibration
        if pending is not None and _ATTENTION_COMPLETION_MASK in pending:
            attention_mask = torch.cat([pending["prompt_mask"],
                                        pending[_ATTENTION_COMPLETION_MASK]], dim=1)
        if self._in_loss:
            logps, entropies, aux = self._logps_and_entropies(
                model, input_ids, attention_mask, *args, **kwargs)
        else:  # TRL 1.15-1.16's old/reference passes (and the old-policy entropies pass)
            with self.step_clock.part("logprobs"):
                logps, entropies, aux = self._logps_and_entropies(
                    model, input_ids, attention_mask, *args, **kwargs)
        if pending is not None and entropies is not None:
            self._pending_calibration = None  # only the policy pass of this _compute_loss
            self._calibrate(pending, logps.detach(), entropies.detach())
        return logps, entropies, aux

    def _logps_and_entropies(self, model, input_ids, attention_mask, *args, **kwargs):
        """TRL's pass, or the same values from the ``full`` head where it is chosen
        (:mod:`ktae.train.logprob_head`): text-only inputs, no MoE auxiliary loss."""
        call = _TRL_LOGPS.bind(self, model, input_ids, attention_mask, *args, **kwargs)
        call.apply_defaults()
        a = call.arguments
        keep, rows = a["logits_to_keep"], input_ids.size(0)
        batch = a["batch_size"] or rows
        entropy_grad = torch.is_grad_enabled() and getattr(self, "_entropy_bonus_enabled", True)
        if (not self._full_head_fits or a["compute_aux_loss"]
                or any(a[k] is not None for k in _MULTIMODAL)
                or choose_head(self.logprob_head, input_ids.device, min(batch, rows), keep,
                               self.model.config.get_text_config().vocab_size,
                               grad=torch.is_grad_enabled(),
                               entropy_grad=entropy_grad and a["compute_entropy"],
                               trl_head=self._trl_head_runs) == "chunked"):
            if not self._trl_head_runs:  # vision inputs under TRL 1.15 without Triton
                raise RuntimeError(f"trl {TRL_VERSION}'s fused LM head computes log-probs "
                                   "with Triton on a CUDA or XPU device only: use trl 1.16.0")
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, *args, **kwargs)
        logps, entropies = [], []
        for start in range(0, rows, batch):
            rows_ = slice(start, start + batch)
            with self.accelerator.autocast():
                lp, ent = full_logps(model, input_ids[rows_], attention_mask[rows_], keep,
                                     self.temperature, compute_entropy=a["compute_entropy"],
                                     entropy_grad=entropy_grad)
            logps.append(lp)
            entropies.append(ent)
        return (torch.cat(logps), torch.cat(entropies) if a["compute_entropy"] else None, None)

    def _calibrate(self, inputs: dict, logps: torch.Tensor, entropies: torch.Tensor) -> None:
        adv = inputs["advantages"]
        mask = inputs["completion_mask"].clone()
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        if adv.dim() == 1:
            adv = adv[:, None] * mask.to(adv.dtype)
        # TRL 1.15-1.16 skip the old-policy pass when the batch is on-policy (num_iterations = 1,
        # generation aligned with optimizer steps) and then uses the current log-probs,
        # detached, as the old ones: the same holds for adv-reweight's rollout probability.
        old = inputs.get("old_per_token_logps")
        old = logps if old is None else old.detach()
        g = torch.Generator(device="cpu").manual_seed(derived_seed(
            self.credit.seed, self.state.global_step, -1, self.accelerator.process_index))
        result = calibration.calibrate_advantages(self.credit.calibration, adv.detach(),
                                                  logprobs=logps, entropies=entropies,
                                                  mask=mask.bool(), old_logprobs=old, generator=g,
                                                  **self.credit.calibration_options)
        inputs["advantages"] = result.advantages.detach().to(adv.dtype)
        self._narrow_loss_mask(inputs, mask.bool(), result.loss_mask)
        if not result.ppo_clip:  # TRL 1.15-1.16's _compute_loss reads them after this pass
            self.epsilon_low = self.epsilon_high = math.inf
        if self.rollouts is not None:
            self.rollouts.on_calibration(self, inputs=inputs, logprobs=logps,
                                         entropies=entropies, result=result)
        mode = "train" if self.model.training else "eval"
        # flag_rate (logged as flagged_token_rate; left out where it is 1 by construction,
        # adv-reweight, whose mean_weight is logged), loss_token_fraction, the rule's own
        for key, value in logged_metrics(self.credit.calibration, result).items():
            key = "flagged_token_rate" if key == "flag_rate" else key
            self._metrics[mode][f"ktae/{key}"].append(self._mean_across_processes(value))

    def _narrow_loss_mask(self, inputs: dict, mask: torch.Tensor, loss_mask: torch.Tensor):
        """Make ``loss_mask`` TRL's loss mask (see :meth:`_loss_inputs`), in place.

        TRL's ``dapo`` loss (and ``cispo``/``vespo``) divides by ``num_items_in_batch``,
        the generation batch's token count gathered at generation time; it is scaled by
        the surviving share of this micro-batch over all processes, which makes it the
        surviving-token count when a generation batch is one micro-batch per process
        (``ktae train``'s layout) and an estimate of it otherwise.
        """
        completion_mask = inputs["completion_mask"]
        completion_mask.mul_(loss_mask.to(completion_mask.dtype))
        if "num_items_in_batch" in inputs:
            counts = torch.stack([loss_mask.sum(), mask.sum()]).float()
            if self.accelerator.num_processes > 1:
                counts = self.accelerator.gather(counts).view(-1, 2).sum(dim=0)
            share = counts[0] / counts[1].clamp(min=1)
            inputs["num_items_in_batch"] = inputs["num_items_in_batch"] * share.to(
                inputs["num_items_in_batch"].device)

    # ------------------------------------------------------------------ helpers

    def _mean_across_processes(self, value: float) -> float:
        if self.accelerator.num_processes == 1:
            return float(value)
        t = torch.tensor([float(value)], device=self.accelerator.device)
        return self.accelerator.gather(t).mean().item()

    def _any_across_processes(self, flag: bool) -> bool:
        if self.accelerator.num_processes == 1:
            return bool(flag)
        t = torch.tensor([1.0 if flag else 0.0], device=self.accelerator.device)
        return bool(self.accelerator.gather(t).max().item() > 0)

    # ------------------------------------------------------------------ resume

    def _get_train_sampler(self, dataset=None):
        """TRL 1.15-1.16's sampler (same arguments) with an order fixed per epoch (module
        docstring, 4)."""
        sampler = super()._get_train_sampler(dataset)
        if type(sampler) is not RepeatSampler:
            raise RuntimeError(f"ktae expects TRL 1.15-1.16's RepeatSampler, got {type(sampler)}")
        self._epoch_sampler = EpochRepeatSampler(
            data_source=sampler.data_source, mini_repeat_count=sampler.mini_repeat_count,
            batch_size=sampler.batch_size, repeat_count=sampler.repeat_count,
            shuffle=sampler.shuffle, seed=sampler.seed)
        return self._epoch_sampler

    def _run_epoch(self, *args, epoch: int, **kwargs):
        # transformers 5.24 calls set_epoch through accelerate's loader wrappers, which do
        # not reach the sampler of a multi-process loader that skips a resumed epoch's
        # first batches: the epoch is set here, before any wrapper iterates
        if getattr(self, "_epoch_sampler", None) is not None:
            self._epoch_sampler.set_epoch(epoch)
        return super()._run_epoch(*args, epoch=epoch, **kwargs)

    # ------------------------------------------------------------------ saving

    def create_model_card(self, *args, **kwargs):
        """No TRL auto-generated card (TRL 1.15-1.16's public ``create_model_card``, called
        on save): ``ktae train`` writes its own (``README.md``)."""
        return None

    def _save_checkpoint(self, model, trial):
        folder = os.path.join(self._get_output_dir(trial=trial),
                              f"checkpoint-{self.state.global_step}")
        # transformers 5.24's _save_checkpoint rotates with rotate_checkpoints before our
        # marker exists, deleting any checkpoint-* directory: ours rotates after it
        keep, self.args.save_total_limit = self.args.save_total_limit, None
        try:
            if self.args.should_save:
                claim_checkpoint(folder)
            try:
                super()._save_checkpoint(model, trial)
            finally:
                self.args.save_total_limit = keep
            if self.args.should_save:
                if self.generation_defaults is not None:
                    save_generation_defaults(folder, **self.generation_defaults)
                if self.ema_teacher is not None:
                    self.ema_teacher.save(folder)
                follow_umask(folder)
                mark_checkpoint_complete(folder, self.state.global_step)
                rotate_checkpoints(self._get_output_dir(trial=trial), keep)
        except Exception as err:
            if is_disk_full(err):
                raise DiskFullError(
                    errno.ENOSPC, f"no space left on the device while writing {folder}; it is "
                    "incomplete and will be ignored, earlier complete checkpoints are intact: "
                    "free some space and run again with --resume") from err
            raise
