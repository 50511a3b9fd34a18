"""The 5-seed verdict's 50 runs re-scored: a held-out answer cut at the budget is wrong.

The 5-seed study (studies/verdict-5seed/) scored a held-out response by its last
number even when the response hit the token budget without ending. Its records keep, per
held-out problem, ``correct`` and ``truncated``; re-scored, a problem is right only when
it was read right and not cut off. This prints, per setting and arm, the held-out accuracy
after training under both rules and, for every comparison of the old plan (each arm
against GRPO, and KTAE against the length control), the difference after training:

* under the old rule and the new one, with the old plan's reading (its percentile
  bootstrap over seeds and problems, its "helps" when that interval lies above 0);
* under the new rule, paired by seed and problem with the t interval over both sources
  (:func:`stats.paired_interval`), Holm-corrected over the plan's 10 comparisons, and
  the label each comparison gets with each seed left out in turn.

    python studies/paired-verdict/rescore.py [--records studies/verdict-5seed/records] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "verdict-5seed")]

import stats  # noqa: E402
import verdict_analysis as old  # noqa: E402

RULES = ("read", "wrong")
"""``read``: the old scoring (a cut-off response read like any other); ``wrong``: ended
answers only."""


def scored(run: dict, when: str, rule: str) -> np.ndarray:
    right = run[when]["correct"]
    return right if rule == "read" else right * (1 - run[when]["truncated"])


def figures(records: Path, *, draws: int = old.DRAWS, seed: int = 0) -> dict:
    out = {}
    for setting in old.SETTINGS:
        seeds = old.shared_seeds(records, setting)
        entry = {"seeds": seeds, "arms": {}, "comparisons": []}
        out[setting] = entry
        if not seeds:
            continue
        runs = old.load_setting(records, setting)
        for arm in old.ARMS:
            entry["arms"][arm] = {
                rule: {when: old.mean_sd([scored(r, when, rule).mean() for r in runs[arm]])
                       for when in ("before", "after")} for rule in RULES}
            entry["arms"][arm]["cut_off_right_after"] = old.mean_sd(
                [float((r["after"]["correct"] * r["after"]["truncated"]).sum()
                       / max(r["after"]["correct"].sum(), 1)) for r in runs[arm]])
        for arm, against in old.COMPARISONS:
            row = {"arm": arm, "against": against}
            for rule in RULES:
                a = np.stack([scored(r, "after", rule) for r in runs[arm]], axis=1)
                b = np.stack([scored(r, "after", rule) for r in runs[against]], axis=1)
                boot = old.two_level_bootstrap(a, b, draws=draws, seed=seed)
                row[rule] = {"diff": boot["estimate"], "bootstrap": boot,
                             "old_verdict": old.verdict(boot),
                             "paired": stats.paired_interval(a - b)}
            entry["comparisons"].append(row)
    family = [(s, i) for s in out for i in range(len(out[s]["comparisons"]))]
    pvalues = [out[s]["comparisons"][i]["wrong"]["paired"]["p"] for s, i in family]
    h = stats.holm(pvalues)
    for k, (s, i) in enumerate(family):
        row = out[s]["comparisons"][i]["wrong"]
        row["holm_p"], row["holm_level"] = h["adjusted"][k], h["levels"][k]
        row["label"] = stats.label(row["paired"]["diff"], h["reject"][k])
    # each label with one seed left out, Holm over the whole family each time
    matrices = []
    for k, (s, i) in enumerate(family):
        c = out[s]["comparisons"][i]
        runs = old.load_setting(records, s)
        a = np.stack([scored(r, "after", "wrong") for r in runs[c["arm"]]], axis=1)
        b = np.stack([scored(r, "after", "wrong") for r in runs[c["against"]]], axis=1)
        matrices.append(a - b)
        if h["levels"][k] is not None:
            c["wrong"]["holm_interval"] = stats.paired_interval(a - b, level=h["levels"][k])
    if len({m.shape[1] for m in matrices}) == 1:
        for k, (s, i) in enumerate(family):
            out[s]["comparisons"][i]["wrong"]["drop_one"] = stats.drop_one_labels(matrices, k)
    return out


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:+.1f}"


def _ms(f: dict) -> str:
    return "—" if f["mean"] is None else f"{100 * f['mean']:.1f} ± {100 * f['sd']:.1f}"


def table(result: dict) -> str:
    """Two tables: accuracy per arm under both rules; each comparison under both."""
    labels = old.ARM_LABELS
    lines = ["| setting | arm | seeds | after, cut-off read | after, must end | right answers "
             "cut off (after) |", "|---|---|---|---|---|---|"]
    for setting, entry in result.items():
        for arm, f in entry["arms"].items():
            lines.append(f"| `{setting}` | {labels[arm]} | {len(entry['seeds'])} | "
                         f"{_ms(f['read']['after'])} | {_ms(f['wrong']['after'])} | "
                         f"{_ms(f['cut_off_right_after'])}% |")
    lines += ["", "| setting | comparison | cut-off read: diff, bootstrap 95%, old verdict | "
              "must end: diff, bootstrap 95%, old verdict | must end: paired t 95% (seeds and "
              "problems) | at its Holm step | Holm p | label | label, each seed left out |",
              "|---|---|---|---|---|---|---|---|---|"]
    for setting, entry in result.items():
        for c in entry["comparisons"]:
            cells = []
            for rule in RULES:
                r, b = c[rule], c[rule]["bootstrap"]
                cells.append(f"{_pct(r['diff'])} [{_pct(b['low'])}, {_pct(b['high'])}] "
                             f"{r['old_verdict']}")
            w = c["wrong"]
            pi = w["paired"]
            drop = ", ".join(w.get("drop_one", [])) or "—"
            holm_p = "—" if w["holm_p"] is None else f"{w['holm_p']:.3f}"
            hi = w.get("holm_interval") or {"low": None, "high": None}
            step = (f"{_pct(hi['low'])} to {_pct(hi['high'])} ({100 * w['holm_level']:.1f}%)"
                    if w.get("holm_level") else "—")
            lines.append(
                f"| `{setting}` | {labels[c['arm']]} − {labels[c['against']]} | {cells[0]} | "
                f"{cells[1]} | {_pct(pi['low'])} to {_pct(pi['high'])} | {step} | "
                f"{holm_p} | {w['label']} | "
                f"{drop} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=Path, default=old.RECORDS)
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = p.parse_args(argv)
    result = figures(args.records)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
