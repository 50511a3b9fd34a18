"""``ktae simulate``'s credit audit on the MDP's exact labels (``ktae.sim.blame``).

The vectorised figures are checked against a plain loop over trajectories and step pairs
written straight from the definitions (docs/simulate.md, "Credit on the MDP's exact
labels"), on random small batches with many ties; GRPO (broadcast) must give exactly
0.5 blame; the probe groups must leave training untouched.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from oracle import single_thread  # noqa: F401  (one torch thread for this module)

from ktae.cli import main
from ktae.sim import SimConfig, blame, simulate
from ktae.sim.blame_report import audit_summaries
from ktae.sim.credit import Credit, CreditBatch
from ktae.sim.report import to_json

# ------------------------------------------------------------------ slow reference


def slow_figures(credit, loss_mask, step_rewards, mask, group) -> list[dict]:
    """Per trajectory, every figure's value (None where undefined) and the mass figures'
    numerators and denominators, by plain loops from the definitions."""
    B, T = len(credit), len(credit[0])
    steps = [[t for t in range(T) if mask[i][t]] for i in range(B)]
    k = [sum(step_rewards[i][t] for t in steps[i]) for i in range(B)]
    ret = [k[i] / len(steps[i]) for i in range(B)]
    members = {g: [j for j in range(B) if group[j] == g] for g in set(group)}
    # GRPO: (R - mean) / (unbiased std + 1e-6), one value per trajectory
    grpo = []
    for i in range(B):
        rs = [ret[j] for j in members[group[i]]]
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / (len(rs) - 1))
        grpo.append((ret[i] - mean) / (std + 1e-6))
    out = []
    for i in range(B):
        ks = [k[j] for j in members[group[i]]]
        # successful: return above the group's mean (returns share H within a group)
        success = [k[j] * len(ks) > sum(ks) for j in members[group[i]]]
        mixed = any(success) and not all(success)
        ok = k[i] * len(ks) > sum(ks)
        A = {t: (float(credit[i][t]) if loss_mask[i][t] else 0.0) for t in steps[i]}
        wrong = [A[t] for t in steps[i] if step_rewards[i][t] == 0]
        right = [A[t] for t in steps[i] if step_rewards[i][t] == 1]
        row = dict.fromkeys(("blame", "lowest", "chance", "contamination", "mass_gap",
                             "mass_gap_norm", "tokens_changed", "tokens", "scale",
                             "scale_norm"))
        if mixed and not ok and wrong and right:
            pairs = [1.0 if w < r else 0.5 if w == r else 0.0 for w in wrong for r in right]
            row["blame"] = sum(pairs) / len(pairs)
            low = min(wrong + right)
            n_low_w, n_low_r = sum(w == low for w in wrong), sum(r == low for r in right)
            row["lowest"] = n_low_w / (n_low_w + n_low_r)
            row["chance"] = len(wrong) / (len(wrong) + len(right))
            row["mass_gap"] = sum(wrong) / len(wrong) - sum(right) / len(right)
            row["mass_gap_norm"] = abs(grpo[i])
        positive = sum(max(a, 0.0) for a in A.values())
        if mixed and ok and wrong and positive > 0:
            row["contamination"] = sum(max(w, 0.0) for w in wrong) / positive
        if mixed:
            row["tokens"] = len(steps[i])
            row["tokens_changed"] = sum(abs(A[t] - grpo[i]) > 1e-6 * (1 + abs(grpo[i]))
                                        for t in steps[i])
            row["scale"] = sum(abs(a) for a in A.values())
            row["scale_norm"] = abs(grpo[i]) * len(steps[i])
        out.append(row)
    return out


def random_case(seed: int):
    """A batch of groups of 2-5 trajectories of 1-6 steps, credit from a few values
    (ties everywhere), some steps outside the loss mask, some equal to GRPO's."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(2, 6, (6,), generator=g).tolist()
    horizons = torch.randint(1, 7, (6,), generator=g).tolist()
    group = torch.repeat_interleave(torch.arange(6), torch.tensor(sizes))
    B, T = len(group), max(horizons)
    horizon = torch.tensor(horizons)[group]
    mask = torch.arange(T)[None, :] < horizon[:, None]
    p = torch.rand(B, 1, generator=g)
    rewards = ((torch.rand(B, T, generator=g) < p) & mask).float()
    # a few values, none within 1e-6 of a GRPO value (|z| = 1 in groups of two)
    credit = (torch.randint(-2, 3, (B, T), generator=g).float() + 0.1) / 2
    batch = CreditBatch(step_rewards=rewards, mask=mask, group=group, horizon=horizon,
                        token_ids=torch.zeros(B, T, dtype=torch.long),
                        logprobs=torch.zeros(B, T), entropies=torch.zeros(B, T),
                        run_slices=())
    # some steps keep GRPO's credit exactly: "tokens changed" must not count them
    from ktae.sim.credit import base_advantages

    keep_grpo = torch.rand(B, T, generator=g) < 0.3
    credit = torch.where(keep_grpo, base_advantages("broadcast", batch), credit)
    loss_mask = mask & (torch.rand(B, T, generator=g) < 0.85)
    return Credit(credit, loss_mask, torch.zeros_like(mask)), batch


