"""What ``ktae audit`` writes: ``audit.md``, ``audit.json``, one PNG per figure, and a
short terminal summary."""

from __future__ import annotations

import json
from pathlib import Path

from ktae.core.credit_metrics import METRICS
from ktae.credit_audit.sanity import SANITY_RULES
from ktae.credit_audit.token_kinds import KINDS

TITLES = {
    "blame": "blame localisation: P(wrong token gets less credit than a right one)",
    "lowest": "share of wrong answers whose lowest-credit token is locally wrong",
    "contamination": "share of positive credit on locally wrong tokens (right answers)",
}
SHORT = {"blame": "blame P(w<r)", "lowest": "lowest token wrong",
         "contamination": "contamination"}
FILES = {m: f"audit_{m}.png" for m in METRICS}
RATE_NOTE = ("on the arith task: a false claim; \"right answer, wrong tokens\"; over every "
             "right answer, bootstrap 95% interval over groups")
MASS_NOTE = (
    "Mass gap: over the wrong answers of the blame column, the sum of (mean credit on "
    "wrong tokens − mean credit on right tokens) divided by the sum of their |GRPO "
    "advantage| (negative: wrong tokens get less credit; GRPO 0). Tokens changed: the "
    "share of the tokens of mixed groups whose credit differs from GRPO's (GRPO 0). Scale: "
    "sum of |credit| over those tokens / the same sum for GRPO (GRPO 1). Ratios of sums "
    "over responses, with bootstrap 95% intervals over groups.")


SANITY_NOTE = (
    "Sanity rules (not credit methods; ktae.credit_audit.sanity): *oracle* gives -|GRPO "
    "advantage| to the labelled wrong tokens and +|GRPO advantage| to every other token, so "
    "its blame and lowest must be exactly 1 and its contamination 0; *random* gives "
    "|GRPO advantage| times a seeded standard normal draw per token, so its blame should be "
    "0.5 within its interval (and lowest the chance share). Other values mean the figures "
    "or the labels' token alignment are broken.")
KIND_NOTE = (
    "Where the credit goes, by kind of token, over the responses of the blame column "
    "(ktae.credit_audit.token_kinds): the share of each method's negative credit "
    "(sum of max(-A, 0)) and of its positive credit on labelled wrong results, other "
    "number tokens, words, punctuation and spaces, and end-of-turn (special) tokens. "
    "The first row is the share of the tokens, what a constant credit gives.")


def kind_table(by_kind: dict) -> list[str]:
    """The markdown lines of the credit-by-kind table (``audit.json``'s
    ``credit_by_kind``)."""

    names = list(KINDS.values())

    def cells(shares: dict) -> str:
        return " | ".join("n/a" if shares[k] is None else f"{shares[k]:.3f}" for k in names)

    first = next(iter(by_kind.values()))
    lines = ["## Where the credit goes, by kind of token", "", KIND_NOTE, "",
             "| method | credit | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names),
             f"| *share of tokens* | | {cells(first['tokens'])} |"]
    for name, entry in by_kind.items():
        label = f"*{name} (sanity rule)*" if name in SANITY_RULES else name
        for sign in ("negative", "positive"):
            lines.append(f"| {label} | {sign} | {cells(entry[sign])} |")
    return [*lines, ""]


def _cell(s: dict | None, digits: int = 3) -> str:
    if not s or s["mean"] is None:
        return "n/a"
    if s["low"] == s["high"] == s["mean"]:
        return f"{s['mean']:.{digits}f}"
    return f"{s['mean']:.{digits}f} [{s['low']:.{digits}f}, {s['high']:.{digits}f}]"


def _signed(x: float) -> str:
    return f"{x + 0.0 if round(x, 3) else 0.0:+.3f}"  # no "-0.000"


def _signed_cell(s: dict | None) -> str:
    if not s or s["mean"] is None:
        return "n/a"
    if s["low"] == s["high"] == s["mean"]:
        return _signed(s["mean"])
    return f"{_signed(s['mean'])} [{_signed(s['low'])}, {_signed(s['high'])}]"


