"""Two ktae source trees' training steps side by side, part by part, against their floors.

Usage:
    git worktree add /tmp/old-ktae <commit>                  # the code before a change
    python benchmarks/bench_step_ab.py /tmp/old-ktae/src     # the LoRA recipe, 3 rounds
    python benchmarks/bench_step_ab.py OLD_SRC --rounds 4 --json ab.json -- --steps 2
    python benchmarks/bench_step_ab.py OLD_SRC --new-args=--bf16   # the new tree in bfloat16
    python benchmarks/bench_step_ab.py OLD_SRC --vllm VLLM_ENV/bin/python   # and vLLM vs HF

Each round runs ``benchmarks/bench_step.py --lora --only passes,step --kinds ktae`` once with each
tree (``--ktae-src``), each in its own process (a process imports one ktae), the order
alternating between rounds (old, new; new, old; ...), so that both see the same machine.
Every run measures the matmul rate, and so its floors, anew. Arguments after ``--`` go to
every run of bench_step (e.g. ``--lora OTHER_RECIPE``, ``--steps 2``); ``--old-args`` and
``--new-args`` to one tree's runs only (e.g. ``--new-args=--bf16``: each tree's floors are
then at its own arithmetic's measured matmul rate). Prints each part's
median seconds under each tree, the median over runs of each run's seconds over its own
floor, and new/old of the medians; the row ``step, CPU time`` holds the step's CPU seconds
(the process's), which a shared machine's other jobs move far less than its wall time;
the 1-minute load average at each run's start and end.
``--from-json`` prints a saved run's table again. The row ``generation, 1 prefill/prompt``
holds generation against the floor of one prefill per distinct prompt (the trainer's,
``ktae.train.shared_prefill``) instead of one per row. Generation's floors take the
decoding step's matmul rate over the model's own weights (bench_step's ``streamed`` rate);
the row ``generation, cached rate`` holds generation against the floor at the rate of one
matrix per shape, kept in the CPU's caches (the floor of runs from before it was measured).
The row ``update, no trainer`` is
bench_step's 1c: the update's passes through each tree's log-prob head alone, over the same
micro-batches, against the same floor. The row ``update, 1 prefix/prompt`` holds the update
against the floor of the work left when each micro-batch runs each distinct prompt once
(the trainer's, ``ktae.train.logprob_head.shared_prefix_logits``; expected over TRL's
shuffle of the batch, or counted where the tree's trainer keeps the batch in prompt order,
``ktae.train.micro_batches``).

``--vllm PYTHON`` adds colocated vLLM against transformers to the same run: after each
round's two trees, ``benchmarks/bench_vllm_step.py steps`` with the Python of a vLLM
environment (whose ktae is the new tree's) runs ``ktae train`` on the recipe (float32,
``--vllm-steps`` steps) once with each generation backend, the order alternating between
rounds; each run's median step after its first, and their ratio vLLM/transformers, per
round and as the median over rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench_step.py"
PARTS = ("generation", "scoring", "logprobs", "advantages", "update", "other", "step")


def vllm_round(python: str, out: Path, steps: int, first: str) -> dict:
    """One ``ktae train`` run with each generation backend (``first`` first), from the
    vLLM environment's ``python``: their step medians after the first step, and the ratio."""
    cmd = [python, str(ROOT / "benchmarks" / "bench_vllm_step.py"), "steps", "--out-dir",
           str(out), "--steps", str(steps), "--rounds", "1", "--bracket", "0",
           "--first", first]
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    subprocess.run(cmd, check=True, stdout=2, env=env)  # its progress to our stderr
    summary = json.loads((out / "summary.json").read_text())["steps after the first"]
    return {"hf": summary["hf"], "vllm": summary["vllm"], "ratio": summary["ratio"],
            "first": first}


