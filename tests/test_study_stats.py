"""The studies' statistics on cases with known answers: the paired interval over seeds and
problems, the exact sign-flip test, Holm's step-down, the labels; the coverage simulation
and the re-scoring of the 5-seed study run from their scripts."""

from __future__ import annotations

import importlib.util
import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

STUDIES = Path(__file__).resolve().parents[1] / "studies"
sys.path.insert(0, str(STUDIES))

import stats  # noqa: E402


def _script(name: str):
    path = STUDIES / "paired-verdict" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"paired_verdict_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_problem_is_the_paired_t_interval_over_seeds():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.4, 0.1, 7), rng.normal(0.35, 0.1, 7)
    got = stats.paired_interval((a - b)[None, :])
    ref = sps.ttest_rel(a, b)
    ci = ref.confidence_interval(0.95)
    assert got["p"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert (got["low"], got["high"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert got["df"] == pytest.approx(6) and got["se_problems"] is None


def test_one_seed_is_the_t_interval_over_problems():
    d = np.array([[1.0], [0.0], [0.0], [-1.0], [1.0], [1.0]])
    got = stats.paired_interval(d)
    ref = sps.ttest_1samp(d[:, 0], 0.0)
    assert got["p"] == pytest.approx(ref.pvalue, rel=1e-9) and got["df"] == pytest.approx(5)


def test_both_sources_add_with_satterthwaites_degrees_of_freedom():
    seeds = np.array([0.1, -0.2, 0.3, 0.0])
    problems = np.array([0.5, -0.5, 0.25, -0.25, 0.0])
    d = problems[:, None] + seeds[None, :]
    got = stats.paired_interval(d)
    v_s = seeds.var(ddof=1) / 4  # the column means are the seed effects plus a constant
    v_p = problems.var(ddof=1) / 5
    df = (v_s + v_p) ** 2 / (v_s ** 2 / 3 + v_p ** 2 / 4)
    assert got["se"] == pytest.approx(math.sqrt(v_s + v_p)) and got["df"] == pytest.approx(df)
    half = sps.t.ppf(0.975, df) * math.sqrt(v_s + v_p)
    assert got["high"] - got["diff"] == pytest.approx(half)


def test_paired_interval_degenerate_and_bad_input():
    flat = stats.paired_interval(np.zeros((3, 4)))
    assert flat["diff"] == 0.0 and flat["p"] is None and flat["low"] is None
    with pytest.raises(ValueError, match=r"d: expected a \[problems, seeds\] matrix"):
        stats.paired_interval(np.zeros(4))
    with pytest.raises(ValueError, match="level: expected a number in"):
        stats.paired_interval(np.ones((2, 2)), level=1.5)


def test_sign_flip_p_by_enumeration():
    x = np.array([0.3, 0.1, -0.05, 0.2])
    means = [abs(np.dot(s, x)) / 4 for s in itertools.product((1, -1), repeat=4)]
    assert stats.sign_flip_p(x) == pytest.approx(np.mean(np.array(means) >= abs(x.mean())))
    five = stats.sign_flip_interval([0.2, 0.3, 0.25, 0.1, 0.15])
    assert five["p"] == pytest.approx(2 / 32) and five["min_p"] == pytest.approx(0.0625)
    assert five["low"] < 0.1 and five["high"] > 0.3  # never excludes at 5 seeds...
    six = stats.sign_flip_interval([0.2, 0.3, 0.25, 0.1, 0.15, 0.22])
    assert six["p"] == pytest.approx(2 / 64) and six["low"] > 0  # ...six seeds can


def test_holm_on_a_known_family():
    h = stats.holm([0.01, 0.04, 0.03, 0.005, None])
    assert h["adjusted"][:4] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert h["reject"] == [True, False, False, True, False]
    assert h["levels"][:4] == pytest.approx([1 - 0.05 / 3, 1 - 0.05, 1 - 0.05 / 2,
                                             1 - 0.05 / 4])
    assert h["adjusted"][4] is None and h["levels"][4] is None


def test_holm_against_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(50):
        p = list(rng.uniform(0, 0.2, 6))
        order = np.argsort(p)
        expected = np.empty(6)
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (6 - rank) * p[i]))
            expected[i] = running
        assert stats.holm(p)["adjusted"] == pytest.approx(list(expected))


def test_labels_need_the_corrected_rejection_and_survive_dropping_a_seed():
    assert stats.label(0.1, True) == "helps" and stats.label(-0.1, True) == "hurts"
    assert stats.label(0.1, False) == "no evidence"
    rng = np.random.default_rng(2)
    big = 0.4 + 0.02 * rng.standard_normal((50, 8))  # a large, steady difference
    null = rng.choice([-1.0, 0.0, 1.0], size=(50, 8))
    labels = stats.drop_one_labels([big, null], 0)
    assert labels == ["helps"] * 8
    assert set(stats.drop_one_labels([big, null], 1)) == {"no evidence"}


def test_coverage_simulation_runs_and_the_paired_interval_holds_its_level():
    coverage = _script("coverage")
    var = {"theta": list(np.linspace(-2, 2, 41)), "seed_sd": 0.8, "correlation": 0.5}
    out = coverage.coverage(var, sims=300, seeds=5, boot_draws=200, problems=60)
    paired = out["intervals"]["paired"]
    # 300 draws: a 95% interval's coverage lies within about 2.5 points of 95%
    assert paired["coverage"] >= 0.92 and out["truth"] == 0.0
    assert set(out["intervals"]) == {"paired", "paired-seeds", "bootstrap", "welch"}
    shifted = coverage.coverage(var, sims=50, seeds=5, boot_draws=100, problems=60,
                                effect=0.5)
    assert shifted["truth"] > 0.05


def test_rescoring_counts_every_cut_off_answer_wrong():
    rescore = _script("rescore")
    run = {"after": {"correct": np.array([1.0, 1.0, 0.0]),
                     "truncated": np.array([0.0, 1.0, 1.0])}}
    assert list(rescore.scored(run, "after", "wrong")) == [1.0, 0.0, 0.0]
    assert list(rescore.scored(run, "after", "read")) == [1.0, 1.0, 0.0]


def test_power_components_recover_known_variances_and_count_seeds():
    power = _script("power")
    rng = np.random.default_rng(3)
    p, s = 400, 300
    d = (0.05 + 0.10 * rng.standard_normal(s)[None, :] + 0.20 * rng.standard_normal(p)[:, None]
         + 0.50 * rng.standard_normal((p, s)))
    parts = power.components(d)
    assert parts["seed"] == pytest.approx(0.10 ** 2, rel=0.2)
    assert parts["problem"] == pytest.approx(0.20 ** 2, rel=0.2)
    assert parts["residual"] == pytest.approx(0.50 ** 2, rel=0.02)
    known = {"seed": 0.01, "problem": 0.0, "residual": 0.0}
    # 0.1 * t(0.975, S - 1) / sqrt(S) <= 0.05 first holds at S = 18 (2.110 * 0.1 / 4.243 = 0.0497)
    need = power.seeds_needed(known, target=0.05, problems=200)
    assert power.half_width(known, need, 200) <= 0.05 < power.half_width(known, need - 1, 200)
    assert need == 18
    assert power.seeds_needed({"seed": 0.0, "problem": 1.0, "residual": 0.0},
                              target=0.05, problems=200) is None
    with pytest.raises(ValueError, match="at least 2 of each"):
        power.components(np.ones((1, 5)))


def test_power_upper_limit_of_the_seeds_variance_covers_it_as_often_as_its_level():
    """The seed component's upper confidence limit: the chi-square limit of the seeds' mean
    square, by hand on one matrix, and at or above the true variance in about ``upper`` of
    simulated 5-seed pilots (the point estimate: about half of them)."""
    from scipy import stats as sps

    power = _script("power")
    rng = np.random.default_rng(11)
    p, s, sd_seed, sd_e = 200, 5, 0.05, 0.3
    d = (sd_seed * rng.standard_normal(s)[None, :] + sd_e * rng.standard_normal((p, s)))
    cols, grand = d.mean(axis=0), d.mean()
    ms_seed = p * ((cols - grand) ** 2).sum() / (s - 1)
    ms_resid = power.components(d)["residual"]
    limit = (s - 1) * ms_seed / sps.chi2.ppf(0.2, s - 1)
    assert power.components(d, 0.8)["seed"] == pytest.approx((limit - ms_resid) / p)
    assert power.components(d, 0.8)["residual"] == ms_resid
    covered = point = 0
    for _ in range(2000):
        d = (sd_seed * rng.standard_normal(s)[None, :] + sd_e * rng.standard_normal((p, s)))
        covered += power.components(d, 0.8)["seed"] >= sd_seed ** 2
        point += power.components(d)["seed"] >= sd_seed ** 2
    assert 0.76 <= covered / 2000 <= 0.84
    assert point / 2000 < 0.6
    with pytest.raises(ValueError, match=r"upper: expected a confidence level in \(0, 1\)"):
        power.components(d, 1.0)


def test_power_reads_arm_correlations_and_builds_a_difference_from_one_arm():
    power = _script("power")
    rng = np.random.default_rng(5)
    p, s = 300, 400
    seed = rng.standard_normal(s)
    # arm b's seed effect is 0.6 * a's plus an independent 0.8 share: r = 0.6 at the seed level
    a = 0.10 * seed[None, :] + 0.30 * rng.standard_normal((p, s))
    b = 0.10 * (0.6 * seed + 0.8 * rng.standard_normal(s))[None, :] + 0.30 * rng.standard_normal((p, s))
    r = power.correlations(a, b)
    assert r["seed"] == pytest.approx(0.6, abs=0.1)
    assert r["residual"] == pytest.approx(0.0, abs=0.02)
    arm = {"seed": 0.04, "problem": 0.09, "residual": 0.25}
    diff = power.difference_components(arm, {"seed": 0.75, "residual": 0.5}, problem=0.01)
    assert diff == pytest.approx({"seed": 0.02, "problem": 0.01, "residual": 0.25})
    # independent arms need the most seeds; correlated ones fewer
    n0 = power.seeds_needed(power.difference_components(arm, {"seed": 0.0, "residual": 0.0}, 0.0))
    n1 = power.seeds_needed(diff)
    assert n1 < n0
    with pytest.raises(ValueError, match=r"r\['seed'\]: expected a correlation"):
        power.difference_components(arm, {"seed": 1.5, "residual": 0.0}, 0.0)


def test_power_reads_the_pilots_outcome_as_the_mean_of_its_evaluations(tmp_path):
    import json

    power = _script("power")
    for seed, rows in ((1, [[1, 0], [1, 1]]), (2, [[0, 0], [1, 0]])):
        folder = tmp_path / f"pt-s{seed}"
        folder.mkdir()
        evals = [{"step": st, "problems": [{"correct": bool(c)} for c in row]}
                 for st, row in zip((24, 30), rows, strict=True)]
        evals.insert(0, {"step": 0, "problems": [{"correct": True}, {"correct": True}]})
        (folder / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    out = power.pilot_outcomes(tmp_path, "pt", (1, 2), (24, 30))
    assert out.tolist() == [[1.0, 0.5], [0.5, 0.0]]
    with pytest.raises(ValueError, match=r"steps: pt-s1 has no evaluation at \[18\]"):
        power.pilot_outcomes(tmp_path, "pt", (1,), (18, 24))
