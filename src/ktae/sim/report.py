"""Numbers from a :class:`~ktae.sim.run.SimResult`: tables, the paper's claims, JSON.

Definitions (all per seed, then mean ± std over seeds; std is the sample std):

* final return: the expected normalised return of the policy after the last update;
* mean return: the area under the evaluation curve divided by the number of updates
  (trapezoid rule), i.e. the average expected return over training;
* steps to target: the first evaluation step whose expected return is >= the target
  (0.9 by default, i.e. 90% of the optimal normalised return 1), or not reached;
* gap: step-level oracle minus broadcast return (final or mean), paired by seed (both
  methods of a seed share the initial logits and the sampling uniforms);
* share of the oracle's gain: ``(method - broadcast) / (oracle - broadcast)`` of the
  returns' means over seeds (0 = broadcast, 1 = the step-level oracle).

Credit audit on the MDP's exact labels (:mod:`ktae.sim.blame`): per method, setting and
audited update, ``ktae audit``'s figures on the probe groups, as means (mass figures:
ratios of sums) with bootstrap 95% intervals over the probe groups of all seeds; "all
settings" pools the groups of every setting.

The paper's claims (TACO paper, section 2.3 and Fig. 4) are checked on the gap's mean
over seeds, once on the final return (where training ends) and once on the mean return
(the whole curve; a method that learns faster but ends at the same return wins there):
step-level beats broadcast (gap > 0 in every setting), and the gap widens with longer
traces (larger H), sparser optimal actions (smaller n_opt) and smaller groups (G): it
grows strictly along the axis in that direction and ends positive.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

import torch

from ktae.sim import blame
from ktae.sim.blame_report import audit_summaries, audit_tables
from ktae.sim.config import AXES, AXIS_LABELS, Setting
from ktae.sim.run import SimResult

BROADCAST, ORACLE = "broadcast", "step"

# For each axis: the direction in which the paper says the gap widens.
WIDENS = {"horizon": ("larger H", False), "n_opt": ("smaller n_opt", True),
          "group_size": ("smaller G", True)}

#: What a claim or a share is measured on: the final return or the mean return.
MEASURES = {"final": "final return", "mean": "mean return over training"}


def mean_return(curves: torch.Tensor, eval_steps: list[int]) -> torch.Tensor:
    """``[seeds]`` area under each curve / number of updates (trapezoid rule)."""
    x = torch.tensor(eval_steps, dtype=torch.float64)
    if len(eval_steps) < 2:
        return curves[:, 0].clone()
    return torch.trapezoid(curves, x, dim=1) / (x[-1] - x[0])


def steps_to_target(curves: torch.Tensor, eval_steps: list[int],
                    target: float) -> list[int | None]:
    """Per seed, the first evaluation step with return >= ``target`` (None: never)."""
    out = []
    for row in (curves >= target).tolist():
        out.append(eval_steps[row.index(True)] if True in row else None)
    return out


def per_seed(result: SimResult, method: str, setting: Setting, measure: str) -> torch.Tensor:
    """``[seeds]`` final return (``measure="final"``) or mean return (``"mean"``)."""
    curves = result.curves[(method, setting)]
    if measure == "final":
        return curves[:, -1]
    if measure == "mean":
        return mean_return(curves, result.eval_steps)
    raise ValueError(f"measure: expected one of {', '.join(MEASURES)}, got {measure!r}")


def mean_std(values) -> tuple[float, float]:
    t = torch.as_tensor(values, dtype=torch.float64)
    std = float(t.std()) if t.numel() > 1 else 0.0
    return float(t.mean()), std


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims as measured: ``held`` is True, False or None (not
    testable with these methods/settings); ``detail`` gives the numbers."""

    text: str
    held: bool | None
    detail: str
    measure: str = "mean"
    """What the gaps were measured on: "final" or "mean" (:data:`MEASURES`)."""


def gaps(result: SimResult, measure: str = "mean") -> dict[Setting, tuple[float, float]] | None:
    """Per setting, the oracle's minus broadcast's final or mean return (mean, std over
    seeds, paired by seed)."""
    names = result.config.method_names
    if BROADCAST not in names or ORACLE not in names:
        return None
    out = {}
    for s in result.config.settings():
        diff = per_seed(result, ORACLE, s, measure) - per_seed(result, BROADCAST, s, measure)
        out[s] = mean_std(diff)
    return out


