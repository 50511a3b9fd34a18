"""The self-teacher audit: where do the 2026 self-teacher methods put their credit on the
real model's own text, and which 2026 method localises blame best?

``ktae audit --model smollm2-135m`` on the recipe's task (configs/smollm2-recipe.yaml:
arith level 0, temperature 0.6, 64 new tokens), twice:

* **development**: prompt set 0, sampling seed 0, the set the study's 2026 arm is chosen on;
* **held out**: prompt set 1, sampling seed 1: other problems and other samples.

Both sets are drawn from the arith ``eval`` split, which no training run draws from, and
are disjoint: level 0's ``eval`` split holds 233 distinct computations (kind and operands
up to order, :func:`ktae.tasks.arith.canonical`), and the two sets take computations
0-31 and 32-63 of its stream, each once (the audit's ``repeated_problems`` says 0). So
no held-out problem is a development one reworded or reordered, and each group is one
problem: the audit's bootstrap resamples groups, so its intervals count problems, not
responses, as the unit of variance.

The methods (:data:`CREDIT`): SDPO's token signal ``q - s`` alone (``sdpo``, its default
``lam = 0``: the pure self-teacher signal) and mixed half and half with GRPO's advantage
(``sdpo@lam=0.5``), next to GRPO, KTAE, KTAE over 3-grams, OAR-G, STAPO, RSI-S (its loss
mask on GRPO's advantage) and DelTA (the other 2026 methods the audit can read), and the
audit's oracle and random sanity rules. SDPG has no credit to audit (docs/audit.md, "The
self-teacher methods").

    python studies/self-teacher-audit/self_teacher_audit.py run      # both sets (~1 h, resumable)
    python studies/self-teacher-audit/self_teacher_audit.py report   # results/summary.json, the tables

``run`` skips a set whose record exists and records a finished audit folder without
sampling it again; a set cut before its ``audit.json`` is written starts again.
``python scripts/tables.py run self-teacher-audit self-teacher-audit-counts`` rewrites
the tables of report.md and docs/audit.md from the records.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RECORDS = HERE / "records"
RESULTS = HERE / "results"
MARKER = "record.json"
"""Written last into a set's record: the command, the commit, the seconds, when it ended."""

TASK = "arith@difficulty=0"
TEMPERATURE = 0.6
PROMPTS = 32
SAMPLES = 8
CREDIT = ("grpo", "ktae", "ktae@ngram=3", "oar-g", "stapo", "sdpo", "sdpo@lam=0.5", "rsi-s",
          "delta")
SETS = {"dev": (0, 0), "heldout": (1, 1)}
"""Set name -> (prompt set, sampling seed)."""
SET_LABELS = {"dev": "development", "heldout": "held out"}
CANDIDATES_2026 = ("oar-g", "stapo", "sdpo", "sdpo@lam=0.5", "rsi-s", "delta")
"""The 2026 methods the audit can read, among which the study's 2026 arm is chosen (SDPG
has no per-token credit)."""
PRIMARY = "blame"
"""The audit's primary figure: P(a wrong token of a wrong answer gets less credit than a
right one), 0.5 for a constant credit."""
KEEP = ("audit.json", "audit.md")


def runs_root() -> Path:
    """Where the audit folders go: ``$KTAE_CACHE/studies/self-teacher-audit`` (outside the
    work tree)."""
    cache = os.environ.get("KTAE_CACHE")
    return (Path(cache) if cache else Path.home() / ".cache" / "ktae") / "studies" / \
        "self-teacher-audit"


def command(name: str, folder: Path) -> list[str]:
    """The ``ktae audit`` arguments of set ``name`` writing into ``folder``."""
    if name not in SETS:
        raise ValueError(f"set: expected one of {', '.join(SETS)}, got {name!r}")
    prompt_set, seed = SETS[name]
    return ["audit", "--model", "smollm2-135m", "--task", TASK, "--temperature",
            str(TEMPERATURE), "--prompts", str(PROMPTS), "--samples", str(SAMPLES),
            "--credit", ",".join(CREDIT), "--prompt-set", str(prompt_set), "--seed", str(seed),
            "--threads", "1", "-o", str(folder), "--overwrite"]


