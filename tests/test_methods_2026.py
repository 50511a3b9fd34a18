"""The entropy advantage, Clip-Cov, KL-Cov and SPO's probability mask (docs/method.md §16):
each against a plain loop written from its paper's equations or verl's code, its options,
its name in every command, and verl's option checks."""

from __future__ import annotations

import math

import pytest
import torch
from oracle import single_thread  # noqa: F401  (one torch thread for this module)

import ktae
from ktae.core.methods import method_credit, parse_method

NEW = ("entropy-adv", "clip-cov", "kl-cov", "spo-mask")


def batch(seed: int = 0, B: int = 4, T: int = 7, off_policy: float = 0.1):
    """Advantages, current and old log-probs, entropies and a ragged mask (float64)."""
    g = torch.Generator().manual_seed(seed)
    adv = (torch.randn(B, generator=g) * 2)[:, None].expand(B, T).clone()
    adv += torch.randn(B, T, generator=g) * 0.5  # token-level credit
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = lp + off_policy * torch.randn(B, T, generator=g, dtype=torch.float64)
    ent = torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 5:] = False
    mask[3, 2:] = False
    return adv.double(), lp, old, ent, mask


def calibrate(name, adv, lp, old, ent, mask, seed=0, **options):
    return ktae.calibrate_advantages(name, adv, logprobs=lp, entropies=ent, mask=mask,
                                     old_logprobs=old,
                                     generator=torch.Generator().manual_seed(seed), **options)


def real_tokens(mask):
    return [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]


# ------------------------------------------------------------------ entropy advantage


def slow_entropy_advantage(adv, ent, mask, alpha, kappa):
    out = torch.zeros_like(adv)
    for i, t in real_tokens(mask):
        a = float(adv[i, t])
        out[i, t] = a + min(alpha * float(ent[i, t]), abs(a) / kappa)
    return out


@pytest.mark.parametrize("options", [{}, {"alpha": 0.05, "kappa": 3.0}, {"alpha": 2.0}])
def test_entropy_advantage_equals_the_loop(options):
    adv, lp, old, ent, mask = batch(1)
    res = calibrate("entropy-adv", adv, lp, old, ent, mask, **options)
    want = slow_entropy_advantage(adv, ent, mask, options.get("alpha", 0.4),
                                  options.get("kappa", 2.0))
    torch.testing.assert_close(res.advantages, want)
    assert res.loss_mask.equal(mask)
    # the bonus never flips a sign (kappa > 1) and is never negative
    assert ((res.advantages - adv)[mask] >= 0).all()
    assert (torch.sign(res.advantages[mask]) * torch.sign(adv[mask]) >= 0).all()


def test_entropy_advantage_options_take_effect():
    adv, lp, old, ent, mask = batch(2)
    base = calibrate("entropy-adv", adv, lp, old, ent, mask).advantages
    for options in ({"alpha": 0.01}, {"kappa": 10.0}):
        assert not torch.allclose(calibrate("entropy-adv", adv, lp, old, ent, mask,
                                            **options).advantages, base)
    with pytest.raises(ValueError, match="kappa: expected a finite number > 0"):
        calibrate("entropy-adv", adv, lp, old, ent, mask, kappa=0)
    with pytest.raises(ValueError, match="^entropies: required by calibration 'entropy-adv'"):
        calibrate("entropy-adv", adv, lp, old, None, mask)


# ------------------------------------------------------------------ SPO probability mask


def test_spo_mask_equals_the_code_and_its_loss():
    """SPO's code: action_mask &= exp(old_logprobs) < 0.9; loss = masked_mean of the
    clipped surrogate over action_mask."""
    adv, lp, old, ent, mask = batch(3, off_policy=0.0)
    old = old.clone()
    old[0, :3] = math.log(0.95)  # confident tokens
    old[2, 1] = math.log(0.9)    # exactly the threshold: out (strict <)
    for threshold in (0.9, 0.5):
        res = calibrate("spo-mask", adv, lp, old, ent, mask,
                        **({} if threshold == 0.9 else {"prob_threshold": threshold}))
        keep = torch.zeros_like(mask)
        for i, t in real_tokens(mask):
            keep[i, t] = math.exp(float(old[i, t])) < threshold
        assert res.loss_mask.equal(keep)
        assert res.flagged.equal(mask & ~keep)
    res = calibrate("spo-mask", adv, lp, old, ent, mask)
    lp_new = (lp + 0.05).requires_grad_()
    loss, _ = ktae.policy_loss(lp_new, old, res.advantages, res.loss_mask)
    total, n = 0.0, 0
    for i, t in real_tokens(mask):
        if math.exp(float(old[i, t])) < 0.9:
            r = math.exp(float(lp_new[i, t].detach()) - float(old[i, t]))
            a = float(adv[i, t])
            total += max(-a * r, -a * min(max(r, 0.8), 1.2))
            n += 1
    assert loss.item() == pytest.approx(total / n, rel=1e-9)


