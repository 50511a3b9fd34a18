"""Does better blame train better? Credit figures against training gains, per method.

Joins, per credit method, three sources of figures:

* ``ktae compare`` run directories (``<credit>-seed<S>/summary.json``): held-out accuracy
  after training; the *training gain* is the method's mean over seeds minus GRPO's
  (credit ``none``), with a Welch t-test and the Welch 95% interval of the difference;
* a ``ktae audit`` output directory (``audit.json``): blame P(w<r), lowest, contamination
  and the credit-mass figures on the embedded task, with their bootstrap 95% intervals;
* ``ktae simulate`` output directories (``curves.json``): the MDP's final return, whose
  gain over broadcast (GRPO) is paired by seed (the methods of a seed share the initial
  logits and the sampling uniforms), and the same credit figures on the MDP's exact labels
  at one audited update (default 0: the initial policy, before any training).

Then, for each figure on each testbed, the Spearman rank correlation over methods with
the training gain and with the MDP return gain, with a bootstrap 95% interval over
methods and its n. Writes ``credit_study.md``, ``credit_study.json`` and scatter plots
into ``--output-dir``. A method missing from a source is listed as missing.

Names: compare's ``none`` is GRPO (``grpo``), simulate's ``broadcast`` is GRPO; a run or a
simulation of KTAE over N-token spans (``ktae_ngram: N``) is ``ktae@ngram=N``, as
``ktae audit --credit`` names it. The audit's names are kept as written.

    python studies/credit-study/credit_study.py --compare runs/compare --audit runs/audit/X \\
        --simulate runs/simulate/quick --seeds 0,1,2,3,4 -o runs/credit-study
    python studies/credit-study/credit_study.py --compare runs/compare --run-audit --prompt-set 3 \\
        --audit-prompts 100 --run-simulate -o runs/credit-study
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stats import welch  # noqa: E402  (studies/stats.py)

GRPO = "grpo"
FIGURES = ("blame", "lowest", "contamination", "contamination_vs_grpo", "mass_gap",
           "tokens_changed", "scale")
"""Credit figures read from both testbeds (as ``ktae.core.credit_metrics`` names them)."""
BETTER = {"blame": +1, "lowest": +1, "contamination": -1, "contamination_vs_grpo": -1,
          "mass_gap": -1, "tokens_changed": 0, "scale": 0}
"""The direction the audit calls better (+1 higher, -1 lower, 0 none): the sign a
correlation with the gain should have if the figure predicts training."""
TESTBEDS = ("audit", "mdp")
TARGETS = ("train_gain", "mdp_gain")
MARKER = "credit_study.json"
RESAMPLES = 2000


# ------------------------------------------------------------------------ names


def canonical_name(credit: str, ngram: int = 1, options: dict | None = None) -> str:
    """One name per method across the three tools: ``none``/``broadcast`` -> ``grpo``;
    KTAE over N-token spans -> ``ktae@ngram=N`` (``ktae+taco`` -> ``ktae+taco@ngram=N``);
    a run's own estimator or calibration ``options`` follow as ``@key=value``, in key
    order (``prefix-value@weight=0.5``), as the audit names a method given so."""
    base, *settings = credit.strip().split("@")
    name = {"none": GRPO, "broadcast": GRPO}.get(base, base)
    pairs = dict(s.partition("=")[::2] for s in settings)
    if ngram and int(ngram) != 1 and "ktae" in name.split("+"):
        pairs["ngram"] = int(ngram)
    pairs.update(options or {})
    for key, value in sorted(pairs.items()):
        name += f"@{key}={value}"
    return name


def simulate_name(method: str) -> tuple[str, int] | None:
    """The ``ktae simulate --methods`` name and ``--ktae-ngram`` of a canonical method,
    or None when the simulator has no such method (e.g. GTPO, or other settings)."""
    from ktae.sim.credit import parse_method

    base, *settings = method.split("@")
    ngram = 1
    only_spans = all(s.partition("=")[0] == "ngram" and s.partition("=")[2].isdigit()
                     for s in settings)
    if base in ("ktae+taco", GRPO) or (base == "ktae" and only_spans):
        # the simulator's own names, with spans from --ktae-ngram
        if not only_spans:
            return None
        for setting in settings:
            ngram = int(setting.partition("=")[2])
        settings = []
    name = "@".join(["broadcast" if base == GRPO else base, *settings])
    try:
        parse_method(name)
    except ValueError:
        return None
    return name, ngram


# ------------------------------------------------------------------------ readers


def read_compare(dirs: list[Path], seeds: list[int] | None = None) -> dict:
    """``{"runs": {method: {seed: summary}}, "unfinished": [dir...], "settings": {...}}``
    from every ``<credit>-seed<S>/`` with ``config.yaml`` under ``dirs`` (a run without
    ``summary.json`` is unfinished). Only ``seeds`` enter (None: all)."""
    runs: dict = {}
    unfinished, settings = [], {}
    for root in dirs:
        for cfg_path in sorted(Path(root).glob("*-seed*/config.yaml")):
            run = cfg_path.parent
            cfg = yaml.safe_load(cfg_path.read_text())
            seed = int(cfg["seed"])
            if seeds is not None and seed not in seeds:
                continue
            options = {**(cfg.get("estimator_options") or {}),
                       **(cfg.get("calibration_options") or {})}
            name = canonical_name(str(cfg["credit"]), cfg.get("ktae_ngram") or 1, options)
            summary = run / "summary.json"
            if not summary.is_file():
                unfinished.append(str(run))
                continue
            if seed in runs.get(name, {}):
                raise ValueError(f"compare: two finished runs of {name} seed {seed} "
                                 f"({runs[name][seed]['dir']} and {run})")
            runs.setdefault(name, {})[seed] = {**json.loads(summary.read_text()),
                                               "dir": str(run)}
            settings.setdefault(name, set()).add(
                (cfg.get("max_steps"), cfg.get("learning_rate"), cfg.get("eval_size")))
    return {"runs": dict(sorted(runs.items())), "unfinished": unfinished,
            "settings": {k: sorted(map(list, v)) for k, v in settings.items()}}


def read_audit(folder: Path) -> dict:
    """``{"methods": {method: {figure: {"mean", "low", "high"}}}, "prompt_set", ...}``
    from ``audit.json`` in ``folder``."""
    data = json.loads((Path(folder) / "audit.json").read_text())
    methods = {canonical_name(n): {f: e["all"].get(f) for f in FIGURES if e["all"].get(f)}
               for n, e in data["methods"].items()}
    return {"methods": methods, "prompt_set": data.get("prompt_set"),
            "input": data.get("input"), "counts": data.get("counts"),
            "path": str(folder)}


def read_simulate(folders: list[Path], update: str | int = 0) -> dict:
    """From ``curves.json`` in each folder: ``{"methods": {method: {"final": [per seed:
    final return averaged over the settings], "reference": the same for broadcast of the
    same folder (the gain is paired by seed within a folder), "figures": {figure:
    summary}}}, "update", "paths"}``, the figures pooled over all settings ("all") at
    audited ``update`` (``"last"``: the last audited update). A method in two folders is
    an error, except GRPO (broadcast): the first folder's is kept."""
    out: dict = {}
    used = []
    for folder in folders:
        data = json.loads((Path(folder) / "curves.json").read_text())
        ngram = data["config"].get("ktae_ngram") or 1
        finals: dict = {}
        for c in data["curves"]:
            finals.setdefault(c["method"], []).append([row[-1] for row in c["returns"]])
        results = (data.get("audit") or {}).get("results") or {}
        key = str(update)
        if update == "last" and results:
            key = max(results, key=int)
        used.append(key)
        final = {m: np.mean(np.array(v, dtype=float), axis=0).tolist()
                 for m, v in finals.items()}
        for m, per_setting in finals.items():
            name = canonical_name(m, ngram)
            if name in out:
                if name == GRPO:  # every folder's own broadcast serves as its reference
                    continue
                raise ValueError(f"simulate: {name} is in two simulate folders")
            audit = (results.get(key) or {}).get(m, {}).get("all", {})
            out[name] = {"final": final[m], "reference": final.get("broadcast"),
                         "settings": len(per_setting), "folder": str(folder),
                         "figures": {f: audit[f] for f in FIGURES if audit.get(f)}}
    return {"methods": out, "update": used, "paths": [str(f) for f in folders]}


