"""The real-model verdict's figures, computed from the study's records (plan.md here).

Reads ``records/`` here as ``verdict_study.py`` writes it: one folder per run,
``SETTING-ARM-sSEED/`` (``summary.json``, ``metrics.jsonl``, ``eval.jsonl``,
``rollouts.jsonl``, ``config.yaml``; a run counts once its ``record.json`` marker is
there), and one per audit, ``audit-SETTING-start/`` and ``audit-SETTING-ARM-sSEED/``
(``audit.json``). In each setting only the seeds every arm has recorded are used (the
plan's rule; the rest are named as missing). Four tables:

* ``verdict``: held-out greedy accuracy before and after training per arm, and each arm
  against GRPO (and KTAE against the length control): the difference of accuracies after
  training with the plan's bootstrap over seeds and problems (:func:`two_level_bootstrap`)
  and Welch's interval over per-seed accuracies; the verdict (:func:`verdict`);
* ``length``: response length, truncation, accuracy on the responses that were not
  truncated and accuracy by kind on the held-out problems, and the training batches'
  truncation over the last 3 steps;
* ``credit-mass``: the share of the positive and of the negative credit on number tokens,
  words, the end-of-turn token and the rest, over every recorded step of every run
  (:mod:`verdict_credit_mass`);
* ``audit``: the "right answer, wrong tokens" rate of the starting and trained models.

``verdict_tables.py`` turns them into tables (and prints them all); ``scripts/tables.py``
renders them between their markers in the report (``verdict``, ``verdict-length``,
``verdict-credit-mass``, ``verdict-audit``) through ``verdict_tables.table``.
"""

from __future__ import annotations

import json
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent):  # this study's modules; studies/stats.py
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import verdict_study as study  # noqa: E402  (the plan as code: arms, settings, seeds)
from stats import welch  # noqa: E402
from verdict_credit_mass import credit_mass  # noqa: E402

ARMS, ARM_LABELS, SETTINGS = tuple(study.ARMS), study.ARM_LABELS, study.SETTINGS
SEEDS, AUDIT_SEEDS, RECORDS, MARKER = study.SEEDS, study.AUDIT_SEEDS, study.RECORDS, study.MARKER
run_name = study.run_name

BASELINE = "grpo"
COMPARISONS = tuple((arm, BASELINE) for arm in ARMS if arm != BASELINE) + (("ktae", "length"),)
"""(arm, against): every arm against GRPO, and KTAE against the length control."""
DRAWS = 10_000
LEVEL = 0.95
KIND_LABELS = {"add": "sum", "sub": "difference", "mul": "product"}
DIFFICULTY = 0
TASK = f"arith@difficulty={DIFFICULTY}"
NO_RECORDS = "No run of the verdict study is recorded yet"


# --- statistics ------------------------------------------------------------------------

