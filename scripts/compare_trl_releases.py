"""Compare the TRL code ``KTAEGRPOTrainer`` overrides or swaps across TRL releases.

For every method ``KTAEGRPOTrainer`` defines that TRL's ``GRPOTrainer`` also defines, and
for the module globals ktae swaps, prints whether each release's signature and body are
the ones of the reference release, and how many lines differ. Each release's wheel is
fetched with ``pip download --no-deps`` (PyPI) and read, never imported.

    python scripts/compare_trl_releases.py 1.16.0 1.15.0 1.14.2 1.13.0

The first release is the reference. Output: one line per name and release.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

#: (file in the wheel, class or None for a module-level function, name): TRL code ktae
#: relies on besides GRPOTrainer's methods.
GLOBALS = (
    ("trl/trainer/utils.py", None, "shuffle_sequence_dict"),
    ("trl/trainer/utils.py", "RepeatSampler", "__iter__"),
    ("trl/trainer/utils.py", "RepeatSampler", "__init__"),
    ("trl/generation/vllm_generation.py", "VLLMGeneration", "sync_weights"),
    ("trl/generation/vllm_generation.py", "VLLMGeneration", "_init_vllm"),
)


def overridden_names() -> list[str]:
    """Methods of ``KTAEGRPOTrainer`` that replace one of ``trl.GRPOTrainer``'s own."""
    from trl import GRPOTrainer

    from ktae.train.trainer import KTAEGRPOTrainer

    own = {n for n, v in vars(GRPOTrainer).items() if callable(v)}
    return sorted(n for n, v in vars(KTAEGRPOTrainer).items() if callable(v) and n in own)


def source_lines(source: str) -> list[str]:
    """``source``'s lines, ends kept, split only at ``\\r\\n``, ``\\r`` and ``\\n`` (where
    Python's parser ends a line, as ``ast.get_source_segment`` splits)."""
    return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z", source)


def segment(lines: list[str], node: ast.AST) -> str:
    """The source of ``node``, as ``ast.get_source_segment`` gives it, from the file's lines
    split once (that function splits the whole file again, a character at a time, for
    every node: seconds for the ~60 methods of ``grpo_trainer.py``)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
    return "".join([lines[first].encode()[node.col_offset:].decode(), *lines[first + 1:last],
                    lines[last].encode()[:node.end_col_offset].decode()])


def definitions(source: str, cls: str | None) -> dict[str, str]:
    """``name -> source`` of the functions of class ``cls`` (module level when None)."""
    tree = ast.parse(source)
    if cls is None:
        body = tree.body
    else:
        body = next((n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                     and n.name == cls), [])
    lines = source_lines(source)
    return {n.name: segment(lines, n) for n in body if isinstance(n, ast.FunctionDef)}


def signature(code: str) -> str:
    """A function's parameters (names, defaults, annotations) from its source."""
    node = ast.parse(code.strip()).body[0]
    return ast.unparse(node.args)


def fetch(version: str, into: Path) -> zipfile.ZipFile:
    """TRL ``version``'s wheel from PyPI, unread."""
    folder = into / version
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    f"trl=={version}", "-d", str(folder)], check=True)
    (wheel,) = folder.glob("trl-*.whl")
    return zipfile.ZipFile(wheel)


def compare(versions: list[str]) -> list[str]:
    """One line per name and release: same signature, same body, or the count of lines
    removed plus lines added (a changed line counts twice)."""
    items = [("trl/trainer/grpo_trainer.py", "GRPOTrainer", n) for n in overridden_names()]
    items += list(GLOBALS)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        wheels = {v: fetch(v, Path(tmp)) for v in versions}
        parsed = {}  # (version, path, cls) -> definitions: each file is parsed once

        def code(version, path, cls, name):
            key = (version, path, cls)
            if key not in parsed:
                try:
                    text = wheels[version].read(path).decode()
                except KeyError:
                    text = None
                parsed[key] = None if text is None else definitions(text, cls)
            return None if parsed[key] is None else parsed[key].get(name)

        reference = versions[0]
        for path, cls, name in items:
            ref = code(reference, path, cls, name)
            label = f"{cls}.{name}" if cls else name
            for version in versions[1:]:
                other = code(version, path, cls, name)
                if ref is None or other is None:
                    lines.append(f"{label:52s} {version:8s} missing in "
                                 f"{reference if ref is None else version}")
                    continue
                diff = [d for d in difflib.unified_diff(other.splitlines(), ref.splitlines(),
                                                        lineterm="", n=0)
                        if d[:1] in "+-" and d[:3] not in ("+++", "---")]
                lines.append(f"{label:52s} {version:8s} "
                             f"signature {'same' if signature(ref) == signature(other) else 'DIFFERS'}, "
                             f"body {'same' if not diff else f'{len(diff)} lines differ'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="+", help="TRL releases, the reference first")
    args = parser.parse_args(argv)
    if len(args.versions) < 2:
        parser.error("versions: expected a reference release and at least one other")
    print("\n".join(compare(args.versions)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