@pytest.mark.parametrize("seed", range(8))
def test_mdp_figures_equal_the_pairwise_loop(seed):
    credit, batch = random_case(seed)
    got = blame.score(credit, batch)
    ref = slow_figures(credit.advantages.tolist(), credit.loss_mask.tolist(),
                       batch.step_rewards.tolist(), batch.mask.tolist(), batch.group.tolist())
    for key in ("blame", "lowest", "chance", "contamination"):
        for a, r in zip(got[key].tolist(), ref, strict=True):
            if r[key] is None:
                assert math.isnan(a), key
            else:
                assert a == pytest.approx(r[key], rel=1e-12, abs=1e-12), key
    slow_names = {"mass_gap_norm": "mass_gap_norm", "tokens_changed_norm": "tokens",
                  "scale_norm": "scale_norm"}
    for key in ("mass_gap", "tokens_changed", "scale"):
        for name in (key, key + blame.NORM):
            for a, r in zip(got[name].tolist(), ref, strict=True):
                r = {**r, name: r[slow_names.get(name, name)]}
                if r[name] is None:
                    assert math.isnan(a), name
                else:  # GRPO in float32 by the library (a return at the mean: ~1e-7)
                    assert a == pytest.approx(r[name], rel=1e-5, abs=1e-5), name
    assert sum(r["blame"] is not None for r in ref) > 0
    # the summaries are the means (ratios of sums) of those values over trajectories
    got["group"] = batch.group.numpy()
    s = blame.summaries(got, resamples=50)
    blames = [r["blame"] for r in ref if r["blame"] is not None]
    assert s["blame"]["mean"] == pytest.approx(sum(blames) / len(blames))
    counted = [r for r in ref if r["tokens"] is not None]
    assert s["tokens_changed"]["mean"] == pytest.approx(
        sum(r["tokens_changed"] for r in counted) / sum(r["tokens"] for r in counted))
    gaps = [r for r in ref if r["mass_gap"] is not None]
    assert s["mass_gap"]["mean"] == pytest.approx(
        sum(r["mass_gap"] for r in gaps) / sum(r["mass_gap_norm"] for r in gaps), rel=1e-5)


def test_grpo_credit_gives_exactly_half_and_no_mass():
    credit, batch = random_case(3)
    from ktae.sim.credit import base_advantages

    grpo = Credit(base_advantages("broadcast", batch), batch.mask, torch.zeros_like(batch.mask))
    got = blame.score(grpo, batch)
    defined = ~np.isnan(got["blame"])
    assert defined.any() and (got["blame"][defined] == 0.5).all()
    assert np.array_equal(got["lowest"][defined], got["chance"][defined])
    assert (got["mass_gap"][defined] == 0).all()
    counted = ~np.isnan(got["tokens_changed_norm"])
    assert (got["tokens_changed"][counted] == 0).all()
    assert np.array_equal(got["scale"][counted], got["scale_norm"][counted])


# ------------------------------------------------------------------ through the simulator


def tiny(**overrides) -> SimConfig:
    base = dict(horizons=(3, 5), n_opts=(2,), group_sizes=(4,), actions=12, steps=6,
                lr=0.5, seeds=2, eval_every=3, audit_groups=6,
                methods=("broadcast", "step", "ktae", "taco-random", "forking-tokens"))
    return SimConfig(**{**base, **overrides})