def audit_overlap(prompt_set: int | None, prompts: int | None, eval_sizes) -> str:
    """Whether the audit's held-out prompts (set K of P: problems K*P..(K+1)*P-1 of the
    held-out stream) avoid the first ``eval_size`` problems ``ktae train`` evaluates on."""
    sizes = sorted({int(e) for e in eval_sizes if e is not None})
    if prompt_set is None or not prompts or not sizes:
        return "unknown (no prompt set, prompt count or training eval size)"
    start, end = prompt_set * prompts, (prompt_set + 1) * prompts - 1
    shared = max(0, min(end + 1, sizes[-1]) - start)
    where = (f"held-out problems {start}..{end}; training evaluates on the first "
             f"{'/'.join(map(str, sizes))}")
    return (f"disjoint ({where})" if shared == 0
            else f"OVERLAPPING in up to {shared} problems ({where})")


# ------------------------------------------------------------------------ statistics


def paired(a, b) -> dict:
    """Mean of ``a - b`` (paired by position) and its t 95% interval:
    ``{"diff", "low", "high", "p", "n"}``."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    out = {"diff": float(d.mean()) if d.size else None, "low": None, "high": None,
           "p": None, "n": int(d.size)}
    if d.size < 2 or d.std(ddof=1) == 0:
        return out
    se = d.std(ddof=1) / math.sqrt(d.size)
    half = stats.t.ppf(0.975, d.size - 1) * se
    out.update(low=out["diff"] - half, high=out["diff"] + half,
               p=float(2 * stats.t.sf(abs(out["diff"] / se), d.size - 1)))
    return out


def spearman(x, y, *, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Spearman's rho of ``x`` and ``y`` (ranks with ties averaged), its p-value
    (scipy's), and a percentile bootstrap 95% interval over the points (draws whose
    values are constant on a side are skipped): ``{"rho", "p", "low", "high", "n"}``;
    rho None below three points or without spread."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = int(x.size)
    out = {"rho": None, "p": None, "low": None, "high": None, "n": n}
    if n < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return out
    res = stats.spearmanr(x, y)
    out.update(rho=float(res.statistic), p=float(res.pvalue))
    rng = np.random.default_rng(seed)
    draws = []
    for idx in rng.integers(0, n, size=(resamples, n)):
        xs, ys = x[idx], y[idx]
        if np.ptp(xs) == 0 or np.ptp(ys) == 0:
            continue
        draws.append(_rho(xs, ys))
    if draws:
        out.update(low=float(np.percentile(draws, 2.5)), high=float(np.percentile(draws, 97.5)))
    return out


def _rho(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    return float(np.corrcoef(rx, ry)[0, 1])


# ------------------------------------------------------------------------ the study


def join(compare: dict | None, audit: dict | None, simulate: dict | None, *,
         min_seeds: int = 1) -> dict:
    """Per method: the training gain (Welch, vs GRPO), the MDP gain (paired, vs
    broadcast), each testbed's figures; and per source the methods it lacks. A method (or
    GRPO) with fewer than ``min_seeds`` finished seeds keeps its gain in the table but is
    marked ``partial``: its training gain enters no correlation."""
    runs = (compare or {}).get("runs", {})
    a_methods = (audit or {}).get("methods", {})
    s_methods = (simulate or {}).get("methods", {})
    names = list(dict.fromkeys([GRPO, *runs, *a_methods, *s_methods]))
    if GRPO not in runs and GRPO not in a_methods and GRPO not in s_methods:
        names.remove(GRPO)
    grpo_acc = [r["heldout_after"] for r in runs.get(GRPO, {}).values()]
    rows = {}
    for m in names:
        row: dict = {"seeds": sorted(runs.get(m, {}))}
        acc = [runs[m][s]["heldout_after"] for s in row["seeds"]]
        row["heldout_after"] = {"mean": float(np.mean(acc)) if acc else None,
                                "std": float(np.std(acc, ddof=1)) if len(acc) > 1 else None}
        carry = [runs[m][s].get("heldout_carry_after") for s in row["seeds"]]
        carry = [c for c in carry if c is not None]
        row["carry_after"] = float(np.mean(carry)) if carry else None
        row["train_gain"] = welch(acc, grpo_acc) if acc and grpo_acc else None
        row["partial"] = bool(acc) and (len(acc) < min_seeds or len(grpo_acc) < min_seeds)
        sim = s_methods.get(m)
        row["mdp_final"] = float(np.mean(sim["final"])) if sim else None
        ref = (sim or {}).get("reference")  # broadcast of the same simulate folder
        row["mdp_gain"] = (paired(sim["final"], ref)
                           if ref is not None and len(sim["final"]) == len(ref) else None)
        row["audit"] = a_methods.get(m, {})
        row["mdp"] = (sim or {}).get("figures", {})
        rows[m] = row
    missing = {
        "compare": [m for m in names if m not in runs],
        "audit": [m for m in names if m not in a_methods],
        "simulate": [m for m in names if m not in s_methods],
    }
    return {"methods": rows, "missing": missing}


def target_value(row: dict, target: str) -> float | None:
    """The gain's difference; None without one, or for a partial training gain."""
    if target == "train_gain" and row.get("partial"):
        return None
    g = row.get(target)
    return None if not g else g["diff"]


