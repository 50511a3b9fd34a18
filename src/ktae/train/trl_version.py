"""The TRL releases ``KTAEGRPOTrainer`` supports, checked before anything is built.

The trainer overrides private methods of TRL's ``GRPOTrainer`` and swaps module globals of
TRL (docs/contributing.md, "The trainer's overrides of TRL"): each was compared, signature
and body, in every release of :data:`SUPPORTED_TRL`, and the trainer's tests run on its
oldest and newest release (``.ci/trl-bounds``). TRL 1.14.2's
``_get_per_token_logps_and_entropies`` takes ``(model, *args, **kwargs)`` and has no fused
LM head, and TRL 1.14.0 has no ``eos_token_ids``: the range starts at 1.15.0. A newer TRL
is not promised until it is tested, so the range ends at the newest release tested. The
``train`` extra of ``pyproject.toml`` requires the same range (a test checks it).
"""

from __future__ import annotations

SUPPORTED_TRL = ">=1.15.0,<=1.16.0"
"""The TRL releases the trainer supports, as a pip version specifier."""


class UnsupportedTRLError(RuntimeError):
    """The installed TRL is outside :data:`SUPPORTED_TRL` (or TRL is missing)."""


def check_trl(version: str | None = None) -> str:
    """The installed TRL's version, or a one-line :class:`UnsupportedTRLError` naming the
    supported range when it is outside :data:`SUPPORTED_TRL` (a pre-release, such as
    ``1.16.0rc1`` or a ``.dev`` build of TRL's main branch, is outside it: untested).

    Args:
        version: the version to check; by default the imported ``trl``'s ``__version__``
            (what runs, even where another release's metadata is also on the path).
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if version is None:
        try:
            import trl
        except ImportError:
            raise UnsupportedTRLError(
                f"trl is not installed; ktae's trainer needs trl{SUPPORTED_TRL}: "
                "pip install 'ktae[train]'") from None
        version = trl.__version__
    try:
        parsed = Version(version)
    except InvalidVersion:
        parsed = None
    if parsed is None or not SpecifierSet(SUPPORTED_TRL).contains(parsed, prereleases=False):
        raise UnsupportedTRLError(
            f"trl {version} is installed; ktae's trainer supports trl{SUPPORTED_TRL} only: "
            f"pip install 'trl{SUPPORTED_TRL}'")
    return version
