"""Trainer callbacks of ``ktae train``: metrics.jsonl lines, held-out eval, the no-signal
warning, progress bar."""

from __future__ import annotations

import sys

import torch
from transformers import TrainerCallback

from ktae.rewards.ends import DEFAULT_CUT_OFF
from ktae.rewards.registry import DEFAULT_REWARD
from ktae.runs.rundir import RunDir
from ktae.train.evaluation import greedy_accuracy
from ktae.train.lora_forward import lora_for_sampling
from ktae.train.no_signal import find_no_signal, warn_no_signal
from ktae.train.step_timing import describe_step


class MetricsCallback(TrainerCallback):
    """Writes one ``metrics.jsonl`` line per logged training step (main process only)."""

    def __init__(self, rundir: RunDir):
        self.rundir = rundir
        self.last: dict = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return
        self.last = self.rundir.metrics_record(state.global_step, logs)
        self.rundir.append(self.rundir.metrics_path, self.last)


class EvalCallback(TrainerCallback):
    """Greedy held-out evaluation every ``every`` steps (0 = never during training), or at
    exactly ``steps`` when given."""

    def __init__(self, rundir: RunDir, rows: list[dict], *, every: int, max_new_tokens: int,
                 tokenizer, reward: str = DEFAULT_REWARD, autocast: torch.dtype | None = None,
                 cut_off: str = DEFAULT_CUT_OFF, steps: list[int] | None = None):
        self.rundir, self.rows, self.every = rundir, rows, every
        self.steps = set(steps or ())
        """Evaluate at exactly these steps (empty: every ``every`` steps, and before and
        after training: :meth:`due`)."""
        self.max_new_tokens, self.tokenizer, self.reward = max_new_tokens, tokenizer, reward
        self.cut_off = cut_off
        """How a held-out response cut at the budget is scored (:mod:`ktae.rewards.ends`)."""
        self.autocast = autocast
        """The dtype the products run in (``--bf16``: bfloat16, as in training, before
        the trainer wraps the model's forward too); None: the weights' own."""
        self.last: dict = {}

    def evaluate(self, model, step: int) -> dict:
        device = next(model.parameters()).device.type
        # a LoRA model's adapters as in the trainer's sampling (merged in float32)
        with torch.autocast(device, dtype=self.autocast, enabled=self.autocast is not None), \
                lora_for_sampling(model):
            accuracy = greedy_accuracy(model, self.tokenizer, self.rows,
                                       max_new_tokens=self.max_new_tokens, reward=self.reward,
                                       cut_off=self.cut_off)
        report = {"step": int(step), **accuracy}
        self.rundir.append(self.rundir.eval_path, report)
        self.last = report
        return report

    def evaluates_before_training(self) -> bool:
        """Whether the run evaluates the untrained model (step 0)."""
        return not self.steps or 0 in self.steps

    def due(self, step: int, max_steps: int) -> bool:
        """Whether the run evaluates at ``step`` (0: before training; ``max_steps``: after)."""
        if self.steps:
            return step in self.steps
        return step in (0, max_steps) or bool(self.every and step % self.every == 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.is_world_process_zero and state.global_step < state.max_steps \
                and self.due(state.global_step, state.max_steps):
            self.evaluate(model, state.global_step)


class NoSignalCallback(TrainerCallback):
    """Warns once when the run learns nothing (:func:`ktae.train.no_signal.find_no_signal`
    over the metrics.jsonl records, earlier segments of a resumed run included)."""

    def __init__(self, metrics: MetricsCallback, *, steps: int, max_new_tokens: int,
                 reward: str | None):
        self.metrics, self.steps = metrics, steps
        self.options = {"max_new_tokens": max_new_tokens, "reward": reward}
        self.records: list[dict] = []
        self.warned = False

    def _find(self):
        return find_no_signal(self.records, steps=self.steps, **self.options)

    def on_train_begin(self, args, state, control, **kwargs):
        self.records = [r for r in RunDir.read_jsonl(self.metrics.rundir.metrics_path)
                        if r["step"] <= state.global_step]
        self.warned = self._find() is not None  # a resumed run that already warned

    def on_log(self, args, state, control, logs=None, **kwargs):
        last = self.metrics.last
        if not state.is_world_process_zero or not last or \
                (self.records and self.records[-1]["step"] >= last["step"]):
            return
        self.records.append(last)
        if not self.warned:
            finding = self._find()
            if finding is not None:
                self.warned = True
                warn_no_signal(finding)


class ProgressCallback(TrainerCallback):
    """A tqdm bar with live reward / accuracy / length / held-out accuracy and the last
    step's time by part (:func:`ktae.train.step_timing.describe_step`)."""

    def __init__(self, metrics: MetricsCallback, evals: EvalCallback):
        self.metrics, self.evals, self.bar = metrics, evals, None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="ktae train",
                            file=sys.stderr, dynamic_ncols=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is None:
            return
        m, post = self.metrics.last, {}
        for key, short in (("round1_accuracy", "acc"), ("reward", "reward"),
                           ("response_length", "len"),
                           ("generation_rounds", "rounds")):
            if key in m:
                post[short] = f"{m[key]:.2f}" if key != "response_length" else f"{m[key]:.1f}"
        if self.evals.last:
            post["heldout"] = f"{self.evals.last['accuracy']:.3f}"
        timing = describe_step(m)
        if timing is not None:
            post["step"] = timing
        self.bar.set_postfix(post, refresh=False)  # MetricsCallback ran first: this step
        self.bar.update(state.global_step - self.bar.n)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
