"""Regenerate the measured tables of README.md and docs/*.md from the ktae commands behind them.

Each such table sits between markers in the markdown::

    <!-- table: audit-default-seed0 -->

    | method | ... |
    |---|...|

    <!-- /table -->

and is registered here: ``RUNS`` holds the exact commands (each writes JSON into its own
cache folder under ``runs/tables/``), ``TABLES`` names, per table, the runs it reads and the
function that turns their JSON into the markdown table.

    python scripts/tables.py list                         # names, commands, estimated cost
    python scripts/tables.py run NAME... | --all [--max-cost SECONDS] [--reuse]
    python scripts/tables.py check NAME... [--reuse]      # exit 1 when a table differs
    python scripts/tables.py exec RUN... [--reuse]        # only the named runs

``run`` runs the commands (``--reuse``: keep a finished run's cache) and rewrites the tables
between their markers; ``check`` regenerates and prints a diff against the committed table.
A run that names files to keep (``Run.keep``: the ones its tables read) copies them, with
its marker, into ``records/tables/NAME/`` in the repository when it finishes; ``--reuse``
then renders from that record where the cache is gone, so hours of runs outlive the
machine that made them.
Costs are wall seconds at ``--threads 1`` on the project's shared 2-core CPU machine.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "runs" / "tables"
RECORDS = REPO / "records" / "tables"
VERDICT = REPO / "studies" / "verdict-5seed"
DOCS = ("README.md", "docs/*.md", "studies/*/report.md")
MARKER = ".json"
"""Suffix of the file beside a run's cache folder (``runs/tables/NAME.json``): the command
that filled the folder and whether it finished; the script removes only such folders."""
SHIPPED = "src/ktae/models/shipped/embedded-cc11645a8340"

OPEN = re.compile(r"^<!-- table: ([a-z0-9][a-z0-9.=-]*) -->$")
CLOSE = "<!-- /table -->"


@dataclass(frozen=True)
class Run:
    command: str
    """The command line; ``{out}`` is this run's cache folder, ``{run:NAME}`` another's."""
    cost_s: int
    """Estimated wall seconds at one thread on the shared 2-core machine."""
    keep: tuple[str, ...] = ()
    """Files of the run's folder its tables read, kept under ``RECORDS`` once it finishes."""
    resumable: bool = False
    """The command continues what an earlier, unfinished run of it left in its folder
    (``ktae train --resume``): a cut-off run is run again into the same folder."""


@dataclass(frozen=True)
class Table:
    runs: tuple[str, ...]
    render: Callable[..., str]
    """Called with each run's cache folder, in the order of ``runs``; returns the table."""


def _audit(seed: int, extra: str = "") -> Run:
    return Run(f"ktae audit --model default --seed {seed}{extra} --threads 1 -o {{out}} "
               "--overwrite", 510 if "1000" in extra else 60, ("audit.json",))


DIGITS = " --reward digits --eval-every 25"

KERNEL_ENV = {
    "avx2": "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2",
    "portable": "ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 "
                "MKL_ENABLE_INSTRUCTIONS=SSE4_2",
}
"""CPU kernel levels the default job is measured at: torch's own kernels
(``ATEN_CPU_CAPABILITY``), oneDNN's and MKL's, each held at the level, so that any x86 CPU
that has the level gives the same float kernels."""


def _default_job(kernel: str) -> dict[str, Run]:
    """The default job (``ktae train``) and the two embedded evaluations, at one kernel level."""
    env = KERNEL_ENV[kernel]
    return {
        f"train-default-{kernel}": Run(f"{env} ktae train --threads 1 --no-progress -o {{out}}",
                                       1200, ("eval.jsonl", "summary.json")),
        f"eval-shipped-{kernel}": Run(f"{env} ktae eval {SHIPPED} --benchmarks embedded "
                                      "--threads 1 -o {out} --overwrite", 60, ("results.json",)),
        f"eval-train-default-{kernel}": Run(
            f"{env} ktae eval {{run:train-default-{kernel}}}/final --benchmarks embedded "
            "--threads 1 -o {out} --overwrite", 60, ("results.json",)),
    }


def _compare(credit: str, seeds: int, steps: int, extra: str = "") -> str:
    return (f"ktae compare --algo grpo --credit {credit} --seeds {seeds} --max-steps {steps}"
            f"{extra} --threads 1 --no-progress -o {{out}}")


RUNS = {
    "audit-seed0": _audit(0),
    "audit-seed1": _audit(1),
    "audit-seed0-1000": _audit(0, " --prompts 1000"),
    # 200 steps: 3.5 to 6.5 min on the machine when lightly used, 20 min at a load of 8-10
    "train-default": Run("ktae train --threads 1 --no-progress -o {out}", 1200),
    "eval-shipped": Run(f"ktae eval {SHIPPED} --benchmarks embedded --threads 1 -o {{out}} "
                        "--overwrite", 60),
    "eval-train-default": Run("ktae eval {run:train-default}/final --benchmarks embedded "
                              "--threads 1 -o {out} --overwrite", 60),
    **{name: run for kernel in KERNEL_ENV for name, run in _default_job(kernel).items()},
    "simulate-small": Run("ktae simulate --horizon 4,16 --n-opt 10 --group-size 8 --actions 100 "
                          "--steps 200 --lr 0.2 --seeds 3 --eval-every 50 "
                          "--methods broadcast,step,ktae,ktae+taco --audit-groups 0 --threads 1 "
                          "--no-progress -o {out} --overwrite", 40),
    "simulate-ktae-tokens": Run("ktae simulate --methods broadcast,step,ktae --threads 1 "
                                "--no-progress -o {out} --overwrite", 240),
    "simulate-ktae-spans": Run("ktae simulate --methods broadcast,step,ktae --ktae-ngram 3 "
                               "--threads 1 --no-progress -o {out} --overwrite", 240),
    "simulate-all-h": Run("ktae simulate --methods all --n-opt 10 --group-size 8 --lr 0.5 "
                          "--threads 1 --no-progress -o {out} --overwrite", 450),
    "ngram-coverage": Run("python benchmarks/ngram_coverage.py --prompts 100 --seed 1 "
                          "--json {out}/coverage.json", 40),
    "simulate-quick": Run("ktae simulate --threads 1 -o {out} --overwrite", 700),
    # 150-step comparisons: about 10 min per run (150 steps and 4 held-out evaluations)
    "compare-150-5seeds": Run(_compare("none,ktae,ktae@ngram=3", 5, 150), 15 * 600),
    "compare-150-3seeds": Run(_compare("taco,gtpo", 3, 150), 6 * 600),
    "compare-150-none-ktae-taco": Run(_compare("none,ktae,taco", 3, 150), 9 * 600),
    # --reward digits, 50 steps: about 3.5 min per run
    "compare-digits-none-ktae": Run(_compare("none,ktae", 5, 50, DIGITS), 10 * 200),
    "compare-digits-ngram": Run(_compare("ktae@ngram=3", 5, 50, DIGITS), 5 * 200),
    # SmolLM2-135M-Instruct's starting point on the arith task at the recipe's temperature
    # and length, on seed 1's problems (seed 0's chose level 0 and the temperature): 48
    # problems x 8 samples and one greedy answer per difficulty, about 5 min per difficulty
    # beside two training runs
    "arith-baseline": Run("python studies/smollm2-recipe/arith_baseline.py --model smollm2-135m "
                          "--difficulty 0,1,2,3 --problems 48 --temperature 0.6 "
                          "--max-new-tokens 64 --seed 1 --json {out}/baseline.json", 4 * 300,
                          ("baseline.json",)),
    "compare-digits-graded": Run(_compare("ktae,ktae@ngram=3", 5, 50,
                                          DIGITS + " --estimator-option split=graded"), 10 * 200),
}

# The real model's audit (every default method; about 7 min each with two training runs
# beside it): prompt set 0, seed 0 chose the study's methods; set 1, seed 1 was held out.
for _name, _extra in (("audit-smollm2", ""), ("audit-smollm2-heldout", " --prompt-set 1 --seed 1")):
    RUNS[_name] = Run("ktae audit --model smollm2-135m --prompts 16 --samples 8 --threads 1"
                      f"{_extra} --no-progress -o {{out}} --overwrite", 420, ("audit.json",))

RECIPE_SEEDS = (0, 1, 2)
RECIPE = {"grpo": "none", "ktae": "ktae"}
"""The recipe (configs/smollm2-recipe.yaml: arith level 0 at temperature 0.6) per arm and
seed, runs ``recipe0-ARM-sSEED``: GRPO and GRPO + KTAE."""
for _arm, _credit in RECIPE.items():
    for _seed in RECIPE_SEEDS:
        RUNS[f"recipe0-{_arm}-s{_seed}"] = Run(
            f"ktae train --config configs/smollm2-recipe.yaml --credit {_credit} --seed {_seed} "
            "--no-progress -o {out}", 1500, ("summary.json", "metrics.jsonl"))

PRECISION_SEEDS = (21, 22, 23)
"""The recipe (GRPO + KTAE) in float32 and under ``--bf16``, runs
``precision-recipe-{float32,bf16}-sSEED`` (studies/step-time/report.md): seeds of their own, used by
no other table; each resumes from its last checkpoint when cut off."""
for _precision, _flag in (("float32", ""), ("bf16", " --bf16")):
    for _seed in PRECISION_SEEDS:
        RUNS[f"precision-recipe-{_precision}-s{_seed}"] = Run(
            f"ktae train --config configs/smollm2-recipe.yaml --seed {_seed}{_flag} "
            "--save-every 2 --no-progress --resume -o {out}", 1500,
            ("summary.json", "metrics.jsonl", "eval.jsonl"), resumable=True)