def run_one(src: str, out: Path, extra: list[str]) -> dict:
    """One bench_step run of the tree ``src``; its JSON result."""
    cmd = [sys.executable, str(BENCH), "--lora", "--only", "passes,step", "--kinds", "ktae",
           "--rounds", "1", "--rate-repeats", "1", "--ktae-src", src, "--json", str(out), *extra]
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    return json.loads(out.read_text())


def shared_prefill_floor(run: dict) -> float:
    """Generation's floor with one prefill per prompt (``ktae.train.shared_prefill``):
    ``2 N`` a token of each distinct prompt, at the update shapes' rate, plus ``2 N`` a
    sampled token at the decoding step's."""
    prompts = run.get("prompts")
    if prompts is None:  # a run from before bench_step recorded it: the recipe's
        prompts = yaml.safe_load(Path(run["lora"]).read_text())["num_prompts"]
    n, rates = run["parameters"], run["matmul"]
    return (2 * n * prompts * run["prompt_tokens"] / rates["train_flops"]
            + 2 * n * run["batch"] * run["new_tokens"]
            / rates.get("decode_streamed_flops", rates["decode_flops"]))


def expected_distinct(groups: int, group_size: int, rows: int) -> float:
    """The expected number of distinct groups among ``rows`` rows drawn without replacement
    from ``groups`` groups of ``group_size`` (a micro-batch of a shuffled GRPO batch):
    ``groups (1 - C(N - n, m) / C(N, m))``.

    >>> expected_distinct(4, 8, 32), expected_distinct(4, 8, 1)
    (4.0, 1.0)
    """
    total = groups * group_size
    return groups * (1 - math.comb(total - group_size, rows) / math.comb(total, rows))


def spanned_groups(groups: int, group_size: int, rows: int) -> int:
    """How many groups the micro-batches of ``rows`` consecutive rows span, summed over
    the micro-batches, for ``groups`` groups of ``group_size`` consecutive rows (a GRPO
    batch split in its own order, :mod:`ktae.train.micro_batches`).

    >>> spanned_groups(4, 8, 8), spanned_groups(4, 8, 12), spanned_groups(2, 4, 8)
    (4, 5, 2)
    """
    total = groups * group_size
    return sum((min(start + rows, total) - 1) // group_size - start // group_size + 1
               for start in range(0, total, rows))