def two_level_bootstrap(a, b=None, *, draws: int = DRAWS, seed: int = 0, den_a=None,
                        den_b=None, level: float = LEVEL) -> dict:
    """The plan's bootstrap over seeds and problems of the mean over seeds of a per-seed
    rate, or of the difference of two arms' (``a`` minus ``b``).

    ``a``, ``b``: ``[problems, seeds]`` per-problem values (1/0 correctness), the same
    problems in the same order in both (the seeds need not match). Each draw resamples the
    problems with replacement once for both arms (``[draws, problems]`` multinomial counts
    ``W``) and each arm's seeds with replacement, independently; an arm's statistic is the
    mean over its drawn seeds of ``W @ a / W @ den`` (``den`` default all ones: the rate on
    the drawn problems; a 0/1 ``den`` gives the rate on a subset, e.g. the problems not
    truncated). A seed whose drawn subset is empty is left out of its draw's mean; a draw
    with none left is dropped.

    Returns ``{"estimate", "low", "high", "draws"}``: the statistic on the data as observed
    and the percentile interval at ``level`` (None where no draw is defined).
    """
    a = np.asarray(a, dtype=float)
    den_a = np.ones_like(a) if den_a is None else np.asarray(den_a, dtype=float)
    arms = [(a, den_a)]
    if b is not None:
        b = np.asarray(b, dtype=float)
        den_b = np.ones_like(b) if den_b is None else np.asarray(den_b, dtype=float)
        arms.append((b, den_b))
    n_problems = a.shape[0]
    for x, den in arms:
        if x.ndim != 2 or x.shape[0] != n_problems or x.shape[1] == 0 or den.shape != x.shape:
            raise ValueError(f"expected [problems, seeds] arrays over the same {n_problems} "
                             f"problems, got {x.shape} (den {den.shape})")
    if not 0 < level < 1 or draws < 1:
        raise ValueError(f"level in (0, 1) and draws >= 1 expected, got {level}, {draws}")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, n_problems, size=(draws, n_problems))
    offsets = picks + n_problems * np.arange(draws)[:, None]
    weights = np.bincount(offsets.ravel(), minlength=draws * n_problems).reshape(
        draws, n_problems).astype(float)
    stats, observed = [], []
    for x, den in arms:
        seeds = rng.integers(0, x.shape[1], size=(draws, x.shape[1]))
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a draw with no seed left: nan
            per_seed = (weights @ (x * den)) / (weights @ den)  # [draws, seeds]
            stats.append(np.nanmean(np.take_along_axis(per_seed, seeds, axis=1), axis=1))
            rates = (x * den).sum(axis=0) / den.sum(axis=0)
        observed.append(float(np.nanmean(rates)) if not np.isnan(rates).all() else None)
    stat = stats[0] - stats[1] if b is not None else stats[0]
    estimate = (None if None in observed
                else observed[0] - observed[1] if b is not None else observed[0])
    stat = stat[~np.isnan(stat)]
    if stat.size == 0:
        return {"estimate": estimate, "low": None, "high": None, "draws": 0}
    tail = (1 - level) / 2
    low, high = np.quantile(stat, [tail, 1 - tail])
    return {"estimate": estimate, "low": float(low), "high": float(high),
            "draws": int(stat.size)}


def verdict(interval: dict) -> str:
    """The plan's reading of a difference from GRPO: ``helps`` when its bootstrap interval
    lies above 0, ``hurts`` when below, ``no evidence`` otherwise."""
    if interval.get("low") is None:
        return "no evidence"
    if interval["low"] > 0:
        return "helps"
    if interval["high"] < 0:
        return "hurts"
    return "no evidence"


def mean_sd(values) -> dict:
    """``{"mean", "sd", "values"}`` over seeds (None values left out; sd 0 for one)."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return {"mean": None, "sd": None, "values": []}
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "sd": sd, "values": values}


# --- records ---------------------------------------------------------------------------

def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def recorded(records: Path, name: str) -> bool:
    return (records / name / MARKER).is_file()


def shared_seeds(records: Path, setting: str) -> list[int]:
    """The plan's seeds that every arm of ``setting`` has recorded, in order."""
    return [s for s in SEEDS if all(recorded(records, run_name(setting, arm, s)) for arm in ARMS)]


def missing_runs(records: Path) -> list[str]:
    """The plan's runs not recorded, in the order the driver makes them."""
    return [run_name(setting, arm, seed) for seed in SEEDS for setting in SETTINGS
            for arm in ARMS if not recorded(records, run_name(setting, arm, seed))]


def heldout_kinds(n: int) -> list[str]:
    """The kind of each held-out problem, in the evaluation's order."""
    from ktae.tasks import arith

    return [p.kind for p in arith.generate(n, split="test", seed=arith.TEST_SEED,
                                           difficulty=DIFFICULTY)]


def _check_heldout(folder: Path, problems: list[dict]) -> None:
    """Every answer judged right must be the held-out problem's answer at its position:
    a run evaluated on other problems, or in another order, is refused."""
    from ktae.tasks import arith

    held = arith.generate(len(problems), split="test", seed=arith.TEST_SEED,
                          difficulty=DIFFICULTY)
    for i, (p, r) in enumerate(zip(held, problems, strict=True)):
        if not r["correct"]:
            continue
        try:
            same = float(r["extracted"]) == float(p.answer)
        except (TypeError, ValueError):
            same = False
        if not same:
            raise ValueError(f"{folder / 'eval.jsonl'}: problem {i} is judged right with "
                             f"{r['extracted']!r}, but the held-out answer there is "
                             f"{p.answer}: not the held-out problems in order")


def _check_config(folder: Path, expected: dict) -> None:
    """The run's ``config.yaml`` (its resolved settings) holds the ``expected`` values."""
    import yaml

    path = folder / "config.yaml"
    config = yaml.safe_load(path.read_text()) if path.is_file() else None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: missing or not a run's configuration")
    for key, value in expected.items():
        if config.get(key) != value:
            raise ValueError(f"{path}: {key} is {config.get(key)!r}, the plan's {value!r}")


