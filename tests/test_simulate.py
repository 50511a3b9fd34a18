"""``ktae.sim``: the synthetic MDP, the credit adapter and the run loop.

The vectorised simulator is checked against plain references written from the
equations (one run, Python loops, autograd through ``ktae.policy_loss``), and its
credit against direct calls of the public ``ktae`` API on the same sampled batch.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.stats
import torch
from oracle import single_thread  # noqa: F401  (one torch thread for this module)

import ktae
from ktae.sim import mdp
from ktae.sim.config import Setting, SimConfig
from ktae.sim.credit import (
    TOKEN_LOCAL_RULES,
    CreditBatch,
    base_advantages,
    calibrate,
    method_advantages,
    parse_method,
    parse_methods,
)
from ktae.sim.report import gaps
from ktae.sim.run import Block, Run, plan_blocks, simulate


def tiny(**overrides) -> SimConfig:
    base = dict(horizons=(3,), n_opts=(2,), group_sizes=(4,), actions=12, steps=6, lr=0.5,
                seeds=2, eval_every=2, methods=("broadcast",))
    return SimConfig(**{**base, **overrides})


# ------------------------------------------------------------------ MDP and policy


def test_policy_stats_match_softmax():
    gen = torch.Generator().manual_seed(0)
    theta = mdp.initial_logits(5, 24, 3, gen)
    st = mdp.policy_stats(theta, block=mdp.block_width(24, 4))
    ref = torch.distributions.Categorical(logits=theta.double())
    torch.testing.assert_close(st.log_norm.double(), torch.logsumexp(theta.double(), 1))
    torch.testing.assert_close(st.entropy.double(), ref.entropy(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mdp.expected_step_reward(st, torch.full((5,), 3)),
                               ref.probs[:, :3].sum(1), atol=1e-6, rtol=1e-6)
    # Entropies only from a row on: the others are 0.
    part = mdp.policy_stats(theta, block=4, entropy_from=3)
    assert torch.equal(part.entropy[:3], torch.zeros(3))
    torch.testing.assert_close(part.entropy[3:], st.entropy[3:])


def test_initial_logits_prior():
    gen = torch.Generator().manual_seed(1)
    theta = mdp.initial_logits(200, 100, 10, gen)
    assert abs(float(theta[:, :10].mean()) - 1.0) < 0.05
    assert abs(float(theta[:, 10:].mean())) < 0.02
    assert abs(float(theta.std()) - 1.0) < 0.1


@pytest.mark.parametrize("actions,samples", [(12, 4), (1000, 16), (97, 8)])
def test_two_level_sampling_equals_inverse_cdf(actions, samples):
    gen = torch.Generator().manual_seed(actions)
    theta = 2 * torch.randn(6, actions, generator=gen)
    u = torch.rand(6, samples, generator=gen, dtype=torch.float64)
    st = mdp.policy_stats(theta, block=mdp.block_width(actions, samples))
    got = mdp.sample_actions(st, u)
    probs = torch.softmax(theta.double(), 1).numpy()
    for r in range(6):
        cdf = np.cumsum(probs[r])
        ref = np.minimum(np.searchsorted(cdf, u[r].numpy() * cdf[-1], side="right"), actions - 1)
        assert got[r].tolist() == ref.tolist()


def test_sampling_frequencies_chi_square():
    gen = torch.Generator().manual_seed(3)
    theta = torch.randn(1, 40, generator=gen)
    st = mdp.policy_stats(theta, block=mdp.block_width(40, 20_000))
    actions = mdp.sample_actions(st, torch.rand(1, 20_000, generator=gen, dtype=torch.float64))
    counts = torch.bincount(actions[0], minlength=40).numpy()
    expected = torch.softmax(theta.double(), 1)[0].numpy() * 20_000
    assert scipy.stats.chisquare(counts, expected).pvalue > 1e-3


def test_sgd_step_equals_autograd_of_policy_loss():
    gen = torch.Generator().manual_seed(4)
    theta = torch.randn(3, 10, generator=gen, dtype=torch.float64)
    actions = torch.randint(0, 10, (3, 5), generator=gen)
    coef = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    lr = 0.3
    t = theta.clone().requires_grad_()
    logp = torch.log_softmax(t, 1).gather(1, actions)
    # policy_loss at ratio 1 with token-mean over 15 tokens: -(1/15) sum A logp
    loss, _ = ktae.policy_loss(logp, logp.detach(), coef * 15, torch.ones(3, 5))
    loss.backward()
    expected = theta - lr * t.grad
    st = mdp.policy_stats(theta, block=mdp.block_width(10, 5))
    drift = mdp.sgd_step(theta, st, actions, coef, lr)
    torch.testing.assert_close(theta, expected)
    assert (drift >= 0).all()


def test_recentre_keeps_the_softmax():
    theta = torch.tensor([[50.0, 49.0, 10.0], [1.0, 0.0, -1.0]])
    before = torch.softmax(theta, 1)
    drift = torch.tensor([41.0, 3.0])
    mdp.recentre(theta, drift)
    assert theta[0].max() == 0 and theta[1].tolist() == [1.0, 0.0, -1.0]
    assert drift.tolist() == [0.0, 3.0]
    torch.testing.assert_close(torch.softmax(theta, 1), before)


# ------------------------------------------------------------------ credit adapter


def _batch(seed: int = 0, runs: int = 3, G: int = 4, H: int = 5, A: int = 6) -> CreditBatch:
    gen = torch.Generator().manual_seed(seed)
    actions = torch.randint(0, A, (runs * G, H), generator=gen)
    mask = torch.ones(runs * G, H, dtype=torch.bool)
    mask[-G:, H - 2:] = False  # the last run is shorter
    steps = torch.arange(H).expand_as(actions)
    return CreditBatch(
        step_rewards=((actions < 2) & mask).float(), mask=mask,
        group=torch.arange(runs).repeat_interleave(G),
        horizon=torch.tensor([H] * (runs - 1) * G + [H - 2] * G),
        token_ids=torch.where(mask, steps * A + actions, 0),
        logprobs=torch.where(mask, -3 * torch.rand(runs * G, H, generator=gen), 0.0),
        entropies=torch.where(mask, 2 * torch.rand(runs * G, H, generator=gen), 0.0),
        run_slices=tuple((k * G, (k + 1) * G) for k in range(runs)))


def test_step_oracle_is_per_step_group_normalised_reward():
    b = _batch()
    got = base_advantages("step", b)
    expected = torch.zeros_like(got)
    for s, e in b.run_slices:
        for t in range(b.mask.shape[1]):
            if not b.mask[s, t]:
                continue
            r = b.step_rewards[s:e, t].double()
            expected[s:e, t] = ((r - r.mean()) / (r.std() + 1e-6)).float()
    torch.testing.assert_close(got, expected)


def test_broadcast_is_grpo_on_the_normalised_return():
    b = _batch(1)
    got = base_advantages("broadcast", b)
    R = b.step_rewards.sum(1) / b.horizon
    seq = ktae.compute_advantages("grpo", rewards=R, group=b.group)
    torch.testing.assert_close(got, seq[:, None] * b.mask)


def test_ktae_adapter_adds_nothing():
    b = _batch(2)
    R = [float(b.step_rewards[i].sum()) / int(b.horizon[i]) for i in range(len(b.group))]
    correct = []
    for s, e in b.run_slices:  # plain loop: return above its group's mean
        mean = sum(R[s:e]) / (e - s)
        correct += [R[i] > mean + 1e-12 for i in range(s, e)]
    direct = ktae.compute_advantages("ktae", rewards=torch.tensor(R), group=b.group,
                                     token_ids=b.token_ids, mask=b.mask,
                                     correct=torch.tensor(correct))
    torch.testing.assert_close(base_advantages("ktae", b), direct)
    assert b.above_group_mean().tolist() == correct
    # The threshold option is the library's reward_threshold rule.
    thr = ktae.compute_advantages("ktae", rewards=torch.tensor(R), group=b.group,
                                  token_ids=b.token_ids, mask=b.mask, reward_threshold=0.3)
    torch.testing.assert_close(base_advantages("ktae", b, ktae_threshold=0.3), thr)


def test_token_local_rules_batched_equal_per_run():
    b = _batch(3)
    adv = base_advantages("broadcast", b)
    for rule in sorted(TOKEN_LOCAL_RULES & set(ktae.CALIBRATIONS.names())):
        got = calibrate(rule, adv, b)
        for s, e in b.run_slices:
            ref = ktae.calibrate_advantages(rule, adv[s:e], logprobs=b.logprobs[s:e],
                                            entropies=b.entropies[s:e], mask=b.mask[s:e],
                                            old_logprobs=b.logprobs[s:e])
            torch.testing.assert_close(got.advantages[s:e], ref.advantages)
            assert torch.equal(got.loss_mask[s:e], getattr(ref, "loss_mask", b.mask[s:e]))
            assert torch.equal(got.flagged[s:e], ref.flagged)


def test_batch_level_rules_see_one_run_as_their_batch():
    b = _batch(4)
    adv = base_advantages("step", b)
    for rule in sorted(set(ktae.CALIBRATIONS.names()) - TOKEN_LOCAL_RULES):
        gens = [torch.Generator().manual_seed(k) for k in range(len(b.run_slices))]
        got = calibrate(rule, adv, b, gens)
        for k, (s, e) in enumerate(b.run_slices):
            ref = ktae.calibrate_advantages(rule, adv[s:e], logprobs=b.logprobs[s:e],
                                            entropies=b.entropies[s:e], mask=b.mask[s:e],
                                            old_logprobs=b.logprobs[s:e],
                                            generator=torch.Generator().manual_seed(k))
            torch.testing.assert_close(got.advantages[s:e], ref.advantages)
            assert torch.equal(got.flagged[s:e], ref.flagged)


def test_method_names():
    assert parse_method("taco") == parse_method("broadcast+taco").__class__("taco", "broadcast", "taco")
    assert parse_method("ktae+taco").base == "ktae"
    names = [m.name for m in parse_methods("all")]
    assert {"broadcast", "step", "ktae", "ktae+taco"} <= set(names)
    assert set(ktae.CALIBRATIONS.names()) <= set(names)
    for bad in ("nope", "ktae+nope", "taco+ktae"):
        with pytest.raises(ValueError, match="methods: unknown method"):
            parse_method(bad)


# ------------------------------------------------------------------ run loop


def _reference_advantages(base, rewards, token_ids):
    """One group's ``[G, H]`` base advantages, by direct library calls and loops."""
    G, H = rewards.shape
    R = rewards.sum(1) / H
    if base == "broadcast":
        return ktae.compute_advantages("grpo", rewards=R, group=[0] * G)[:, None].expand(G, H)
    if base == "step":
        cols = [ktae.compute_advantages("grpo", rewards=rewards[:, t], group=[0] * G)
                for t in range(H)]
        return torch.stack(cols, 1)
    correct = [bool(R[i] > R.mean() + 1e-9) for i in range(G)]
    return ktae.compute_advantages("ktae", rewards=R, group=[0] * G, token_ids=token_ids,
                                   correct=correct)