RECIPE_ARMS = {"grpo": "none", "ktae": "ktae", "ktae3": "ktae --ktae-ngram 3", "spo": "grpo+spo-mask"}
"""The credit study (configs/smollm2-arith.yaml: the recipe on level 1 at temperature 0.7)
per arm and seed, runs ``recipe-ARM-sSEED``: about 35 min a run
with two runs side by side, one thread each. ``ktae3`` is KTAE over 3-token spans and
``spo`` SPO's probability mask on GRPO: the two methods with the best blame in the
real-model audit (docs/audit.md, "On a real chat model"), chosen before they were trained."""
ARM_LABELS = {"grpo": "GRPO", "ktae": "GRPO + KTAE", "ktae3": "GRPO + KTAE over 3-grams",
              "spo": "GRPO + SPO mask"}
for _arm, _credit in RECIPE_ARMS.items():
    for _seed in RECIPE_SEEDS:
        RUNS[f"recipe-{_arm}-s{_seed}"] = Run(
            f"ktae train --config configs/smollm2-arith.yaml --credit {_credit} --seed {_seed} "
            "--no-progress -o {out}", 2100, ("summary.json", "metrics.jsonl"))
        RUNS[f"recipe-audit-{_arm}-s{_seed}"] = Run(
            f"ktae audit {{run:recipe-{_arm}-s{_seed}}} --credit grpo,ktae,ktae@ngram=3 "
            "--threads 1 --no-progress -o {out} --overwrite", 30, ("audit.json",))

# The advantage estimators' speed at the paper's scale (docs/speed.md): one sort of the
# batch's keys is the yardstick, and the algorithms the current ones replaced run in the
# same rounds. Each run records its CPU, kernel level, threads and the load at its start
# and end (an otherwise idle machine shows a load near 0; `--contend K` adds K busy loops).
SPEED = ("python benchmarks/bench_advantages.py --preset paper --ngram 1,3 --prefix-value "
         "--compare --no-reference --repeats 5 --no-memory --json {out}/bench.json")
#: The rows of the speed table: both batches (the preset's ids with topic vocabularies;
#: Zipf ids over the whole vocabulary) at the AVX2 and the portable kernel level, at 1
#: and 2 threads, on an otherwise idle machine and beside two busy processes.
SPEED_RUNS = tuple(f"speed-{batch}-{kernel}-t{threads}{busy}" for busy in ("", "-busy2")
                   for threads in (1, 2) for kernel in ("avx2", "default")
                   for batch in ("paper", "zipf"))
for _name in SPEED_RUNS:
    _batch, _kernel, _threads, *_busy = _name.split("-")[1:]
    RUNS[_name] = Run(f"{SPEED}{' --zipf' if _batch == 'zipf' else ''} --kernel {_kernel} "
                      f"--threads {_threads[1:]}{' --contend 2' if _busy else ''}", 600,
                      ("bench.json",))
# One step of SmolLM2-135M-Instruct against its floors and against TRL's own trainer
# (studies/step-time/report.md): best on an otherwise idle machine; the table records the load.
RUNS["step-idle"] = Run(
    "python benchmarks/bench_step.py --prompts 2 --generations 4 --new-tokens 32 --threads 1 "
    "--other-threads 2 --rounds 3 --steps 3 --json {out}/bench.json", 420, ("bench.json",))
RUNS["logprob-head-idle"] = Run(
    "python benchmarks/bench_logprob_head.py --rows 8 --prompt 50 --completion 32 --rounds 4 "
    "--json {out}/bench.json", 120, ("bench.json",))
RUNS["speed-large-memory"] = Run(
    "python benchmarks/bench_advantages.py --preset large --ngram 1,3 --prefix-value "
    "--compare --no-reference --repeats 1 --threads 2 --json {out}/bench.json", 60,
    ("bench.json",))


# --- rendering -------------------------------------------------------------------------

def _json(folder: Path, name: str) -> dict:
    return json.loads((folder / name).read_text())


def _cell(s: dict | None) -> str:
    from ktae.credit_audit.report import _cell as cell
    return cell(s)


def _signed_cell(s: dict | None) -> str:
    from ktae.credit_audit.report import _signed_cell as cell
    return cell(s)


def _mean(s: dict | None) -> str:
    return _cell(s).split(" [")[0]


def _signed_mean(s: dict | None) -> str:
    return _signed_cell(s).split(" [")[0]


AUDIT_HEAD = ["| method | blame P(w<r) | lowest-credit token wrong | contamination | "
              "contamination − GRPO's |", "|---|---|---|---|---|"]


def audit_seeds(*folders: Path) -> str:
    """One row per method: the three figures' means, one value per seed joined by ' / '."""
    results = [_json(f, "audit.json")["methods"] for f in folders]
    lines = list(AUDIT_HEAD)
    for name in results[0]:
        a = [r[name]["all"] for r in results]
        lines.append(f"| {name} | " + " | ".join(
            " / ".join(fmt(x[key]) for x in a)
            for key, fmt in (("blame", _mean), ("lowest", _mean), ("contamination", _mean),
                             ("contamination_vs_grpo", _signed_mean))) + " |")
    chance = " / ".join(_mean(r[next(iter(r))]["all"]["chance"]) for r in results)
    half = " / ".join("0.5" for _ in results)
    lines.append(f"| *chance (constant credit)* | {half} | {chance} | | |")
    return "\n".join(lines)


def audit_intervals(folder: Path) -> str:
    """One seed: the three figures with their bootstrap 95% intervals."""
    methods = _json(folder, "audit.json")["methods"]
    lines = list(AUDIT_HEAD)
    for name, entry in methods.items():
        a = entry["all"]
        lines.append(f"| {name} | {_cell(a['blame'])} | {_cell(a['lowest'])} | "
                     f"{_cell(a['contamination'])} | {_signed_cell(a['contamination_vs_grpo'])} |")
    chance = next(iter(methods.values()))["all"]["chance"]
    lines.append(f"| *chance (constant credit)* | 0.5 | {_cell(chance)} | | |")
    return "\n".join(lines)


def audit_mass(folder: Path) -> str:
    """One seed: the credit-mass figures with their intervals."""
    methods = _json(folder, "audit.json")["methods"]
    lines = ["| method | mass gap (wrong − right, in GRPO advantages) | tokens changed from "
             "GRPO | scale (abs. credit / GRPO's) |", "|---|---|---|---|"]
    for name, entry in methods.items():
        a = entry["all"]
        lines.append(f"| {name} | {_signed_cell(a['mass_gap'])} | {_cell(a['tokens_changed'])} "
                     f"| {_cell(a['scale'])} |")
    return "\n".join(lines)


SPEED_COLUMNS = (("KTAE exact", "ktae exact", " [sort]"),
                 ("KTAE over 3-grams", "ktae ngram=3", " [sort]"),
                 ("prefix-value", "prefix-value", " [unique]"))
#: Each estimator's torch path, timed where numba runs its chunks (``bench_advantages.py``'s
#: ``[torch]`` rows for KTAE, ``[lcp]`` for prefix-value): shown beside the replaced
#: algorithm when the run has it.
TORCH = {"ktae exact": " [torch]", "ktae ngram=3": " [torch]", "prefix-value": " [lcp]"}


def _bracket(rows: dict, key: str, old: str, field: str) -> str:
    """``(torch x, sort x)`` (``unique x`` for prefix-value), or ``(x)`` of the replaced
    algorithm alone."""
    torch_key = key + TORCH[key]
    cells = [f"{rows[torch_key][field]:.2f}x torch"] if torch_key in rows else []
    cells.append(f"{rows[key + old][field]:.2f}x" + (f" {old.strip(' []')}" if cells else ""))
    return "(" + ", ".join(cells) + ")"


def speed_memory(folder: Path) -> str:
    """docs/speed.md: each estimator's peak memory over its input, the replaced algorithm's
    beside it."""
    memory = _json(folder, "bench.json")
    r = memory["rows"]
    cells = [f"{r[key]['peak_extra_x_input']:.2f}x {_bracket(r, key, old, 'peak_extra_x_input')}"
             for _, key, old in SPEED_COLUMNS]
    return "\n".join([
        "| peak extra memory over the input | " + " | ".join(t for t, _, _ in SPEED_COLUMNS)
        + " |", "|---" * (1 + len(SPEED_COLUMNS)) + "|",
        f"| {memory['preset']} preset, {memory['threads']} threads | " + " | ".join(cells) + " |"])


