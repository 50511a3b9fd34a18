"""Run a function right after a given module has been imported (a post-import hook).

The plugin loads on every ``import verl``, before verl's trainer and worker modules exist.
Importing them there would cost every Ray process several seconds of CPU (measured in
docs/verl.md) and pull trainer-only dependencies into workers, so each wrapper is
applied when verl itself imports the module that defines the wrapped function, before
any other module can bind the function by name. A module already imported is patched at
once.

Mechanism: a finder placed first on ``sys.meta_path`` answers only for the hooked module
names; it asks the other finders for the real spec and wraps its loader so that
``exec_module`` runs the hooks after the module body. Nothing else changes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable
from types import ModuleType

logger = logging.getLogger(__name__)

Hook = Callable[[ModuleType], None]


class _HookedLoader(importlib.abc.Loader):
    """The real loader, then the hooks of that module."""

    def __init__(self, loader, finder: PostImportFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._finder.run_hooks(module)

    def __getattr__(self, name):  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


class PostImportFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder that attaches hooks to named modules (one instance per process)."""

    mark = "ktae_verl_post_import_finder"

    def __init__(self) -> None:
        self.hooks: dict[str, list[Hook]] = {}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookedLoader(spec.loader, self)
                return spec
        return None

    def run_hooks(self, module: ModuleType) -> None:
        for hook in self.hooks.get(module.__name__, ()):
            hook(module)


def _finder() -> PostImportFinder:
    # Found by its mark, not its class: a second copy of this module (imported under
    # another name) must reuse the first finder rather than add one.
    for finder in sys.meta_path:
        if getattr(finder, "mark", None) == PostImportFinder.mark:
            return finder
    finder = PostImportFinder()
    sys.meta_path.insert(0, finder)
    return finder


def when_imported(module_name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once ``module_name`` is imported (now, if it already is)."""
    module = sys.modules.get(module_name)
    if module is not None and getattr(module, "__spec__", None) is not None \
            and not _initialising(module):
        hook(module)
        return
    _finder().hooks.setdefault(module_name, []).append(hook)


def _initialising(module: ModuleType) -> bool:
    return bool(getattr(module.__spec__, "_initializing", False))