def _reference_update(theta, u, method, setting, lr, A):
    """One update of one run from the equations: plain inverse-CDF sampling, credit
    through the public API, loss through ``ktae.policy_loss`` and autograd."""
    H, G, n = setting.horizon, setting.group_size, setting.n_opt
    probs = torch.softmax(theta.double(), 1).numpy()
    actions = torch.zeros(G, H, dtype=torch.long)
    for t in range(H):
        cdf = np.cumsum(probs[t])
        for i in range(G):
            actions[i, t] = min(int(np.searchsorted(cdf, float(u[t, i]) * cdf[-1], "right")), A - 1)
    t_ = theta.double().clone().requires_grad_()
    logp_all = torch.log_softmax(t_, 1)
    logp = torch.stack([logp_all[t, actions[:, t]] for t in range(H)], 1)  # [G, H]
    p = logp_all.detach().exp()
    entropy = -(p * logp_all.detach()).sum(1)
    rewards = (actions < n).float()
    mask = torch.ones(G, H, dtype=torch.bool)
    adv = _reference_advantages(method.base, rewards, torch.arange(H) * A + actions)
    loss_mask = mask
    if method.calibration is not None:
        res = ktae.calibrate_advantages(method.calibration, adv, logprobs=logp.detach().float(),
                                        entropies=entropy.float().expand(G, H), mask=mask,
                                        old_logprobs=logp.detach().float())
        adv, loss_mask = res.advantages, getattr(res, "loss_mask", mask)
    loss, _ = ktae.policy_loss(logp, logp.detach(), adv.double(), loss_mask)
    (H * loss).backward()
    return (theta.double() - lr * t_.grad).float()


