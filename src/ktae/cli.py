"""The ``ktae`` command line: one entry point, one module per subcommand.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``;
they are imported only when their subcommand is used, so ``ktae --help`` stays fast
and the core install works without the heavy extras.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("ktae.train.cli_train", "RL fine-tuning (GRPO/DAPO/Dr.GRPO) with KTAE or TACO credit"),
    "compare": ("ktae.train.cli_compare", "run a credit x seed grid and write a comparison table"),
    "eval": ("ktae.eval.cli", "evaluate a model on math and science benchmarks"),
    "explain": ("ktae.explain.cli", "show which tokens of sampled responses get which credit"),
    "audit": ("ktae.credit_audit.cli", "measure whether each credit method's token credit "
              "lands on locally wrong tokens (exact labels)"),
    "simulate": ("ktae.sim.cli", "credit methods on the TACO paper's synthetic MDP, "
                 "against the step-level oracle"),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ktae", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    argv = sys.argv[1:] if argv is None else argv
    wanted = argv[0] if argv and not argv[0].startswith("-") else None
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
