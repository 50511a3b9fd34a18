"""The simulation loop: blocks of runs advancing together, one update per step.

A run is one (method, setting, seed). Runs are packed into blocks (all seeds of a
(method, setting) always together; as many (method, setting) pairs as
``block_elements`` allows); a block's policies are one ``[rows, |A|]`` tensor, and each
update of the block is a fixed number of tensor operations whatever the number of runs,
trajectories or steps, plus one library call per method (and per run for batch-level
calibrations, see :mod:`ktae.sim.credit`).

Per update of each run: sample G trajectories from the current policy, compute the
method's token advantages ``A[i,t]`` and loss mask, and take one SGD step on the
policy-gradient loss

    L = -(H / N) sum_{(i,t) in loss mask} A[i,t] log pi_t(a[i,t])

with ``N`` the number of tokens in the run's loss mask (G*H unless a calibration removes
tokens). That is ``ktae.policy_loss``'s ``token-mean`` (at ratio 1, where clipping is
inactive) times H: each step has its own logits, so the factor H makes each step's
update the mean over the group of that step's terms, ``-(1/G) sum_i A[i,t] log pi_t``,
and the step size does not shrink as H grows. The evaluation is exact: the expected
normalised return of the current policy, ``(1/H) sum_t pi_t(optimal actions)``.

At the audited updates (``SimConfig.audited_updates``), extra probe groups are drawn
from each run's current policy with their own random stream and every method's credit
on them is scored against the MDP's exact labels (:mod:`ktae.sim.blame`); training
never sees them.

Randomness is per (seed, setting): the initial logits depend on (seed, H, n_opt, |A|),
the sampling uniforms on (seed, setting, |A|). Methods of one seed and setting thus see
the same start and the same uniforms (common random numbers), and a run's result does
not depend on which other runs share its block.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ktae.sim import blame, mdp
from ktae.sim.config import Setting, SimConfig
from ktae.sim.credit import Credit, CreditBatch, Method, method_advantages, parse_methods

#: Uniforms are drawn for this many updates at a time (fixed: it is part of the stream).
UNIFORM_CHUNK = 50

#: The group size the sampler's action blocks are sized for (see mdp.block_width).
SAMPLING_GROUP_HINT = 16


def stream_seed(*parts) -> int:
    """A 63-bit seed from any labels (stable across processes and platforms)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _generator(*parts) -> torch.Generator:
    return torch.Generator().manual_seed(stream_seed(*parts))


@dataclass(frozen=True)
class Run:
    """One training run: a method on a setting, from one seed."""

    method: Method
    setting: Setting
    seed: int


@dataclass
class SimResult:
    """Curves of every (method, setting): ``curves[(method, setting)]`` is
    ``[seeds, len(eval_steps)]`` float64, the expected normalised return of each seed's
    policy at each evaluation step. ``flag_rates[(method, setting)]`` (methods with a
    calibration) is ``[seeds]``: the share of all sampled tokens of the run that the
    calibration flagged, over the whole training."""

    config: SimConfig
    eval_steps: list[int]
    curves: dict[tuple[str, Setting], torch.Tensor]
    seconds: float
    flag_rates: dict[tuple[str, Setting], torch.Tensor] = dataclasses.field(default_factory=dict)
    audit: dict[tuple[str, Setting, int], dict[str, np.ndarray]] = dataclasses.field(
        default_factory=dict)
    """``audit[(method, setting, update)]``: per probe trajectory, the figures of
    :func:`ktae.sim.blame.score` and its ``group`` (``seed * audit_groups + k``)."""


