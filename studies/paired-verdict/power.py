"""How many paired seeds give a 95% interval of at most ±5 points on a difference of arms.

A ``[problems, seeds]`` difference matrix ``D`` (arm minus arm, per problem and seed) is
read as crossed random effects, ``D[p, s] = mu + a_s + b_p + e_ps``: the seed's effect on
the difference (``sigma_s``), the problem's (``sigma_p``: a problem one arm gets right
more often) and the rest (``sigma_e``). Their variances come from the two-way ANOVA's
mean squares (:func:`components`; a negative estimate is taken as 0). The verdict's
interval on ``S`` paired seeds and ``P`` problems then has ``se^2 = sigma_s^2 / S +
sigma_p^2 / P + 2 sigma_e^2 / (S P)`` (it counts the residual in both terms) and a
half-width of at most ``t(0.975, S - 1) * se`` (:func:`half_width`); :func:`seeds_needed`
is the smallest ``S`` that reaches the target.

    python studies/paired-verdict/power.py [--half-width 0.05] [--problems 200]

prints the seeds needed for KTAE − GRPO and KTAE − the length control from the 5-seed
study's records (must-end scoring).

    python studies/paired-verdict/power.py --pilot lr2e-4-p4g8-t96 --steps 24,30

takes the pilot's variance instead: the pilot ran plain GRPO only, so its components are
one arm's (:func:`arm_components`, on each problem's mean over the outcome's evaluations),
and a difference of two arms with those components has (:func:`difference_components`)
``sigma_s^2 = 2 (1 - r_s) sigma_s,arm^2`` and ``sigma_e^2 = 2 (1 - r_e) sigma_e,arm^2``,
with the arms' correlations ``r`` read from the 5-seed study (its GRPO and KTAE runs at
the setting given) or 0 (arms independent: the most seeds). The problem-by-arm share is
the 5-seed study's. The seeds' variance is its ``--upper`` (80%) one-sided upper
confidence limit from the pilot's seeds (:func:`components`), the usual guard when a
pilot's variance sets a study's size (Browne, 1995).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats as sps

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "verdict-5seed")]

MAX_SEEDS = 500


def components(d, upper: float | None = None) -> dict:
    """``{"seed", "problem", "residual"}`` variance components of a ``[problems, seeds]``
    matrix (two-way random effects without replication, method of moments). With
    ``upper`` (a confidence level such as 0.8), the seed component is its one-sided upper
    confidence limit instead: the seeds' mean square at its ``upper`` chi-square limit,
    ``(s - 1) MS_seed / chi2(1 - upper, s - 1)``, less the residual's (a pilot of a few
    seeds estimates it loosely, and a study planned on the point estimate is too small
    about half the time).

    Raises:
        ValueError: fewer than 2 problems or 2 seeds, or ``upper`` outside (0, 1).
    """
    if upper is not None and not 0 < upper < 1:
        raise ValueError(f"upper: expected a confidence level in (0, 1), got {upper!r}")
    d = np.asarray(d, dtype=float)
    if d.ndim != 2 or min(d.shape) < 2:
        raise ValueError(f"d: expected a [problems, seeds] matrix with at least 2 of each, got "
                         f"shape {d.shape}")
    p, s = d.shape
    rows, cols, grand = d.mean(axis=1), d.mean(axis=0), d.mean()
    ms_seed = p * ((cols - grand) ** 2).sum() / (s - 1)
    ms_problem = s * ((rows - grand) ** 2).sum() / (p - 1)
    resid = d - rows[:, None] - cols[None, :] + grand
    ms_resid = (resid ** 2).sum() / ((p - 1) * (s - 1))
    if upper is not None:
        ms_seed = (s - 1) * ms_seed / float(sps.chi2.ppf(1 - upper, s - 1))
    return {"seed": max(0.0, (ms_seed - ms_resid) / p),
            "problem": max(0.0, (ms_problem - ms_resid) / s), "residual": ms_resid}


def arm_components(a, upper: float | None = None) -> dict:
    """:func:`components` of one arm's ``[problems, seeds]`` outcome matrix."""
    return components(a, upper)