def correlations(joined: dict, *, resamples: int = RESAMPLES) -> list[dict]:
    """For each testbed, figure and target: Spearman over the methods that have both."""
    out = []
    for bed in TESTBEDS:
        for fig in FIGURES:
            for target in TARGETS:
                pts = [(m, r[bed][fig]["mean"], target_value(r, target))
                       for m, r in joined["methods"].items()
                       if fig in r[bed] and r[bed][fig].get("mean") is not None
                       and target_value(r, target) is not None]
                res = spearman([p[1] for p in pts], [p[2] for p in pts], resamples=resamples)
                out.append({"testbed": bed, "figure": fig, "target": target,
                            "methods": [p[0] for p in pts], **res,
                            "verdict": verdict(res, BETTER[fig])})
    return out


MIN_METHODS = 5
"""Fewest methods a verdict is given on: below it the bootstrap over methods has too few
distinct draws for its interval to mean much."""


def verdict(res: dict, better: int) -> str:
    """What the numbers say, when both the bootstrap interval excludes 0 and p < 0.05:
    "predicts" (the sign the audit reads the figure with), "predicts, reversed" (the
    opposite sign), "related" (a figure without a better side); otherwise "no evidence";
    "too few methods" below :data:`MIN_METHODS` or without an interval."""
    if res["rho"] is None or res["low"] is None or res["n"] < MIN_METHODS:
        return "too few methods"
    if res["low"] <= 0 <= res["high"] or res["p"] >= 0.05:
        return "no evidence"
    sign = 1 if res["rho"] > 0 else -1
    if better == 0:
        return "related"
    return "predicts" if sign == better else "predicts, reversed"


