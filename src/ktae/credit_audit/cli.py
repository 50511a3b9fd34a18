"""``ktae audit``: does each credit method's token credit land on the right tokens?

INPUT is a ``ktae train`` run directory (its saved rollouts: the figures per recorded
step) or a JSONL file of groups with ``wrong`` character spans; with ``--model`` and no
INPUT, ``--prompts`` held-out embedded prompts x ``--samples`` responses are sampled
(``--model default``: the shipped tiny model, offline) and labelled exactly
(:func:`ktae.tasks.label_response`). Writes ``audit.md``, ``audit.json`` and one PNG per
figure into ``--output-dir`` and prints a short summary. See docs/audit.md.
"""

from __future__ import annotations

import argparse
import sys

from ktae.credit_audit.run import DEFAULT_PROMPTS, DEFAULT_RESAMPLES, DEFAULT_SAMPLES

DEFAULT_OUTPUT = "audit"


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
    parser.add_argument("--max-new-tokens", type=int, help="response length budget with "
                        "--model (default 40 for character-level tokenizers, else 1024)")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="sampling and scoring temperature (default 1)")
    parser.add_argument("--tokenizer", help="tokenizer directory (JSONL input; default: the "
                        "model's, or the shipped tiny model's)")
    parser.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES,
                        help=f"bootstrap draws per interval (default {DEFAULT_RESAMPLES})")
    parser.add_argument("-o", "--output-dir", default=DEFAULT_OUTPUT,
                        help=f"folder for audit.md, audit.json and the PNGs (default "
                        f"{DEFAULT_OUTPUT})")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1)")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``ktae audit``."""
    from ktae.credit_audit.report import summary
    from ktae.credit_audit.run import audit

    try:
        if args.threads < 1:
            raise ValueError(f"threads: expected a positive integer, got {args.threads}")
        result = audit(args.input, model=args.model, credit=args.credit, prompts=args.prompts,
                       samples=args.samples, seed=args.seed, max_new_tokens=args.max_new_tokens,
                       temperature=args.temperature, tokenizer=args.tokenizer,
                       resamples=args.resamples, threads=args.threads,
                       output_dir=args.output_dir)
    except ValueError as err:
        print(f"ktae audit: {err}", file=sys.stderr)
        return 2
    print(summary(result))
    print(f"  wrote {', '.join(result['files'])}")
    return 0
