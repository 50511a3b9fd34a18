"""Coverage of the verdict's intervals, by simulation on the 5-seed study's own variance.

A simulated study has two arms, ``S`` paired seeds and ``P`` held-out problems drawn from a
population of problems, with a known true difference of the arms' expected accuracy
(0 under the null). Each response is right with probability
``sigmoid(theta_p + u_{arm,s} + delta_{arm,p})``:

* ``theta_p``: the problem's difficulty, drawn from the logits of the 5-seed study's
  per-problem accuracies over its 50 runs (must-end scoring);
* ``u_{arm,s}``: the run's seed effect, normal with the sd of the study's per-seed
  logit accuracies, correlated across the two arms of a seed at the study's paired
  correlation (a seed fixes the prompt order);
* ``delta_{arm,p}``: the problem-by-arm interaction, normal with sd :data:`TAU` (what the
  problems add to the variance of a difference).

Under these, each interval's coverage of the true difference (the expected accuracy
difference over the problem population and seeds, computed by Monte Carlo) is counted:

* ``paired``: :func:`stats.paired_interval`, over seeds and problems (the verdict's);
* ``paired-seeds``: the paired t interval over the per-seed differences alone;
* ``bootstrap``: the 5-seed plan's percentile bootstrap over seeds and problems;
* ``welch``: Welch's interval over the per-seed accuracies, unpaired.

    python studies/paired-verdict/coverage.py [--sims 2000] [--seeds 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats as sps

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "verdict-5seed")]

import stats  # noqa: E402

TAU = 0.5
"""The sd of the problem-by-arm interaction on the logit scale."""
PROBLEMS = 200


def study_variance(records: Path) -> dict:
    """From the 5-seed study's records (must-end scoring, accuracy after training): the
    per-problem accuracy logits pooled over every run, the sd of the per-seed accuracy
    logits within an arm and setting, and the mean correlation of two arms' per-seed
    accuracies over the seeds they share."""
    import verdict_analysis as old

    per_problem, sds, correlations = [], [], []
    for setting in old.SETTINGS:
        if not old.shared_seeds(records, setting):
            continue
        runs = old.load_setting(records, setting)
        acc = {}
        for arm, rs in runs.items():
            right = np.stack([r["after"]["correct"] * (1 - r["after"]["truncated"])
                              for r in rs], axis=1)
            per_problem.append(right)
            acc[arm] = right.mean(axis=0)
            sds.append(np.std(_logit(acc[arm]), ddof=1))
        arms = list(acc)
        for i, a in enumerate(arms):
            for b in arms[i + 1:]:
                correlations.append(np.corrcoef(acc[a], acc[b])[0, 1])
    if not per_problem:
        raise ValueError(f"records: no recorded run of the 5-seed study under {records}")
    pooled = np.concatenate(per_problem, axis=1).mean(axis=1)
    return {"theta": _logit(pooled).tolist(), "seed_sd": float(np.mean(sds)),
            "correlation": float(np.mean(correlations))}


def _logit(p) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=float), 0.01, 0.99)
    return np.log(p / (1 - p))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def draw(rng, var: dict, seeds: int, problems: int, effect: float) -> tuple:
    """One simulated study: two ``[problems, seeds]`` 0/1 matrices (arm B gets ``effect``
    added to its logits)."""
    theta = rng.choice(np.asarray(var["theta"]), size=problems)
    rho, sd = var["correlation"], var["seed_sd"]
    shared = rng.standard_normal(seeds)
    u = [sd * (math.sqrt(rho) * shared + math.sqrt(1 - rho) * rng.standard_normal(seeds))
         for _ in range(2)]
    delta = [TAU * rng.standard_normal(problems) for _ in range(2)]
    arms = []
    for k in range(2):
        logits = theta[:, None] + u[k][None, :] + delta[k][:, None] + (effect if k else 0.0)
        arms.append((rng.random(logits.shape) < _sigmoid(logits)).astype(float))
    return arms[1], arms[0]


def true_difference(var: dict, effect: float, *, draws: int = 400_000, seed: int = 1) -> float:
    """The expected accuracy difference over problems, seeds and interactions (0 with no
    effect: the arms are then drawn alike)."""
    if effect == 0:
        return 0.0
    rng = np.random.default_rng(seed)
    theta = rng.choice(np.asarray(var["theta"]), size=draws)
    sd = var["seed_sd"]
    a = _sigmoid(theta + sd * rng.standard_normal(draws) + TAU * rng.standard_normal(draws)
                 + effect)
    b = _sigmoid(theta + sd * rng.standard_normal(draws) + TAU * rng.standard_normal(draws))
    return float(a.mean() - b.mean())


def intervals(a: np.ndarray, b: np.ndarray, rng, *, boot_draws: int) -> dict:
    import verdict_analysis as old
    from stats import welch

    d = a - b
    per_seed = d.mean(axis=0)
    n = per_seed.size
    half = sps.t.ppf(0.975, n - 1) * per_seed.std(ddof=1) / math.sqrt(n)
    boot = old.two_level_bootstrap(a, b, draws=boot_draws, seed=int(rng.integers(2**31)))
    w = welch(a.mean(axis=0), b.mean(axis=0))
    p = stats.paired_interval(d)
    return {"paired": (p["low"], p["high"]),
            "paired-seeds": (per_seed.mean() - half, per_seed.mean() + half),
            "bootstrap": (boot["low"], boot["high"]), "welch": (w["low"], w["high"])}


def coverage(var: dict, *, sims: int, seeds: int, effect: float = 0.0, seed: int = 0,
             boot_draws: int = 2000, problems: int = PROBLEMS) -> dict:
    """Each interval's share of ``sims`` simulated studies covering the true difference,
    its mean half-width, and the share that exclude 0."""
    truth = true_difference(var, effect)
    rng = np.random.default_rng(seed)
    hits, widths, excl = {}, {}, {}
    for _ in range(sims):
        a, b = draw(rng, var, seeds, problems, effect)
        for name, (low, high) in intervals(a, b, rng, boot_draws=boot_draws).items():
            if low is None:
                continue
            hits[name] = hits.get(name, 0) + (low <= truth <= high)
            widths.setdefault(name, []).append((high - low) / 2)
            excl[name] = excl.get(name, 0) + (low > 0 or high < 0)
    return {"truth": truth, "sims": sims, "seeds": seeds, "effect": effect,
            "intervals": {k: {"coverage": hits[k] / sims, "half_width": float(np.mean(widths[k])),
                              "excludes_0": excl[k] / sims} for k in hits}}


def main(argv: list[str] | None = None) -> int:
    import verdict_analysis as old

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=Path, default=old.RECORDS)
    p.add_argument("--sims", type=int, default=2000)
    p.add_argument("--seeds", type=int, default=5, help="paired seeds per simulated study")
    p.add_argument("--boot-draws", type=int, default=2000)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.sims < 1 or args.seeds < 2:
        print("coverage: --sims >= 1 and --seeds >= 2 expected", file=sys.stderr)
        return 2
    var = study_variance(args.records)
    result = coverage(var, sims=args.sims, seeds=args.seeds, boot_draws=args.boot_draws)
    result["variance"] = {"seed_sd_logit": var["seed_sd"], "correlation": var["correlation"],
                          "tau": TAU, "problems_in_pool": len(var["theta"])}
    print(f"{args.sims} simulated studies of {args.seeds} paired seeds x {PROBLEMS} problems "
          f"(seed sd {var['seed_sd']:.2f} logits, paired correlation {var['correlation']:.2f}, "
          f"interaction sd {TAU}); true difference {100 * result['truth']:+.2f} points")
    print("| interval | coverage of the true difference (nominal 95%) | mean half-width "
          "(points) | excludes 0 |")
    print("|---|---|---|---|")
    for name, r in result["intervals"].items():
        print(f"| {name} | {100 * r['coverage']:.1f}% | {100 * r['half_width']:.1f} | "
              f"{100 * r['excludes_0']:.1f}% |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