@pytest.mark.parametrize("method", ["broadcast", "step", "ktae", "taco", "ktae+taco", "stapo"])
def test_block_update_equals_reference(method):
    cfg = tiny(horizons=(3, 5), group_sizes=(4, 6), actions=20, methods=(method,), lr=0.7)
    runs = plan_blocks(cfg)[0]
    block = Block(runs, cfg)
    theta0 = block.theta.clone()
    u = Block(runs, cfg).uniforms(0)  # a twin block draws the same uniforms
    block.update(0, block.policy_stats())
    for r, run in enumerate(block.runs):
        s, h = int(block.row_offset[r]), run.setting.horizon
        ref = _reference_update(theta0[s:s + h], u[s:s + h, :run.setting.group_size],
                                run.method, run.setting, cfg.lr, cfg.actions)
        torch.testing.assert_close(block.theta[s:s + h], ref, atol=2e-5, rtol=1e-5)


def test_a_run_does_not_depend_on_its_company():
    # Bitwise: other methods, horizons and group sizes in the block change nothing.
    cfg = tiny(actions=240, group_sizes=(4, 6), horizons=(3, 5))
    k, b = parse_method("ktae"), parse_method("taco-random")
    run_set = [Run(k, Setting(5, 2, 4), s) for s in range(2)]
    alone = Block(run_set, cfg)
    mixed = Block([Run(b, Setting(3, 2, 6), s) for s in range(2)] + run_set
                  + [Run(k, Setting(3, 2, 6), s) for s in range(3)], cfg)
    first = [i for i, r in enumerate(mixed.runs) if r in run_set][0]
    rows = slice(int(mixed.row_offset[first]), int(mixed.row_offset[first]) + alone.rows)
    for step in range(8):
        alone.update(step, alone.policy_stats())
        mixed.update(step, mixed.policy_stats())
    assert torch.equal(alone.theta, mixed.theta[rows])