def speed(*folders: Path) -> str:
    """README.md and docs/speed.md: each estimator's time over one sort of the batch's keys
    at the paper's scale, the algorithm it replaced beside it, per batch (the presets' ids
    with topic vocabularies; Zipf ids), kernel level, threads and busy processes."""
    timed = [_json(f, "bench.json") for f in folders]
    rows = ["| batch | kernels | threads | busy processes | load at start, end | one sort | "
            + " | ".join(title for title, _, _ in SPEED_COLUMNS) + " |",
            "|---" * (6 + len(SPEED_COLUMNS)) + "|"]
    for d in timed:
        r = d["rows"]
        cells = [f"**{r[key]['median_x_sort']:.2f}x** {_bracket(r, key, old, 'median_x_sort')}"
                 for _, key, old in SPEED_COLUMNS]
        batch = (f"Zipf ids, {d['real_tokens'] / 1e6:.1f}M" if d.get("zipf")
                 else f"topics, {d['real_tokens'] / 1e6:.1f}M")
        rows.append(f"| {batch} | {d['cpu_capability'].lower()} | {d['threads']} | "
                    f"{d['contend']} | {d['load_average'][0]:.1f}, {d['load_average'][1]:.1f} | "
                    f"{r['sort (floor)']['median_seconds']:.2f} s | " + " | ".join(cells) + " |")
    shape = timed[0]["shape"]
    cpus = sorted({d["cpu"] for d in timed})
    rows += ["", f"CPU: {', '.join(cpus)} ({timed[0]['cpu_count']} cores). Median over "
             f"{timed[0]['repeats']} paired rounds of each time over one "
             f"`torch.sort` of the batch's (group, token) keys in the same round; "
             f"{shape[0]} prompts x {shape[1]} responses x <= {shape[2]} tokens (real tokens in "
             "the batch column; topics: the preset's ids, half from a per-prompt topic "
             "vocabulary; Zipf ids: `--zipf`); kernels: torch's CPU kernel level "
             "(`--kernel`); in brackets, timed in the same rounds, each estimator in "
             "torch where numba runs its chunks in compiled loops (`torch`: the path "
             "without `ktae[fast]`; for prefix-value, its classes from prefix hashes) and "
             "the algorithm each replaced (a sort of the keys, "
             "`torch.unique`); busy processes are `--contend K` busy loops."]
    return "\n".join(rows)


def speed_summary(*folders: Path) -> str:
    """README.md: each estimator's range over :func:`speed`'s grid (batches, kernel levels,
    threads), the algorithm it replaced beside it."""
    timed = [_json(f, "bench.json") for f in folders]

    def span(key: str) -> str:
        xs = [d["rows"][key]["median_x_sort"] for d in timed]
        return f"{min(xs):.2f}x-{max(xs):.2f}x"

    torch_rows = all(key + TORCH[key] in d["rows"] for _, key, _ in SPEED_COLUMNS[:2]
                     for d in timed)
    rows = ["| estimator | time over one sort | "
            + ("without numba (`ktae[fast]`) | " if torch_rows else "")
            + "the algorithm it replaced |", "|---" * (3 + torch_rows) + "|"]
    for title, key, old in SPEED_COLUMNS:
        without = ((span(key + TORCH[key]) if all(key + TORCH[key] in d["rows"] for d in timed)
                    else "the same")
                   + " | ") if torch_rows else ""
        rows.append(f"| {title} | **{span(key)}** | {without}{span(key + old)} |")
    sorts = [d["rows"]["sort (floor)"]["median_seconds"] for d in timed]
    batches = sorted({"Zipf ids" if d.get("zipf") else "topics" for d in timed})
    kernels = sorted({d["cpu_capability"].lower() for d in timed})
    threads = sorted({d["threads"] for d in timed})
    cpus = sorted({d["cpu"] for d in timed})
    busy = sorted({d["contend"] for d in timed})
    rows += ["", f"Range of the medians over {len(timed)} settings ({', '.join(batches)} "
             f"batches; kernels {', '.join(kernels)}; {', '.join(map(str, threads))} threads; "
             f"{', '.join(map(str, busy))} busy processes) "
             f"on {', '.join(cpus)} ({timed[0]['cpu_count']} cores); one sort took "
             f"{min(sorts):.2f}-{max(sorts):.2f} s."]
    return "\n".join(rows)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def heldout_default(train: Path, eval_shipped: Path, eval_trained: Path) -> str:
    """The two held-out evaluations of the shipped model and of the default run's model."""
    evals = [json.loads(line) for line in (train / "eval.jsonl").read_text().splitlines()
             if line.strip()]
    before, after = evals[0], evals[-1]
    summary = _json(train, "summary.json")

    def bench(folder: Path) -> dict:
        return _json(folder, "results.json")["benchmarks"]["embedded"]

    shipped, trained = bench(eval_shipped), bench(eval_trained)
    return "\n".join([
        "| model | `ktae train`'s held-out set (300 problems), all / carry-borrow | "
        "`ktae eval --benchmarks embedded` (200 problems) |",
        "|---|---|---|",
        f"| shipped (before training) | {_pct(before['accuracy'])} / "
        f"{_pct(before['accuracy_carry'])} | {_eval_cells(shipped)} |",
        f"| after default `ktae train` ({summary['steps']} steps) | {_pct(after['accuracy'])} / "
        f"{_pct(after['accuracy_carry'])} | {_eval_cells(trained)} |",
    ])


def heldout_default_kernels(dirs) -> str:
    """:func:`heldout_default`'s figures, one row pair per kernel level of :data:`KERNEL_ENV`
    (``dirs``: each level's train, shipped-eval and trained-eval folders, in turn)."""
    lines = ["| kernels | model | `ktae train`'s held-out set (300 problems), all / "
             "carry-borrow | `ktae eval --benchmarks embedded` (200 problems) |",
             "|---|---|---|---|"]
    for i, kernel in enumerate(KERNEL_ENV):
        train, shipped, trained = dirs[3 * i:3 * i + 3]
        body = heldout_default(train, shipped, trained).splitlines()[2:]
        lines += [f"| {kernel} {row}" for row in body]
    return "\n".join(lines + ["", "Kernels: " + "; ".join(
        f"{k}: `{v}`" for k, v in KERNEL_ENV.items()) + "."])


def _eval_cells(b: dict) -> str:
    carry = b.get("accuracy_carry")
    return f"{_pct(b['accuracy'])}" + (f" / {_pct(carry)}" if carry is not None else "")


def train_cost(train: Path) -> str:
    """The default run's step time and the share of it spent computing advantages."""
    s = _json(train, "summary.json")
    return "\n".join([
        "| steps | mean step time | advantages (KTAE) share of step time |",
        "|---|---|---|",
        f"| {s['steps']} | {s['mean_step_seconds']:.2f} s | "
        f"{100 * s['advantage_share']:.2f}% |"])


def _ms(values: list, scale: float = 100.0, digits: int = 1, unit: str = "",
        signed: bool = False) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    sign = "+" if signed else ""
    return f"{scale * statistics.fmean(values):{sign}.{digits}f} ± {scale * sd:.{digits}f}{unit}"


LABELS = {"none": "GRPO", "ktae": "GRPO + KTAE",
          "ktae@ngram=3": "GRPO + KTAE over trigrams (`ktae@ngram=3`)",
          "taco": "GRPO + TACO", "gtpo": "GRPO + GTPO"}


def _accuracy_cells(rows: list[dict]) -> str:
    """Held-out accuracy and carry/borrow accuracy after training, mean ± std over seeds."""
    return (f"{_ms([r.get('heldout_after') for r in rows], unit=' %')} | "
            f"{_ms([r.get('heldout_carry_after') for r in rows], unit=' %')}")


def compare_seeds(*folders: Path) -> str:
    """README: each arm's held-out accuracy after training, from ``comparison.json``."""
    lines = ["| credit | seeds | after 150 steps | carry/borrow problems |",
             "|---|---|---|---|"]
    for folder in folders:
        for arm, rows in _json(folder, "comparison.json").items():
            lines.append(f"| {LABELS.get(arm, arm)} | {len(rows)} | {_accuracy_cells(rows)} |")
    return "\n".join(lines)


def compare_accuracy(folder: Path) -> str:
    """docs/calibration.md: held-out accuracy after training, per arm."""
    lines = ["| credit | after 150 steps | carry/borrow problems |", "|---|---|---|"]
    for arm, rows in _json(folder, "comparison.json").items():
        lines.append(f"| {LABELS.get(arm, arm)} | {_accuracy_cells(rows)} |")
    return "\n".join(lines)


def compare_share(folder: Path) -> str:
    """docs/ngram.md: accuracy after training and the advantages' share of step time."""
    lines = ["| credit | held-out after (%) | carry/borrow after (%) | advantage share of step "
             "time (%) |", "|---|---|---|---|"]
    names = {**LABELS, "ktae@ngram=3": "GRPO + KTAE, N = 3"}
    for arm, rows in _json(folder, "comparison.json").items():
        lines.append(f"| {names.get(arm, arm)} | {_ms([r.get('heldout_after') for r in rows])} | "
                     f"{_ms([r.get('heldout_carry_after') for r in rows])} | "
                     f"{_ms([r.get('advantage_share') for r in rows], digits=2)} |")
    return "\n".join(lines)


def _after(folder: Path, arm: str, seeds: int, step: int, key: str = "accuracy") -> list:
    from ktae.train.cli_compare import parse_arm

    out = []
    for seed in range(seeds):
        rows = (folder / f"{parse_arm(arm).dirname}-seed{seed}" / "eval.jsonl").read_text()
        out += [r[key] for r in map(json.loads, rows.splitlines()) if r["step"] == step]
    return out


def compare_digits(none_ktae: Path, ngram: Path, graded: Path) -> str:
    """docs/graded.md: the digits reward's grids, after 25 and 50 steps."""
    names = [(none_ktae, "none", "GRPO"),
             (none_ktae, "ktae", "GRPO + KTAE (threshold: the strict check)"),
             (graded, "ktae", "GRPO + KTAE, graded split"),
             (ngram, "ktae@ngram=3", "GRPO + KTAE over trigrams (threshold)"),
             (graded, "ktae@ngram=3", "GRPO + KTAE over trigrams, graded split")]
    lines = ["| credit | after 25 steps | after 50 steps | carry/borrow problems after 50 |",
             "|---|---|---|---|"]
    for folder, arm, label in names:
        seeds = len(_json(folder, "comparison.json")[arm])
        lines.append(f"| {label} | {_ms(_after(folder, arm, seeds, 25), unit=' %')} | "
                     f"{_ms(_after(folder, arm, seeds, 50), unit=' %')} | "
                     f"{_ms(_after(folder, arm, seeds, 50, 'accuracy_carry'), unit=' %')} |")
    return "\n".join(lines)