def markdown(result: dict) -> str:
    """The tables of ``audit.md``: every method's three figures with their 95% intervals;
    then each figure per level and, for a run directory, the means per recorded step."""
    lines = ["# Credit audit", "", f"Input: {result.get('input', '')}.", ""]
    lines += _counts_lines(result)
    lines += _rate_lines(result.get("right_answer_wrong_tokens"))
    lines += _methods_table(result)
    if result.get("levels"):
        lines += _per_level_tables(result)
    if len(result.get("steps") or []) > 0:
        lines += _per_step_tables(result)
    return "\n".join(lines)


def _counts_lines(result: dict) -> list[str]:
    """What the audit read: groups, responses, labelled tokens, the scoring, the intervals."""
    counts = result.get("counts", {})
    if not counts:
        return []
    t = counts["tokens"]
    right = ""
    if "groups_with_right_answer" in counts:  # results written before these counts lack them
        right = (f", {counts['groups_with_right_answer']} with a right answer; "
                 f"{counts['responses_with_teacher']} responses have another right answer "
                 "of their group to teach from")
    return [f"{counts['groups']} groups ({counts['mixed_groups']} mixed{right}), "
            f"{counts['responses']} responses ({counts['wrong_answers']} wrong answers, "
            f"{counts['responses_with_wrong_tokens']} with a locally wrong token, "
            f"{counts['right_answers_with_wrong_tokens']} of them right answers); tokens: "
            f"{t['wrong']} wrong, {t['right']} right, {t['other']} not labelled. "
            f"Log-probs and entropies: {result.get('scored_with', 'n/a')}. "
            f"Intervals: bootstrap 95% over groups ({result.get('resamples')} draws).", ""]


def _rate_lines(rate: dict | None) -> list[str]:
    """The share of right answers holding a locally wrong token, overall and per step/level."""
    if not rate:  # results written before the rate lack it
        return []
    lines = [f"Right answers holding a locally wrong token ({RATE_NOTE}): "
             f"{_cell(rate['all'])} of {rate['all']['responses']} right answers in "
             f"{rate['all']['groups']} groups."]
    for part, title in (("steps", "step"), ("levels", "level")):
        if len(rate.get(part) or {}) > 1:
            lines.append(f"Per {title}: " + "; ".join(
                f"{title} {k}: {_cell(v)} of {v['responses']}"
                for k, v in rate[part].items()) + ".")
    return lines + [""]


def _methods_table(result: dict) -> list[str]:
    """One row per method and sanity rule, then the chance share and the notes."""
    methods = result["methods"]
    first = next(iter(methods.values()))["all"]
    mass = "mass_gap" in first  # results written before the mass figures lack them
    head = ("| method | blame P(w<r) | lowest-credit token wrong | contamination | "
            "contamination − GRPO's (paired) | ")
    if mass:
        head += ("mass gap: wrong − right, in GRPO advantages | tokens changed from GRPO | "
                 "scale: abs. credit / GRPO's | ")
    lines = [head + "responses (blame / contamination) |",
             "|---|---|---|---|---|" + ("---|---|---|" if mass else "") + "---|"]

    def row(label: str, a: dict) -> str:
        cells = (f"| {label} | {_cell(a['blame'])} | {_cell(a['lowest'])} | "
                 f"{_cell(a['contamination'])} | {_signed_cell(a['contamination_vs_grpo'])} | ")
        if mass:
            cells += (f"{_signed_cell(a['mass_gap'])} | {_cell(a['tokens_changed'])} | "
                      f"{_cell(a['scale'])} | ")
        return cells + f"{a['blame']['responses']} / {a['contamination']['responses']} |"

    lines += [row(name, entry["all"]) for name, entry in methods.items()]
    lines += [row(f"*{name} (sanity rule)*", entry["all"])
              for name, entry in (result.get("sanity_rules") or {}).items()]
    lines += ["", f"Chance share of the lowest-credit token (wrong tokens / labelled tokens, "
              f"what a constant credit gives): {_cell(first['chance'])}.", ""]
    if result.get("sanity_rules"):
        lines += [SANITY_NOTE, ""]
    if result.get("credit_by_kind"):
        lines += kind_table(result["credit_by_kind"])
    if mass:
        lines += [MASS_NOTE, ""]
    return lines