def shared_prefix_floor(run: dict) -> float:
    """The LoRA update's floor with one prefix per distinct prompt in each micro-batch
    (``ktae.train.logprob_head.shared_prefix_logits``): the floor's ``T`` counts each
    micro-batch's kept positions (``new_tokens + 1`` a row) and, once per distinct prompt,
    the prompt's other ``prompt_tokens - 1``. The distinct prompts of a micro-batch are
    those of the trainer's split: where it keeps the batch in prompt order
    (``micro_batches_by_prompt``, :mod:`ktae.train.micro_batches`) the groups each block of
    consecutive rows spans (:func:`spanned_groups`), else their expectation over TRL's
    shuffle (:func:`expected_distinct`)."""
    sizes, batch, prompts = run["lora_sizes"], run["batch"], run["prompts"]
    micro = run["trl_settings"].get("gradient_accumulation_steps", 1)
    if run.get("micro_batches_by_prompt"):
        distinct = spanned_groups(prompts, batch // prompts, batch // micro)
    else:
        distinct = micro * expected_distinct(prompts, batch // prompts, batch // micro)
    tokens = batch * (run["new_tokens"] + 1) + distinct * (run["prompt_tokens"] - 1)
    scored = batch * run["new_tokens"]
    flops = 4 * sizes["body"] * tokens + 4 * sizes["head"] * scored + 6 * sizes["adapters"] * tokens
    return flops / run["matmul"]["train_flops"]


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Per part and tree: median seconds, median x floor (each run over its own floor)."""
    table = {}
    for part in PARTS:
        row = {}
        for tree, results in runs.items():
            seconds = [r["ktae_part_medians"][part] for r in results]
            row[tree] = statistics.median(seconds)
            if part in results[0]["floors"] and results[0]["floors"][part]:
                row[f"{tree}_floor"] = statistics.median(r["floors"][part] for r in results)
                row[f"{tree}_x_floor"] = statistics.median(
                    r["ktae_part_medians"][part] / r["floors"][part] for r in results)
        table[part] = row
    if all("step_cpu_median" in r for results in runs.values() for r in results):
        table["step, CPU time"] = {tree: statistics.median(r["step_cpu_median"]["ktae"]
                                                           for r in results)
                                   for tree, results in runs.items()}
    def against(part: str, floor) -> dict:  # ``part``'s seconds against another floor
        return {tree: table[part][tree] for tree in runs} | {
            f"{tree}_floor": statistics.median(floor(r) for r in results)
            for tree, results in runs.items()} | {
            f"{tree}_x_floor": statistics.median(
                r["ktae_part_medians"][part] / floor(r) for r in results)
            for tree, results in runs.items()}

    table["generation, 1 prefill/prompt"] = against("generation", shared_prefill_floor)
    if all("generation_floor_cached" in r for results in runs.values() for r in results):
        table["generation, cached rate"] = against(
            "generation", lambda r: r["generation_floor_cached"])
    if all("lora_sizes" in r for results in runs.values() for r in results):
        table["update, 1 prefix/prompt"] = against("update", shared_prefix_floor)
    if all("lora_passes" in r for results in runs.values() for r in results):
        table["update, no trainer"] = {
            tree: statistics.median(r["lora_passes"]["total"] for r in results)
            for tree, results in runs.items()} | {
            f"{tree}_x_floor": statistics.median(r["lora_passes"]["x_floor"] for r in results)
            for tree, results in runs.items()} | {
            f"{tree}_floor": statistics.median(r["floors"]["update"] for r in results)
            for tree, results in runs.items()}
    return table


VLLM_PARTS = ("step_time", "generation_seconds", "logprob_seconds", "update_seconds")


def vllm_table(rounds: list[dict]) -> dict:
    """Per part: the median over rounds of each backend's seconds, and of each round's
    ratio vLLM/transformers (the step's ratio is the rounds' own)."""
    table = {}
    for part in VLLM_PARTS:
        hf = statistics.median(r["hf"][part] for r in rounds)
        vl = statistics.median(r["vllm"][part] for r in rounds)
        ratios = [r["vllm"][part] / r["hf"][part] for r in rounds if r["hf"][part]]
        table[part.removesuffix("_seconds").replace("_time", "")] = {
            "hf": hf, "vllm": vl, "ratio": statistics.median(ratios) if ratios else math.nan}
    return table


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old_src", help="the other tree's source directory (holding ktae/)")
    p.add_argument("--new-src", default=str(ROOT / "src"), help="default: this tree's src")
    p.add_argument("--rounds", type=int, default=3, help="runs of each tree")
    p.add_argument("--old-args", default="", help="bench_step arguments for the old tree only")
    p.add_argument("--new-args", default="", help="bench_step arguments for the new tree only")
    p.add_argument("--vllm", metavar="PYTHON",
                   help="also vLLM against transformers in ktae train, each round, with "
                        "this vLLM environment's Python")
    p.add_argument("--vllm-steps", type=int, default=3,
                   help="steps of each ktae train run of --vllm (the first is left out)")
    p.add_argument("--json", help="write every run's result and the table here")
    p.add_argument("--from-json", action="store_true",
                   help="OLD_SRC is an earlier run's --json: print its table again, run nothing")
    a = p.parse_args(argv)
    if a.from_json:
        saved = json.loads(Path(a.old_src).read_text())
        return report(saved["trees"], saved["runs"], a.json, saved.get("vllm", []))
    trees = {"old": a.old_src, "new": a.new_src}
    own = {"old": shlex.split(a.old_args), "new": shlex.split(a.new_args)}
    if a.old_args or a.new_args:
        trees = {t: f"{src} {' '.join(own[t])}".strip() for t, src in trees.items()}
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    vllm: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-step-ab-") as tmp:
        for r in range(a.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for tree in order:
                src = a.old_src if tree == "old" else a.new_src
                result = run_one(src, Path(tmp) / f"{tree}-{r}.json", [*extra, *own[tree]])
                runs[tree].append(result)
                print(f"round {r + 1}, {tree}: step {result['ktae_part_medians']['step']:.1f} s "
                      f"({result.get('step_cpu_median', {}).get('ktae', float('nan')):.1f} s CPU), "
                      f"update {result['ktae_part_medians']['update']:.1f} s (floor "
                      f"{result['floors']['update']:.1f} s); load {result['load_start']} -> "
                      f"{result['load_end']}", flush=True)
            if a.vllm:
                pair = vllm_round(a.vllm, Path(tmp) / f"vllm-{r}", a.vllm_steps,
                                  "hf" if r % 2 == 0 else "vllm")
                vllm.append(pair)
                print(f"round {r + 1}, ktae train: transformers step "
                      f"{pair['hf']['step_time']:.1f} s, vLLM step "
                      f"{pair['vllm']['step_time']:.1f} s: vLLM/HF {pair['ratio']:.2f}",
                      flush=True)
    return report(trees, runs, a.json, vllm)


def report(trees: dict, runs: dict, json_path: str | None, vllm: list[dict] = ()) -> dict:
    """Print the table of ``runs`` (tree -> bench_step results) and of ``vllm``
    (:func:`vllm_round` results); write them."""
    table = summarize(runs)
    first = runs["new"][0]
    rounds = len(runs["new"])
    print(f"\n{first['model']}: {first['batch']} responses of {first['new_tokens']} tokens "
          f"after prompts of <= {first['prompt_tokens']}, {first['threads']} thread(s), "
          f"{rounds} run(s) of each tree, alternating; medians")
    print(f"old: {trees['old']}\nnew: {trees['new']}")
    print(f"\n{'part':<28} {'old s':>8} {'new s':>8} {'floor s':>8} {'old x fl':>9} "
          f"{'new x fl':>9} {'new/old':>8}  floor of")
    for part, row in table.items():
        cells = f"{row['old']:8.2f} {row['new']:8.2f}"
        if "new_floor" in row:
            cells += (f" {row['new_floor']:8.2f} {row['old_x_floor']:9.2f} "
                      f"{row['new_x_floor']:9.2f}")
        else:
            cells += " " * 28
        ratio = row["new"] / row["old"] if row["old"] else float("nan")
        cells += f" {ratio:8.3f}"
        floor_of = first.get("floor_of", {})
        if part in floor_of or part == "update, no trainer":
            cells += f"  {floor_of.get(part, floor_of.get('update'))}"
        elif part == "generation, cached rate":
            cells += "  as generation's, a new token at the cached rate"
        elif part.startswith("generation, "):
            cells += "  2 N a distinct prompt's token + 2 N a new token"
        elif part.startswith("update, "):
            cells += "  the same, T: one prefix per distinct prompt in a micro-batch"
        print(f"{part:<28} {cells}")
    loads = [float(x) for rs in runs.values() for r in rs
             for x in (r["load_start"], r["load_end"])]
    print(f"\n1-minute load average at the runs' starts and ends: {min(loads):.2f} to "
          f"{max(loads):.2f}")
    out = {"trees": trees, "runs": runs, "table": table}
    if vllm:
        out["vllm"] = list(vllm)
        out["vllm_table"] = vllm_table(vllm)
        print(f"\nktae train on the recipe (float32, the new tree), colocated vLLM against "
              f"transformers' generation, {len(vllm)} round(s), medians of the steps after "
              "each run's first:")
        print(f"{'part':<22} {'transformers s':>15} {'vLLM s':>8} {'vLLM/HF':>8}")
        for part, row in out["vllm_table"].items():
            print(f"{part:<22} {row['hf']:15.2f} {row['vllm']:8.2f} {row['ratio']:8.2f}")
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
