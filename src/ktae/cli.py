"""The ``ktae`` command line: one entry point, one module per subcommand.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``;
they are imported only when their subcommand is used, so ``ktae --help`` stays fast
and the core install works without the heavy extras. The arguments, the counts
(:data:`ktae.cli_common.COUNT_LIMITS`) and the output path are checked before a
subcommand imports its heavy dependencies; errors, interrupts and SIGTERM are reported in
one line (:mod:`ktae.cli_common`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ktae._version import __version__
from ktae.cli_common import Parser, UsageError, check_counts, error, install_signal_handlers, interrupted
from ktae.plugins import load_from_argv

DESCRIPTION = """\
ktae: token-level credit for RL fine-tuning of language models. Train with GRPO, DAPO or
Dr.GRPO and token-level credit (KTAE key tokens, TACO calibration, ...), evaluate the
result on math benchmarks, and see where each credit method puts its credit."""

EPILOG = """\
Every command writes under runs/ by default (ktae eval: eval-results/) and refuses to
replace an earlier result unless told to (--overwrite; ktae train: --resume).
'ktae COMMAND --help' lists a command's options. Documentation: README.md and the
docs/ folder of the source distribution (training.md, evaluation.md, explain.md,
audit.md, simulate.md)."""

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("ktae.train.cli_train", "RL fine-tuning (GRPO/DAPO/Dr.GRPO) with KTAE or TACO credit"),
    "compare": ("ktae.train.cli_compare", "run a credit x seed grid and write a comparison table"),
    "eval": ("ktae.eval.cli", "evaluate a model on math and science benchmarks"),
    "explain": ("ktae.explain.cli", "show which tokens of sampled responses get which credit"),
    "audit": ("ktae.credit_audit.cli", "measure whether each credit method's token credit "
              "lands on locally wrong tokens (exact labels)"),
    "models": ("ktae.models.cli", "list the models --model knows by name; prepare one for "
               "offline use (smollm2-135m)"),
    "simulate": ("ktae.sim.cli", "credit methods on the TACO paper's synthetic MDP, "
                 "against the step-level oracle"),
}


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ktae")
    except metadata.PackageNotFoundError:  # a source tree that is not installed
        return __version__


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = Parser(prog="ktae", description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ktae {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    parser.add_argument("--plugin", action="append", metavar="MODULE_OR_FILE",
                        help="import a module or .py file that registers credit rules "
                             "(ktae.register_estimator; repeatable; docs/plugins.md)")
    argv = sys.argv[1:] if argv is None else argv
    wanted = argv[0] if argv and not argv[0].startswith("-") else None
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            importlib.import_module(module).add_arguments(p)
            parser.set_defaults(_flags={a.dest: max(a.option_strings, key=len)
                                        for a in p._actions if a.option_strings})
            parser.chosen = p  # reports the unrecognized arguments of this subcommand
    return parser


def _dispatch(argv: list[str]) -> int:
    try:  # users' credit rules first, so that their names and options validate
        argv = load_from_argv(argv)
    except ValueError as err:
        print(f"ktae: {err}", file=sys.stderr)
        return 2
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if extra:
        getattr(parser, "chosen", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return 0
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    try:
        check_counts(args, vars(args).pop("_flags", None))
    except UsageError as err:
        return error(args.command, str(err))
    return int(module.run(args) or 0)


def main(argv: list[str] | None = None) -> int:
    """Run ``ktae ARGV``; the exit status. As the program itself (``argv`` None), Ctrl-C
    and SIGTERM stop it with one line and status 130 / 143 (see
    :func:`ktae.cli_common.interrupted`)."""
    if argv is not None:
        return _dispatch(list(argv))

    install_signal_handlers()
    argv = sys.argv[1:]
    try:
        return _dispatch(argv)
    except KeyboardInterrupt as err:
        command = next((a for a in argv if a in SUBCOMMANDS), None)
        interrupted(command or "", err)
        raise  # not reached: interrupted() leaves the process


if __name__ == "__main__":
    sys.exit(main())
