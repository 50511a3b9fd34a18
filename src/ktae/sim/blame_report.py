"""The MDP's credit audit in ``ktae simulate``'s results: summaries, markdown tables and
terminal lines (the figures: :mod:`ktae.sim.blame`).

Per method, setting and audited update, ``ktae audit``'s figures on the probe groups, as
means (mass figures: ratios of sums) with bootstrap 95% intervals over the probe groups of
all seeds; "all settings" pools the groups of every setting.
"""

from __future__ import annotations

from ktae.sim import blame
from ktae.sim.run import SimResult

AUDIT_TITLES = {
    "blame": "blame: P(sub-optimal step gets less credit than an optimal one), failed "
             "trajectories",
    "lowest": "lowest-credit step is sub-optimal, failed trajectories",
    "chance": "chance share of the lowest-credit step (sub-optimal steps / steps)",
    "contamination": "contamination: share of positive credit on sub-optimal steps, "
                     "successful trajectories",
    "contamination_vs_grpo": "contamination − GRPO's on the same trajectories",
    "mass_gap": "mass gap: mean credit on sub-optimal − on optimal steps, in GRPO advantages",
    "tokens_changed": "share of steps whose credit differs from GRPO's",
    "scale": "scale: sum of abs. credit / GRPO's",
}
AUDIT_SHORT = {"blame": "blame", "lowest": "lowest sub-optimal", "chance": "chance",
               "contamination": "contamination", "contamination_vs_grpo": "− GRPO's",
               "mass_gap": "mass gap", "tokens_changed": "changed", "scale": "scale"}
_SIGNED = ("contamination_vs_grpo", "mass_gap")
ALL_SETTINGS = "all"


def audit_summaries(result: SimResult) -> dict:
    """``{update: {method: {"all": figures, setting label: figures}}}`` with figures as
    :func:`ktae.sim.blame.summaries` ("all": the groups of every setting pooled). Computed
    once per result."""
    cached = getattr(result, "_audit_summaries", None)
    if cached is not None:
        return cached
    cfg = result.config
    out: dict = {}
    for update in cfg.audited_updates():
        methods: dict = {}
        for m in cfg.method_names:
            entry, parts = {}, []
            for k, s in enumerate(cfg.settings()):
                values = result.audit.get((m, s, update))
                if values is None:
                    continue
                entry[s.label()] = blame.summaries(values)
                # distinct group ids across settings for the pooled figures
                parts.append({**values, "group": values["group"] + k * (1 << 40)})
            if parts:
                entry[ALL_SETTINGS] = blame.summaries(blame.concat(parts))
                methods[m] = entry
        if methods:  # a result built by hand may hold no audit
            out[update] = methods
    result._audit_summaries = out
    return out


def _audit_cell(s: dict | None, figure: str, intervals: bool = True) -> str:
    if not s or s["mean"] is None:
        return "n/a"

    def f(x):
        return f"{x + 0.0 if round(x, 3) else 0.0:+.3f}" if figure in _SIGNED else f"{x:.3f}"

    if not intervals or s["low"] == s["high"] == s["mean"]:
        return f(s["mean"])
    return f"{f(s['mean'])} [{f(s['low'])}, {f(s['high'])}]"


def audit_tables(result: SimResult) -> str:
    """Markdown: per audited update, every method's figures over all settings, then one
    table per figure with a column per setting."""
    summ = audit_summaries(result)
    if not summ:
        return ""
    cfg = result.config
    settings = cfg.settings()
    lines = ["## Credit on the MDP's exact labels", "",
             f"{cfg.audit_groups} probe groups of G trajectories per run (seed and setting), "
             "drawn from the policy after the update named below; every method's step "
             "credit on them against the optimal actions, with ktae audit's figures "
             "(docs/simulate.md, \"Credit on the MDP's exact labels\"). A failed "
             "trajectory has a return at or below its group's mean; its sub-optimal steps "
             "are the wrong tokens, its optimal steps the right ones. Means with bootstrap "
             "95% intervals over probe groups (mass figures: ratios of sums); a cell "
             "without an interval rests on one group.", ""]
    figures = blame.FIGURES
    for update, methods in summ.items():
        when = "the initial policy" if update == 0 else f"the policy after {update} updates"
        lines += [f"### Update {update} ({when}), all settings", "",
                  "| method | " + " | ".join(AUDIT_SHORT[f] for f in figures)
                  + " | trajectories (blame / contamination) |",
                  "|---|" + "---|" * (len(figures) + 1)]
        for m, entry in methods.items():
            a = entry[ALL_SETTINGS]
            lines.append(f"| {m} | " + " | ".join(_audit_cell(a[f], f) for f in figures)
                         + f" | {a['blame']['responses']} / {a['contamination']['responses']} |")
        lines.append("")
        for f in figures:
            if f == "chance":
                continue
            lines += [f"**Update {update}: {AUDIT_TITLES[f]}, per setting**", "",
                      "| method | " + " | ".join(s.label() for s in settings) + " |",
                      "|---|" + "---|" * len(settings)]
            for m, entry in methods.items():
                lines.append(f"| {m} | " + " | ".join(
                    _audit_cell(entry.get(s.label(), {}).get(f), f) for s in settings) + " |")
            if f == "lowest":
                first = next(iter(methods.values()))
                lines.append("| *chance* | " + " | ".join(
                    _audit_cell(first.get(s.label(), {}).get("chance"), "chance")
                    for s in settings) + " |")
            lines.append("")
    return "\n".join(lines)


def audit_summary_lines(result: SimResult) -> list[str]:
    """A line per audited update and method for the terminal (means, all settings)."""
    out = []
    for update, methods in audit_summaries(result).items():
        out.append(f"Credit on the MDP's exact labels at update {update} (all settings; "
                   "blame 0.5 = GRPO, intervals in results.md):")
        for m, entry in methods.items():
            a = entry[ALL_SETTINGS]
            out.append(f"  {m}: " + ", ".join(
                f"{AUDIT_SHORT[f]} {_audit_cell(a[f], f, intervals=False)}"
                for f in blame.FIGURES))
    return out