def finished(name: str, folder: Path) -> bool:
    """Whether ``folder`` holds a finished audit of set ``name`` with this study's settings
    (its methods, and the problems and sampling its input line names)."""
    path = folder / "audit.json"
    if not path.is_file():
        return False
    data = json.loads(path.read_text())
    prompt_set, seed = SETS[name]
    difficulty = TASK.split("=")[1]
    return (list(data.get("credit", {})) == list(CREDIT)
            and f"{PROMPTS} arith problems (difficulty {difficulty}, eval split, prompt set "
                f"{prompt_set})" in data.get("input", "")
            and f"temperature {TEMPERATURE}, seed {seed}," in data.get("input", ""))


def record(name: str, folder: Path, argv: list[str], seconds: float | None,
           records: Path = RECORDS) -> Path:
    """Copies the set's files into its record, the marker last."""
    out = records / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in KEEP:
        shutil.copy2(folder / f, out / f)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, text=True,
                            capture_output=True).stdout.strip()
    shown = [a.replace(str(folder.parent), "{runs}") for a in ["ktae", *argv]]
    (out / MARKER).write_text(json.dumps(
        {"command": shlex.join(shown), "code": commit,
         "seconds": None if seconds is None else round(seconds, 1),
         "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1) + "\n")
    return out


def run(names=tuple(SETS), *, root: Path | None = None, records: Path = RECORDS) -> int:
    """Audits each set not yet recorded, one after the other; returns 1 if one failed."""
    root = root or runs_root()
    (root / "logs").mkdir(parents=True, exist_ok=True)
    for name in names:
        folder = root / name
        argv = command(name, folder)
        if (records / name / MARKER).is_file():
            print(f"{name}: recorded", flush=True)
            continue
        seconds = None
        if not finished(name, folder):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
            print(f"[{time.strftime('%H:%M:%S')}] start {name}: ktae {shlex.join(argv)}",
                  flush=True)
            start = time.time()
            with open(root / "logs" / f"{name}.log", "a") as log:
                rc = subprocess.run([sys.executable, "-m", "ktae", *argv], cwd=REPO, env=env,
                                    stdout=log, stderr=subprocess.STDOUT).returncode
            seconds = time.time() - start
            if rc != 0:
                print(f"{name}: FAILED (exit {rc}; log {root / 'logs' / name}.log)", flush=True)
                return 1
        print(f"{name}: recorded in {record(name, folder, argv, seconds, records)}", flush=True)
    return 0


# --- the analysis --------------------------------------------------------------------------

FIGURES = ("blame", "lowest", "chance", "mass_gap", "contamination", "contamination_vs_grpo",
           "tokens_changed", "scale")


def summarise(audit: dict) -> dict:
    """One set's figures: per method and sanity rule, each figure's mean and interval over
    the set; the counts, with the share of the groups a self-teacher can teach from."""
    c = audit["counts"]
    rows = {**audit["methods"], **{f"({k})": v for k, v in audit["sanity_rules"].items()}}
    return {
        "input": audit["input"], "prompt_set": audit["prompt_set"],
        "resamples": audit["resamples"], "seconds": audit.get("seconds"),
        "counts": {k: c[k] for k in ("groups", "mixed_groups", "groups_with_right_answer",
                                     "responses", "responses_with_teacher", "wrong_answers",
                                     "responses_with_wrong_tokens")},
        "teacher_share": {"groups": c["groups_with_right_answer"] / c["groups"],
                          "responses": c["responses_with_teacher"] / c["responses"]},
        "figures": {m: {f: v["all"].get(f) for f in FIGURES} for m, v in rows.items()},
    }


def choose(dev: dict, candidates=CANDIDATES_2026, figure: str = PRIMARY) -> dict:
    """The candidate with the highest development ``figure`` and the candidates it is not
    separable from: those whose interval overlaps its (a conservative reading: two 95%
    intervals that do not overlap differ at well below 5%)."""
    scores = {m: dev["figures"][m][figure] for m in candidates}
    best = max(candidates, key=lambda m: scores[m]["mean"])
    b = scores[best]
    close = [m for m in candidates if m != best and scores[m]["high"] >= b["low"]]
    return {"method": best, "figure": figure, "value": b, "not_separable_from": close}


def sentence(choice: dict) -> str:
    """The study's 2026 arm, in one sentence."""
    v = choice["value"]
    text = (f"The best 2026 method on the development audit is `{choice['method']}`: "
            f"{choice['figure']} {v['mean']:.3f} [{v['low']:.3f}, {v['high']:.3f}] "
            f"(95% interval over problems)")
    if choice["not_separable_from"]:
        others = ", ".join(f"`{m}`" for m in choice["not_separable_from"])
        return text + f"; it is not separable from {others}, whose intervals overlap its."
    return text + "; its interval lies above every other 2026 method's."


def load(records: Path = RECORDS) -> dict:
    """``{set: summary}`` for every recorded set."""
    return {name: summarise(json.loads((records / name / "audit.json").read_text()))
            for name in SETS if (records / name / MARKER).is_file()}


def _cell(s: dict | None, signed: bool = False) -> str:
    if not s or s.get("mean") is None:
        return "n/a"
    f = "{:+.3f}" if signed else "{:.3f}"
    if s["low"] == s["high"] == s["mean"]:
        return f.format(s["mean"])
    return f"{f.format(s['mean'])} [{f.format(s['low'])}, {f.format(s['high'])}]"


def table(summaries: dict) -> str:
    """Blame, lowest (with its chance share) and the mass gap, per method and set."""
    names = [n for n in SETS if n in summaries]
    if not names:
        return "(no set recorded yet: `python studies/self-teacher-audit/self_teacher_audit.py run`)"
    head = "| method |" + "".join(f" {SET_LABELS[n]}: blame | lowest (chance) | mass gap |"
                                  for n in names)
    lines = [head, "|---|" + "---|---|---|" * len(names)]
    for m in summaries[names[0]]["figures"]:
        cells = []
        for n in names:
            f = summaries[n]["figures"][m]
            cells += [_cell(f["blame"]), f"{_cell(f['lowest'])} ({_cell(f['chance']).split(' [')[0]})",
                      _cell(f["mass_gap"], signed=True)]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def counts_table(summaries: dict) -> str:
    """Per set: problems, groups with a right answer to teach from, responses with a teacher,
    mixed groups and the responses blame and the mass gap read."""
    lines = ["| set | problems (groups) | groups with a right answer | responses with a teacher | "
             "mixed groups | blame responses (groups) |", "|---|---|---|---|---|---|"]
    for n in (n for n in SETS if n in summaries):
        s = summaries[n]
        c, share, blame = s["counts"], s["teacher_share"], s["figures"]["grpo"]["blame"]
        lines.append(f"| {SET_LABELS[n]} (prompt set {s['prompt_set']}) | {c['groups']} | "
                     f"{c['groups_with_right_answer']} ({share['groups']:.0%}) | "
                     f"{c['responses_with_teacher']} of {c['responses']} "
                     f"({share['responses']:.0%}) | {c['mixed_groups']} | "
                     f"{blame['responses']} ({blame['groups']}) |")
    return "\n".join(lines)


def report(records: Path = RECORDS, results: Path = RESULTS) -> dict:
    """Writes ``results/summary.json`` (every set's figures and the choice) and returns it."""
    summaries = load(records)
    out = {"sets": summaries}
    if "dev" in summaries:
        choice = choose(summaries["dev"])
        out["choice"] = {**choice, "sentence": sentence(choice)}
    results.mkdir(parents=True, exist_ok=True)
    (results / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("run", "report"))
    p.add_argument("--sets", default=",".join(SETS), help="comma list of sets (dev, heldout)")
    args = p.parse_args(argv)
    if args.action == "run":
        names = [s for s in args.sets.split(",") if s]
        for s in names:
            if s not in SETS:
                p.error(f"--sets: expected names among {', '.join(SETS)}, got {s!r}")
        return run(names)
    out = report()
    print(table(out["sets"]), counts_table(out["sets"]), out.get("choice", {}).get("sentence", ""),
          sep="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