def _per_level_tables(result: dict) -> list[str]:
    """Each figure per level, with the chance share under the lowest-credit table."""
    methods, levels, lines = result["methods"], result["levels"], []
    for metric in METRICS:
        head = " | ".join(f"level {lv}" for lv in levels)
        lines += [f"## {TITLES[metric]}, per level", "", f"| method | all | {head} |",
                  "|---|---|" + "---|" * len(levels)]
        for name, entry in methods.items():
            cells = " | ".join(_cell(entry["levels"][lv][metric]) for lv in levels)
            lines.append(f"| {name} | {_cell(entry['all'][metric])} | {cells} |")
        if metric == "lowest":
            ref = next(iter(methods.values()))
            cells = " | ".join(_cell(ref["levels"][lv]["chance"]) for lv in levels)
            lines.append(f"| *chance (constant credit)* | {_cell(ref['all']['chance'])} | "
                         f"{cells} |")
        lines.append("")
    return lines


def _per_step_tables(result: dict) -> list[str]:
    """Each figure's mean per recorded step of a run directory."""
    steps, lines = [str(s) for s in result["steps"]], []
    for metric in METRICS:
        lines += [f"## {TITLES[metric]}, per recorded step (means)", "",
                  "| method | " + " | ".join(f"step {s}" for s in steps) + " |",
                  "|---|" + "---|" * len(steps)]
        for name, entry in result["methods"].items():
            cells = " | ".join(_cell(entry["steps"][s][metric], 3).split(" [")[0]
                               for s in steps)
            lines.append(f"| {name} | {cells} |")
        lines.append("")
    return lines


def plot_metric(result: dict, metric: str, path: Path) -> Path:
    """Methods side by side with their 95% intervals; over the recorded steps for a run
    directory with more than one step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    methods = result["methods"]
    names = list(methods)
    steps = [str(s) for s in result.get("steps") or []]
    if len(steps) > 1:
        fig, ax = plt.subplots(figsize=(9, 4.8))
        x = [int(s) for s in steps]
        cmap = matplotlib.colormaps["tab10"]
        dashes = ("-", "--", ":")
        for k, name in enumerate(names):
            ys = [methods[name]["steps"][s][metric] for s in steps]
            mean = [y["mean"] if y["mean"] is not None else float("nan") for y in ys]
            low = [y["low"] if y["low"] is not None else float("nan") for y in ys]
            high = [y["high"] if y["high"] is not None else float("nan") for y in ys]
            ax.plot(x, mean, marker="o", color=cmap(k % 10), linestyle=dashes[k // 10 % 3],
                    label=name, linewidth=1.3)
            ax.fill_between(x, low, high, color=cmap(k % 10), alpha=0.10)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("training step (recorded rollouts; identical methods overlap)")
        ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        # the sanity rules after the methods, grey: what a perfect and a random rule give
        rules = {n: e for n, e in (result.get("sanity_rules") or {}).items()
                 if metric in e.get("all", {})}
        labels = [*names, *(f"{n} (sanity rule)" for n in rules)]
        entries = [methods[n]["all"][metric] for n in names] + \
            [e["all"][metric] for e in rules.values()]
        fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(labels) + 2), 4.8))
        mean = [e["mean"] if e["mean"] is not None else float("nan") for e in entries]
        err = [[m - e["low"] if e["mean"] is not None else 0 for m, e in zip(mean, entries, strict=True)],
               [e["high"] - m if e["mean"] is not None else 0 for m, e in zip(mean, entries, strict=True)]]
        colors = ["#4c72b0"] * len(names) + ["#9a9a9a"] * len(rules)
        ax.bar(range(len(labels)), mean, yerr=err, capsize=3, color=colors)
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
        if metric == "blame":
            ax.axhline(0.5, color="black", linestyle="--", linewidth=1, label="chance (GRPO)")
            ax.legend(fontsize=8)
        elif metric == "lowest":
            chance = methods[names[0]]["all"]["chance"]["mean"]
            if chance is not None:
                ax.axhline(chance, color="black", linestyle="--", linewidth=1,
                           label="chance (constant credit)")
                ax.legend(fontsize=8)
        elif "grpo" in methods and methods["grpo"]["all"][metric]["mean"] is not None:
            ax.axhline(methods["grpo"]["all"][metric]["mean"], color="black", linestyle="--",
                       linewidth=1, label="GRPO")
            ax.legend(fontsize=8)
    ax.set_title(TITLES[metric], fontsize=10)
    ax.set_ylabel(SHORT[metric] + " (95% interval)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_outputs(result: dict, folder: Path) -> list[str]:
    """``audit.md``, ``audit.json`` and one PNG per figure in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    md = folder / "audit.md"
    md.write_text(markdown(result) + "\n", encoding="utf-8")
    written.append(str(md))
    for metric in METRICS:
        written.append(str(plot_metric(result, metric, folder / FILES[metric])))
    js = folder / "audit.json"
    js.write_text(json.dumps({**result, "files": written + [str(js)]}, indent=1) + "\n",
                  encoding="utf-8")
    written.append(str(js))
    return written