def claims(result: SimResult, measure: str = "mean") -> list[Claim]:
    """The paper's claims, each checked against this run's gaps on ``measure``."""
    g = gaps(result, measure)
    if g is None:
        why = "needs the methods 'broadcast' and 'step'"
        return [Claim("step-level credit beats broadcast", None, why, measure)] + [
            Claim(f"the gap widens with {WIDENS[a][0]}", None, why, measure) for a in AXES]
    positive = [s for s, (m, _) in g.items() if m > 0]
    first = Claim(
        "step-level credit beats broadcast", len(positive) == len(g),
        f"higher {MEASURES[measure]} in {len(positive)} of {len(g)} settings", measure)
    out = [first]
    for axis in AXES:
        label, descending = WIDENS[axis]
        settings = sorted(result.config.axis_settings(axis),
                          key=lambda s: getattr(s, axis), reverse=descending)
        text = f"the gap widens with {label}"
        values = [g[s][0] for s in settings]
        detail = ", ".join(f"{AXIS_LABELS[axis]}={getattr(s, axis)}: {g[s][0]:+.3f}"
                           for s in settings)
        if len(values) < 2:
            out.append(Claim(text, None, f"one value only ({detail})", measure))
            continue
        widens = all(b > a for a, b in zip(values, values[1:], strict=False))
        held = widens and values[-1] > 0
        note = ""
        if not widens and values[-1] > values[0]:
            note = " (ends ordered, not monotone)"
        out.append(Claim(text, held, detail + note, measure))
    return out


def oracle_shares(result: SimResult, measure: str = "mean"
                  ) -> dict[tuple[str, Setting], float | None] | None:
    """Per (method, setting), the share of the oracle's gain over broadcast on ``measure``
    (None where the oracle and broadcast tie within 1e-12)."""
    names = result.config.method_names
    if BROADCAST not in names or ORACLE not in names:
        return None
    out = {}
    for s in result.config.settings():
        lo = float(per_seed(result, BROADCAST, s, measure).mean())
        span = float(per_seed(result, ORACLE, s, measure).mean()) - lo
        for m in names:
            value = float(per_seed(result, m, s, measure).mean())
            out[(m, s)] = (value - lo) / span if abs(span) > 1e-12 else None
    return out


def landing(result: SimResult) -> dict[str, dict]:
    """Where each method lands: its mean return averaged over all settings (mean and
    std over seeds), that as a share of the way from broadcast (0) to the step-level
    oracle (1), and the share of tokens its calibration flagged (None without one)."""
    settings = result.config.settings()
    avg = {}
    for m in result.config.method_names:
        per_seed = torch.stack([mean_return(result.curves[(m, s)], result.eval_steps)
                                for s in settings]).mean(0)
        avg[m] = mean_std(per_seed)
    out = {}
    span = None
    if BROADCAST in avg and ORACLE in avg:
        span = avg[ORACLE][0] - avg[BROADCAST][0]
    for m, (mean, std) in avg.items():
        share = None
        if span is not None and abs(span) > 1e-12:
            share = (mean - avg[BROADCAST][0]) / span
        flags = [result.flag_rates[(m, s)] for s in settings if (m, s) in result.flag_rates]
        flag_rate = float(torch.stack(flags).mean()) if flags else None
        out[m] = {"mean_return": mean, "std": std, "share_of_oracle_gain": share,
                  "flag_rate": flag_rate}
    return out


def _fmt_steps(values: list[int | None]) -> str:
    reached = [v for v in values if v is not None]
    if not reached:
        return "—"
    mean, std = mean_std(reached)
    if len(reached) == len(values):
        return f"{mean:.0f} ± {std:.0f}"
    return f"{mean:.0f} ({len(reached)}/{len(values)})"


