"""Wall time of each ktae subcommand at 1 and 2 torch threads and at its default, with and
without competing busy processes.

Usage:
    python benchmarks/bench_cli_threads.py                       # every command, K = 0 and 2
    python benchmarks/bench_cli_threads.py --commands simulate,eval --repeats 5

The sibling of ``bench_contention.py`` for whole commands: for every number of competing
busy processes K (``--contend``, started here and killed at the end, as
``bench_advantages.py --contend``), runs each command with small but representative
settings (``SETTINGS`` below: the shipped tiny model, the quick preset's shapes) once per
thread setting per round, the settings of a round side by side in a rotating order, and
prints per (command, K) the median wall seconds of each setting and the ratio of the
default's median to the best median. The default is the command run without
``--threads``; when the parser's default is a number among ``--threads`` (``ktae eval``,
``audit``, ``explain``: 1; ``ktae train``: its config's 1) that timing stands for it
rather than running the same command twice. Every run writes to a fresh temporary folder.

The load average (1 minute) is read before every run; its median per K is printed, since
a shared machine is rarely idle: K = 0 means "no busy processes of ours", measured at that
load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# command -> (arguments after ``ktae``; {out} is a fresh folder per run, {model} the
# shipped tiny model's directory). Reductions keep each command's hot path: simulate keeps
# the quick preset's block (|A| = 1,000, 5 seeds, 6 methods) and runs 50 of its 1,500
# updates; train runs 5 steps of the default recipe (generation and update; its held-out
# eval, before and after, on 4 problems); the others sample from the tiny model.
SETTINGS = {
    "simulate": "simulate --steps 50 --no-progress -o {out}/sim --overwrite",
    "eval": "eval {model} --benchmarks embedded --limit 16 --no-progress -o {out}/eval "
            "--overwrite",
    "audit": "audit --model default --prompts 50 -o {out}/audit --overwrite",
    "explain": "explain --model default --groups 2 -o {out}/explain.html --overwrite",
    "train": "train --max-steps 5 --eval-every 0 --eval-size 4 --no-progress -o {out}/train",
}


def default_threads(command: str) -> int | None:
    """The thread count ``command`` runs with when ``--threads`` is not given (None: torch's
    own choice)."""
    from ktae.cli import build_parser

    parser = build_parser([command]).chosen
    value = next(a.default for a in parser._actions if a.option_strings == ["--threads"])
    if value is None and command == "train":
        from ktae.runs.config import TrainConfig

        value = TrainConfig().torch_threads
    return value


def time_command(command: str, threads: int | None, model: str) -> float:
    """Seconds of wall time of one run of ``ktae COMMAND`` (``--threads`` unless None)."""
    out = tempfile.mkdtemp(prefix=f"bench-{command}-")
    try:
        argv = SETTINGS[command].format(out=out, model=model).split()
        if threads is not None:
            argv += ["--threads", str(threads)]
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "ktae", *argv], capture_output=True,
                              text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"ktae {' '.join(argv)} failed ({done.returncode}):\n"
                               f"{done.stderr[-2000:]}")
        return seconds
    finally:
        shutil.rmtree(out, ignore_errors=True)


def summarize(times: dict, loads: dict, defaults: dict) -> list[str]:
    """The markdown table of ``times[command, K][setting] = [seconds...]`` (setting: a
    thread count, or ``"default"`` when it was timed apart)."""
    lines = ["| command | K busy | load (median) | default | "
             "1 thread | 2 threads | default (if apart) | default / best |",
             "|---|---|---|---|---|---|---|---|"]
    for (command, k), cells in times.items():
        med = {s: statistics.median(v) for s, v in cells.items()}
        default = defaults[command]
        d = med["default"] if "default" in med else med[default]
        ratio = d / min(med.values())
        label = "torch's" if default is None else str(default)
        cols = [f"{med[s]:.1f} s" if s in med else "-" for s in (1, 2, "default")]
        lines.append(f"| {command} | {k} | {statistics.median(loads[k]):.1f} | {label} | "
                     + " | ".join(cols) + f" | {ratio:.2f} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commands", default=",".join(SETTINGS),
                    help=f"comma list among {', '.join(SETTINGS)}")
    ap.add_argument("--contend", default="0,2", help="comma list of busy-process counts K")
    ap.add_argument("--threads", default="1,2", help="comma list of torch thread counts")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per K")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan and a table of made-up times; run nothing")
    args = ap.parse_args(argv)
    commands = [c.strip() for c in args.commands.split(",") if c.strip()]
    unknown = [c for c in commands if c not in SETTINGS]
    if unknown:
        ap.error(f"unknown command(s) {', '.join(unknown)}; expected among {', '.join(SETTINGS)}")
    ks = [int(x) for x in args.contend.split(",")]
    threads = [int(x) for x in args.threads.split(",")]
    defaults = {c: default_threads(c) for c in commands}
    plan = {c: [*threads, *([] if defaults[c] in threads else ["default"])] for c in commands}
    print(f"{os.cpu_count()} CPUs; {args.repeats} rounds per K; K = {ks}; settings per "
          f"command: " + "; ".join(f"{c} {plan[c]} (default {defaults[c]})" for c in commands))
    times: dict = {}
    loads: dict = {k: [] for k in ks}
    if args.dry_run:
        for k in ks:
            loads[k].append(os.getloadavg()[0])
            for c in commands:
                times[c, k] = {s: [1.0 + i + k] for i, s in enumerate(plan[c])}
    else:
        from bench_advantages import BusyProcesses

        from ktae.models.warmstart import default_model_path

        model = str(default_model_path())
        for r in range(args.repeats):
            for k in ks:  # conditions interleaved round by round, as the settings
                with BusyProcesses(k):
                    for c in commands:
                        order = plan[c][r % len(plan[c]):] + plan[c][:r % len(plan[c])]
                        for s in order:
                            loads[k].append(os.getloadavg()[0])
                            t = time_command(c, None if s == "default" else s, model)
                            times.setdefault((c, k), {}).setdefault(s, []).append(t)
                            print(f"round {r + 1} K={k} {c} threads={s}: {t:.1f} s "
                                  f"(load {loads[k][-1]:.1f})", flush=True)
            if r + 1 < args.repeats:  # a table so far, in case the run is cut short
                print("\n".join(summarize(times, loads, defaults)), flush=True)
    print()
    print("\n".join(summarize(times, loads, defaults)))
    print("\nmedian wall seconds of whole commands; K: our busy processes; load: 1-minute load "
          "average read before each run, median; default / best: the default's median over "
          "the best median")
    return 0


if __name__ == "__main__":
    sys.exit(main())