def test_ktae_through_the_simulator_equals_the_library_on_its_sampled_batch():
    cfg = tiny(horizons=(3, 5), group_sizes=(4, 6), actions=15, methods=("ktae",), seeds=3)
    block = Block(plan_blocks(cfg)[0], cfg)
    for step in range(3):  # a few updates, so that returns spread out
        block.update(step, block.policy_stats())
    stats = block.policy_stats()
    actions = mdp.sample_actions(stats, block.uniforms(3))
    logp = mdp.sampled_logprobs(block.theta, stats.log_norm, actions)
    (method, mb), = block.methods.items()
    got = method_advantages(method, block.credit_batch(mb, actions, logp, stats)).advantages
    # Rebuild each run's group from the sampled actions, with plain loops.
    rewards, token_ids, groups, mask = [], [], [], []
    T = max(r.setting.horizon for r in block.runs)
    for r, run in enumerate(block.runs):
        s, h = int(block.row_offset[r]), run.setting.horizon
        for i in range(run.setting.group_size):
            a = [int(actions[s + t, i]) for t in range(h)]
            rewards.append(sum(x < run.setting.n_opt for x in a) / h)
            token_ids.append([t * cfg.actions + a[t] for t in range(h)] + [0] * (T - h))
            mask.append([1] * h + [0] * (T - h))
            groups.append(r)
    correct = [rewards[i] > sum(rewards[j] for j in range(len(groups)) if groups[j] == groups[i])
               / groups.count(groups[i]) + 1e-9 for i in range(len(groups))]
    assert 0 < sum(correct) < len(correct)
    direct = ktae.compute_advantages("ktae", rewards=torch.tensor(rewards), group=groups,
                                     token_ids=torch.tensor(token_ids), mask=torch.tensor(mask),
                                     correct=torch.tensor(correct))
    torch.testing.assert_close(got, direct)


