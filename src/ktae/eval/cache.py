"""What an evaluation's results were computed from, so that they are reused only when
nothing changed, and where they go by default.

``results.json`` records ``config.cache_key``: the model's identity (absolute directory,
or hub id) and weights (each file's name, size and modification time in nanoseconds, for
the files at the top of the model directory; a checkpoint's label and step too), the data (the sha256 of each
benchmark's problems, :func:`ktae.eval.provenance.records_sha256`) and every setting
that changes the samples. Results are read back instead of computed only when the key
is equal and every ``samples_<benchmark>.jsonl`` is still there; anything else is
evaluated afresh.

The default output directory (:func:`default_output_dir`) names the model: the last two
components of its absolute path and a short hash of that path
(``eval-results/a-final-1f3c2b``), or the hub id (``eval-results/Qwen--Qwen2.5-Math-1.5B``).
A results directory holding another model's results is not replaced unless asked
(``--overwrite``; :func:`check_replace`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

TRAINER_STATE_FILES = ("optimizer.pt", "scheduler.pt", "trainer_state.json",
                       "training_args.bin", "scaler.pt")
"""Files of a checkpoint that do not change the model (left out of the fingerprint)."""


def model_identity(model: str) -> str:
    """The absolute directory of a local MODEL, else its hub id."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def default_output_dir(model: str, root: str | Path = "eval-results") -> Path:
    """``root/<parent>-<name>-<hash6>`` for a local MODEL, ``root/<owner>--<name>`` for a
    hub id: two models never share a default directory."""
    ident = model_identity(model)
    path = Path(ident)
    if not path.is_absolute():
        return Path(root) / ident.replace("/", "--")
    tail = "-".join(p for p in path.parts[-2:] if p != path.anchor) or "model"
    return Path(root) / f"{tail}-{hashlib.sha256(ident.encode()).hexdigest()[:6]}"


def weights_fingerprint(model_dir: str | Path | None) -> dict | None:
    """``{name: [size, mtime_ns]}`` of every file of the model directory (its top level,
    where transformers saves weights, config and tokenizer; trainer state and rng files
    left out); None when there is no local directory."""
    if model_dir is None or not Path(model_dir).is_dir():
        return None
    out = {}
    for file in sorted(p for p in Path(model_dir).iterdir() if p.is_file()):
        if file.name in TRAINER_STATE_FILES or file.name.startswith("rng_state"):
            continue
        st = file.stat()
        out[file.name] = [st.st_size, st.st_mtime_ns]
    return out


def cache_key(*, model: str, model_dir: str | Path | None, data: Mapping[str, str],
              settings: Mapping, checkpoint: Mapping | None = None) -> dict:
    """The key of one evaluation (see the module docstring); JSON-ready."""
    key = {"model": model_identity(model), "weights": weights_fingerprint(model_dir),
           "data": dict(data), "settings": dict(settings)}
    if checkpoint is not None:
        key["checkpoint"] = dict(checkpoint)
    return json.loads(json.dumps(key))


def read_results(path: Path) -> dict | None:
    try:
        results = json.loads((path / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return results if isinstance(results, dict) else None


def cached_results(path: Path, key: Mapping, benchmarks: Sequence[str]) -> dict | None:
    """``path/results.json`` when it records ``cache_key == key`` and the samples of every
    benchmark are there; else None (evaluate again)."""
    results = read_results(path)
    config = results.get("config") if results else None
    if not isinstance(config, dict) or config.get("cache_key") != json.loads(json.dumps(key)):
        return None
    if not all((path / f"samples_{name}.jsonl").is_file() for name in benchmarks):
        return None
    return results


def changed_parts(old: Mapping, new: Mapping) -> list[str]:
    """Which parts of two cache keys differ (``model``, ``weights``, ``data``, ...)."""
    return [k for k in dict.fromkeys([*old, *new]) if old.get(k) != new.get(k)]


def check_replace(path: Path, key: Mapping, *, overwrite: bool = False,
                  option: str = "--output-dir") -> None:
    """Refuse to replace ``path/results.json`` when it holds another model's results
    (``--overwrite`` allows it); results of the same model are replaced when the weights,
    data or settings changed, and reused when nothing did.

    Raises:
        ValueError: one line naming the directory and the model whose results it holds.
    """
    results = read_results(path)
    if results is None or overwrite:
        return
    config = results.get("config") or {}
    old = config.get("cache_key")
    old_model = old.get("model") if isinstance(old, dict) else (
        model_identity(config["model"]) if isinstance(config.get("model"), str) else None)
    if old_model is None or old_model != key["model"]:
        raise ValueError(f"{option}: {path} holds the results of another model "
                         f"({old_model or 'unknown'}); choose another {option}, or pass "
                         "--overwrite to replace them")