# ------------------------------------------------------------------------ report


def _num(x, digits=3, signed=False):
    if x is None:
        return "n/a"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def _interval(s: dict | None, key="mean", signed=False, digits=3) -> str:
    if not s or s.get(key) is None:
        return "n/a"
    text = _num(s[key], digits, signed)
    if s.get("low") is not None and not (s["low"] == s["high"] == s[key]):
        text += f" [{_num(s['low'], digits, signed)}, {_num(s['high'], digits, signed)}]"
    return text


def markdown(study: dict) -> str:
    """``credit_study.md``: inputs, the per-method table, the correlations, the verdicts
    and the missing methods, all from ``study``."""
    j, inputs = study["joined"], study["inputs"]
    lines = ["# Credit study: does better blame train better?", ""]
    if study.get("preliminary"):
        lines += [f"**PRELIMINARY**: {study['preliminary']}", ""]
    lines += [f"Training runs: {', '.join(inputs['compare']) or 'none'} (seeds "
              f"{inputs['seeds'] if inputs['seeds'] is not None else 'all'}). Audit: "
              f"{inputs['audit'] or 'none'} (prompt set {inputs['prompt_set']}). Simulate: "
              f"{', '.join(inputs['simulate']) or 'none'} (figures at update "
              f"{', '.join(map(str, inputs['sim_update'])) or 'n/a'}).", "",
              f"Training settings (max_steps, learning_rate, eval_size): "
              f"{_settings_text(study.get('training_settings') or {})}. "
              f"Audit prompts vs the training's held-out set: {inputs.get('overlap')}. "
              f"Audit input: {inputs.get('audit_input') or 'n/a'}.", "",
              "Training gain: held-out accuracy after training, method minus GRPO, mean over "
              f"seeds, Welch 95% interval and p; *partial*: fewer than {inputs.get('min_seeds')} "
              "finished seeds, kept out of the correlations. MDP gain: final return averaged over the "
              "simulated settings, method minus broadcast, paired by seed, t 95% interval. "
              "Figures: mean [bootstrap 95% interval over groups].", "",
              "| method | seeds | held-out after | training gain | p | MDP gain | "
              "audit blame | audit contamination | audit mass gap | MDP blame | "
              "MDP contamination | MDP mass gap |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, r in j["methods"].items():
        acc = r["heldout_after"]
        acc_text = (f"{acc['mean']:.3f} ± {acc['std']:.3f}" if acc["std"] is not None
                    else _num(acc["mean"]))
        g = r["train_gain"] or {}
        lines.append(
            f"| {m} | {len(r['seeds'])}{' (partial)' if r.get('partial') else ''} | {acc_text} | "
            f"{_interval(g, 'diff', signed=True)} | {_num(g.get('p'))} | "
            f"{_interval(r['mdp_gain'], 'diff', signed=True)} | "
            f"{_interval(r['audit'].get('blame'))} | "
            f"{_interval(r['audit'].get('contamination'))} | "
            f"{_interval(r['audit'].get('mass_gap'), signed=True)} | "
            f"{_interval(r['mdp'].get('blame'))} | {_interval(r['mdp'].get('contamination'))} | "
            f"{_interval(r['mdp'].get('mass_gap'), signed=True)} |")
    for bed, title in (("audit", "embedded task (ktae audit)"),
                       ("mdp", "synthetic MDP's exact labels (ktae simulate)")):
        lines += ["", f"Every credit figure on the {title}:", "",
                  "| method | " + " | ".join(FIGURES) + " |", "|---|" + "---|" * len(FIGURES)]
        for m, r in j["methods"].items():
            if r[bed]:
                lines.append(f"| {m} | " + " | ".join(
                    _interval(r[bed].get(f), signed=f in ("contamination_vs_grpo", "mass_gap"))
                    for f in FIGURES) + " |")
    lines += ["", "## Rank correlations with the gains", "",
              "Spearman's rho over the methods that have both numbers (GRPO included, its "
              "gain 0), bootstrap 95% interval over methods, n methods. Verdict: "
              "*predicts* when the interval excludes 0 and p < 0.05, with the sign the audit "
              "calls better (higher blame and lowest, lower contamination and mass gap); "
              f"*too few methods* below n = {MIN_METHODS}.", "",
              "| testbed | figure | gain | rho [95%] | p | n | verdict |",
              "|---|---|---|---|---|---|---|"]
    for c in study["correlations"]:
        rho = _interval({"mean": c["rho"], "low": c["low"], "high": c["high"]}, signed=True,
                        digits=2)
        lines.append(f"| {c['testbed']} | {c['figure']} | {c['target']} | {rho} | "
                     f"{_num(c['p'], 3)} | {c['n']} | {c['verdict']} |")
    for target, title in (("train_gain", "the training gain"), ("mdp_gain", "the MDP gain")):
        lines += ["", f"## What predicted {title}", ""]
        lines += conclusions(study["correlations"], target)
    lines += ["", "## Missing", ""]
    for source, names in j["missing"].items():
        lines.append(f"* not in {source}: {', '.join(names) or 'none'}")
    for run in study.get("unfinished", []):
        lines.append(f"* unfinished run (no summary.json): {run}")
    for m, r in j["methods"].items():
        want = inputs["seeds"]
        if want is not None and r["seeds"] and set(r["seeds"]) != set(want):
            lines.append(f"* {m}: seeds {sorted(set(want) - set(r['seeds']))} not finished")
    return "\n".join(lines) + "\n"


def _settings_text(settings: dict) -> str:
    distinct = {json.dumps(v) for v in settings.values()}
    if not distinct:
        return "n/a"
    if len(distinct) == 1:
        return f"the same for every method, {', '.join(map(str, next(iter(settings.values()))))}"
    return "DIFFER: " + "; ".join(f"{m} {v}" for m, v in settings.items())


def conclusions(corrs: list[dict], target: str = "train_gain") -> list[str]:
    """One line per verdict class, for ``target``, from the numbers."""
    lines = []
    train = [c for c in corrs if c["target"] == target]
    for label, keep in (("Predicted it", ("predicts",)),
                        ("Related, in the reverse of the audit's reading",
                         ("predicts, reversed",)),
                        ("Related (a figure without a better side)", ("related",)),
                        ("No evidence either way (interval holds 0)", ("no evidence",)),
                        ("Too few methods to tell", ("too few methods",))):
        chosen = [c for c in train if c["verdict"] in keep]
        if chosen:
            lines.append(f"* {label}: " + "; ".join(
                f"{c['testbed']} {c['figure']} (rho {_num(c['rho'], 2, True)}, n {c['n']})"
                for c in chosen) + ".")
    return lines or ["* No correlation could be computed."]


MARKERS = "osD^vP*Xhp<>d"


def method_styles(methods) -> dict[str, tuple[str, tuple]]:
    """Method -> (marker, colour), the same in every panel and figure, distinct for up to
    ``len(MARKERS) * 10`` methods (markers cycle within each group of ten colours)."""
    import matplotlib

    colours = matplotlib.colormaps["tab10"].colors
    return {m: (MARKERS[(i // len(colours) + i) % len(MARKERS)], colours[i % len(colours)])
            for i, m in enumerate(sorted(methods))}


def plot(study: dict, folder: Path) -> list[str]:
    """Per testbed: blame and contamination against the training gain (and, for the
    MDP, against the MDP gain), error bars both ways; one marker and colour per method,
    named in one legend. One PNG per testbed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    rows = study["joined"]["methods"]
    styles = method_styles(rows)
    for bed in TESTBEDS:
        targets = TARGETS if bed == "mdp" else ("train_gain",)
        fig, axes = plt.subplots(len(targets), 2, figsize=(10, 4.2 * len(targets)),
                                 squeeze=False)
        handles: dict = {}
        for i, target in enumerate(targets):
            for k, figure in enumerate(("blame", "contamination")):
                ax = axes[i][k]
                for m, r in rows.items():
                    s, g = r[bed].get(figure), r.get(target)
                    if not s or s.get("mean") is None or not g or g["diff"] is None:
                        continue
                    xerr = ([[s["mean"] - s["low"]], [s["high"] - s["mean"]]]
                            if s.get("low") is not None else None)
                    yerr = ([[g["diff"] - g["low"]], [g["high"] - g["diff"]]]
                            if g.get("low") is not None else None)
                    marker, colour = styles[m]
                    handles[m] = ax.errorbar(s["mean"], g["diff"], xerr=xerr, yerr=yerr,
                                             fmt=marker, color=colour, capsize=3,
                                             markersize=6, alpha=0.85)
                ax.axhline(0, color="black", linewidth=0.8, linestyle="--")
                ax.set_xlabel(f"{bed} {figure} (95% interval)")
                ax.set_ylabel(f"{target.replace('_', ' ')} over GRPO (95% interval)")
                ax.grid(alpha=0.3)
        fig.suptitle(f"credit figures on the {bed} testbed vs gains over GRPO", fontsize=10)
        fig.tight_layout()
        if handles:
            fig.legend([handles[m] for m in sorted(handles)], sorted(handles),
                       loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
                       title="method", title_fontsize=8)
        path = folder / f"scatter_{bed}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(str(path))
    return written


# ------------------------------------------------------------------------ running


def run_tool(argv: list[str]) -> None:
    """Run a ``ktae`` subcommand in this interpreter's environment; fail loudly."""
    cmd = [sys.executable, "-m", "ktae", *argv]
    print("credit_study: " + " ".join(["ktae", *argv]), file=sys.stderr)
    done = subprocess.run(cmd)
    if done.returncode != 0:
        raise SystemExit(f"credit_study: ktae {argv[0]} failed (exit {done.returncode})")


def check_output(folder: Path) -> None:
    """Refuse a non-empty folder this script did not write (no ``credit_study.json``)."""
    if folder.is_dir() and any(folder.iterdir()) and not (folder / MARKER).is_file():
        raise SystemExit(f"credit_study: {folder} holds files this script did not write; "
                         "choose another --output-dir")


def parse_seeds(text: str | None) -> list[int] | None:
    """``"5"`` -> seeds 0..4; ``"0,2,4"`` -> those; None -> every seed found."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if len(parts) == 1 and "," not in text:
        return list(range(int(parts[0])))
    return sorted({int(p) for p in parts})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compare", action="append", default=[], metavar="DIR",
                   help="a ktae compare output directory (repeatable)")
    p.add_argument("--seeds", help="training seeds that enter: N (0..N-1) or a comma list "
                   "(default: every finished seed)")
    p.add_argument("--min-seeds", type=int, help="finished seeds a method (and GRPO) needs "
                   "for its training gain to enter the correlations (default: as many as "
                   "--seeds names, else 1); fewer: shown in the table as partial")
    p.add_argument("--audit", metavar="DIR", help="a ktae audit output directory")
    p.add_argument("--run-audit", action="store_true", help="run ktae audit --model default "
                   "on the compare methods into OUTPUT/audit")
    p.add_argument("--prompt-set", type=int, default=3, help="--prompt-set of --run-audit "
                   "(default 3: with --audit-prompts 100, prompts 300..399 of the held-out "
                   "stream, after the 300 ktae train evaluates on)")
    p.add_argument("--audit-prompts", type=int, default=100, help="--prompts of --run-audit")
    p.add_argument("--simulate", action="append", default=[], metavar="DIR",
                   help="a ktae simulate output directory (repeatable)")
    p.add_argument("--run-simulate", action="store_true", help="run ktae simulate --preset "
                   "quick on the methods it has into OUTPUT/simulate[-ngram=N]")
    p.add_argument("--sim-seeds", type=int, help="--seeds of --run-simulate")
    p.add_argument("--sim-update", default="0", help="audited update whose MDP figures "
                   "enter: 0 (default, the initial policy) or 'last'")
    p.add_argument("--threads", type=int, default=1, help="threads of the runs (default 1)")
    p.add_argument("--resamples", type=int, default=RESAMPLES,
                   help=f"bootstrap draws of the correlations' intervals ({RESAMPLES})")
    p.add_argument("--preliminary", help="a note printed at the top of the report")
    p.add_argument("-o", "--output-dir", default="runs/credit-study")
    args = p.parse_args(argv)
    try:
        return _main(args)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"credit_study: {err}") from None


def _main(args: argparse.Namespace) -> int:

    out = Path(args.output_dir)
    check_output(out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = parse_seeds(args.seeds)
    compare = read_compare([Path(d) for d in args.compare], seeds) if args.compare else None
    methods = [GRPO, *sorted(set(compare["runs"] if compare else ()) - {GRPO})]
    audit_dir = args.audit
    if args.run_audit:
        audit_dir = str(out / "audit")
        run_tool(["audit", "--model", "default", "--credit", ",".join(methods), "--threads",
                  str(args.threads), "--prompts", str(args.audit_prompts), "--prompt-set",
                  str(args.prompt_set), "-o", audit_dir])
    sim_dirs = list(args.simulate)
    if args.run_simulate:
        by_ngram: dict = {}
        for m in methods:
            s = simulate_name(m)
            if s:
                by_ngram.setdefault(s[1], []).append(s[0])
        for ngram, names in by_ngram.items():
            folder = out / ("simulate" if ngram == 1 else f"simulate-ngram={ngram}")
            if ngram != 1:  # its own broadcast: the gain is paired within a folder
                names = ["broadcast"] + [n for n in names if "ktae" in n.split("+")]
            extra = ["--seeds", str(args.sim_seeds)] if args.sim_seeds else []
            run_tool(["simulate", "--preset", "quick", "--threads", str(args.threads),
                      "--methods", ",".join(dict.fromkeys(names)), "--ktae-ngram", str(ngram),
                      "--no-progress", "-o", str(folder), *extra])
            sim_dirs.append(str(folder))
    audit = read_audit(Path(audit_dir)) if audit_dir else None
    update = args.sim_update if args.sim_update == "last" else int(args.sim_update)
    simulate = read_simulate(_sim_order(sim_dirs), update) if sim_dirs else None
    min_seeds = args.min_seeds if args.min_seeds is not None else len(seeds or [None])
    joined = join(compare, audit, simulate, min_seeds=min_seeds)
    study = {
        "inputs": {"compare": args.compare, "seeds": seeds, "min_seeds": min_seeds,
                   "audit": audit_dir,
                   "prompt_set": audit["prompt_set"] if audit else None,
                   "audit_counts": audit["counts"] if audit else None,
                   "audit_input": audit["input"] if audit else None,
                   "overlap": audit_overlap(
                       audit["prompt_set"] if audit else None,
                       (audit["counts"] or {}).get("groups") if audit else None,
                       [v[2] for vs in (compare or {}).get("settings", {}).values() for v in vs]),
                   "simulate": sim_dirs, "sim_update": simulate["update"] if simulate else []},
        "preliminary": args.preliminary,
        "unfinished": compare["unfinished"] if compare else [],
        "training_settings": compare["settings"] if compare else {},
        "joined": joined,
        "correlations": correlations(joined, resamples=args.resamples),
    }
    (out / "credit_study.md").write_text(markdown(study), encoding="utf-8")
    study["files"] = plot(study, out)
    (out / MARKER).write_text(json.dumps(study, indent=1) + "\n", encoding="utf-8")
    print(markdown(study))
    print(f"credit_study: wrote {out / 'credit_study.md'}, {out / MARKER}, "
          + ", ".join(study["files"]))
    return 0


def _sim_order(dirs: list[str]) -> list[Path]:
    """Folders with ``ktae_ngram: 1`` first, so broadcast (GRPO) comes from a plain run
    and an n-gram run's own broadcast is skipped rather than clashing."""
    return sorted((Path(d) for d in dirs), key=lambda d: json.loads(
        (d / "curves.json").read_text())["config"].get("ktae_ngram", 1) != 1)


if __name__ == "__main__":
    sys.exit(main())