def compare_cost(folder: Path) -> str:
    """docs/training.md: accuracy, step time and the advantages' share of it."""
    lines = ["| credit | after 150 steps | carry/borrow | step time (s) | advantage share |",
             "|---|---|---|---|---|"]
    for arm, rows in _json(folder, "comparison.json").items():
        lines.append(f"| {LABELS.get(arm, arm)} | "
                     f"{_ms([r.get('heldout_after') for r in rows])} | "
                     f"{_ms([r.get('heldout_carry_after') for r in rows])} | "
                     f"{statistics.fmean(r['mean_step_seconds'] for r in rows):.2f} | "
                     f"{100 * statistics.fmean(r['advantage_share'] for r in rows):.2f}% |")
    return "\n".join(lines)


def ngram_coverage(folder: Path) -> str:
    """docs/ngram.md: how much of a response KTAE credits, per span length and reduction."""
    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    def num(x, fmt):
        return "n/a" if x is None else format(x, fmt)

    lines = ["| N | reduce | non-zero (mixed groups) | non-zero (all groups) | mean abs(v) | "
             "blame | hit | tied |", "|---|---|---|---|---|---|---|---|"]
    for r in _json(folder, "coverage.json")["rows"]:
        lines.append(f"| {r['ngram']} | {r['reduce'] if r['ngram'] > 1 else '-'} | "
                     f"{pct(r['nonzero_mixed'])} | {pct(r['nonzero_all'])} | "
                     f"{num(r['mean_abs_mixed'], '.3f')} | {num(r['blame'], '+.3f')} | "
                     f"{pct(r['hit'])} | {num(r['tied'], '.1f')} |")
    return "\n".join(lines)


def _sim(folder: Path):
    """``ktae simulate``'s curves.json as the SimResult its report functions read."""
    import torch

    from ktae.sim.config import Setting, SimConfig
    from ktae.sim.run import SimResult

    d = _json(folder, "curves.json")
    cfg = SimConfig(**{k: tuple(v) if isinstance(v, list) else v
                       for k, v in d["config"].items()})
    curves, flags = {}, {}
    for c in d["curves"]:
        key = (c["method"], Setting(**c["setting"]))
        curves[key] = torch.tensor(c["returns"], dtype=torch.float64)
        if c["flag_rate"] is not None:
            flags[key] = torch.tensor(c["flag_rate"], dtype=torch.float64)
    return SimResult(cfg, d["eval_steps"], curves, d["seconds"], flags)


SIM_LABELS = {"broadcast": "broadcast (GRPO)", "step": "step-level oracle",
              "ktae": "KTAE (split at the group's mean return)", "ktae-graded": "KTAE, graded split",
              "taco": "TACO", "ktae+taco": "KTAE + TACO"}


def simulate_summary(folder: Path) -> str:
    """README: final and mean return along H, and the share of the oracle's gain."""
    from ktae.sim import report
    from ktae.sim.config import Setting

    r = _sim(folder)
    base = r.config.base
    hs = [Setting(h, base.n_opt, base.group_size) for h in r.config.horizons]
    land = report.landing(r)
    lines = ["| method | final return, H=" + " / ".join(map(str, r.config.horizons))
             + " | mean return over training, H=" + " / ".join(map(str, r.config.horizons))
             + f" | share of the oracle's gain (mean return, {len(r.config.settings())} "
             "settings) |", "|---|---|---|---|"]
    for m in r.config.method_names:
        final = " / ".join(f"{float(report.per_seed(r, m, s, 'final').mean()):.3f}" for s in hs)
        mean = " / ".join(f"{float(report.per_seed(r, m, s, 'mean').mean()):.3f}" for s in hs)
        share = land[m]["share_of_oracle_gain"]
        lines.append(f"| {SIM_LABELS.get(m, m)} | {final} | {mean} | "
                     f"{'n/a' if share is None else f'{share:.0%}'} |")
    return "\n".join(lines)


def _sim_columns(r) -> list:
    """The base setting, then each axis's other values: H = 4, H = 16 (base), H = 64, ..."""
    from ktae.sim.config import AXES, AXIS_LABELS

    cols = []
    for axis in AXES:
        for s in r.config.axis_settings(axis):
            if s == r.config.base and axis != AXES[0]:
                continue
            label = f"{AXIS_LABELS[axis]} = {getattr(s, axis)}"
            cols.append((label + (" (base)" if s == r.config.base else ""), s))
    return cols


