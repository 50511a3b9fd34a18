"""Load users' credit rules: ``--plugin MODULE_OR_FILE`` and the ``ktae.plugins`` entry points.

A plugin is any Python module whose import calls :func:`ktae.register_estimator` or
:func:`ktae.register_calibration`. The ``ktae`` command loads, before it parses a
subcommand's arguments (so that ``--credit NAME`` and the options are validated against
the plugin's rules):

* every module of the entry-point group ``ktae.plugins`` of the installed distributions
  (``[project.entry-points."ktae.plugins"] mine = "my_package.credit"``), once per process;
* every module or file named in the environment variable ``KTAE_PLUGINS`` (separated by
  ``os.pathsep``, ``:`` on POSIX), which separate processes such as verl's Ray workers
  read too (:func:`ktae.integrations.verl.options.load_user_rules`);
* every ``--plugin`` given anywhere on the command line (repeatable): a dotted module name
  (``my_package.credit``) or the path of a ``.py`` file (``./my_rule.py``).

A plugin that fails to import is a one-line error naming it. See ``docs/plugins.md``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

ENTRY_POINT_GROUP = "ktae.plugins"
PLUGIN_FLAG = "--plugin"
ENV_VAR = "KTAE_PLUGINS"

_loaded: dict[str, object] = {}


class PluginError(ValueError):
    """A plugin could not be found or imported (the message names it)."""


def load_plugin(spec: str):
    """Import ``spec``, a ``.py`` file path or a dotted module name; return the module.

    Loading the same spec twice imports it once (its ``register_*`` calls run once).
    """
    spec = str(spec).strip()
    if not spec:
        raise PluginError(f"{PLUGIN_FLAG}: expected a module name or a .py file, got ''")
    path = Path(spec)
    is_file = spec.endswith(".py") or path.is_file()
    key = str(path.resolve()) if is_file else spec
    if key in _loaded:
        return _loaded[key]
    try:
        module = _import_file(path) if is_file else importlib.import_module(spec)
    except PluginError:
        raise
    except Exception as err:  # noqa: BLE001 - any error of user code, reported on one line
        first = str(err).splitlines()[0] if str(err) else ""
        raise PluginError(f"{PLUGIN_FLAG} {spec}: {type(err).__name__}: {first}") from err
    _loaded[key] = module
    return module


def _import_file(path: Path):
    if not path.is_file():
        raise PluginError(f"{PLUGIN_FLAG} {path}: no such file")
    name = f"ktae_plugin_{path.stem}_{abs(hash(str(path.resolve()))):x}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"{PLUGIN_FLAG} {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_entry_points() -> list[str]:
    """Import every module of the ``ktae.plugins`` entry-point group (once per process);
    return the names of the entry points loaded now."""
    done = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = f"entry point {ep.name}"
        if key in _loaded:
            continue
        try:
            _loaded[key] = ep.load()
        except Exception as err:  # noqa: BLE001 - user code
            first = str(err).splitlines()[0] if str(err) else ""
            raise PluginError(f"plugin entry point {ep.name!r} ({ep.value}) of group "
                              f"{ENTRY_POINT_GROUP}: {type(err).__name__}: {first}") from err
        done.append(ep.name)
    return done


def load_from_env(environ=None) -> list[str]:
    """Load every module or ``.py`` file named in ``KTAE_PLUGINS`` (``os.pathsep``
    separated; ``environ``: default ``os.environ``); return their specs. A failing one is
    a :class:`PluginError` naming the variable."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    specs = [s.strip() for s in value.split(os.pathsep) if s.strip()]
    for spec in specs:
        try:
            load_plugin(spec)
        except PluginError as err:
            raise PluginError(f"{ENV_VAR}: {err}") from err
    return specs


def split_plugin_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(plugins, rest)``: the values of ``--plugin X`` / ``--plugin=X`` anywhere in
    ``argv`` (up to a ``--``), and ``argv`` without them."""
    plugins, rest = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg == PLUGIN_FLAG:
            if i + 1 >= len(argv):
                raise PluginError(f"{PLUGIN_FLAG}: expected a module name or a .py file")
            plugins.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith(PLUGIN_FLAG + "="):
            plugins.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    return plugins, rest


def load_from_argv(argv: list[str]) -> list[str]:
    """Load the entry-point plugins, ``KTAE_PLUGINS`` and every ``--plugin`` of ``argv``;
    return ``argv`` without the ``--plugin`` flags (what the subcommand parsers see)."""
    plugins, rest = split_plugin_args(argv)
    load_entry_points()
    load_from_env()
    for spec in plugins:
        load_plugin(spec)
    return rest