# ------------------------------------------------------------------ Clip-Cov


def slow_clip_cov(adv, lp, old, mask, *, ratio=0.0002, lb=1.0, ub=5.0, clip=(0.2, 0.2),
                  seed=0):
    """verl's compute_policy_loss_clip_cov, as plain loops: the chosen tokens' corr."""
    toks = real_tokens(mask)
    mean_a = sum(float(adv[i, t]) for i, t in toks) / len(toks)
    mean_lp = sum(float(lp[i, t].detach()) for i, t in toks) / len(toks)
    candidates = []
    for i, t in toks:  # row-major, as torch.nonzero lists them
        a = float(adv[i, t])
        r = math.exp(float(lp[i, t]) - float(old[i, t]))
        clipped = -a * min(max(r, 1 - clip[0]), 1 + clip[1]) > -a * r
        cov = (a - mean_a) * (float(lp[i, t]) - mean_lp)
        if not clipped and lb < cov < ub:
            candidates.append((i, t))
    n = max(int(ratio * len(toks)), 1)
    perm = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed))
    return {candidates[int(k)] for k in perm[:n]}


@pytest.mark.parametrize("options", [
    {"clip_cov_ratio": 0.2, "clip_cov_lb": -50.0, "clip_cov_ub": 50.0},
    {"clip_cov_ratio": 0.3, "clip_cov_lb": 0.0, "clip_cov_ub": 50.0, "clip_low": 0.05,
     "clip_high": 0.05},
    {},
])
def test_clip_cov_equals_verls_loss(options):
    adv, lp, old, ent, mask = batch(4, off_policy=0.2)
    adv = adv * 3
    res = calibrate("clip-cov", adv, lp, old, ent, mask, seed=5, **options)
    chosen = slow_clip_cov(adv, lp, old, mask, ratio=options.get("clip_cov_ratio", 0.0002),
                           lb=options.get("clip_cov_lb", 1.0), ub=options.get("clip_cov_ub", 5.0),
                           clip=(options.get("clip_low", 0.2), options.get("clip_high", 0.2)),
                           seed=5)
    assert {(i, t) for i, t in real_tokens(mask) if res.flagged[i, t]} == chosen
    assert res.loss_mask.equal(mask)  # chosen tokens stay in the token mean
    # verl: token-mean over the response mask of max(pg1, pg2) * corr, value and gradient
    lp_new = lp.clone().requires_grad_()
    loss, _ = ktae.policy_loss(lp_new, old, res.advantages, res.loss_mask,
                               clip_low=options.get("clip_low", 0.2),
                               clip_high=options.get("clip_high", 0.2))
    lp_ref = lp.clone().requires_grad_()
    ratio = (lp_ref - old).exp()
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - options.get("clip_low", 0.2),
                                                        1 + options.get("clip_high", 0.2)))
    corr = torch.ones_like(adv)
    for i, t in chosen:
        corr[i, t] = 0
    ref = torch.where(mask, pg * corr, 0).sum() / mask.sum()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(torch.autograd.grad(loss, lp_new)[0],
                               torch.autograd.grad(ref, lp_ref)[0])
    if options:
        assert chosen  # the case exercises the choice
    # at the defaults this batch of 21 tokens selects none; tests/test_clip_cov_verl.py
    # checks the defaults on batches where they select tokens


def test_clip_cov_options_take_effect():
    adv, lp, old, ent, mask = batch(6, off_policy=0.3)
    wide = {"clip_cov_lb": -50.0, "clip_cov_ub": 50.0}
    few = calibrate("clip-cov", adv * 3, lp, old, ent, mask, **wide).flagged.sum()
    many = calibrate("clip-cov", adv * 3, lp, old, ent, mask, clip_cov_ratio=0.3,
                     **wide).flagged.sum()
    assert few == 1 and many > 1
    assert not calibrate("clip-cov", adv, lp, old, ent, mask, clip_cov_lb=100.0,
                         clip_cov_ub=200.0).flagged.any()
    with pytest.raises(ValueError, match="clip_cov_ratio: expected a finite number > 0"):
        calibrate("clip-cov", adv, lp, old, ent, mask, clip_cov_ratio=0)