def _sim_table(folder: Path, cell, *, skip_empty: bool = False) -> str:
    r = _sim(folder)
    cols = _sim_columns(r)
    rows = {m: [cell(r, m, s) for _, s in cols] for m in r.config.method_names}
    if skip_empty:  # a setting no method got anywhere in
        keep = [i for i in range(len(cols)) if any(v[i] != "—" for v in rows.values())]
        cols = [cols[i] for i in keep]
        rows = {m: [v[i] for i in keep] for m, v in rows.items()}
    lines = ["| method | " + " | ".join(label for label, _ in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for m, cells in rows.items():
        name = "step (oracle)" if m == "step" else m
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _sim_return(measure: str):
    def cell(r, m, s):
        from ktae.sim import report
        return "{:.3f} ± {:.3f}".format(*report.mean_std(report.per_seed(r, m, s, measure)))
    return lambda folder: _sim_table(folder, cell)


def simulate_landing(folder: Path) -> str:
    """Each method's mean return averaged over every setting and its share of the oracle's
    gain (ktae simulate's own summary table)."""
    from ktae.sim import report

    lines = ["| method | mean return, all settings | share of the oracle's gain | "
             "tokens flagged by the calibration |", "|---|---|---|---|"]
    for m, v in report.landing(_sim(folder)).items():
        share = v["share_of_oracle_gain"]
        flags = "—" if v["flag_rate"] is None else f"{v['flag_rate']:.2%}"
        lines.append(f"| {m} | {v['mean_return']:.3f} ± {v['std']:.3f} | "
                     f"{'n/a' if share is None else f'{share:.0%}'} | {flags} |")
    return "\n".join(lines)


def simulate_ngram(tokens: Path, spans: Path) -> str:
    """docs/ngram.md: KTAE's mean return per setting over tokens and over trigrams."""
    from ktae.sim import report

    lines = []
    for label, folder in (("tokens (N = 1)", tokens), ("spans (N = 3)", spans)):
        r = _sim(folder)
        cols = _sim_columns(r)
        if not lines:
            lines = ["| KTAE | " + " | ".join(c.replace(" (base)", "") for c, _ in cols)
                     + " | share of the oracle's gain |", "|---|" + "---|" * (len(cols) + 1)]
        cells = ["{:.3f} ± {:.3f}".format(*report.mean_std(report.per_seed(r, "ktae", s, "mean")))
                 for _, s in cols]
        share = report.landing(r)["ktae"]["share_of_oracle_gain"]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {share:.0%} |")
    return "\n".join(lines)


def simulate_calibrations(folder: Path) -> str:
    """docs/simulate.md: every method along H: mean return, share, tokens flagged."""
    from ktae.sim import report

    r = _sim(folder)
    cols = _sim_columns(r)
    land = report.landing(r)
    lines = ["| method | " + " | ".join(c.replace(" (base)", "") for c, _ in cols)
             + " | share of the oracle's gain | tokens flagged |",
             "|---|" + "---|" * (len(cols) + 2)]
    for m in r.config.method_names:
        cells = ["{:.3f} ± {:.3f}".format(*report.mean_std(report.per_seed(r, m, s, "mean")))
                 for _, s in cols]
        v = land[m]
        share = "n/a" if v["share_of_oracle_gain"] is None else f"{v['share_of_oracle_gain']:.0%}"
        flags = "—" if v["flag_rate"] is None else f"{v['flag_rate']:.2%}"
        name = "step (oracle)" if m == "step" else m
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {share} | {flags} |")
    return "\n".join(lines)


def _sim_audit(folder: Path, last: bool) -> tuple[str, dict]:
    results = _json(folder, "curves.json")["audit"]["results"]
    update = sorted(results, key=int)[-1 if last else 0]
    return update, results[update]


def simulate_audit(folder: Path, *, last: bool) -> str:
    """The MDP's credit audit at the first or last audited update, all settings pooled."""
    from ktae.sim import blame
    from ktae.sim.blame_report import ALL_SETTINGS, AUDIT_SHORT, _audit_cell

    _, methods = _sim_audit(folder, last)
    # chance beside lowest, which it is the baseline of (means only: it is the same for
    # every method on the same trajectories)
    figures = ["blame", "lowest", "chance",
               *(f for f in blame.FIGURES if f not in ("blame", "lowest", "chance"))]
    lines = ["| method | " + " | ".join(AUDIT_SHORT[f] for f in figures)
             + " | trajectories (blame / contamination) |",
             "|---|" + "---|" * (len(figures) + 1)]
    for m, entry in methods.items():
        a = entry[ALL_SETTINGS]
        name = "step (oracle)" if m == "step" else m
        lines.append(f"| {name} | " + " | ".join(_audit_cell(a[f], f, f != "chance")
                                                  for f in figures)
                     + f" | {a['blame']['responses']} / {a['contamination']['responses']} |")
    return "\n".join(lines)


def simulate_audit_blame(folder: Path) -> str:
    """Blame at the last audited update, per setting."""
    from ktae.sim.blame_report import _audit_cell

    cols = _sim_columns(_sim(folder))
    _, methods = _sim_audit(folder, True)
    lines = ["| method | " + " | ".join(label for label, _ in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for m, entry in methods.items():
        name = "step (oracle)" if m == "step" else m
        lines.append(f"| {name} | " + " | ".join(
            _audit_cell(entry.get(s.label(), {}).get("blame"), "blame")
            for _, s in cols) + " |")
    return "\n".join(lines)


def simulate_steps(folder: Path) -> str:
    """Updates to reach the target return; settings where no method got there are left out."""
    def cell(r, m, s):
        from ktae.sim import report
        return report._fmt_steps(report.steps_to_target(r.curves[(m, s)], r.eval_steps,
                                                        r.config.target))
    return _sim_table(folder, cell, skip_empty=True)


def simulate_shares(folder: Path) -> str:
    """Each method's share of the oracle's gain per setting, final and mean return."""
    from ktae.sim import report

    r = _sim(folder)
    cols = _sim_columns(r)
    lines = ["| method | measure | " + " | ".join(label for label, _ in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for measure in ("final", "mean"):
        shares = report.oracle_shares(r, measure)
        for m in r.config.method_names:
            if m in (report.BROADCAST, report.ORACLE):
                continue
            cells = ["n/a" if shares[(m, s)] is None else f"{shares[(m, s)] + 0.0:.0%}"
                     .replace("-0%", "0%") for _, s in cols]
            lines.append(f"| {m} | {measure} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _problem_bootstrap(passes: list[int], samples: int, draws: int = 4000) -> tuple[float, float]:
    """95% percentile interval of the sampled pass rate, resampling problems (a problem's
    samples are not independent of each other)."""
    import numpy as np

    per = np.asarray(passes, dtype=float) / samples
    rng = np.random.default_rng(0)
    means = per[rng.integers(0, len(per), (draws, len(per)))].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def arith_baseline(folder: Path) -> str:
    """studies/smollm2-recipe/report.md: pass rates of the model before training, per difficulty, with a
    95% interval over problems."""
    data = _json(folder, "baseline.json")
    first = next(iter(data["results"].values()))
    rows = [f"| difficulty | sampled pass rate (T = {first['temperature']:g}), 95% interval | "
            f"mixed groups | greedy accuracy | truncated at {data['max_new_tokens']} tokens | "
            "mean response tokens | sampled pass by kind |",
            "|---|---|---|---|---|---|---|"]
    for d in sorted(data["results"], key=int):
        r = data["results"][d]
        low, high = _problem_bootstrap(r["passes_per_problem"], r["samples"])
        kinds = ", ".join(f"{k} {v:.0%}" for k, v in sorted(r["pass_by_kind"].items()))
        rows.append(f"| {d} | {r['sampled_pass']:.1%} [{low:.1%}, {high:.1%}] | "
                    f"{r['mixed_groups']:.0%} | {r['greedy_accuracy']:.0%} | "
                    f"{r['truncated']:.0%} | {r['mean_tokens']:.0f} | {kinds} |")
    rows += ["", f"{first['problems']} training problems per difficulty (seed {data['seed']}), "
             f"{first['samples']} samples each."]
    return "\n".join(rows)


def step_idle(folder: Path) -> str:
    """studies/step-time/report.md: generation and the update against their floors, and ktae's step
    against TRL's, from one ``benchmarks/bench_step.py`` run."""
    b = _json(folder, "bench.json")
    floor, parts, gens = b["floors"], b["ktae_part_medians"], b["generation"]
    best = min(gens.values())
    rows = ["| part | seconds | floor | x floor |", "|---|---|---|---|"]
    for name, seconds in gens.items():
        mark = " (best)" if seconds == best else ""
        rows.append(f"| generation, `generate` + {name}{mark} | {seconds:.2f} | "
                    f"{floor['generation']:.2f} | {seconds / floor['generation']:.2f} |")
    rows.append(f"| ktae step: generation | {parts['generation']:.2f} | "
                f"{floor['generation']:.2f} | {parts['generation'] / floor['generation']:.2f} |")
    if "passes" in b:
        own = b["passes"]["forward, with gradients"] + b["passes"]["backward"]
        rows.append(f"| the model's own forward and backward, no trainer (full logits) | "
                    f"{own:.2f} | {floor['update']:.2f} | {own / floor['update']:.2f} |")
    rows.append(f"| ktae step: update (forward, backward, AdamW) | {parts['update']:.2f} | "
                f"{floor['update']:.2f} | **{parts['update'] / floor['update']:.2f}** |")
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_step import steady_steps

    per = b.get("steps_per_turn", 1)

    def steady(xs: list) -> list:
        return steady_steps(xs, per)

    n = len(steady(b["steps"]["ktae"]))
    med = {k: statistics.median(steady(v)) for k, v in b["steps"].items()}
    loss = {k: statistics.median(p.get("compute_loss", 0.0) for p in steady(b["trl_profiled"][k]))
            for k in ("ktae", "trl")}
    rows.append(f"| ktae step (median of {n}) | {med['ktae']:.2f} | | |")
    rows += ["", f"- ktae (`--credit none`, log-prob head `{b['logprob_head']}`) against TRL's "
             f"`GRPOTrainer`, medians of {n} alternating steps: {med['ktae']:.2f} s against "
             f"{med['trl']:.2f} s, ktae/TRL **{b['ratio']:.3f}**; TRL's profiled "
             f"`compute_loss` (the loss's forward pass): {loss['ktae']:.2f} s against "
             f"{loss['trl']:.2f} s.",
             f"- Generation in the step over the best backend: "
             f"{parts['generation'] / best:.2f}x.",
             *([f"- Each trainer ran {per} steps a turn, {len(b['steps']['ktae']) // per} "
                "turns; the figures above leave out each turn's first step (a fresh "
                "trainer's, which creates AdamW's state), whose medians were "
                f"{b['first_step_medians']['ktae']:.2f} s (ktae) and "
                f"{b['first_step_medians']['trl']:.2f} s (TRL)."] if per > 1 else []),
             f"- Matmul rate, one thread: {b['matmul']['train_flops'] / 1e9:.0f} GFLOP/s at "
             f"{b['matmul']['train_rows']} rows, {b['matmul']['decode_flops'] / 1e9:.0f} at "
             f"{b['matmul']['decode_rows']} rows. 1-minute load average at the start and end: "
             f"{b['load_start']}, {b['load_end']}."]
    return "\n".join(rows)


def logprob_head(folder: Path) -> str:
    """studies/step-time/report.md: the policy pass's forward and backward under each head."""
    b = _json(folder, "bench.json")
    rows = ["| pass (forward with gradients, backward) | forward | backward | total | "
            "x 6 N T |", "|---|---|---|---|---|"]
    for name, t in b["passes"].items():
        rows.append(f"| {name} | {t['forward']:.2f} s | {t['backward']:.2f} s | "
                    f"{t['total']:.2f} s | {t['total'] / b['floor_6NT']:.2f} |")
    rows += ["", f"SmolLM2-135M-Instruct, {b['rows']} rows of {b['prompt']} prompt and "
             f"{b['completion']} completion tokens, full fine-tuning, {b['threads']} thread; "
             f"medians of {b['rounds']} rounds; 6 N T = {b['floor_6NT']:.2f} s at "
             f"{b['matmul_flops'] / 1e9:.0f} GFLOP/s; 1-minute load {b['load'][0]:.1f} at "
             f"the start, {b['load'][1]:.1f} at the end."]
    return "\n".join(rows)


def _arms(folders: tuple[Path, ...]) -> list[str]:
    """The arms whose runs ``folders`` holds, in RECIPE_ARMS order (seeds innermost)."""
    names = [f.name.removeprefix("recipe-audit-").removeprefix("recipe0-")
             .removeprefix("recipe-").rsplit("-s", 1)[0] for f in folders]
    return [arm for arm in RECIPE_ARMS if arm in names]


def _recipe_runs(folders: tuple[Path, ...]) -> dict[str, list[dict]]:
    """Per arm, per seed: the run's summary, metrics and wall seconds (from the marker)."""
    out: dict[str, list[dict]] = {}
    it = iter(folders)
    for arm in _arms(folders):
        for _seed in RECIPE_SEEDS:
            folder = next(it)
            record = json.loads((folder.parent / f"{folder.name}{MARKER}").read_text())
            metrics = [json.loads(line) for line in (folder / "metrics.jsonl").open()]
            out.setdefault(arm, []).append({"summary": _json(folder, "summary.json"),
                                            "metrics": metrics, "wall": record.get("seconds")})
    return out


def recipe(*folders: Path) -> str:
    """studies/smollm2-recipe/report.md: the recipe's held-out greedy accuracy before and
    after, over the seeds, per arm; the change of KTAE against GRPO with Welch's interval."""
    sys.path.insert(0, str(REPO / "studies"))
    from stats import welch

    runs = _recipe_runs(folders)
    rows = ["| arm | seeds | held-out greedy before | after | change (points) | "
            "training reward, first 3 steps -> last 3 | truncated, last 3 steps | "
            "wall per run, min: mean (range) |", "|---|---|---|---|---|---|---|---|"]
    change: dict[str, list[float]] = {}
    for arm, items in runs.items():
        before = [r["summary"]["heldout_before"] for r in items]
        after = [r["summary"]["heldout_after"] for r in items]
        change[arm] = [a - b for a, b in zip(after, before, strict=True)]
        first = [statistics.fmean(m["reward"] for m in r["metrics"][:3]) for r in items]
        last = [statistics.fmean(m["reward"] for m in r["metrics"][-3:]) for r in items]
        trunc = [statistics.fmean(m["truncated_fraction"] for m in r["metrics"][-3:])
                 for r in items]
        wall = [r["wall"] / 60 for r in items if r["wall"] is not None]
        rows.append(f"| {ARM_LABELS[arm]} | {len(items)} | "
                    f"{_ms(before, unit='%')} | {_ms(after, unit='%')} | "
                    f"{_ms(change[arm], signed=True)} | "
                    f"{_ms(first, unit='%')} -> {_ms(last, unit='%')} | {_ms(trunc, unit='%')} | "
                    f"{statistics.fmean(wall):.0f} ({min(wall):.0f}-{max(wall):.0f}) |")
    rows.append("")
    for arm in change:
        if arm == "grpo":
            continue
        w = welch(change[arm], change["grpo"])
        if w["low"] is None:
            interval = "undefined (no spread)"
        else:
            interval = f"[{100 * w['low']:+.1f}, {100 * w['high']:+.1f}]"
        rows.append(f"- {ARM_LABELS[arm]}'s change minus GRPO's: {100 * w['diff']:+.1f} points, "
                    f"Welch 95% interval {interval} ({w['n_a']} and {w['n_b']} seeds).")
    rows.append("")
    rows.append("Mean ± standard deviation over seeds.")
    return "\n".join(rows)


def precision_recipe(*folders: Path) -> str:
    """studies/step-time/report.md: the recipe (GRPO + KTAE) in float32 and under ``--bf16``: held-out
    greedy accuracy before and after, the step's time by part, and bfloat16's difference
    from float32 with Welch's interval over seeds and the bootstrap over seeds and
    problems (scripts/verdict_analysis.py)."""
    import numpy as np

    sys.path.insert(0, str(REPO / "studies"))
    from stats import welch
    from verdict_analysis import two_level_bootstrap

    runs: dict[str, list[dict]] = {}
    for folder in folders:
        precision = folder.name.removeprefix("precision-recipe-").rsplit("-s", 1)[0]
        evals = [json.loads(line) for line in (folder / "eval.jsonl").open()]
        record = json.loads((folder.parent / f"{folder.name}{MARKER}").read_text())
        runs.setdefault(precision, []).append({
            "summary": _json(folder, "summary.json"), "wall": record.get("seconds"),
            "before": [p["correct"] for p in evals[0]["problems"]],
            "after": [p["correct"] for p in evals[-1]["problems"]]})
    rows = ["| precision | seeds | held-out greedy before | after | change (points) | "
            "step (s) | generation (s) | update (s) | wall per run, min |",
            "|---|---|---|---|---|---|---|---|---|"]
    change, per_problem = {}, {}
    for precision, items in runs.items():
        before = [r["summary"]["heldout_before"] for r in items]
        after = [r["summary"]["heldout_after"] for r in items]
        change[precision] = [a - b for a, b in zip(after, before, strict=True)]
        per_problem[precision] = np.array([[float(a) - float(b) for a, b in
                                            zip(r["after"], r["before"], strict=True)]
                                           for r in items]).T  # [problems, seeds]
        secs = [r["summary"]["step_seconds"] for r in items]
        wall = [r["wall"] / 60 for r in items if r["wall"] is not None]
        rows.append(f"| {precision} | {len(items)} | {_ms(before, unit='%')} | "
                    f"{_ms(after, unit='%')} | {_ms(change[precision], signed=True)} | "
                    f"{_ms([s['step'] for s in secs], scale=1)} | "
                    f"{_ms([s['generation'] for s in secs], scale=1)} | "
                    f"{_ms([s['update'] for s in secs], scale=1)} | "
                    + (f"{statistics.fmean(wall):.0f} |" if wall else "n/a |"))
    rows.append("")
    if {"float32", "bf16"} <= set(change):
        w = welch(change["bf16"], change["float32"])
        interval = ("undefined (no spread)" if w["low"] is None
                    else f"[{100 * w['low']:+.1f}, {100 * w['high']:+.1f}]")
        boot = two_level_bootstrap(per_problem["bf16"], per_problem["float32"])
        rows.append(f"- bfloat16's change minus float32's: {100 * w['diff']:+.1f} points; "
                    f"Welch 95% interval over seeds {interval} ({w['n_a']} and {w['n_b']} "
                    f"seeds); bootstrap over seeds and the {per_problem['bf16'].shape[0]} "
                    f"problems [{100 * boot['low']:+.1f}, {100 * boot['high']:+.1f}].")
        step = {p: statistics.fmean(r["summary"]["step_seconds"]["step"] for r in runs[p])
                for p in ("float32", "bf16")}
        rows.append(f"- Mean step, bfloat16 over float32: {step['bf16'] / step['float32']:.2f} "
                    "(the runs of each precision ran at different times on a shared machine: "
                    "the side-by-side ratio is bench_step_ab's).")
        rows.append("")
    rows.append("Mean ± standard deviation over seeds; configs/smollm2-recipe.yaml, seeds "
                f"{', '.join(str(s) for s in PRECISION_SEEDS)}.")
    return "\n".join(rows)


def recipe_steps(*folders: Path) -> str:
    """studies/smollm2-recipe/report.md: the recipe's step time by part, mean over every step of every run."""
    runs = _recipe_runs(folders)
    parts = ("generation", "scoring", "logprobs", "advantages", "update", "other")
    rows = ["| arm | step (s) | " + " | ".join(parts) + " |", "|---" * (len(parts) + 2) + "|"]
    for arm, items in runs.items():
        secs = [r["summary"]["step_seconds"] for r in items]
        cells = [f"{statistics.fmean(s.get(p, 0.0) for s in secs):.1f}" for p in parts]
        rows.append(f"| {ARM_LABELS[arm]} | "
                    f"{statistics.fmean(s['step'] for s in secs):.1f} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def recipe_claims(*folders: Path) -> str:
    """studies/smollm2-recipe/report.md: the share of right answers that hold a false arithmetic claim
    in the recipe's recorded rollouts (``ktae audit RUN``), at the first and last recorded
    step, pooled over seeds."""
    sys.path.insert(0, str(REPO / "studies" / "claims"))
    from claims_rate import wilson

    it = iter(folders)
    rows = ["| arm | step | right answers | with a false claim | share [Wilson 95%] |",
            "|---|---|---|---|---|"]
    for arm in _arms(folders):
        pooled: dict[int, list[int]] = {}
        for _seed in RECIPE_SEEDS:
            steps = _json(next(it), "audit.json")["right_answer_wrong_tokens"]["steps"]
            for step, r in steps.items():
                k = round(r["mean"] * r["responses"]) if r["mean"] is not None else 0
                acc = pooled.setdefault(int(step), [0, 0])
                acc[0] += k
                acc[1] += r["responses"]
        for step in sorted(pooled):
            k, n = pooled[step]
            low, high = wilson(k, n)
            share = f"{k / n:.1%} [{max(low, 0.0):.1%}, {min(high, 1.0):.1%}]" if n else "n/a"
            rows.append(f"| {ARM_LABELS[arm]} | {step} | {n} | {k} | "
                        f"{share} |")
    return "\n".join(rows)


ARM_AUDIT_NAMES = {"grpo": "grpo", "ktae": "ktae", "ktae3": "ktae@ngram=3", "spo": "spo-mask"}
"""Each study arm as ``ktae audit`` names the method."""
CROSS_FIGURES = ("blame", "lowest", "mass_gap")
"""The audit figures both testbeds measure (contamination needs right answers holding a
false claim, which the real model's audits did not have)."""


def _audit_means(folder: Path, figure: str) -> dict[str, float]:
    """Each method's mean of ``figure``, rounded to 9 decimals: methods that agree up to
    floating-point noise (the many that score exactly GRPO's value) tie in the ranks
    instead of being ordered by the last bits of one machine's arithmetic."""
    methods = _json(folder, "audit.json")["methods"]
    return {name: round(e["all"][figure]["mean"], 9) for name, e in methods.items()
            if e["all"].get(figure) and e["all"][figure].get("mean") is not None}


def _corr_row(cells: str, x: dict[str, float], y: dict[str, float], better: int) -> str:
    sys.path[:0] = [str(REPO / "studies" / "credit-study"), str(REPO / "studies")]
    from credit_study import spearman, verdict

    common = [m for m in x if m in y]
    res = spearman([x[m] for m in common], [y[m] for m in common])
    if res["rho"] is None:
        return f"| {cells} | {res['n']} | n/a (no spread) | | | {verdict(res, better)} |"
    interval = "n/a" if res["low"] is None else f"[{res['low']:+.2f}, {res['high']:+.2f}]"
    return (f"| {cells} | {res['n']} | {res['rho']:+.2f} | {interval} | {res['p']:.3f} | "
            f"{verdict(res, better)} |")


_CROSS_AUDITS = {"shipped model (set 0, seed 0, 200 x 8)": 0,
                 "SmolLM2, development (set 0, seed 0, 16 x 8)": 1,
                 "SmolLM2, held out (set 1, seed 1, 16 x 8)": 2}
_CROSS_HEAD = ["| figure | x | y | methods | rho | 95% interval | p | verdict |",
               "|---|---|---|---|---|---|---|---|"]


def cross_audits(*audits: Path) -> str:
    """studies/credit-study/report.md: Spearman's rho over the methods both audits scored (bootstrap
    95% interval over methods, scipy's p, credit_study.py's verdict, "predicts" = the same
    order) between the shipped model's audit and the real model's two audits."""
    names = list(_CROSS_AUDITS)
    rows = list(_CROSS_HEAD)
    for fig in CROSS_FIGURES:
        means = {n: _audit_means(audits[i], fig) for n, i in _CROSS_AUDITS.items()}
        for a, b in ((names[0], names[2]), (names[0], names[1]), (names[1], names[2])):
            rows.append(_corr_row(f"{fig} | {a} | {b}", means[a], means[b], 1))
    return "\n".join(rows)


def study_gains(runs: tuple[Path, ...]) -> dict[str, float]:
    """Each study arm's mean held-out change over seeds minus GRPO's, by audit name."""
    change: dict[str, float] = {}
    it = iter(runs)
    for arm in RECIPE_ARMS:
        diffs = []
        for _seed in RECIPE_SEEDS:
            summary = _json(next(it), "summary.json")
            diffs.append(summary["heldout_after"] - summary["heldout_before"])
        change[ARM_AUDIT_NAMES[arm]] = statistics.fmean(diffs)
    return {m: v - change["grpo"] for m, v in change.items()}


def cross_gains(*folders: Path) -> str:
    """studies/credit-study/report.md: each audit's figures against the real model's training gain
    over GRPO (the study's arms: mean change over seeds minus GRPO's; GRPO's gain is 0),
    Spearman's rho as in :func:`cross_audits`, the verdict in the audit's better direction."""
    sys.path[:0] = [str(REPO / "studies" / "credit-study"), str(REPO / "studies")]
    from credit_study import BETTER

    audits, runs = folders[:3], folders[3:]
    gain = study_gains(runs)
    rows = list(_CROSS_HEAD)
    for fig in CROSS_FIGURES:
        for n, i in _CROSS_AUDITS.items():
            rows.append(_corr_row(f"{fig} | {n} | training gain", _audit_means(audits[i], fig),
                                  gain, BETTER[fig]))
    rows += ["", "Training gains over GRPO, points: "
             + ", ".join(f"{m} {100 * g:+.1f}" for m, g in gain.items()) + "."]
    return "\n".join(rows)


_RECIPE = tuple(f"recipe0-{arm}-s{seed}" for arm in RECIPE for seed in RECIPE_SEEDS)
_STUDY = tuple(f"recipe-{arm}-s{seed}" for arm in RECIPE_ARMS for seed in RECIPE_SEEDS)
_AUDITS3 = ("audit-seed0", "audit-smollm2", "audit-smollm2-heldout")

TABLES = {
    "recipe": Table(_RECIPE, recipe),
    "precision-recipe": Table(tuple(f"precision-recipe-{p}-s{s}" for p in ("float32", "bf16")
                                    for s in PRECISION_SEEDS), precision_recipe),
    "recipe-steps": Table(_RECIPE, recipe_steps),
    "recipe-claims": Table(tuple(f"recipe-audit-{arm}-s{seed}" for arm in ("grpo", "ktae")
                                 for seed in RECIPE_SEEDS), recipe_claims),
    "audit-smollm2": Table(("audit-smollm2",), audit_intervals),
    "audit-smollm2-mass": Table(("audit-smollm2",), audit_mass),
    "audit-smollm2-heldout": Table(("audit-smollm2-heldout",), audit_intervals),
    "audit-smollm2-heldout-mass": Table(("audit-smollm2-heldout",), audit_mass),
    "cross-audits": Table(_AUDITS3, cross_audits),
    "study-real": Table(_STUDY, recipe),
    "study-real-claims": Table(tuple(f"recipe-audit-{arm}-s{seed}" for arm in RECIPE_ARMS
                                     for seed in RECIPE_SEEDS), recipe_claims),
    "cross-gains": Table(_AUDITS3 + _STUDY, cross_gains),
    "speed": Table(SPEED_RUNS, speed),
    "speed-summary": Table(SPEED_RUNS, speed_summary),
    "speed-memory": Table(("speed-large-memory",), speed_memory),
    "audit-default-seeds01": Table(("audit-seed0", "audit-seed1"), audit_seeds),
    "audit-default-seed0": Table(("audit-seed0",), audit_intervals),
    "audit-default-seed1": Table(("audit-seed1",), audit_intervals),
    "audit-default-seed0-1000": Table(("audit-seed0-1000",), audit_intervals),
    "audit-mass-seed0": Table(("audit-seed0",), audit_mass),
    "heldout-default": Table(("train-default", "eval-shipped", "eval-train-default"),
                             heldout_default),
    "heldout-default-kernels": Table(
        tuple(f"{run}-{kernel}" for kernel in KERNEL_ENV
              for run in ("train-default", "eval-shipped", "eval-train-default")),
        lambda *dirs: heldout_default_kernels(dirs)),
    "train-default-cost": Table(("train-default",), train_cost),
    "simulate-small": Table(("simulate-small",), simulate_summary),
    "simulate-quick-summary": Table(("simulate-quick",), simulate_summary),
    "simulate-quick-final": Table(("simulate-quick",), _sim_return("final")),
    "simulate-quick-mean": Table(("simulate-quick",), _sim_return("mean")),
    "simulate-quick-landing": Table(("simulate-quick",), simulate_landing),
    "simulate-quick-audit-first": Table(("simulate-quick",),
                                        lambda f: simulate_audit(f, last=False)),
    "simulate-quick-audit-last": Table(("simulate-quick",), lambda f: simulate_audit(f, last=True)),
    "simulate-quick-audit-blame": Table(("simulate-quick",), simulate_audit_blame),
    "simulate-quick-steps": Table(("simulate-quick",), simulate_steps),
    "simulate-quick-shares": Table(("simulate-quick",), simulate_shares),
    "ngram-coverage": Table(("ngram-coverage",), ngram_coverage),
    "simulate-ngram": Table(("simulate-ktae-tokens", "simulate-ktae-spans"), simulate_ngram),
    "simulate-all-h": Table(("simulate-all-h",), simulate_calibrations),
    "arith-baseline": Table(("arith-baseline",), arith_baseline),
    "step-idle": Table(("step-idle",), step_idle),
    "logprob-head-idle": Table(("logprob-head-idle",), logprob_head),
    "compare-grpo-150": Table(("compare-150-5seeds", "compare-150-3seeds"), compare_seeds),
    "compare-grpo-150-taco-gtpo": Table(("compare-150-3seeds",), compare_accuracy),
    "compare-grpo-150-ngram": Table(("compare-150-5seeds",), compare_share),
    "compare-digits-50": Table(("compare-digits-none-ktae", "compare-digits-ngram",
                                "compare-digits-graded"), compare_digits),
    "compare-grpo-150-none-ktae-taco": Table(("compare-150-none-ktae-taco",), compare_cost),
}


# The real-model 5-seed verdict (studies/verdict-5seed/plan.md): these tables read the
# study's records (studies/verdict-5seed/records/, which its verdict_study.py fills)
# through its verdict_tables.py, so they name no run of their own; a partial study renders
# with the seeds it has, and names the runs still missing.
def _verdict(name: str) -> Callable[[], str]:
    def render() -> str:
        sys.path.insert(0, str(VERDICT))
        import verdict_tables

        return verdict_tables.table(name)
    render.__doc__ = f"studies/verdict-5seed/verdict_tables.py's {name!r} table."
    return render


TABLES.update({"verdict" if name == "verdict" else f"verdict-{name}": Table((), _verdict(name))
               for name in ("verdict", "length", "credit-mass", "audit")})


def _verdict_rescored() -> str:
    """studies/paired-verdict/rescore.py's tables: the 5-seed study's 50 runs with every
    held-out answer cut at the budget counted wrong, paired and Holm-corrected."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "paired_verdict_rescore", REPO / "studies" / "paired-verdict" / "rescore.py")
    rescore = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rescore)
    return rescore.table(rescore.figures(rescore.old.RECORDS))


TABLES["verdict-rescored"] = Table((), _verdict_rescored)


def _self_teacher_audit(which: str) -> Callable[[], str]:
    """studies/self-teacher-audit's tables, from its records (the study's own script runs
    the two audits: ``self_teacher_audit.py run``)."""
    def render() -> str:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "self_teacher_audit", REPO / "studies" / "self-teacher-audit" / "self_teacher_audit.py")
        study = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(study)
        sets = study.load()
        return study.table(sets) if which == "figures" else study.counts_table(sets)
    return render


def _pilot_table() -> str:
    """studies/paired-verdict/pilot.py's tuning table, from the pilot's records."""
    import importlib.util

    sys.path.insert(0, str(REPO / "studies"))
    spec = importlib.util.spec_from_file_location(
        "paired_verdict_pilot", REPO / "studies" / "paired-verdict" / "pilot.py")
    pilot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pilot)
    return pilot.tuning_table()


def _paired_final_table() -> str:
    """studies/paired-verdict/final.py's verdict table, once every final run is recorded."""
    import importlib.util

    sys.path[:0] = [str(REPO / "studies"), str(REPO / "studies" / "paired-verdict")]
    spec = importlib.util.spec_from_file_location(
        "paired_verdict_final", REPO / "studies" / "paired-verdict" / "final.py")
    final = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(final)
    try:
        return final.final_table()
    except ValueError as e:
        sys.exit(f"tables: paired-verdict-final: {e}")


TABLES["paired-verdict-pilot"] = Table((), _pilot_table)
TABLES["paired-verdict-final"] = Table((), _paired_final_table)
TABLES["self-teacher-audit"] = Table((), _self_teacher_audit("figures"))
TABLES["self-teacher-audit-counts"] = Table((), _self_teacher_audit("counts"))


# --- markers ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    path: Path
    name: str
    start: int
    """Index of the opening marker's line."""
    end: int
    """Index of the closing marker's line."""
    body: str
    """The table between the markers, without the blank lines around it."""


def doc_files() -> list[Path]:
    files: list[Path] = []
    for pattern in DOCS:
        files += sorted(REPO.glob(pattern))
    return files


def blocks(path: Path) -> list[Block]:
    """The marked tables of one file; a ValueError names a malformed marker."""
    lines = path.read_text().splitlines()
    out, open_at, name = [], None, None
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith("<!-- table") or s.startswith("<!-- /table"):
            m = OPEN.match(s)
            if m:
                if open_at is not None:
                    raise ValueError(f"{path}:{i + 1}: table {m.group(1)!r} opens inside "
                                     f"table {name!r}")
                open_at, name = i, m.group(1)
            elif s == CLOSE:
                if open_at is None:
                    raise ValueError(f"{path}:{i + 1}: {CLOSE} without an opening marker")
                out.append(Block(path, name, open_at, i,
                                 "\n".join(lines[open_at + 1:i]).strip("\n")))
                open_at = None
            else:
                raise ValueError(f"{path}:{i + 1}: malformed table marker: {s}")
    if open_at is not None:
        raise ValueError(f"{path}:{open_at + 1}: table {name!r} is never closed")
    return out


def all_blocks() -> list[Block]:
    return [b for f in doc_files() for b in blocks(f)]


def replace(block: Block, table: str) -> None:
    lines = block.path.read_text().splitlines(keepends=True)
    lines[block.start + 1:block.end] = ["\n", table.rstrip("\n") + "\n", "\n"]
    block.path.write_text("".join(lines))


# --- running ---------------------------------------------------------------------------

def run_dir(name: str) -> Path:
    """The run's cache folder, or its kept record where only that holds the finished run."""
    if not _finished(marker(name), name) and _finished(record_marker(name), name):
        return RECORDS / name
    return CACHE / name


def _shown_path(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


ENV_WORD = re.compile(r"^[A-Z][A-Z0-9_]*=")


def command_env(name: str) -> dict[str, str]:
    """The ``NAME=VALUE`` words that open the run's command: its environment settings."""
    env = {}
    for word in shlex.split(RUNS[name].command):
        if not ENV_WORD.match(word):
            break
        key, value = word.split("=", 1)
        env[key] = value
    return env


def command_argv(name: str) -> list[str]:
    text = RUNS[name].command
    text = re.sub(r"\{run:([a-z0-9-]+)\}", lambda m: _shown_path(CACHE / m.group(1)), text)
    text = text.replace("{out}", _shown_path(CACHE / name))
    argv = shlex.split(text)[len(command_env(name)):]
    if argv[0] == "ktae":
        argv = [sys.executable, "-m", "ktae", *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    return argv


def dependencies(name: str) -> list[str]:
    return re.findall(r"\{run:([a-z0-9-]+)\}", RUNS[name].command)


def marker(name: str) -> Path:
    return CACHE / f"{name}{MARKER}"


def record_marker(name: str) -> Path:
    return RECORDS / f"{name}{MARKER}"


def _finished(path: Path, name: str) -> bool:
    if not path.is_file():
        return False
    record = json.loads(path.read_text())
    return record.get("finished") is True and record.get("command") == RUNS[name].command


def is_done(name: str, *, cache_only: bool = False) -> bool:
    """Finished with the same command, in the cache (or, unless ``cache_only``, in the
    kept record)."""
    return _finished(marker(name), name) or (not cache_only
                                             and _finished(record_marker(name), name))


def keep_record(name: str) -> None:
    """Copy the finished run's ``keep`` files and its marker into ``RECORDS``."""
    if not RUNS[name].keep:
        return
    target = RECORDS / name
    if target.exists():
        if not record_marker(name).is_file():
            sys.exit(f"tables: {target} exists and was not written by this script; "
                     "remove it or pick another name")
        record_marker(name).unlink()  # first: a record cut off half-way is never read
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for rel in RUNS[name].keep:
        shutil.copyfile(CACHE / name / rel, target / rel)
    shutil.copyfile(marker(name), record_marker(name))


def execute(name: str, *, reuse: bool, done: set[str], cache_only: bool = False) -> None:
    """Run one command into its cache folder (after the runs it reads, which must be in the
    cache: a record holds only what the tables read)."""
    if name in done:
        return
    for dep in dependencies(name):
        execute(dep, reuse=reuse, done=done, cache_only=True)
    folder = CACHE / name
    if reuse and is_done(name, cache_only=cache_only):
        print(f"tables: {name}: reusing {_shown_path(run_dir(name))}", file=sys.stderr)
        done.add(name)
        return
    if folder.exists():
        if not marker(name).is_file():
            sys.exit(f"tables: {folder} exists and was not written by this script; "
                     "remove it or pick another cache")
        previous = json.loads(marker(name).read_text())
        if (RUNS[name].resumable and previous.get("command") == RUNS[name].command
                and previous.get("finished") is False):
            print(f"tables: {name}: continuing the run cut off in {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder)  # only a folder whose marker this script wrote
    folder.mkdir(parents=True, exist_ok=True)  # empty: ktae train and the others accept it
    marker(name).write_text(json.dumps({"command": RUNS[name].command,
                                        "finished": False}) + "\n")
    argv = command_argv(name)
    print(f"tables: {name}: {shlex.join(argv)}", file=sys.stderr)
    start = time.perf_counter()
    with open(folder.parent / f"{name}.log", "w") as log:
        rc = subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **command_env(name)}).returncode
    if rc != 0:
        sys.exit(f"tables: {name} failed (exit {rc}); see {folder.parent / (name + '.log')}")
    marker(name).write_text(json.dumps({
        "command": RUNS[name].command, "finished": True,
        "seconds": round(time.perf_counter() - start, 1)}) + "\n")
    keep_record(name)
    done.add(name)


def cost(names: list[str]) -> int:
    """Estimated seconds of the runs the tables need, each run counted once."""
    needed: set[str] = set()
    for t in names:
        for r in TABLES[t].runs:
            needed.add(r)
            needed.update(dependencies(r))
    return sum(RUNS[r].cost_s for r in needed)


def render(name: str) -> str:
    return TABLES[name].render(*(run_dir(r) for r in TABLES[name].runs))


def shown(name: str) -> str:
    """The command as run, with the cache folders filled in."""
    argv = command_argv(name)
    env = [f"{k}={v}" for k, v in command_env(name).items()]
    if argv[1:3] == ["-m", "ktae"]:
        return shlex.join([*env, "ktae", *argv[3:]])
    return shlex.join([*env, "python", *argv[1:]])


def cmd_list(_args) -> int:
    places: dict[str, list[str]] = {}
    for b in all_blocks():
        places.setdefault(b.name, []).append(str(b.path.relative_to(REPO)))
    for name, table in TABLES.items():
        print(f"{name}  (~{cost([name])} s; in {', '.join(places.get(name, ['no file']))})")
        runs: list[str] = []
        for r in table.runs:
            runs += [d for d in [*dependencies(r), r] if d not in runs]
        for r in runs:
            print(f"    {shown(r)}    # ~{RUNS[r].cost_s} s")
    return 0


def _selected(args) -> list[str]:
    names = list(TABLES) if getattr(args, "all", False) else args.names
    unknown = [n for n in names if n not in TABLES]
    if unknown or not names:
        sys.exit(f"tables: unknown or no table names: {unknown}; see `list`")
    if getattr(args, "max_cost", None) is not None:
        names = [n for n in names if cost([n]) <= args.max_cost]
    return names


def cmd_run(args) -> int:
    names = _selected(args)
    done: set[str] = set()
    for name in names:
        for r in TABLES[name].runs:
            execute(r, reuse=args.reuse, done=done)
        table = render(name)
        files = sorted({b.path for b in all_blocks() if b.name == name})
        for path in files:
            count = sum(b.name == name for b in blocks(path))
            for k in range(count):  # re-read each time: a replacement moves the lines
                replace([b for b in blocks(path) if b.name == name][k], table)
            print(f"tables: {name}: wrote {path.relative_to(REPO)}", file=sys.stderr)
        if not files:
            print(f"tables: {name}: no marker in the docs; the table:\n{table}")
    return 0


def cmd_check(args) -> int:
    names = _selected(args)
    done: set[str] = set()
    differ = False
    for name in names:
        for r in TABLES[name].runs:
            execute(r, reuse=args.reuse, done=done)
        table = render(name)
        for b in (b for b in all_blocks() if b.name == name):
            if b.body != table:
                differ = True
                sys.stdout.writelines(difflib.unified_diff(
                    (b.body + "\n").splitlines(keepends=True),
                    (table + "\n").splitlines(keepends=True),
                    f"{b.path.relative_to(REPO)} ({name})", "regenerated"))
    return 1 if differ else 0


def cmd_exec(args) -> int:
    """Run the named runs (not tables) in order: a way to run a table's runs side by side,
    one ``exec`` per process, before ``run NAME --reuse`` renders the table."""
    unknown = [n for n in args.runs if n not in RUNS]
    if unknown:
        sys.exit(f"tables: unknown run names: {unknown}; see `list`")
    done: set[str] = set()
    for name in args.runs:
        execute(name, reuse=args.reuse, done=done)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    sub.add_parser("list", help="table names, their commands and estimated cost")
    for mode in ("run", "check"):
        s = sub.add_parser(mode)
        s.add_argument("names", nargs="*")
        if mode == "run":
            s.add_argument("--all", action="store_true", help="every registered table")
            s.add_argument("--max-cost", type=float, default=None,
                           help="skip tables whose runs are estimated above SECONDS")
        s.add_argument("--reuse", action="store_true",
                       help="keep the cache of a run that finished with the same command")
    e = sub.add_parser("exec", help="run the named runs only (no table is written)")
    e.add_argument("runs", nargs="+")
    e.add_argument("--reuse", action="store_true",
                   help="keep the cache of a run that finished with the same command")
    args = p.parse_args(argv)
    return {"list": cmd_list, "run": cmd_run, "check": cmd_check,
            "exec": cmd_exec}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
