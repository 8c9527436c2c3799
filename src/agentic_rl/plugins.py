"""Plugins: a user's environments, tools and rewards, registered by importing the user's own code.

Nobody edits `agentic_rl/` to add a task. Two ways in:

1. `plugins:` in any command's config, or `--plugin` on its command line (repeatable, appended to
   the config's list). Each entry is a module name importable from `PYTHONPATH` (`my_tasks.envs`)
   or the path of a `.py` file (`tasks/squares.py`, relative to the working directory):

       agentic-rl grpo --plugin tasks/squares.py --set env.name=squares

   Loading a config only records them; the command's validation step (agentic_rl.validation)
   imports them before it checks env, reward and oracle names, so the plugin's env names, env
   options and reward names validate like built-in ones. The config keeps the list, so every
   process that builds envs imports them too: each pipeline stage's process (`pipeline._run_stage`)
   and each rank of `accelerate launch -m agentic_rl.cli ...`, whose command line is the same.

2. Entry points of an installed distribution, in the groups `agentic_rl.envs`, `agentic_rl.tools`
   and `agentic_rl.rewards`; each value names a module whose `register_*` decorators run on import:

       [project.entry-points."agentic_rl.envs"]
       squares = "my_tasks.envs"

   A registry imports its group the first time it is consulted (listing, making or getting a
   name), once per process, with no setting.

Order in a process: the built-in registrations, then entry points, then `plugins`. A plugin that
fails to import stops the run with a `PluginError` (a ValueError: `agentic-rl` exits 2) naming the
plugin and the import error; a name registered twice is an error naming both modules.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Sequence

from agentic_rl.config import Config

ENTRY_POINT_GROUPS = ("agentic_rl.envs", "agentic_rl.tools", "agentic_rl.rewards")
_NOT_THE_PLUGIN = (str(Path(__file__).resolve().parent), str(Path(importlib.__file__).resolve().parent), "<")
"""Traceback frames of agentic_rl and importlib: an import error is located at the deepest other frame."""


class PluginError(ValueError):
    """A plugin could not be loaded, or registered a name that is taken; the message names it."""


@dataclasses.dataclass
class PluginsConfig(Config):
    """Mixin of every command's config: its `plugins` key."""

    plugins: list[str] = dataclasses.field(default_factory=list)
    """Your own envs, tools and rewards: module names (on PYTHONPATH) or .py file paths, imported
    before the rest of the config is read, in every process of the run (`--plugin` appends one)."""


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
            raise PluginError(f"plugin '{spec}' failed to import: {_describe(exc)}") from exc


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


_LOADED_GROUPS: dict[str, PluginError | None] = {}
"""Entry-point groups imported in this process, and the error that stopped one (raised again on each call)."""


def load_entry_points(group: str) -> None:
    """Import the modules that installed distributions name in entry-point `group`, once per process."""
    if group in _LOADED_GROUPS:
        if _LOADED_GROUPS[group] is not None:
            raise _LOADED_GROUPS[group]
        return
    _LOADED_GROUPS[group] = None  # set first: a plugin that consults its registry while it imports must not recurse
    for entry_point in importlib.metadata.entry_points(group=group):
        try:
            entry_point.load()
        except Exception as exc:
            dist = entry_point.dist.name if entry_point.dist is not None else "an unknown distribution"
            error = PluginError(
                f"entry point '{entry_point.name} = {entry_point.value}' (group {group}, distribution {dist}) "
                f"failed to import: {_describe(exc)}"
            )
            _LOADED_GROUPS[group] = error
            raise error from exc


def _load_registries() -> None:
    from agentic_rl.envs.base import list_envs
    from agentic_rl.rewards.base import list_rewards
    from agentic_rl.tools.base import list_tools

    list_tools(), list_envs(), list_rewards()


def _describe(exc: BaseException) -> str:
    """'ErrorType: message (file:line)', the line being the deepest one outside agentic_rl itself."""
    frames = [
        frame for frame in traceback.extract_tb(exc.__traceback__) if not frame.filename.startswith(_NOT_THE_PLUGIN)
    ]
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