# ------------------------------------------------------------------ KL-Cov


def slow_kl_cov_loss(adv, lp, old, mask, ratio=0.0002, coef=1.0):
    """verl's compute_policy_loss_kl_cov (token-mean), as plain loops over the tokens."""
    toks = real_tokens(mask)
    lp_value = lp.detach()
    mean_a = sum(float(adv[i, t]) for i, t in toks) / len(toks)
    mean_lp = sum(float(lp_value[i, t]) for i, t in toks) / len(toks)
    covs = sorted(((float(adv[i, t]) - mean_a) * (float(lp_value[i, t]) - mean_lp), (i, t))
                  for i, t in toks)
    k = max(1, int(len(toks) * ratio))
    chosen = {tok for _, tok in covs[-k:]}
    terms = []
    for i, t in toks:
        term = -adv[i, t] * (lp[i, t] - old[i, t]).exp()
        if (i, t) in chosen:
            term = term + coef * (lp[i, t] - old[i, t]).abs()
        terms.append(term)
    return torch.stack(terms).sum() / len(toks), chosen


@pytest.mark.parametrize("options", [{}, {"kl_cov_ratio": 0.25}, {"kl_cov_ratio": 0.4,
                                                                     "ppo_kl_coef": 3.0}])
def test_kl_cov_has_verls_gradient(options):
    """Off-policy, at the loss's default clip range, which the result turns off (verl's
    kl_cov has no clip): the gradient equals verl's; the loss value differs on the selected
    tokens by ``coef * (|d| - sign(d))``, ``d = logp - old_logp`` (the offset's value, not
    the penalty's). tests/test_kl_cov_verl.py compares with verl's code itself."""
    adv, lp, old, ent, mask = batch(7, off_policy=0.3)
    res = calibrate("kl-cov", adv, lp, old, ent, mask, **options)
    assert not res.ppo_clip
    lp_new = lp.clone().requires_grad_()
    loss, _ = ktae.policy_loss(lp_new, old, res.advantages, mask, ppo_clip=res.ppo_clip)
    lp_ref = lp.clone().requires_grad_()
    ref, chosen = slow_kl_cov_loss(adv, lp_ref, old, mask, options.get("kl_cov_ratio", 0.0002),
                                   options.get("ppo_kl_coef", 1.0))
    assert {(i, t) for i, t in real_tokens(mask) if res.flagged[i, t]} == chosen
    torch.testing.assert_close(torch.autograd.grad(loss, lp_new)[0],
                               torch.autograd.grad(ref, lp_ref)[0])
    coef = options.get("ppo_kl_coef", 1.0)
    gap = sum(coef * (abs(float(lp[i, t] - old[i, t])) - math.copysign(1, float(lp[i, t] - old[i, t])))
              for i, t in chosen) / mask.sum()
    assert ref.item() - loss.item() == pytest.approx(float(gap), rel=1e-6)


def test_kl_cov_on_policy_changes_nothing():
    adv, lp, _, ent, mask = batch(8)
    res = calibrate("kl-cov", adv, lp, lp, ent, mask, kl_cov_ratio=0.5)
    assert res.flagged.any()
    torch.testing.assert_close(res.advantages, torch.where(mask, adv, 0))


# ------------------------------------------------------------------ every command


@pytest.mark.parametrize("name", NEW)
def test_names_parse_as_credit(name):
    from ktae.runs.config import TrainConfig
    from ktae.runs.credit import credit_settings

    assert credit_settings(TrainConfig(credit=name).resolve()).calibration == name
    s = credit_settings(TrainConfig(credit=f"ktae+{name}").resolve())
    assert (s.estimator, s.calibration) == ("ktae", name)
    with pytest.raises(ValueError, match="wrong_option"):
        credit_settings(TrainConfig(credit=name,
                                    calibration_options={"wrong_option": 1}).resolve())