def test_same_seed_same_curves_and_blocks_do_not_matter():
    cfg = tiny(horizons=(2, 4), methods=("broadcast", "step", "taco-random"), seeds=3)
    a, b = simulate(cfg), simulate(cfg)
    assert a.curves.keys() == b.curves.keys()
    assert all(torch.equal(a.curves[k], b.curves[k]) for k in a.curves)
    # Each (method, setting) alone, and fewer seeds: the same curves.
    split = simulate(dataclasses.replace(cfg, block_elements=1))
    assert len(plan_blocks(dataclasses.replace(cfg, block_elements=1))) == 6
    fewer = simulate(dataclasses.replace(cfg, seeds=2, methods=("step",)))
    assert all(torch.equal(split.curves[k], a.curves[k]) for k in a.curves)
    assert all(torch.equal(c, a.curves[k][:2]) for k, c in fewer.curves.items())
    # Another seed set gives other curves.
    assert not torch.equal(a.curves[("step", cfg.base)][0], a.curves[("step", cfg.base)][1])


def test_eval_steps_and_curve_shape():
    cfg = tiny(steps=7, eval_every=3)
    assert cfg.eval_steps() == [0, 3, 6, 7]
    res = simulate(cfg)
    c = res.curves[("broadcast", cfg.base)]
    assert c.shape == (2, 4) and ((c >= 0) & (c <= 1)).all()


def test_step_beats_broadcast_and_gap_grows_with_horizon():
    cfg = SimConfig(horizons=(4, 16), n_opts=(2,), group_sizes=(4,), actions=50, steps=100,
                    lr=0.5, seeds=3, eval_every=10, methods=("broadcast", "step"))
    res = simulate(cfg)
    g = gaps(res)
    short, long = g[cfg.axis_settings("horizon")[0]], g[cfg.axis_settings("horizon")[1]]
    assert short[0] > 0 and long[0] > 0
    assert long[0] > short[0] + 0.1


def test_flag_rates():
    # forking-tokens keeps the ceil(20%) highest-entropy tokens of a run's G*H = 12:
    # 3 kept, 9 flagged at every update.
    res = simulate(tiny(methods=("broadcast", "forking-tokens")))
    base = res.config.base
    assert torch.equal(res.flag_rates[("forking-tokens", base)],
                       torch.full((2,), 0.75, dtype=torch.float64))
    assert ("broadcast", base) not in res.flag_rates


def test_learning_happens():
    cfg = tiny(actions=30, steps=60, eval_every=20, methods=("step",))
    c = simulate(cfg).curves[("step", cfg.base)]
    assert (c[:, -1] > c[:, 0] + 0.3).all()


# ------------------------------------------------------------------ bad arguments


@pytest.mark.parametrize("overrides,match", [
    (dict(actions=0), "actions: expected a positive integer, got 0"),
    (dict(n_opts=(13,)), "n_opt: expected at most actions = 12"),
    (dict(n_opts=(0,)), "n_opt: expected a positive integer"),
    (dict(methods=("broadcast", "bogus")), "methods: unknown method 'bogus'"),
    (dict(methods=()), "methods: expected at least one"),
    (dict(group_sizes=(1,)), "group_size: expected >= 2"),
    (dict(horizons=()), "horizons: expected at least one value"),
    (dict(lr=0.0), "lr: expected a positive learning rate"),
    (dict(steps=0), "steps: expected a positive integer"),
    (dict(seeds=0), "seeds: expected a positive integer"),
    (dict(target=1.5), "target: expected a normalised return"),
])
def test_bad_arguments(overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny(**overrides)


def test_presets():
    paper = SimConfig.preset("paper")
    assert (paper.actions, paper.steps, paper.lr, paper.seeds, paper.eval_every) == (
        100_000, 8_000, 0.2, 10, 100)
    assert SimConfig.preset("quick", seeds=2).seeds == 2
    with pytest.raises(ValueError, match="preset: expected one of"):
        SimConfig.preset("huge")


def test_run_identity():
    cfg = tiny(methods=("step", "ktae"))
    runs = [r for block in plan_blocks(cfg) for r in block]
    assert len(runs) == 2 * 2 and isinstance(runs[0], Run)
