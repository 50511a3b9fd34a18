"""``ktae audit``: does each credit method's token credit land on the right tokens?

INPUT is a ``ktae train`` run directory (its saved rollouts: the figures per recorded
step) or a JSONL file of groups with ``wrong`` character spans; with ``--model`` and no
INPUT, ``--prompts`` held-out prompts x ``--samples`` responses are sampled and labelled
exactly: the embedded task's for ``--model default`` (the shipped tiny model, offline),
labelled by :func:`ktae.tasks.label_response`; the arith word problems for a real chat
model (``--model smollm2-135m``), labelled by their claims
(:mod:`ktae.credit_audit.arith_input`). The first line says what is sampled; one line per
sampled batch on stderr shows the progress, and lines of the same form every phase after it
(labelling, scoring, each method's credit, the bootstrap; ``--no-progress``: none).
Writes ``audit.md``, ``audit.json`` and one PNG per figure into ``--output-dir``
(default ``runs/audit/NAME``, NAME naming the input or model and the settings; an earlier
result there or at ``--output-dir`` is kept unless ``--overwrite``), and prints a compact
table and the path of the full one. See docs/audit.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ktae.cli_common import check_output_dir, error, slug
from ktae.credit_audit.arith_input import progress_printer
from ktae.credit_audit.progress import phase_printer
from ktae.credit_audit.report import summary
from ktae.credit_audit.run import DEFAULT_PROMPTS, DEFAULT_RESAMPLES, DEFAULT_SAMPLES, audit
from ktae.rewards.ends import CUT_OFF_RULES, DEFAULT_CUT_OFF

DEFAULT_ROOT = "runs/audit"
RESULT_FILES = ("audit.md", "audit.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``ktae audit`` arguments."""
    parser.add_argument("input", nargs="?", metavar="INPUT",
                        help="run directory of ktae train, or a JSONL file of labelled groups")
    parser.add_argument("--model", help="model to sample from (no INPUT) or to score "
                        "responses with; 'default' = the shipped tiny model")
    parser.add_argument("--credit", help="comma list of credit methods, each as ktae explain "
                        "and ktae compare name it (CREDIT[@KEY=VALUE...], e.g. "
                        "grpo,ktae,ktae@ngram=3,taco,ktae+taco); default: every registered "
                        "estimator and calibration, ktae+taco and ktae@ngram=2..4")
    parser.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS,
                        help=f"held-out prompts to sample with --model (default {DEFAULT_PROMPTS})")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                        help=f"responses per prompt with --model (default {DEFAULT_SAMPLES})")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--prompt-set", type=int, default=0,
                        help="which held-out prompts --model samples: set N is prompts "
                        "N*P..(N+1)*P-1 of the held-out stream (P = --prompts), disjoint "
                        "from the other sets; 0 (default) is the set of earlier audits")
    parser.add_argument("--task", help="what --model is sampled on: embedded, arith or "
                        "arith@difficulty=0|1|2|3 (default: embedded for a character-level "
                        "tokenizer such as --model default, else arith@difficulty=1)")
    parser.add_argument("--max-new-tokens", type=int, help="response length budget with "
                        "--model (default 40 for character-level tokenizers, 64 on arith, "
                        "else 256)")
    parser.add_argument("--cut-off-answers", choices=CUT_OFF_RULES, default=DEFAULT_CUT_OFF,
                        help="a --model response cut at --max-new-tokens without ending: "
                        "wrong (default; never a right answer) or read (scored from its text)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling and scoring temperature (default 0.7 on arith, the "
                        "recipe's; a run directory: its own; else 1)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress lines (sampling, labelling, scoring, credit, "
                        "bootstrap)")
    parser.add_argument("--tokenizer", help="tokenizer directory (JSONL input; default: the "
                        "model's, or the shipped tiny model's)")
    parser.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES,
                        help=f"bootstrap draws per interval (default {DEFAULT_RESAMPLES})")
    parser.add_argument("-o", "--output-dir", default=None,
                        help=f"folder for audit.md, audit.json and the PNGs (default "
                        f"{DEFAULT_ROOT}/NAME, NAME from the input or model and the settings)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier audit in the output folder")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1)")


def default_output_dir(args: argparse.Namespace) -> Path:
    """``runs/audit/NAME``: the input's name (or ``model-MODEL-PxS-seedN``) and, when
    given, the credit list."""

    if args.input is not None:
        path = Path(args.input)
        name = path.resolve().name if path.is_dir() else path.stem
    else:
        model = "default" if args.model in (None, "default") else Path(args.model).name
        name = f"model-{model}-{args.prompts}x{args.samples}-seed{args.seed}"
        if getattr(args, "task", None):
            name += f"-{args.task}"
        if getattr(args, "prompt_set", 0):
            name += f"-set{args.prompt_set}"
    if args.credit:
        name += "-" + ",".join(c.strip() for c in args.credit.split(",") if c.strip())
    return Path(DEFAULT_ROOT) / slug(name)[:120]


def terminal_table(result: dict) -> str:
    """Every method's figures (means; the intervals are in ``audit.md``), then the sanity
    rules' under a rule."""
    rows = [("method", "blame P(w<r)", "lowest wrong", "contamination", "vs GRPO",
             "mass gap", "changed", "scale")]
    sanity = {f"({name}: sanity rule)": e for name, e in result.get("sanity_rules", {}).items()}
    for name, entry in {**result["methods"], **sanity}.items():
        fig = entry["all"]

        def mean(key, signed=False, fig=fig):
            m = (fig.get(key) or {}).get("mean")
            return "n/a" if m is None else (f"{m + 0.0:+.3f}" if signed else f"{m:.3f}")

        rows.append((name, mean("blame"), mean("lowest"), mean("contamination"),
                     mean("contamination_vs_grpo", signed=True), mean("mass_gap", signed=True),
                     mean("tokens_changed"), mean("scale")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
             for r in rows]
    rule = "  ".join("-" * w for w in widths)
    lines.insert(1, rule)
    if sanity:  # the reference rows, apart from the methods
        lines.insert(len(lines) - len(sanity), rule)
    return "\n".join("  " + line for line in lines)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``ktae audit``."""

    given = args.output_dir is not None
    out = Path(args.output_dir) if given else default_output_dir(args)
    try:
        if args.threads < 1:
            raise ValueError(f"threads: expected a positive integer, got {args.threads}")
        check_output_dir(out, results=RESULT_FILES, overwrite=args.overwrite)
    except ValueError as err:
        return error("audit", str(err))

    def announce(line: str) -> None:
        print(line, flush=True)

    on_batch = None if args.no_progress else progress_printer(args.prompts, args.samples)
    on_phase = None if args.no_progress else phase_printer()
    try:
        result = audit(args.input, model=args.model, credit=args.credit, prompts=args.prompts,
                       samples=args.samples, seed=args.seed, max_new_tokens=args.max_new_tokens,
                       temperature=args.temperature, tokenizer=args.tokenizer,
                       resamples=args.resamples, threads=args.threads,
                       output_dir=out, prompt_set=args.prompt_set, task=args.task,
                       announce=announce, on_batch=on_batch, on_phase=on_phase,
                       cut_off=args.cut_off_answers)
    except ValueError as err:
        return error("audit", str(err))
    print(summary(result))
    print(terminal_table(result))
    print(f"  full table with 95% intervals, per level and per step: {out / 'audit.md'}")
    print(f"  wrote {', '.join(result['files'])}")
    return 0