@pytest.mark.parametrize("text, option", [
    ("entropy-adv@alpha=0.1", {"alpha": 0.1}), ("clip-cov@clip_cov_ratio=0.5", {"clip_cov_ratio": 0.5}),
    ("kl-cov@ppo_kl_coef=2", {"ppo_kl_coef": 2}), ("spo-mask@prob_threshold=0.5", {"prob_threshold": 0.5}),
])
def test_method_strings_and_credit(text, option):
    """``compare``/``audit``/``explain`` names: options reach the rule."""
    method = parse_method(text)
    assert method.calibration_options == option
    adv, lp, old, ent, mask = batch(9)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    ids = torch.arange(28).view(4, 7) % 5 + 1
    got = method_credit(method, rewards=rewards, group=torch.zeros(4, dtype=torch.long),
                        token_ids=ids, mask=mask, correct=rewards > 0, logprobs=lp,
                        entropies=ent)
    plain = method_credit(parse_method(text.split("@")[0]), rewards=rewards,
                          group=torch.zeros(4, dtype=torch.long), token_ids=ids, mask=mask,
                          correct=rewards > 0, logprobs=lp, entropies=ent)
    assert got.final.shape == mask.shape and torch.isfinite(got.final).all()
    if not text.startswith("kl-cov"):  # on-policy, KL-Cov's penalty has no gradient
        assert not (torch.equal(got.final, plain.final) and torch.equal(got.in_loss, plain.in_loss))
    with pytest.raises(ValueError, match="^credit: 'bogus' in"):
        parse_method(f"{text.split('@')[0]}@bogus=1")


def test_simulate_runs_the_new_calibrations():
    from ktae.sim.config import SimConfig
    from ktae.sim.run import simulate

    cfg = SimConfig(horizons=(3,), n_opts=(2,), group_sizes=(4,), actions=6, steps=4, lr=0.5,
                    seeds=1, eval_every=2, audit_groups=0,
                    methods=("broadcast", "grpo+entropy-adv@alpha=2",
                             "grpo+clip-cov@clip_cov_ratio=0.5", "kl-cov",
                             "grpo+spo-mask@prob_threshold=0.5"))
    res = simulate(cfg)
    curves = {m: c for (m, _), c in res.curves.items()}
    assert set(curves) == set(cfg.methods)
    for curve in curves.values():
        assert torch.isfinite(curve).all()
    for name in ("grpo+entropy-adv@alpha=2", "grpo+spo-mask@prob_threshold=0.5"):
        assert not torch.equal(curves[name], curves["broadcast"])
    # one update per batch: KL-Cov's penalty has no gradient, as in verl
    torch.testing.assert_close(curves["kl-cov"], curves["broadcast"])


def test_verl_options_accept_the_new_losses():
    from ktae.integrations.verl.options import check_config

    def config(loss_mode, block, entropy=True):
        return {"algorithm": {"adv_estimator": "grpo"},
                "trainer": {"use_v1": True},
                "actor_rollout_ref": {"actor": {"calculate_entropy": entropy, "policy_loss": {
                    "loss_mode": loss_mode, "ktae": block}}}}

    for name, block in (("entropy-adv", {"alpha": 0.2, "kappa": 3}),
                        ("clip-cov", {"clip_cov_ratio": 0.001, "clip_low": 0.2}),
                        ("kl-cov", {"kl_cov_ratio": 0.002, "ppo_kl_coef": 1.0}),
                        ("spo-mask", {"prob_threshold": 0.8})):
        got = check_config(config(name, block))
        assert (got.calibration.name, got.calibration.options) == (name, block)
        with pytest.raises(ValueError, match=f"loss_mode={name}\\).*typo"):
            check_config(config(name, {"typo": 1}))
    with pytest.raises(ValueError, match="calculate_entropy=true"):
        check_config(config("entropy-adv", {}, entropy=False))
    # Clip-Cov's clip range must be the loss's: verl's clip_ratio_low/high (default 0.2)
    cfg = config("clip-cov", {"clip_high": 0.28})
    with pytest.raises(ValueError, match=r"clip_high=0.28 but the actor's clip_ratio_high is 0.2"):
        check_config(cfg)
    cfg["actor_rollout_ref"]["actor"]["clip_ratio_high"] = 0.28
    assert check_config(cfg).calibration.options == {"clip_high": 0.28}
    assert check_config(config("spo-mask", {}, entropy=False)).calibration.name == "spo-mask"