def correlations(a, b) -> dict:
    """The seed-level and residual correlations of two arms' ``[problems, seeds]`` outcomes
    run on the same seeds: ``r = (v_a + v_b - v_{a-b}) / (2 sqrt(v_a v_b))`` per component
    (0 where an arm has no spread), clipped to [-1, 1]."""
    pa, pb, pd = components(a), components(b), components(np.asarray(a) - np.asarray(b))
    out = {}
    for part in ("seed", "residual"):
        denom = 2 * math.sqrt(pa[part] * pb[part])
        r = (pa[part] + pb[part] - pd[part]) / denom if denom > 0 else 0.0
        out[part] = float(min(1.0, max(-1.0, r)))
    return out


def difference_components(arm: dict, r: dict, problem: float) -> dict:
    """Components of a difference of two arms that each have ``arm``'s components and
    correlate by ``r`` (``{"seed", "residual"}``); ``problem`` is the problem-by-arm
    variance."""
    for part in ("seed", "residual"):
        if not -1.0 <= r[part] <= 1.0:
            raise ValueError(f"r[{part!r}]: expected a correlation in [-1, 1], got {r[part]}")
    return {"seed": 2 * (1 - r["seed"]) * arm["seed"], "problem": float(problem),
            "residual": 2 * (1 - r["residual"]) * arm["residual"]}


def pilot_outcomes(records: Path, point: str, seeds, steps) -> np.ndarray:
    """``[problems, seeds]``: each problem's mean correctness over the evaluations at
    ``steps`` of the pilot's recorded runs of ``point`` (a cut-off answer is wrong in the
    records already)."""
    import final

    return np.stack([final.outcomes(records, f"{point}-s{seed}", steps) for seed in seeds],
                    axis=1)


def half_width(parts: dict, seeds: int, problems: int, level: float = 0.95) -> float:
    """The half-width of the verdict's interval (``stats.paired_interval``) on a difference
    with components ``parts``: its variance counts the residual once in the seeds' term and
    once in the problems' (as the interval does), its degrees of freedom are the seeds'
    (at most the interval's)."""
    se2 = (parts["seed"] / seeds + parts["problem"] / problems
           + 2 * parts["residual"] / (seeds * problems))
    return float(sps.t.ppf(0.5 + level / 2, seeds - 1)) * math.sqrt(se2)


def seeds_needed(parts: dict, *, target: float = 0.05, problems: int = 200,
                 level: float = 0.95) -> int | None:
    """The smallest number of paired seeds (at least 2) whose half-width is at most
    ``target``; None when even :data:`MAX_SEEDS` do not reach it (the problems' share
    alone is too wide: more problems are needed)."""
    for seeds in range(2, MAX_SEEDS + 1):
        if half_width(parts, seeds, problems, level) <= target:
            return seeds
    return None