def test_the_audit_leaves_training_untouched_and_grpo_is_half():
    cfg = tiny()
    with_audit = simulate(cfg)
    without = simulate(dataclasses.replace(cfg, audit_groups=0))
    assert not without.audit
    for key, curve in without.curves.items():
        assert torch.equal(curve, with_audit.curves[key]), key
    for key, rate in without.flag_rates.items():
        assert torch.equal(rate, with_audit.flag_rates[key]), key
    assert {u for _, _, u in with_audit.audit} == {0, 6}
    summ = audit_summaries(with_audit)
    for update in (0, 6):
        grpo = summ[update]["broadcast"]["all"]
        assert grpo["blame"]["mean"] == 0.5 and grpo["blame"]["low"] == 0.5
        assert grpo["lowest"]["mean"] == pytest.approx(grpo["chance"]["mean"])
        assert grpo["mass_gap"]["mean"] == 0 and grpo["tokens_changed"]["mean"] == 0
        assert grpo["scale"]["mean"] == pytest.approx(1.0)
        assert grpo["contamination_vs_grpo"]["mean"] == 0
        # the step oracle gives its credit to optimal steps: blame far above chance
        assert summ[update]["step"]["all"]["blame"]["mean"] > 0.8


def test_probe_groups_at_update_zero_are_shared_by_the_methods():
    cfg = tiny(audit_updates=(0, 3))
    result = simulate(cfg)
    for s in cfg.settings():
        base = result.audit[("broadcast", s, 0)]
        assert len(base["group"]) == cfg.seeds * cfg.audit_groups * s.group_size
        assert len(np.unique(base["group"])) == cfg.seeds * cfg.audit_groups
        for m in cfg.method_names:  # same policy, same draws: the same trajectories
            np.testing.assert_array_equal(result.audit[(m, s, 0)]["chance"], base["chance"])
            np.testing.assert_array_equal(result.audit[(m, s, 0)]["tokens_changed_norm"],
                                          base["tokens_changed_norm"])
    assert {u for _, _, u in result.audit} == {0, 3}
    # the scored probe groups are what the method gives the policy's samples, per group
    again = simulate(cfg)
    for key, values in result.audit.items():
        for name, v in values.items():
            np.testing.assert_array_equal(v, again.audit[key][name])


def test_json_and_markdown_carry_every_figure(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["simulate", "--actions", "12", "--steps", "4", "--seeds", "2",
                 "--eval-every", "2", "--horizon", "3", "--n-opt", "2", "--group-size", "4",
                 "--methods", "broadcast,step,ktae", "--threads", "1", "--no-progress",
                 "--audit-groups", "3", "--audit-at", "2", "-o", str(out)]) == 0
    data = json.loads((out / "curves.json").read_text())
    assert data["audit"]["updates"] == [2] and data["audit"]["groups_per_run"] == 3
    entry = data["audit"]["results"]["2"]["ktae"]["all"]
    assert set(entry) == set(blame.FIGURES)
    assert entry["blame"]["groups"] <= 6
    text = (out / "results.md").read_text()
    assert "## Credit on the MDP's exact labels" in text and "### Update 2" in text
    assert "| step |" in text and "mass gap" in text
    printed = capsys.readouterr().out
    assert "Credit on the MDP's exact labels at update 2" in printed
    assert "  broadcast: blame 0.500" in printed
    # --audit-groups 0: no audit anywhere
    out0 = tmp_path / "none"
    assert main(["simulate", "--actions", "12", "--steps", "4", "--seeds", "2",
                 "--eval-every", "2", "--horizon", "3", "--n-opt", "2", "--group-size", "4",
                 "--methods", "broadcast", "--threads", "1", "--no-progress",
                 "--audit-groups", "0", "-o", str(out0)]) == 0
    assert json.loads((out0 / "curves.json").read_text())["audit"]["updates"] == []
    assert "exact labels" not in (out0 / "results.md").read_text()


@pytest.mark.parametrize("overrides, match", [
    (dict(audit_groups=-1), "audit_groups"),
    (dict(audit_updates=(7,)), "audit_updates"),
    (dict(audit_updates=()), "audit_updates"),
])
def test_bad_audit_settings(overrides, match):
    with pytest.raises(ValueError, match=f"^{match}"):
        tiny(**overrides)


def test_default_audit_is_initial_and_final_policy():
    assert tiny().audited_updates() == [0, 6]
    assert tiny(audit_groups=0).audited_updates() == []
    assert "audit" in to_json(simulate(tiny(steps=2, audit_groups=0, seeds=1)))
