"""What every ``ktae`` subcommand shares: one error style, output paths checked before any
work, bounded counts, and a clean stop on Ctrl-C or SIGTERM.

Errors read ``ktae SUB: message`` on one line of stderr and exit with status 2, whether
argparse or the subcommand found them. An interrupted command prints one line (train: how
to resume), stops its child processes and exits with 128 + the signal number (130 for
SIGINT, 143 for SIGTERM), without a traceback.

This module imports nothing heavy: it runs before any subcommand's own checks.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

#: Upper bounds of the counts of every subcommand (option dest -> (bound, what it counts)).
#: A count past its bound would only fill the memory (``--k 99999999999`` grew by about
#: 200 MB/s until killed) or run for years; these are far above any published setting
#: (avg@32 evaluation, groups of 64, 1000 bootstrap draws).
COUNT_LIMITS: dict[str, tuple[int, str]] = {
    "k": (4096, "samples per problem"),
    "batch_size": (4096, "prompts per generate call"),
    "samples": (4096, "responses per prompt"),
    "num_generations": (4096, "responses per prompt"),
    "prompts": (100_000, "prompts"),
    "num_prompts": (100_000, "prompts per step"),
    "groups": (100_000, "groups"),
    "resamples": (1_000_000, "bootstrap draws"),
    "seeds": (10_000, "seeds"),
    "max_new_tokens": (1_048_576, "new tokens"),
    "max_steps": (100_000_000, "steps"),
    "steps": (100_000_000, "updates"),
    "limit": (100_000_000, "problems"),
    "train_size": (100_000_000, "training problems"),
    "eval_size": (100_000_000, "held-out problems"),
    "rollout_groups": (100_000, "groups"),
    "max_generation_rounds": (10_000, "generation rounds"),
    "threads": (4096, "threads"),
    "torch_threads": (4096, "threads"),
    "actions": (1_000_000, "actions"),
    "horizon": (100_000, "steps per trace"),
    "n_opt": (1_000_000, "optimal actions"),
    "group_size": (4096, "trajectories per update"),
}


class UsageError(ValueError):
    """A bad argument found by the shared checks (printed as ``ktae SUB: message``)."""


def error(command: str, message: str) -> int:
    """Print ``ktae COMMAND: message`` on stderr; return the exit status 2."""
    print(f"ktae {command}: {message}", file=sys.stderr)
    return 2


class Parser(argparse.ArgumentParser):
    """argparse with the one error style: ``ktae SUB: message`` and exit status 2."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


# --------------------------------------------------------------------------- output paths


def _first_existing(path: Path) -> Path:
    for parent in (path, *path.parents):
        if parent.exists():
            return parent
    return Path(".")


def _check_creatable(path: Path, flag: str) -> None:
    """``path`` does not exist: it can be created (no ancestor is a file, the nearest
    existing one is writable)."""
    base = _first_existing(path.parent if path.parent != path else path)
    if not base.is_dir():
        raise UsageError(f"{flag}: cannot create {path}: {base} is a file, not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise UsageError(f"{flag}: cannot create {path}: {base} is not writable")


def check_output_dir(path, flag: str = "--output-dir", *, results=(), overwrite=True) -> Path:
    """Check, before any work, that the directory ``path`` can hold the outputs.

    ``results`` names the files a previous run of the same command leaves there; unless
    ``overwrite``, a directory holding one of them is refused. Nothing is created.

    Raises:
        UsageError: ``path`` (or a folder above it) is a file, is not writable, or holds
            a previous result and ``overwrite`` is False; one line naming ``flag``.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag}: {path} exists and is not a directory")
    if not path.exists():
        _check_creatable(path, flag)
        return path
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{flag}: {path} is not writable")
    if not overwrite:
        held = [name for name in results if (path / name).exists()]
        if held:
            raise UsageError(f"{flag}: {path} already holds a result ({held[0]}); pass "
                             "--overwrite to replace it, or choose another --output-dir")
    return path


def check_output_file(path, flag: str = "--output", *, overwrite=True) -> Path:
    """Check, before any work, that the file ``path`` can be written (and, unless
    ``overwrite``, does not exist yet). Nothing is created.

    Raises:
        UsageError: ``path`` is a directory, a folder above it is a file or is not
            writable, or it exists and ``overwrite`` is False.
    """
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag}: {path} is a directory; give the name of a file to write")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise UsageError(f"{flag}: {path} is not writable")
        if not overwrite:
            raise UsageError(f"{flag}: {path} exists; pass --overwrite to replace it, or "
                             f"choose another {flag}")
        return path
    _check_creatable(path, flag)
    return path


def slug(text: str) -> str:
    """A file-name-safe form of ``text`` (``ktae@ngram=3`` -> ``ktae@ngram=3``,
    ``runs/grpo-ktae-seed0`` -> ``grpo-ktae-seed0``)."""
    import re

    text = re.sub(r"[^A-Za-z0-9@=+.,_-]+", "-", str(text)).strip("-.")
    return text or "out"


# --------------------------------------------------------------------------- counts


def _values(value) -> list[int]:
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, int)]
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, str):  # eval's --k: "8" or "aime24=32,math500=4"
        out = []
        for part in value.split(","):
            text = part.rpartition("=")[2].strip()
            if text.lstrip("+-").isdigit():
                out.append(int(text))
        return out
    return []


def check_counts(args: argparse.Namespace, option_names: dict[str, str] | None = None) -> None:
    """Every count in ``args`` within :data:`COUNT_LIMITS` (lower bounds are each
    subcommand's own checks).

    Raises:
        UsageError: ``--OPTION: expected at most BOUND WHAT, got VALUE``.
    """
    names = option_names or {}
    for dest, (bound, what) in COUNT_LIMITS.items():
        for value in _values(getattr(args, dest, None)):
            if value > bound:
                flag = names.get(dest, "--" + dest.replace("_", "-"))
                raise UsageError(f"{flag}: expected at most {bound:,} {what}, got {value:,}")


# --------------------------------------------------------------------------- signals


class Interrupted(KeyboardInterrupt):
    """SIGTERM raised as a KeyboardInterrupt (so the same clean-up runs)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_hint: list[str] = []


def set_interrupt_hint(text: str | None) -> None:
    """What to print after ``interrupted`` if the command is stopped now (train: how to
    resume); None clears it."""
    _hint[:] = [] if text is None else [text]


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


def install_signal_handlers() -> None:
    """SIGTERM raises :class:`Interrupted` in the main thread, as SIGINT raises
    KeyboardInterrupt (only from the main thread; a no-op elsewhere)."""
    try:
        signal.signal(signal.SIGTERM, _raise_interrupted)
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            return
        signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread (an in-process caller): leave them alone
        pass


def descendants(pid: int | None = None) -> list[int]:
    """Process ids of every live descendant of ``pid`` (default: this process), read from
    /proc (children first found, then theirs). Empty where /proc is missing."""
    pid = os.getpid() if pid is None else pid
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def stop_children() -> None:
    """Kill every descendant process (verifier workers, data loaders, ...) and reap the
    direct children."""
    for child in descendants():
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break


def interrupted(command: str, err: KeyboardInterrupt):
    """Report an interrupt on one line, stop the children and leave at once with
    128 + signal number (no atexit handlers: they could wait on busy threads)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt this
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signum = getattr(err, "signum", signal.SIGINT)
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    hint = f"; {_hint[0]}" if _hint else ""
    try:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        prefix = f"ktae {command}" if command else "ktae"
        sys.stderr.write(f"\n{prefix}: {word}{hint}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    stop_children()
    os._exit(128 + int(signum))