class _MethodBatch:
    """Index maps between a block's ``[rows, G_max]`` samples and one method's
    ``[B, T]`` trajectories (B = sum of its runs' G, T = their max H)."""

    def __init__(self, run_ids: list[int], H: torch.Tensor, G: torch.Tensor,
                 row_offset: torch.Tensor, device) -> None:
        ids = torch.tensor(run_ids, dtype=torch.long, device=device)
        Gm = G[ids]
        self.traj_run = torch.repeat_interleave(ids, Gm)
        starts = torch.cumsum(Gm, 0) - Gm
        self.traj_col = (torch.arange(self.traj_run.numel(), device=device)
                         - torch.repeat_interleave(starts, Gm))
        T = int(H[ids].max())
        t = torch.arange(T, device=device)
        self.horizon = H[self.traj_run]
        self.mask = t[None, :] < self.horizon[:, None]
        self.rows = torch.where(self.mask, row_offset[self.traj_run][:, None] + t, 0)
        self.cols = self.traj_col[:, None].expand_as(self.rows)
        self.step = t.expand_as(self.rows)
        self.real_rows, self.real_cols = self.rows[self.mask], self.cols[self.mask]
        ends = torch.cumsum(Gm, 0).tolist()
        self.run_slices = tuple(zip([0, *ends[:-1]], ends, strict=True))

    def split_groups(self, G: torch.Tensor, K: int) -> None:
        """For probe batches built with ``K * G`` trajectories per run: make each run's
        ``K`` consecutive sets of ``G`` trajectories groups (and batches) of their own;
        ``traj_run`` then holds ``run * K + k``."""
        size = G[self.traj_run]
        self.traj_run = self.traj_run * K + self.traj_col // size
        ends = torch.cumsum(torch.bincount(self.traj_run), 0)
        ends = ends[ends > 0].unique().tolist()
        self.run_slices = tuple(zip([0, *ends[:-1]], ends, strict=True))

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[rows, G_max] -> [B, T]`` (padding holds row 0's value; mask it)."""
        return x[self.rows, self.cols]


class Block:
    """Runs simulated together: their policies, RNG streams and index maps."""

    def __init__(self, runs: list[Run], config: SimConfig) -> None:
        # Runs whose method reads entropies last, so that their rows are one slice.
        runs = sorted(runs, key=lambda r: r.method.calibration is not None)
        self.runs, self.config = runs, config
        device = torch.device(config.device)
        self.device = device
        A = config.actions
        H = torch.tensor([r.setting.horizon for r in runs], device=device)
        G = torch.tensor([r.setting.group_size for r in runs], device=device)
        n_opt = torch.tensor([r.setting.n_opt for r in runs], device=device)
        self.H, self.G = H, G
        self.row_offset = torch.cumsum(H, 0) - H
        self.row_run = torch.repeat_interleave(torch.arange(len(runs), device=device), H)
        self.n_opt_row = n_opt[self.row_run]
        self.G_max = int(G.max())
        # A function of |A| alone: the block sums' rounding, hence the sampled actions,
        # must not depend on which group sizes share the block.
        self.action_block = mdp.block_width(A, SAMPLING_GROUP_HINT)
        self.theta = torch.cat([
            mdp.initial_logits(r.setting.horizon, A, r.setting.n_opt,
                               _generator("init", r.seed, r.setting.horizon, r.setting.n_opt, A))
            for r in runs]).to(device)
        self._weights = torch.empty_like(self.theta)
        self.drift = self.theta.amax(1).abs()
        self.flagged = torch.zeros(len(runs), dtype=torch.long, device=device)
        calibrated = [i for i, r in enumerate(runs) if r.method.calibration is not None]
        self.entropy_from = int(self.row_offset[calibrated[0]]) if calibrated else self.rows
        self.methods: dict[Method, _MethodBatch] = {}
        self.generators: dict[Method, list[torch.Generator]] = {}
        for method in dict.fromkeys(r.method for r in runs):
            ids = [i for i, r in enumerate(runs) if r.method == method]
            self.methods[method] = _MethodBatch(ids, H, G, self.row_offset, device)
            if method.needs_generator:
                self.generators[method] = [
                    _generator("calibration", runs[i].seed, runs[i].setting, method.name, A)
                    for i in ids]
        self._streams = {key: _generator("sample", *key) for key in
                         dict.fromkeys((r.seed, r.setting, A) for r in runs)}
        self._uniforms: torch.Tensor | None = None

    @property
    def elements(self) -> int:
        return self.theta.numel()

    @property
    def rows(self) -> int:
        return int(self.row_run.numel())

    def policy_stats(self) -> mdp.PolicyStats:
        return mdp.policy_stats(self.theta, self.action_block, self.entropy_from,
                                out=self._weights)

    def _uniform_chunk(self) -> torch.Tensor:
        """``[UNIFORM_CHUNK, rows, G_max]`` float64 uniforms for the next updates."""
        drawn = {key: torch.rand(UNIFORM_CHUNK, key[1].horizon, key[1].group_size,
                                 generator=gen, dtype=torch.float64)
                 for key, gen in self._streams.items()}
        out = torch.zeros(UNIFORM_CHUNK, self.rows, self.G_max,
                          dtype=torch.float64)
        for r, run in enumerate(self.runs):
            s, h, g = int(self.row_offset[r]), run.setting.horizon, run.setting.group_size
            out[:, s:s + h, :g] = drawn[(run.seed, run.setting, self.config.actions)]
        return out.to(self.device)

    def uniforms(self, step: int) -> torch.Tensor:
        """``[rows, G_max]`` the sampling uniforms of an update (call in step order)."""
        k = step % UNIFORM_CHUNK
        if k == 0 or self._uniforms is None:
            self._uniforms = self._uniform_chunk()
        return self._uniforms[k]

    def expected_returns(self, stats: mdp.PolicyStats) -> torch.Tensor:
        """``[runs]`` expected normalised return of each run's current policy."""
        per_row = mdp.expected_step_reward(stats, self.n_opt_row)
        total = torch.zeros(len(self.runs), dtype=per_row.dtype, device=self.device)
        return total.index_add_(0, self.row_run, per_row) / self.H

    def credit_batch(self, mb: _MethodBatch, actions: torch.Tensor, logp: torch.Tensor,
                     stats: mdp.PolicyStats) -> CreditBatch:
        """One method's sampled trajectories as a ``[B, T]`` :class:`CreditBatch`."""
        a = mb.gather(actions)
        return CreditBatch(
            step_rewards=((a < self.n_opt_row[mb.rows]) & mb.mask).to(torch.float32),
            mask=mb.mask, group=mb.traj_run, horizon=mb.horizon,
            token_ids=torch.where(mb.mask, mb.step * self.config.actions + a, 0),
            logprobs=torch.where(mb.mask, mb.gather(logp), 0.0),
            entropies=torch.where(mb.mask, stats.entropy[mb.rows], 0.0),
            run_slices=mb.run_slices)

    def loss_weights(self, mb: _MethodBatch, credit: Credit) -> torch.Tensor:
        """``[B, T]`` the weight of each token's ``-log pi`` in the loss:
        ``A * H / N`` on the run's loss mask (``N`` its size), 0 elsewhere."""
        loss_mask = credit.loss_mask & mb.mask
        n_tokens = torch.zeros(len(self.runs), device=self.device).index_add_(
            0, mb.traj_run, loss_mask.sum(1, dtype=torch.float32))
        scale = self.H[mb.traj_run] / n_tokens.clamp_min(1)[mb.traj_run]
        return torch.where(loss_mask, credit.advantages.to(torch.float32) * scale[:, None], 0.0)

    def audit(self, step: int, stats: mdp.PolicyStats) -> dict:
        """Score every method's credit on ``audit_groups`` probe groups per run, drawn
        from the current policy (:mod:`ktae.sim.blame`): ``{(method, setting): values}``.
        Touches neither the policies nor the training streams."""
        K, A = self.config.audit_groups, self.config.actions
        uniforms = torch.zeros(self.rows, K * self.G_max, dtype=torch.float64)
        for r, run in enumerate(self.runs):
            s, h, g = int(self.row_offset[r]), run.setting.horizon, run.setting.group_size
            gen = _generator("audit", run.seed, run.setting, A, step)
            uniforms[s:s + h, :K * g] = torch.rand(h, K * g, generator=gen, dtype=torch.float64)
        actions = mdp.sample_actions(stats, uniforms.to(self.device))
        logp = mdp.sampled_logprobs(self.theta, stats.log_norm, actions)
        out = {}
        for method, mb in self.methods.items():
            ids = sorted(set(mb.traj_run.tolist()))
            probe = _MethodBatch(ids, self.H, self.G * K, self.row_offset, self.device)
            probe.split_groups(self.G, K)
            batch = self.credit_batch(probe, actions, logp, stats)
            generators = None
            if method.needs_generator:  # their own streams: training's stay untouched
                generators = [_generator("audit-calibration", k, method.name, A, step)
                              for k in range(len(probe.run_slices))]
            credit = method_advantages(method, batch, ktae_threshold=self.config.ktae_threshold,
                                       ktae_ngram=self.config.ktae_ngram, generators=generators)
            values = blame.score(credit, batch)
            group = probe.traj_run.cpu()
            run_of = (group // K).numpy()
            values["group"] = (torch.tensor([self.runs[i].seed for i in run_of.tolist()])
                               * K + group % K).numpy()
            for key in dict.fromkeys((method.name, self.runs[i].setting) for i in ids):
                rows = np.array([(method.name, self.runs[i].setting) == key for i in run_of])
                out[key] = {k: v[rows] for k, v in values.items()}
        return out

    def update(self, step: int, stats: mdp.PolicyStats) -> None:
        """Sample G trajectories per run and take one SGD step on every run."""
        actions = mdp.sample_actions(stats, self.uniforms(step))
        logp = mdp.sampled_logprobs(self.theta, stats.log_norm, actions)
        coef = torch.zeros_like(logp)
        for method, mb in self.methods.items():
            credit = method_advantages(method, self.credit_batch(mb, actions, logp, stats),
                                       ktae_threshold=self.config.ktae_threshold,
                                       ktae_ngram=self.config.ktae_ngram,
                                       generators=self.generators.get(method))
            coef[mb.real_rows, mb.real_cols] = self.loss_weights(mb, credit)[mb.mask]
            self.flagged.index_add_(0, mb.traj_run, (credit.flagged & mb.mask).sum(1))
        self.drift += mdp.sgd_step(self.theta, stats, actions, coef, self.config.lr)
        mdp.recentre(self.theta, self.drift)


def plan_blocks(config: SimConfig) -> list[list[Run]]:
    """Runs grouped into blocks of at most ``block_elements`` logits (greedy, in order
    of setting then method); all seeds of a (method, setting) share a block."""
    blocks: list[list[Run]] = []
    current: list[Run] = []
    size = 0
    for setting in config.settings():
        for method in parse_methods(config.methods):
            unit = [Run(method, setting, s)
                    for s in range(config.first_seed, config.first_seed + config.seeds)]
            unit_size = config.seeds * setting.horizon * config.actions
            if current and size + unit_size > config.block_elements:
                blocks.append(current)
                current, size = [], 0
            current += unit
            size += unit_size
    if current:
        blocks.append(current)
    return blocks


def simulate(config: SimConfig, progress: Callable[[int, int, int], None] | None = None
             ) -> SimResult:
    """Train every (method, setting, seed) and record its evaluation curve.

    Args:
        config: what to simulate.
        progress: called after every update as ``progress(block, n_blocks, step)``.

    Returns:
        A :class:`SimResult`.
    """
    eval_steps = config.eval_steps()
    eval_at = {s: i for i, s in enumerate(eval_steps)}
    curves: dict[tuple[str, Setting], torch.Tensor] = {}
    flag_rates: dict[tuple[str, Setting], torch.Tensor] = {}
    audit: dict[tuple[str, Setting, int], dict] = {}
    audited = set(config.audited_updates())
    blocks = plan_blocks(config)
    start = time.perf_counter()
    with torch.no_grad():
        for b, runs in enumerate(blocks):
            block = Block(runs, config)
            record = torch.zeros(len(runs), len(eval_steps), dtype=torch.float64)
            for step in range(config.steps + 1):
                stats = block.policy_stats()
                if step in eval_at:
                    record[:, eval_at[step]] = block.expected_returns(stats).cpu()
                if step in audited:
                    for (name, setting), values in block.audit(step, stats).items():
                        audit[(name, setting, step)] = values
                if step == config.steps:
                    break
                block.update(step, stats)
                if progress is not None:
                    progress(b, len(blocks), step + 1)
            tokens = (block.H * block.G * config.steps).cpu()
            for key in dict.fromkeys((r.method.name, r.setting) for r in block.runs):
                idx = [i for i, r in enumerate(block.runs) if (r.method.name, r.setting) == key]
                curves[key] = record[idx]
                if block.runs[idx[0]].method.calibration is not None:
                    flag_rates[key] = (block.flagged.cpu()[idx] / tokens[idx]).double()
    return SimResult(config, eval_steps, curves, time.perf_counter() - start, flag_rates,
                     audit)