def from_pilot(args, old, rescore) -> int:
    import pilot

    seeds = [s for s in pilot.DEV_SEEDS
             if (pilot.RECORDS / pilot.run_name(args.pilot, s) / "eval.jsonl").exists()]
    if len(seeds) < 2:
        print(f"power: --pilot: {args.pilot} has {len(seeds)} recorded seeds; at least 2 "
              "are needed", file=sys.stderr)
        return 2
    outcomes = pilot_outcomes(pilot.RECORDS, args.pilot, seeds, args.steps)
    point, arm = arm_components(outcomes), arm_components(outcomes, args.upper)
    print(f"pilot `{args.pilot}`, seeds {', '.join(map(str, seeds))}, outcome: the mean of "
          f"the evaluations at steps {', '.join(map(str, args.steps))}; GRPO's sd of seeds "
          f"{100 * math.sqrt(point['seed']):.1f} points (its {100 * args.upper:g}% upper "
          f"confidence limit {100 * math.sqrt(arm['seed']):.1f}, which the seeds below "
          f"take), residual sd {100 * math.sqrt(arm['residual']):.1f}\n")
    print("| correlations from | comparison | r (seeds) | r (residual) | sd of seeds | "
          "sd of problems | residual sd | paired seeds for "
          f"±{100 * args.half_width:g} points |")
    print("|---|---|---|---|---|---|---|---|")
    for setting in old.SETTINGS:
        runs = old.load_setting(args.records, setting)
        mats = {a: np.stack([rescore.scored(r, "after", "wrong") for r in runs[a]], axis=1)
                for a in ("grpo", "ktae", "length")}
        for against in ("grpo", "length"):
            problem = components(mats["ktae"] - mats[against])["problem"]
            for source, r in ((f"`{setting}`", correlations(mats["ktae"], mats[against])),
                              ("none (independent)", {"seed": 0.0, "residual": 0.0})):
                parts = difference_components(arm, r, problem)
                need = seeds_needed(parts, target=args.half_width, problems=args.problems)
                print(f"| {source} | {old.ARM_LABELS['ktae']} − {old.ARM_LABELS[against]} | "
                      f"{r['seed']:.2f} | {r['residual']:.2f} | "
                      f"{100 * math.sqrt(parts['seed']):.1f} | "
                      f"{100 * math.sqrt(parts['problem']):.1f} | "
                      f"{100 * math.sqrt(parts['residual']):.1f} | "
                      f"{need if need is not None else f'more than {MAX_SEEDS}'} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    import rescore
    import verdict_analysis as old

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=Path, default=old.RECORDS)
    p.add_argument("--half-width", type=float, default=0.05)
    p.add_argument("--problems", type=int, default=200)
    p.add_argument("--pilot", help="a pilot grid point: take its GRPO variance")
    p.add_argument("--steps", default="24,30",
                   help="with --pilot: the evaluated steps the outcome averages")
    p.add_argument("--upper", type=float, default=0.8,
                   help="with --pilot: the upper confidence level of the seeds' variance")
    args = p.parse_args(argv)
    if not 0 < args.upper < 1:
        print(f"power: --upper: expected a confidence level in (0, 1), got {args.upper}",
              file=sys.stderr)
        return 2
    try:
        args.steps = [int(x) for x in args.steps.split(",")]
    except ValueError:
        print(f"power: --steps: expected comma-separated step numbers, got {args.steps!r}",
              file=sys.stderr)
        return 2
    if args.pilot is not None:
        return from_pilot(args, old, rescore)
    print("| setting | comparison | sd of seeds | sd of problems | residual sd | half-width "
          "at 5 seeds | paired seeds for ±"
          f"{100 * args.half_width:g} points |")
    print("|---|---|---|---|---|---|---|")
    for setting in old.SETTINGS:
        runs = old.load_setting(args.records, setting)
        for arm, against in (("ktae", "grpo"), ("ktae", "length")):
            a = np.stack([rescore.scored(r, "after", "wrong") for r in runs[arm]], axis=1)
            b = np.stack([rescore.scored(r, "after", "wrong") for r in runs[against]], axis=1)
            parts = components(a - b)
            need = seeds_needed(parts, target=args.half_width, problems=args.problems)
            print(f"| `{setting}` | {old.ARM_LABELS[arm]} − {old.ARM_LABELS[against]} | "
                  f"{100 * math.sqrt(parts['seed']):.1f} | "
                  f"{100 * math.sqrt(parts['problem']):.1f} | "
                  f"{100 * math.sqrt(parts['residual']):.1f} | "
                  f"±{100 * half_width(parts, 5, args.problems):.1f} | "
                  f"{need if need is not None else f'more than {MAX_SEEDS}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
