"""Plugins: a user's environments, tools and rewards, registered by importing the user's own code.

Nobody edits `agentic_rl/` to add a task. Two ways in:

1. `plugins:` in any command's config, or `--plugin` on its command line (repeatable, appended to
   the config's list). Each entry is a module name importable from `PYTHONPATH` (`my_tasks.envs`)
   or the path of a `.py` file (`tasks/squares.py`, relative to the working directory):

       agentic-rl grpo --plugin tasks/squares.py --set env.name=squares

   Loading a config only records them; the command's validation step (agentic_rl.validation,
   through plugin_loading.py's `load_plugins`) imports them before it checks env, reward and
   oracle names, so the plugin's env names, env options and reward names validate like built-in
   ones. The config keeps the list, so every process that builds envs imports them too: each
   pipeline stage's process (`pipeline._run_stage`) and each rank of `accelerate launch -m
   agentic_rl.cli ...`, whose command line is the same.

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
import traceback
from pathlib import Path

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
                f"failed to import: {describe_import_error(exc)}"
            )
            _LOADED_GROUPS[group] = error
            raise error from exc


def describe_import_error(exc: BaseException) -> str:
    """'ErrorType: message (file:line)', the line being the deepest one outside agentic_rl itself."""
    frames = [
        frame for frame in traceback.extract_tb(exc.__traceback__) if not frame.filename.startswith(_NOT_THE_PLUGIN)
    ]
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