def load_run(folder: Path, expected: dict | None = None) -> dict:
    """One run's held-out evaluations before (the first) and after (the last) training,
    as ``[problems]`` arrays, and its training metrics; ``expected``: settings its
    ``config.yaml`` must hold (a record of another run is refused)."""
    if expected:
        _check_config(folder, expected)
    evals = sorted(_jsonl(folder / "eval.jsonl"), key=lambda e: e["step"])
    if len(evals) < 2 or "problems" not in evals[0]:
        raise ValueError(f"{folder}: eval.jsonl needs the evaluations before and after "
                         "training, each with its per-problem records")
    out = {"metrics": _jsonl(folder / "metrics.jsonl")}
    for when, e in (("before", evals[0]), ("after", evals[-1])):
        _check_heldout(folder, e["problems"])
        out[when] = {key: np.array([p[key] for p in e["problems"]], dtype=float)
                     for key in ("correct", "tokens", "truncated")}
        out[when]["step"] = e["step"]
    return out


def load_setting(records: Path, setting: str) -> dict:
    """``{arm: [run per shared seed]}``."""
    seeds = shared_seeds(records, setting)
    return {arm: [load_run(records / run_name(setting, arm, s),
                           {"task": TASK, "seed": s, "max_new_tokens": SETTINGS[setting]})
                  for s in seeds] for arm in ARMS}


def _matrix(runs: list[dict], when: str, key: str) -> np.ndarray:
    """``[problems, seeds]``."""
    return np.stack([r[when][key] for r in runs], axis=1)


# --- figures ---------------------------------------------------------------------------

def verdict_figures(records: Path, *, draws: int = DRAWS, seed: int = 0) -> dict:
    """Per setting: each arm's accuracy before, after and its change over the shared seeds;
    each comparison's difference after training with both intervals and the verdict."""
    out = {}
    for setting in SETTINGS:
        seeds = shared_seeds(records, setting)
        entry = {"budget": SETTINGS[setting], "seeds": seeds, "draws": draws, "arms": {},
                 "comparisons": []}
        out[setting] = entry
        if not seeds:
            continue
        runs = load_setting(records, setting)
        after = {}
        for arm in ARMS:
            before = [r["before"]["correct"].mean() for r in runs[arm]]
            after[arm] = [r["after"]["correct"].mean() for r in runs[arm]]
            entry["arms"][arm] = {"before": mean_sd(before), "after": mean_sd(after[arm]),
                                  "change": mean_sd([x - y for x, y in
                                                     zip(after[arm], before, strict=True)])}
        for arm, against in COMPARISONS:
            boot = two_level_bootstrap(_matrix(runs[arm], "after", "correct"),
                                       _matrix(runs[against], "after", "correct"),
                                       draws=draws, seed=seed)
            entry["comparisons"].append({
                "arm": arm, "against": against, "diff": boot["estimate"],
                "bootstrap": {"low": boot["low"], "high": boot["high"], "draws": boot["draws"]},
                "welch": welch(after[arm], after[against]), "verdict": verdict(boot)})
    return out


def _rates(runs: list[dict], when: str, kinds: list[str], *, draws: int, seed: int) -> dict:
    """Length, truncation and accuracies (overall, not truncated, by kind) of one arm."""
    correct = _matrix(runs, when, "correct")
    truncated = _matrix(runs, when, "truncated")
    tokens = _matrix(runs, when, "tokens")
    kind = np.array(kinds)

    def rate(values: np.ndarray, den: np.ndarray | None = None) -> dict:
        den = np.ones_like(values) if den is None else den
        with np.errstate(invalid="ignore", divide="ignore"):
            per_seed = (values * den).sum(axis=0) / den.sum(axis=0)
        figure = mean_sd([None if np.isnan(v) else v for v in per_seed])
        boot = two_level_bootstrap(values, den_a=den, draws=draws, seed=seed)
        figure.update(low=boot["low"], high=boot["high"])
        return figure

    return {"response_tokens": rate(tokens), "truncated": rate(truncated),
            "accuracy": rate(correct), "accuracy_not_truncated": rate(correct, 1 - truncated),
            "accuracy_by_kind": {k: rate(correct, np.broadcast_to(
                (kind == k)[:, None], correct.shape).astype(float)) for k in KIND_LABELS}}


