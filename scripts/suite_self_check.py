"""Do an evaluation suite's references verify against themselves, under each grader?

For every row and every accepted alternative of its answer (a list answer is a list of
alternatives, as ``ktae eval`` reads it: :func:`ktae.data.answer_text` strips each entry
and keeps equal entries once), the response ``\\boxed{<alternative>}`` is graded against
the row's reference by each grader of ``ktae eval --grader``. A row passes a grader when
every one of its alternatives does. A reference that fails against itself caps the
accuracy any model can reach on that benchmark under that grader, so this bounds how
faithful a reproduction can be before any model is run.

SOURCE is read as ``ktae eval`` reads it:

* a directory saved with ``save_to_disk``: a DatasetDict such as the KTAE authors'
  ``eval/evaluation_suite`` (each split, under the name ``ktae eval --data-dir`` reports
  it: ``aime`` is ``aime24``), or a Dataset (one benchmark, the directory's name);
* a JSON (a list) or JSONL file of rows with a reference (``answer``, ``reference``,
  ``ground_truth`` or ``gt``) and a benchmark (``benchmark``, ``task_name``, ``task`` or
  ``data_source``; default: the file's stem). A file that also holds responses, such as
  the authors' ``eval_result/*.json``, is read as ``ktae eval --responses`` reads it
  (their ``gt`` repeats the reference once per sample); its responses are not used.

Prints a Markdown table (per benchmark: rows, alternatives, and the rows that pass under
each grader) and then every failing alternative; ``--json FILE`` writes the same.

    python scripts/suite_self_check.py KTAE/eval/evaluation_suite
    python scripts/suite_self_check.py KTAE/eval_result/GRPO+KTAE_7B.json --json check.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ktae.data import answer_text
from ktae.data.sources import read_json
from ktae.eval.benchmarks import load_benchmark, saved_benchmarks
from ktae.eval.graders import GRADERS, get_grader
from ktae.eval.responses import BENCHMARK_KEYS, REFERENCE_KEYS, RESPONSE_KEYS, read_responses
from ktae.rewards.verify import reference_alternatives, reward_stats


@dataclass(frozen=True)
class Reference:
    """One row's reference: ``answer`` as ``ktae eval`` holds it (a string, or a tuple of
    accepted alternatives)."""

    benchmark: str
    id: str
    answer: str | tuple[str, ...]

    @property
    def alternatives(self) -> tuple[str, ...]:
        return reference_alternatives(self.answer, f"{self.benchmark} row {self.id}")


def _first(rec: dict, keys) -> str | None:
    return next((k for k in keys if rec.get(k) is not None), None)


def load_references(source: str | Path) -> dict[str, list[Reference]]:
    """Benchmark -> references of a saved suite directory or a JSON/JSONL file of rows.

    Raises:
        ValueError: a path that is neither, a row without a reference, or an answer
            ``ktae eval`` refuses (null, empty, a list inside a list).
    """
    path = Path(source)
    names = saved_benchmarks(path) if path.is_dir() else None
    if names is not None:
        names = names or {path.name: None}
        return {name: [Reference(name, r.id, r.answer) for r in
                       load_benchmark(name, path=path)] for name in names}
    if not path.is_file():
        raise ValueError(f"{path}: expected a save_to_disk directory or a JSON/JSONL file")
    rows = read_json(path)
    if any(_first(rec, RESPONSE_KEYS) for rec in rows.dicts()):
        return {name: [Reference(name, p.id, answer_text(p.answer)) for p in problems]
                for name, problems in read_responses(path).items()}
    out: dict[str, list[Reference]] = {}
    for i, rec in enumerate(rows.dicts()):
        key = _first(rec, REFERENCE_KEYS)
        if key is None:
            raise ValueError(f"{rows.where(i)}: expected a reference under one of "
                             f"{', '.join(REFERENCE_KEYS)}")
        name_key = _first(rec, BENCHMARK_KEYS)
        name = str(rec[name_key]) if name_key else path.stem
        try:
            answer = answer_text(rec[key])
        except ValueError as e:
            raise ValueError(f"{rows.where(i)}: {e}") from None
        out.setdefault(name, []).append(
            Reference(name, str(rec.get("id", len(out.get(name, ())))), answer))
    return out


def self_check(references: dict[str, list[Reference]], graders=tuple(GRADERS), *,
               timeout: float = 10.0) -> dict:
    """Grade ``\\boxed{alternative}`` against its own row's reference, per grader.

    Returns:
        ``{"benchmarks": {name: {"rows", "alternatives", "pass": {grader: rows passing}}},
        "failures": [{"benchmark", "id", "grader", "alternative", "extracted"}],
        "timeouts": {grader: verifier timeouts}}``.
    """
    table = {name: {"rows": len(refs), "alternatives": sum(len(r.alternatives) for r in refs),
                    "pass": {}} for name, refs in references.items()}
    failures, timeouts = [], {}
    cases = [(ref, alt) for refs in references.values() for ref in refs
             for alt in ref.alternatives]
    for name in graders:
        grader = get_grader(name)
        before = reward_stats()["timeouts"]
        results = grader.grade([f"\\boxed{{{alt}}}" for _, alt in cases],
                               [ref.answer for ref, _ in cases], timeout=timeout)
        timeouts[name] = reward_stats()["timeouts"] - before
        failed = set()
        for (ref, alt), result in zip(cases, results, strict=True):
            if not result.correct:
                failed.add((ref.benchmark, ref.id))
                failures.append({"benchmark": ref.benchmark, "id": ref.id, "grader": name,
                                 "alternative": alt, "extracted": result.extracted})
        for bench, refs in references.items():
            table[bench]["pass"][name] = sum((bench, r.id) not in failed for r in refs)
    return {"benchmarks": table, "failures": failures, "timeouts": timeouts}


def markdown(report: dict) -> str:
    """The table of rows passing per benchmark and grader, then the failures."""
    graders = list(next(iter(report["benchmarks"].values()))["pass"]) \
        if report["benchmarks"] else []
    lines = ["| benchmark | rows | alternatives | " + " | ".join(graders) + " |",
             "|---|---|---|" + "---|" * len(graders)]
    total = {"rows": 0, "alternatives": 0, **{g: 0 for g in graders}}
    for name, row in report["benchmarks"].items():
        lines.append(f"| {name} | {row['rows']} | {row['alternatives']} | "
                     + " | ".join(str(row["pass"][g]) for g in graders) + " |")
        total["rows"] += row["rows"]
        total["alternatives"] += row["alternatives"]
        for g in graders:
            total[g] += row["pass"][g]
    lines.append(f"| all | {total['rows']} | {total['alternatives']} | "
                 + " | ".join(str(total[g]) for g in graders) + " |")
    lines.append("")
    lines.append("verifier timeouts: " + ", ".join(f"{g} {n}" for g, n in
                                                  report["timeouts"].items()))
    if report["failures"]:
        lines += ["", "| benchmark | row | grader | alternative | extracted |",
                  "|---|---|---|---|---|"]
        for f in report["failures"]:
            alt = f["alternative"].replace("|", "\\|").replace("\n", "\\n")
            ext = str(f["extracted"]).replace("|", "\\|").replace("\n", "\\n")
            lines.append(f"| {f['benchmark']} | {f['id']} | {f['grader']} | `{alt}` | "
                         f"`{ext}` |")
    else:
        lines.append("no failures")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="a save_to_disk suite directory, or a JSON/JSONL file of "
                   "reference rows")
    p.add_argument("--graders", default=",".join(GRADERS),
                   help=f"comma list (default {','.join(GRADERS)})")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds per verifier check (default 10)")
    p.add_argument("--json", type=Path, help="also write the report as JSON here")
    args = p.parse_args(argv)
    try:
        graders = [g.strip() for g in args.graders.split(",") if g.strip()]
        for g in graders:
            get_grader(g)
        report = self_check(load_references(args.source), graders, timeout=args.timeout)
    except ValueError as e:
        print(f"suite_self_check: {e}", file=sys.stderr)
        return 2
    print(markdown(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
