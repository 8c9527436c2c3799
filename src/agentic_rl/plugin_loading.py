"""Importing a user's plugins (plugins.py says what they are): each module name or .py path of a
config's `plugins` or a `--plugin` flag, once per process, after the built-in registrations and
the installed entry points, so a plugin that reuses a name is the one an error names second. The
validation step (validation.py) and each pipeline stage's process call `load_plugins`."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Sequence

from agentic_rl.envs.base import list_envs
from agentic_rl.plugins import PluginError, describe_import_error
from agentic_rl.rewards.base import list_rewards
from agentic_rl.tools.base import list_tools


def load_plugins(specs: Sequence[str], named_by: str = "--plugin") -> None:
    """Import each plugin of `specs` (module names or .py paths), once per process, in order. Each
    is announced on stderr first, with the file it runs and `named_by` (the config file, and the
    files it extends, that listed it): a plugin inherited through `extends:` runs code from a file
    the user may never have opened."""
    if not specs:
        return
    _load_registries()  # built-ins and entry points first: a plugin that reuses a name is the one named second
    for spec in specs:
        if not isinstance(spec, str) or not spec.strip():
            raise PluginError(f"plugin {spec!r} must be a module name or the path of a .py file")
        if spec not in _ANNOUNCED:
            print(f"plugin {spec}: importing {_plugin_file(spec)} (named by {named_by})", file=sys.stderr, flush=True)
            _ANNOUNCED.add(spec)
        try:
            _import_plugin(spec)
        except PluginError:
            raise
        except SystemExit as exc:  # sys.exit() on import: the command would exit 0, having done nothing
            raise PluginError(
                f"plugin '{spec}' called sys.exit({exc.code!r}) while it was imported; a plugin registers "
                "envs, tools and rewards, and must not end the command"
            ) from None
        except Exception as exc:  # SyntaxError, ImportError, or whatever the plugin's own code raised
            raise PluginError(f"plugin '{spec}' failed to import: {describe_import_error(exc)}") from exc


_ANNOUNCED: set[str] = set()
"""Plugins already announced in this process (a pipeline stage reloads the config's list)."""


def _plugin_file(spec: str) -> str:
    """The file importing `spec` runs, found without running it ('not found': the import then says why)."""
    if spec.endswith(".py") or "/" in spec:
        return str(Path(spec).expanduser().resolve())
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):
        found = None
    return str(found.origin) if found is not None and found.origin else "(not found)"


def _import_plugin(spec: str) -> None:
    if spec.endswith(".py") or "/" in spec:
        _import_file(spec)
        return
    if not all(part.isidentifier() for part in spec.split(".")):
        raise PluginError(f"plugin '{spec}' is neither a module name (dotted identifiers) nor the path of a .py file")
    importlib.import_module(spec)


def _import_file(spec: str) -> None:
    path = Path(spec).expanduser().resolve()
    if not path.is_file():
        raise PluginError(
            f"plugin file '{spec}' does not exist (looked for {path}); give a .py file's path or a module name"
        )
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        where = getattr(loaded, "__file__", None)
        if where and Path(where).resolve() == path:
            return  # imported already, e.g. listed both in the config and with --plugin
        raise PluginError(
            f"plugin file '{spec}': a module named '{name}' is already imported (from {where or 'the interpreter'}); "
            "rename the file"
        )
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None, f"no loader for {path}"
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # before running it: dataclasses and pickle look their module up by name
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _load_registries() -> None:
    list_tools(), list_envs(), list_rewards()
