"""Markdown tables of the verdict study's figures (studies/verdict-5seed/plan.md).

Functions of the figures :mod:`verdict_analysis` computes (its ``analyse`` result's parts)
and of the runs still missing; ``scripts/tables.py`` writes them between their markers in
the report (:func:`table`), and this script prints them all:

    python studies/verdict-5seed/verdict_tables.py [--records DIR] [--json PATH] [--draws 10000]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import verdict_analysis as analysis  # noqa: E402
from verdict_analysis import ARM_LABELS, ARMS, BASELINE, KIND_LABELS, NO_RECORDS, SEEDS, SETTINGS, mean_sd  # noqa: E402
from verdict_credit_mass import CLASSES  # noqa: E402

VERDICT_HEAD = ("| setting | arm | seeds | held-out before | after | change (points) | "
                "after − GRPO's (points) | bootstrap 95% | Welch 95% | verdict |")
LENGTH_HEAD = ("| setting | model | response tokens | truncated (%) | accuracy, not truncated "
               "(%) | sums (%) | differences (%) | products (%) | training truncated, last 3 "
               "steps (%) |")
CLASS_LABELS = {"number": "numbers", "word": "words", "end": "end of turn", "rest": "rest"}
MASS_HEAD = ("| setting | arm | share of | " + " | ".join(CLASS_LABELS[c] for c in CLASSES)
             + " |")
AUDIT_HEAD = ("| setting | model | seed | right answers | right answers holding a false claim "
              "(%), 95% interval | blame of KTAE's credit | blame of KTAE over 3-grams' |")
HEADS = {"verdict": VERDICT_HEAD, "length": LENGTH_HEAD, "credit-mass": MASS_HEAD,
         "audit": AUDIT_HEAD}


def _pct(figure: dict, signed: bool = False) -> str:
    if figure.get("mean") is None:
        return "n/a"
    return f"{100 * figure['mean']:{'+' if signed else ''}.1f} ± {100 * figure['sd']:.1f}"


def _interval(low, high) -> str:
    return "undefined" if low is None else f"[{100 * low:+.1f}, {100 * high:+.1f}]"


def _label(arm: str) -> str:
    return ARM_LABELS.get(arm, arm)


def empty(name: str) -> str:
    """The table ``name`` before any of its records exists: its head and one line."""
    head = HEADS[name]
    cells = head.count("|") - 1
    return "\n".join([head, "|---" * cells + "|", f"| *{NO_RECORDS}* |" + " |" * (cells - 1)])


def _footer(figures: dict, missing: list[str]) -> list[str]:
    used = "; ".join(f"`{s}`: {', '.join(map(str, e['seeds'])) or 'none'}"
                     for s, e in figures.items())
    lines = ["", f"Seeds every arm of the setting has recorded, the only ones used: {used}."]
    if missing:
        lines.append(f"Not recorded yet ({len(missing)} of "
                     f"{len(SEEDS) * len(SETTINGS) * len(ARMS)} runs): {', '.join(missing)}.")
    return lines


def verdict(figures: dict, missing: list[str]) -> str:
    """Both settings, every arm against GRPO with both intervals and the verdict; KTAE
    against the length control below the table."""
    rows = [VERDICT_HEAD, "|---" * 10 + "|"]
    notes, draws = [], None
    for setting, entry in figures.items():
        if not entry["seeds"]:
            notes.append(f"- `{setting}`: no seed is recorded in every arm yet.")
            continue
        draws = entry["draws"]
        comp = {(c["arm"], c["against"]): c for c in entry["comparisons"]}
        for arm, a in entry["arms"].items():
            c = comp.get((arm, BASELINE))
            cells = (["—"] * 4 if c is None else
                     [f"{100 * c['diff']:+.1f}",
                      _interval(c["bootstrap"]["low"], c["bootstrap"]["high"]),
                      _interval(c["welch"]["low"], c["welch"]["high"]), c["verdict"]])
            rows.append(f"| `{setting}` | {_label(arm)} | {len(entry['seeds'])} | "
                        f"{_pct(a['before'])} | {_pct(a['after'])} | "
                        f"{_pct(a['change'], signed=True)} | " + " | ".join(cells) + " |")
        for c in entry["comparisons"]:
            if c["against"] != BASELINE:
                notes.append(
                    f"- `{setting}`: {_label(c['arm'])} after training minus "
                    f"{_label(c['against'])}: {100 * c['diff']:+.1f} points, bootstrap 95% "
                    f"{_interval(c['bootstrap']['low'], c['bootstrap']['high'])}, Welch 95% "
                    f"{_interval(c['welch']['low'], c['welch']['high'])} ({c['verdict']}).")
    if len(rows) == 2:
        rows.append("| *no seed is recorded in every arm of a setting yet* |" + " |" * 9)
    rows += [""] + notes if notes else []
    if draws:
        rows += ["", "Held-out greedy accuracy (%) on the held-out problems, mean ± sd over "
                 f"seeds. Bootstrap: {draws:,} draws, each resampling each arm's seeds and, "
                 "once for both arms, the problems; Welch: over the per-seed accuracies. An "
                 "arm helps when its bootstrap interval lies above 0, hurts when below."]
    return "\n".join(rows + _footer(figures, missing))


def _before(arms: dict, *path: str) -> dict:
    """A figure of the starting model over every run of every arm (mean ± sd over runs)."""
    values = []
    for figures in arms.values():
        x = figures["before"]
        for key in path:
            x = x[key]
        values += x["values"]
    return mean_sd(values)


def _tokens(figure: dict) -> str:
    return "n/a" if figure["mean"] is None else f"{figure['mean']:.1f} ± {figure['sd']:.1f}"


def length(figures: dict, missing: list[str]) -> str:
    """Length, truncation and accuracies of the starting model (every run's step 0) and
    of each arm after training."""
    rows = [LENGTH_HEAD, "|---" * 9 + "|"]
    for setting, entry in figures.items():
        arms = entry["arms"]
        if not arms:
            continue
        start = [_tokens(_before(arms, "response_tokens")), _pct(_before(arms, "truncated")),
                 _pct(_before(arms, "accuracy_not_truncated")),
                 *(_pct(_before(arms, "accuracy_by_kind", k)) for k in KIND_LABELS), "—"]
        rows.append(f"| `{setting}` | starting model (step 0, every run) | "
                    + " | ".join(start) + " |")
        for arm, a in arms.items():
            after = a["after"]
            cells = [_tokens(after["response_tokens"]), _pct(after["truncated"]),
                     _pct(after["accuracy_not_truncated"]),
                     *(_pct(after["accuracy_by_kind"][k]) for k in KIND_LABELS),
                     _pct(a["train_truncated_last3"])]
            rows.append(f"| `{setting}` | {_label(arm)}, after | " + " | ".join(cells) + " |")
    if len(rows) == 2:
        rows.append("| *no seed is recorded in every arm of a setting yet* |" + " |" * 8)
    rows += ["", "On the held-out problems with greedy decoding, mean ± sd over seeds (sums, "
             "differences, products: accuracy by kind); training truncated: the share of the "
             "sampled training responses cut at the budget, mean of the last 3 steps."]
    return "\n".join(rows + _footer(figures, missing))


def credit_mass(figures: dict, missing: list[str]) -> str:
    """Each class's share of the positive credit, of the negative credit and of the
    tokens, pooled over every recorded step of every run."""
    rows = [MASS_HEAD, "|---" * (3 + len(CLASSES)) + "|"]
    for setting, entry in figures.items():
        for arm, m in entry["arms"].items():
            for key, label in (("positive", "positive credit"),
                               ("negative", "negative credit"), ("tokens", "tokens")):
                cells = ["n/a" if m[key][c] is None else f"{100 * m[key][c]:.1f}%"
                         for c in CLASSES]
                rows.append(f"| `{setting}` | {_label(arm)} | {label} | "
                            + " | ".join(cells) + " |")
    if len(rows) == 2:
        rows.append("| *no seed is recorded in every arm of a setting yet* |"
                    + " |" * (2 + len(CLASSES)))
    rows += ["", "A token's credit is what the loss reads: the estimator's advantage, times the "
             "calibration's weight and loss mask where a calibration runs; over every recorded "
             "group of every step. Numbers: tokens whose text is digits; words: letters; end "
             "of turn: `<|im_end|>`; rest: spaces, punctuation and the like."]
    return "\n".join(rows + _footer(figures, missing))


def audit(figures: dict) -> str:
    """The "right answer, wrong tokens" rate of the starting and the trained models, one
    row per recorded audit."""
    rows = [AUDIT_HEAD, "|---" * 7 + "|"]
    missing = []

    def blame(b: dict | None) -> str:
        if b is None or b.get("mean") is None:
            return "n/a"
        return f"{b['mean']:.3f} [{b['low']:.3f}, {b['high']:.3f}] ({b['responses']})"

    for setting, entry in figures.items():
        for key, e in entry.items():
            r = e["rate"]
            if r is None:
                missing.append(e["record"])
                continue
            arm, _, seed = key.partition("-s")
            model = "starting model" if key == "start" else _label(arm)
            cell = ("n/a" if r["mean"] is None else
                    f"{100 * r['mean']:.1f} [{100 * r['low']:.1f}, {100 * r['high']:.1f}]")
            blames = " | ".join(blame(b) for b in e.get("blame", {}).values())
            rows.append(f"| `{setting}` | {model} | {seed or '—'} | {r['responses']} | {cell} "
                        f"| {blames} |")
    if len(rows) == 2:
        return empty("audit")
    rows += ["", "`ktae audit` on 200 prompts of the `eval` split x 4 samples at temperature "
             "0.6, at the setting's budget; bootstrap 95% interval over prompts. Blame: "
             "how often the method's credit on that model's own samples puts a false "
             "claim's token below a right token of the same wrong answer (0.5 is chance, "
             "GRPO's by construction), over the wrong answers holding both (their number "
             "after the interval, in parentheses)."]
    if missing:
        rows.append(f"Not recorded yet: {', '.join(missing)}.")
    return "\n".join(rows)


def document(result: dict) -> str:
    """All four tables of an ``analyse`` result, each under a heading."""
    missing = result["missing_runs"]
    parts = [("Verdict", verdict(result["verdict"], missing)),
             ("Length and truncation", length(result["length"], missing)),
             ("Credit mass on real text", credit_mass(result["credit_mass"], missing)),
             ("Audit of the trained models", audit(result["audit"]))]
    return "\n\n".join(f"## {title}\n\n{table}" for title, table in parts)


def table(name: str, records: Path | None = None) -> str:
    """The markdown table ``name`` of :data:`verdict_analysis.TABLES` over ``records``
    (default: the study's)."""
    records = analysis.RECORDS if records is None else records
    render = globals()[name.replace("-", "_")]
    if name == "audit":
        return render(analysis.audit_figures(records))
    if not any(analysis.recorded(records, analysis.run_name(s, a, seed))
               for s in SETTINGS for a in ARMS for seed in SEEDS):
        return empty(name)
    return render(analysis.TABLES[name](records), analysis.missing_runs(records))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="The 5-seed verdict's tables from its records.")
    p.add_argument("--records", type=Path, default=analysis.RECORDS,
                   help="the study's records (default: studies/verdict-5seed/records)")
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument("--draws", type=int, default=analysis.DRAWS,
                   help="bootstrap draws (the plan's: 10000)")
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's random seed")
    args = p.parse_args(argv)
    if args.draws < 1:
        print("verdict_tables: --draws: expected a positive integer", file=sys.stderr)
        return 2
    result = analysis.analyse(args.records, draws=args.draws, seed=args.seed)
    if analysis.has_records(args.records):
        print(document(result))
    else:
        print(f"{NO_RECORDS} ({args.records}).")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
