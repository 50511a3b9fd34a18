"""``KTAEGRPOTrainer``: TRL's ``GRPOTrainer`` with our advantages, dynamic sampling and TACO.

Three small overrides, each next to the TRL method it changes (TRL 1.16):

1. ``_generate_and_score_completions``: after TRL generates and scores a batch, the
   gathered rewards (kept by the ``_calculate_rewards`` override) and the gathered
   completion ids/mask go through :func:`ktae.compute_advantages` over the *whole*
   global batch, groups = contiguous blocks of ``num_generations`` rows (TRL's layout);
   the ``[B, T]`` token-level result replaces TRL's ``[B]`` advantages. Gathering the
   token ids makes the estimate correct however the global batch is split across
   processes. With dynamic sampling (SPEC 4) extra rounds are generated first and only
   informative groups are kept (:mod:`ktae.train.dynamic_sampling`); this needs every
   group on one process, and other layouts are refused at construction.
2. ``_compute_loss`` / ``_get_per_token_logps_and_entropies``: when a calibration (TACO,
   SPEC 5) is configured, the current policy's per-token log-probs and entropies computed
   inside ``_compute_loss`` (``compute_entropy=True``) calibrate a copy of the advantages,
   detached, before TRL's loss reads them. The old/ref log-prob passes (no entropy, outside
   ``_compute_loss``) are untouched.
3. ``_save_checkpoint``: writes a completion marker last, so a checkpoint half-written by
   a kill is never resumed from (:mod:`ktae.train.rundir`).

Metrics (``ktae/*`` keys) go through TRL's ``_metrics`` so they reach every logger.
"""

from __future__ import annotations

import hashlib
import os
import time

import torch
from trl import GRPOTrainer

import ktae
from ktae.train.credit import CreditSettings
from ktae.train.dynamic_sampling import (
    MERGEABLE_KEYS,
    informative_groups,
    merge_rows,
    select_groups,
)
from ktae.train.rundir import mark_checkpoint_complete


