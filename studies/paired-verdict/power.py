"""How many paired seeds give a 95% interval of at most ±5 points on a difference of arms.

A ``[problems, seeds]`` difference matrix ``D`` (arm minus arm, per problem and seed) is
read as crossed random effects, ``D[p, s] = mu + a_s + b_p + e_ps``: the seed's effect on
the difference (``sigma_s``), the problem's (``sigma_p``: a problem one arm gets right
more often) and the rest (``sigma_e``). Their variances come from the two-way ANOVA's
mean squares (:func:`components`; a negative estimate is taken as 0). A study with ``S``
paired seeds on ``P`` problems then has ``se^2 = sigma_s^2 / S + sigma_p^2 / P +
sigma_e^2 / (S P)`` and a half-width of ``t(0.975, S - 1) * se``; :func:`seeds_needed` is
the smallest ``S`` that reaches the target.

    python studies/paired-verdict/power.py [--half-width 0.05] [--problems 200]

prints the seeds needed for KTAE − GRPO and KTAE − the length control from the 5-seed
study's records (must-end scoring); the plan takes the same function over the pilot's
variance.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats as sps

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "verdict-5seed")]

MAX_SEEDS = 500


def components(d) -> dict:
    """``{"seed", "problem", "residual"}`` variance components of a ``[problems, seeds]``
    matrix (two-way random effects without replication, method of moments).

    Raises:
        ValueError: fewer than 2 problems or 2 seeds.
    """
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
    return {"seed": max(0.0, (ms_seed - ms_resid) / p),
            "problem": max(0.0, (ms_problem - ms_resid) / s), "residual": ms_resid}


def half_width(parts: dict, seeds: int, problems: int, level: float = 0.95) -> float:
    se2 = (parts["seed"] / seeds + parts["problem"] / problems
           + parts["residual"] / (seeds * problems))
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


def main(argv: list[str] | None = None) -> int:
    import rescore
    import verdict_analysis as old

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=Path, default=old.RECORDS)
    p.add_argument("--half-width", type=float, default=0.05)
    p.add_argument("--problems", type=int, default=200)
    args = p.parse_args(argv)
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