def best(result: dict, metric: str, *, lowest: bool = False) -> str | None:
    """The method with the highest (``lowest``: smallest) mean of ``metric``."""
    scored = [(e["all"][metric]["mean"], n) for n, e in result["methods"].items()
              if e["all"][metric]["mean"] is not None]
    if not scored:
        return None
    return (min(scored) if lowest else max(scored))[1]


def _after_sampling(seconds: dict) -> str:
    """``"; after sampling R x the sampling"``: the phases after sampling over it."""
    names = list(seconds)
    if not seconds.get("sampling"):
        return ""
    after = sum(seconds[k] for k in names[names.index("sampling") + 1:])
    return f"; after sampling {after / seconds['sampling']:.2f} x the sampling"


def summary(result: dict) -> str:
    """A few lines for the terminal."""
    c = result.get("counts", {})
    lines = [f"ktae audit: {result.get('input', '')}"]
    if c:
        lines.append(f"  {c['mixed_groups']} mixed groups; "
                     f"{c['responses_with_wrong_tokens']} responses hold a locally wrong token "
                     f"({c['right_answers_with_wrong_tokens']} of them right answers)")
    rate = result.get("right_answer_wrong_tokens")
    if rate and rate["all"]["mean"] is not None:
        steps = list((rate.get("steps") or {}).items())
        ends = "".join(f"; step {k}: {_cell(v)} of {v['responses']}"
                       for k, v in (steps[0], steps[-1])) if len(steps) > 1 else ""
        lines.append(f"  right answers holding a locally wrong token: {_cell(rate['all'])} "
                     f"of {rate['all']['responses']}{ends}")
    b, low, con = best(result, "blame"), best(result, "lowest"), best(result, "contamination",
                                                                       lowest=True)
    m = result["methods"]
    if b:
        lines.append(f"  blame localisation best: {b} ({_cell(m[b]['all']['blame'])}; "
                     "a constant credit gives 0.5)")
    if low:
        lines.append(f"  lowest-credit token wrong most often: {low} "
                     f"({_cell(m[low]['all']['lowest'])}; chance "
                     f"{_cell(next(iter(m.values()))['all']['chance'])})")
    if con:
        grpo = m.get("grpo", {}).get("all", {}).get("contamination")
        ref = f"; GRPO {_cell(grpo)}" if grpo else ""
        paired = _signed_cell(m[con]["all"].get("contamination_vs_grpo"))
        lines.append(f"  least contamination: {con} ({_cell(m[con]['all']['contamination'])}"
                     f"{ref}; paired difference from GRPO {paired})")
    for key, unit in (("seconds", "time"), ("cpu_seconds", "CPU time")):
        seconds = result.get(key)
        if seconds:
            parts = ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
            lines.append(f"  {unit}: {parts}{_after_sampling(seconds)}")
    return "\n".join(lines)