def axis_tables(result: SimResult, axis: str) -> str:
    """Markdown tables of one axis: final return, mean return, steps to target."""
    cfg = result.config
    settings = cfg.axis_settings(axis)
    label = AXIS_LABELS[axis]
    head = "| method | " + " | ".join(f"{label} = {getattr(s, axis)}" for s in settings) + " |"
    rule = "|---|" + "---|" * len(settings)
    fixed = ", ".join(f"{AXIS_LABELS[a]} = {getattr(cfg.base, a)}" for a in AXES if a != axis)
    blocks = []
    for title, cell in (
        ("final normalised return", lambda c: "{:.3f} ± {:.3f}".format(*mean_std(c[:, -1]))),
        ("mean normalised return over training",
         lambda c: "{:.3f} ± {:.3f}".format(*mean_std(mean_return(c, result.eval_steps)))),
        (f"steps to reach {cfg.target:g}",
         lambda c: _fmt_steps(steps_to_target(c, result.eval_steps, cfg.target))),
    ):
        lines = [f"**{label} axis ({fixed}): {title}**", "", head, rule]
        for m in cfg.method_names:
            lines.append(f"| {m} | " + " | ".join(cell(result.curves[(m, s)])
                                                  for s in settings) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def share_tables(result: SimResult, measure: str) -> str:
    """Markdown: per axis, each method's share of the oracle's gain on ``measure``."""
    shares = oracle_shares(result, measure)
    if shares is None:
        return ""
    cfg = result.config
    blocks = []
    for axis in AXES:
        settings = cfg.axis_settings(axis)
        label = AXIS_LABELS[axis]
        lines = [f"**{label} axis: share of the oracle's gain, {MEASURES[measure]}**", "",
                 "| method | " + " | ".join(f"{label} = {getattr(s, axis)}"
                                          for s in settings) + " |",
                 "|---|" + "---|" * len(settings)]
        for m in cfg.method_names:
            cells = ["n/a" if shares[(m, s)] is None else f"{shares[(m, s)]:.0%}"
                     for s in settings]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def summary_paragraph(result: SimResult) -> str:
    """One paragraph: which claims held (on the final and on the mean return), and where
    each method lands."""
    verdicts = {True: "held", False: "did not hold", None: "not tested"}
    sentences = []
    for measure in MEASURES:
        parts = [f"{c.text}: {verdicts[c.held]} ({c.detail})"
                 for c in claims(result, measure)]
        sentences.append(f"Paper's claims, on the {MEASURES[measure]}: " + "; ".join(parts)
                         + ".")
    text = " ".join(sentences)
    land = landing(result)
    if land.get(BROADCAST, {}).get("share_of_oracle_gain") is not None:
        others = [f"{m} {v['share_of_oracle_gain']:+.0%}" for m, v in land.items()
                  if m not in (BROADCAST, ORACLE)]
        if others:
            text += (" Share of the oracle's gain over broadcast (0% = broadcast, 100% = "
                     "step-level oracle; mean return averaged over all settings): "
                     + ", ".join(others) + ".")
    return text


def markdown(result: SimResult) -> str:
    """The whole report: settings, one table set per axis, claims, landing."""
    cfg = result.config
    seeds = f"{cfg.seeds} seeds"
    if cfg.first_seed:
        seeds += f" ({cfg.first_seed}..{cfg.first_seed + cfg.seeds - 1})"
    lines = [
        "# ktae simulate", "",
        f"|A| = {cfg.actions}, {cfg.steps} updates, lr = {cfg.lr:g}, {seeds}, "
        f"evaluation every {cfg.eval_every} updates; base setting "
        f"H = {cfg.base.horizon}, n_opt = {cfg.base.n_opt}, G = {cfg.base.group_size}. "
        "Returns are the exact expected normalised return of the policy, mean ± std "
        f"over seeds. Steps to {cfg.target:g}: first evaluation at or above it, mean ± std "
        "over seeds; (k/n) when only k seeds got there, — when none did.", ""]
    for axis in AXES:
        lines += [axis_tables(result, axis), ""]
    lines += ["## Claims", "", summary_paragraph(result), ""]
    for measure in MEASURES:
        tables = share_tables(result, measure)
        if tables:
            lines += [tables, ""]
    land = landing(result)
    lines += ["| method | mean return, all settings | share of the oracle's gain | "
              "tokens flagged by the calibration |", "|---|---|---|---|"]
    for m, v in land.items():
        share = "n/a" if v["share_of_oracle_gain"] is None else f"{v['share_of_oracle_gain']:.0%}"
        flags = "—" if v["flag_rate"] is None else f"{v['flag_rate']:.2%}"
        lines.append(f"| {m} | {v['mean_return']:.3f} ± {v['std']:.3f} | {share} | {flags} |")
    audit = audit_tables(result)
    if audit:
        lines += ["", audit]
    lines += ["", f"Simulated in {result.seconds:.0f} s."]
    return "\n".join(lines) + "\n"


def to_json(result: SimResult) -> dict:
    """Everything needed to redraw the curves: config, evaluation steps, raw curves."""
    def clean(x):
        return None if isinstance(x, float) and not math.isfinite(x) else x

    return {
        "config": dataclasses.asdict(result.config),
        "eval_steps": result.eval_steps,
        "curves": [{"method": m, "setting": dataclasses.asdict(s), "returns": c.tolist(),
                    "flag_rate": (result.flag_rates[(m, s)].tolist()
                                  if (m, s) in result.flag_rates else None)}
                   for (m, s), c in result.curves.items()],
        "claims": [dataclasses.asdict(c) for c in claims(result)],
        "claims_final": [dataclasses.asdict(c) for c in claims(result, "final")],
        "landing": {m: {k: clean(v) for k, v in d.items()} for m, d in landing(result).items()},
        "audit": {
            "groups_per_run": result.config.audit_groups,
            "updates": result.config.audited_updates(),
            "figures": list(blame.FIGURES),
            "results": {str(u): methods for u, methods in audit_summaries(result).items()},
        },
        "seconds": result.seconds,
    }


def write_json(result: SimResult, path) -> None:
    with open(path, "w") as f:
        json.dump(to_json(result), f, indent=1)
        f.write("\n")