def length_figures(records: Path, *, draws: int = DRAWS, seed: int = 0) -> dict:
    """Per setting and arm, before and after training: response tokens, truncation,
    accuracy on responses not truncated and by kind (mean ± sd over seeds and the
    bootstrap interval over seeds and problems); the training batches' truncation over
    the last 3 steps (``metrics.jsonl``'s ``truncated_fraction``)."""
    out = {}
    for setting in SETTINGS:
        seeds = shared_seeds(records, setting)
        out[setting] = {"seeds": seeds, "arms": {}}
        if not seeds:
            continue
        runs = load_setting(records, setting)
        kinds = heldout_kinds(len(runs[ARMS[0]][0]["after"]["correct"]))
        for arm in ARMS:
            last3 = [statistics.fmean(m["truncated_fraction"] for m in r["metrics"][-3:])
                     if r["metrics"] and all("truncated_fraction" in m for m in r["metrics"][-3:])
                     else None for r in runs[arm]]
            out[setting]["arms"][arm] = {
                when: _rates(runs[arm], when, kinds, draws=draws, seed=seed)
                for when in ("before", "after")} | {"train_truncated_last3": mean_sd(last3)}
    return out


def credit_mass_figures(records: Path) -> dict:
    """Per setting and arm: the credit's mass shares by token class, pooled over every
    recorded step of every run of the shared seeds (:func:`verdict_credit_mass.credit_mass`),
    and each run's shares."""
    out = {}
    for setting in SETTINGS:
        seeds = shared_seeds(records, setting)
        out[setting] = {"seeds": seeds, "arms": {}}
        for arm in ARMS:
            if seeds:
                out[setting]["arms"][arm] = credit_mass(
                    [records / run_name(setting, arm, s) / "rollouts.jsonl" for s in seeds])
    return out


BLAMED = ("ktae", "ktae@ngram=3")
"""The credit methods whose blame on each audited model's own samples the audit table
gives (the plan's audits score these beside GRPO, whose blame is 0.5 by construction)."""


def audit_figures(records: Path) -> dict:
    """Per setting: the starting model's and each audited run's "right answer, wrong
    tokens" rate (``audit.json``'s ``right_answer_wrong_tokens.all``) and the blame of
    each of :data:`BLAMED` on that model's samples (``methods.M.all.blame``: 0.5 is
    chance), None where missing."""
    out = {}
    for setting in SETTINGS:
        names = {"start": f"audit-{setting}-start"}
        names |= {f"{arm}-s{seed}": f"audit-{run_name(setting, arm, seed)}"
                  for arm in ARMS for seed in AUDIT_SEEDS}
        out[setting] = {}
        for key, name in names.items():
            rate, blame = None, dict.fromkeys(BLAMED)
            if recorded(records, name) and (records / name / "audit.json").is_file():
                audit = json.loads((records / name / "audit.json").read_text())
                rate = audit["right_answer_wrong_tokens"]["all"]
                methods = audit.get("methods", {})
                blame = {m: methods[m]["all"]["blame"] if m in methods else None
                         for m in BLAMED}
            out[setting][key] = {"record": name, "rate": rate, "blame": blame}
    return out


def has_records(records: Path) -> bool:
    """Whether any run or audit of the study is recorded under ``records``."""
    return records.is_dir() and any((d / MARKER).is_file() for d in records.iterdir())


def analyse(records: Path, *, draws: int = DRAWS, seed: int = 0) -> dict:
    """Every figure of the plan: the four tables' figures and the runs still missing."""
    return {"records": str(records), "draws": draws, "seed": seed,
            "shared_seeds": {s: shared_seeds(records, s) for s in SETTINGS},
            "missing_runs": missing_runs(records),
            "verdict": verdict_figures(records, draws=draws, seed=seed),
            "length": length_figures(records, draws=draws, seed=seed),
            "credit_mass": credit_mass_figures(records),
            "audit": audit_figures(records)}


TABLES = {"verdict": verdict_figures, "length": length_figures,
          "credit-mass": credit_mass_figures, "audit": audit_figures}
"""The tables ``scripts/tables.py`` renders (as ``verdict``, ``verdict-length``, ...)."""