def derived_seed(*parts: int) -> int:
    """A stable 63-bit seed from integers (same on every run and process, unlike ``hash``)."""
    digest = hashlib.sha256(",".join(str(int(p)) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class KTAEGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose advantages come from :func:`ktae.compute_advantages`.

    Args:
        credit: a :class:`CreditSettings`.
        *args, **kwargs: as for ``trl.GRPOTrainer``.
    """

    rollouts = None
    """A :class:`ktae.train.rollouts.RolloutRecorder` that keeps sampled rollouts, or None."""

    def __init__(self, *args, credit: CreditSettings, **kwargs):
        if not isinstance(credit, CreditSettings):
            raise ValueError(f"credit: expected CreditSettings, got {type(credit).__name__}")
        self.credit = credit
        self._last_rewards_per_func: torch.Tensor | None = None
        self._pending_calibration: dict | None = None
        super().__init__(*args, **kwargs)
        if credit.correct_reward_index >= len(self.reward_funcs):
            raise ValueError(f"credit.correct_reward_index: expected < {len(self.reward_funcs)} "
                             f"(number of reward functions), got {credit.correct_reward_index}")
        self._check_group_layout()
        tok = self._tokenizer
        ignore = {int(i) for i in getattr(self, "eos_token_ids", None) or ()}
        for i in (tok.pad_token_id, tok.eos_token_id):
            if i is not None:
                ignore.add(int(i))
        self.ignore_token_ids = sorted(ignore)

    # ------------------------------------------------------------------ layout checks

    @property
    def local_generation_rows(self) -> int:
        """Rows generated per process per generation (TRL's local generation batch)."""
        return self.args.per_device_train_batch_size * self.args.steps_per_generation

    def _check_group_layout(self) -> None:
        G, n = self.num_generations, self.accelerator.num_processes
        rows = self.local_generation_rows
        if self.credit.dynamic_sampling and rows % G:
            raise ValueError(
                f"dynamic sampling keeps or drops whole groups on each process, so each process's "
                f"generation batch (per_device_train_batch_size * steps_per_generation = {rows}) "
                f"must be a multiple of num_generations={G} (with {n} process(es)); adjust the "
                "batch size or the number of prompts, or turn dynamic sampling off")

    # ------------------------------------------------------------------ rewards

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions,
                                                      completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # [B_global, n_funcs], gathered
        return rewards_per_func

    def _local_slice(self, rows: int) -> slice:
        i = self.accelerator.process_index
        return slice(i * rows, (i + 1) * rows)

    def _one_round(self, inputs: list[dict]) -> dict:
        """One TRL generation+scoring pass; adds local ``rewards`` and ``correct`` [b]."""
        out = super()._generate_and_score_completions(inputs)
        per_func = self._last_rewards_per_func[self._local_slice(len(inputs))]
        weights = self.reward_weights.to(per_func.device)
        rewards = torch.nan_to_num(per_func * weights[None, :], nan=0.0).sum(dim=1)
        idx = self.credit.correct_reward_index
        correct = per_func[:, idx] > 0.5
        global_correct = self._last_rewards_per_func[:, idx] > 0.5
        return {"batch": out, "rewards": rewards, "correct": correct,
                "global_correct": global_correct}

    # ------------------------------------------------------------------ generation

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        if mode != "train":
            out = self._one_round(inputs)
            return self._finish_batch(out["batch"], out["rewards"], out["correct"], mode)
        rounds = [self._one_round(inputs)]
        G = self.num_generations
        first_informative = informative_groups(rounds[0]["global_correct"], G)
        if self.credit.dynamic_sampling:
            rounds = self._dynamic_sampling(inputs, rounds)
            need = len(inputs) // G
            info = [informative_groups(r["correct"], G) for r in rounds]
            picks = select_groups(info, need)
            rows = [[] for _ in rounds]
            for r, g in picks:
                rows[r].extend(range(g * G, (g + 1) * G))
            rows = [torch.tensor(x, dtype=torch.long) for x in rows]
            batch = self._merge(rounds, rows)
            rewards = torch.cat([r["rewards"][i] for r, i in zip(rounds, rows, strict=True)])
            correct = torch.cat([r["correct"][i] for r, i in zip(rounds, rows, strict=True)])
            kept = sum(bool(info[r][g]) for r, g in picks) / need
            self._metrics[mode]["ktae/informative_group_fraction"].append(
                self._mean_across_processes(kept))
        else:
            batch, rewards, correct = rounds[0]["batch"], rounds[0]["rewards"], rounds[0]["correct"]
        self._metrics[mode]["ktae/generation_rounds"].append(float(len(rounds)))
        first = rounds[0]
        self._metrics[mode]["ktae/accuracy"].append(first["global_correct"].float().mean().item())
        lengths = first["batch"]["completion_mask"].sum(dim=1).float().mean().item()
        self._metrics[mode]["ktae/response_length"].append(self._mean_across_processes(lengths))
        self._metrics[mode]["ktae/zero_variance_group_fraction"].append(
            1.0 - first_informative.float().mean().item())
        return self._finish_batch(batch, rewards, correct, mode)

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
                         if k not in MERGEABLE_KEYS and k not in recomputed)
        if unknown:
            raise ValueError(f"dynamic sampling: cannot merge generation batches holding {unknown} "
                             "(multimodal inputs); turn dynamic sampling off")
        pad = self._tokenizer.pad_token_id
        device = rounds[0]["batch"]["completion_ids"].device
        batch = merge_rows([r["batch"] for r in rounds], [i.to(device) for i in rows],
                           {"prompt_ids": pad, "completion_ids": pad, "tool_mask": 1})
        loss_mask = batch["completion_mask"] * batch.get("tool_mask", 1)
        batch["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        return batch

    # ------------------------------------------------------------------ advantages

    def _finish_batch(self, batch: dict, rewards: torch.Tensor, correct: torch.Tensor,
                      mode: str) -> dict:
        """Replace TRL's [b] advantages with ``[b, T]`` ones computed on the global batch."""
        start = time.perf_counter()
        ids, mask = batch["completion_ids"], batch["completion_mask"]
        if "tool_mask" in batch:
            mask = mask * batch["tool_mask"]
        T = ids.shape[1]
        if self.accelerator.num_processes > 1:
            pad = self._tokenizer.pad_token_id
            ids = self.accelerator.pad_across_processes(ids, dim=1, pad_index=pad)
            mask = self.accelerator.pad_across_processes(mask, dim=1, pad_index=0)
            ids, mask = self.accelerator.gather(ids), self.accelerator.gather(mask)
            rewards = self.accelerator.gather(rewards)
            correct = self.accelerator.gather(correct.to(torch.uint8)).bool()  # gloo: no bool
        G = self.num_generations if mode == "train" else self.num_generations_eval
        if rewards.numel() % G:
            raise ValueError(f"global batch of {rewards.numel()} responses is not a whole number "
                             f"of groups of num_generations={G}")
        group = torch.arange(rewards.numel(), device=rewards.device) // G
        options = dict(self.credit.estimator_options)
        if self.credit.estimator == "ktae":
            options.setdefault("correct", correct)
            options.setdefault("ignore_token_ids", self.ignore_token_ids)
        adv = ktae.compute_advantages(self.credit.estimator, rewards=rewards, group=group,
                                      token_ids=ids, mask=mask.bool(), **options)
        local = adv[self._local_slice(batch["completion_ids"].shape[0])][:, :T]
        batch["advantages"] = local.to(torch.float32)
        seconds = time.perf_counter() - start
        self._metrics[mode]["ktae/advantage_seconds"].append(seconds)
        if self.rollouts is not None:
            self.rollouts.on_advantages(self, batch=batch, ids=ids, mask=mask, rewards=rewards,
                                        correct=correct, advantages=adv)
        return batch

    # ------------------------------------------------------------------ calibration

    def _compute_loss(self, model, inputs):
        if self.credit.calibration is None:
            return super()._compute_loss(model, inputs)
        inputs = dict(inputs)  # the calibrated advantages must not leak into buffered batches
        self._pending_calibration = inputs
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._pending_calibration = None

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        pending = self._pending_calibration
        if pending is not None and entropies is not None:
            self._pending_calibration = None  # only the policy pass of this _compute_loss
            self._calibrate(pending, logps.detach(), entropies.detach())
        return logps, entropies, aux

    def _calibrate(self, inputs: dict, logps: torch.Tensor, entropies: torch.Tensor) -> None:
        adv = inputs["advantages"]
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        if adv.dim() == 1:
            adv = adv[:, None] * mask.to(adv.dtype)
        g = torch.Generator(device="cpu").manual_seed(derived_seed(
            self.credit.seed, self.state.global_step, -1, self.accelerator.process_index))
        result = ktae.calibrate_advantages(self.credit.calibration, adv.detach(), logprobs=logps,
                                           entropies=entropies, mask=mask.bool(), generator=g,
                                           **self.credit.calibration_options)
        inputs["advantages"] = result.advantages.detach().to(adv.dtype)
        if self.rollouts is not None:
            self.rollouts.on_calibration(self, inputs=inputs, logprobs=logps,
                                         entropies=entropies, result=result)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["ktae/flagged_token_rate"].append(
            self._mean_across_processes(float(result.flag_rate)))

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

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial),
                                  f"checkpoint-{self.state.global_step}")
            mark_checkpoint_complete(folder, self.state.global_step)
