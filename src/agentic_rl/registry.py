"""`Registry`: names to registered things, one instance per kind (environments in envs/base.py,
tools in tools/base.py, reward terms in rewards/base.py). Built-ins and plugins register by name
(agentic_rl.plugins); a name registered twice is an error naming both origins; an unknown name is
an error listing the registered ones. The kind's built-ins and installed entry points are imported
the first time the registry is consulted, so importing a registry module registers nothing by itself.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Generic, TypeVar

from agentic_rl.plugins import PluginError

T = TypeVar("T")


class Registry(Generic[T]):
    """Registered entries of one kind, by name (module docstring)."""

    def __init__(self, kind: str, plural: str, load_builtins: Callable[[], None]):
        self.kind, self.plural, self._load_builtins = kind, plural, load_builtins
        self._entries: dict[str, T] = {}
        self._origins: dict[str, str] = {}
        """Where each name was registered (module and file), for the error on a second registration."""

    def add(self, name: str, entry: T, registered: Any) -> None:
        """Register `entry` as `name`; `registered` is the class or function the user decorated,
        whose module names the origin."""
        origin = registration_origin(registered)
        if name in self._entries:
            raise PluginError(
                f"{self.kind} '{name}' is registered twice: first by {self._origins[name]}, again by {origin}; "
                "rename one of them (names are global across plugins and built-ins)"
            )
        self._entries[name], self._origins[name] = entry, origin

    def get(self, name: str) -> T:
        """The entry registered as `name`; ValueError listing the registered names otherwise."""
        self._load_builtins()
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} '{name}'; registered {self.plural}: {sorted(self._entries)}")
        return self._entries[name]

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        self._load_builtins()
        return sorted(self._entries)


def registration_origin(obj: Any) -> str:
    """Where `obj` (a registered class or function) comes from: its module and the module's file."""
    module = getattr(obj, "__module__", None) or "an unnamed module"
    file = getattr(sys.modules.get(module), "__file__", None)
    return f"{module} ({file})" if file else module
