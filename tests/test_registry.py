"""The one registry behind environments, tools and reward terms (agentic_rl/registry.py)."""

from __future__ import annotations

import pytest

from agentic_rl.envs.base import _ENVS
from agentic_rl.plugins import PluginError
from agentic_rl.registry import Registry
from agentic_rl.rewards.base import _REWARDS
from agentic_rl.tools.base import _TOOLS


def first_entry() -> str:
    return "first"


def second_entry() -> str:
    return "second"


def test_a_registry_loads_its_builtins_once_on_first_use_and_names_what_it_holds():
    """Guards against a registry that registers on import (the loader would build envs) or that
    reloads its built-ins on every lookup, and against an unknown name without the list of known ones."""
    loads = []
    registry: Registry[str] = Registry("widget", "widgets", lambda: loads.append(1))
    registry.add("b", "B", first_entry)
    registry.add("a", "A", second_entry)
    assert loads == []
    assert registry.get("a") == "A" and registry.names() == ["a", "b"]
    assert len(loads) == 2  # each lookup asks; the kind's loader imports its modules once (plugins.load_entry_points)
    with pytest.raises(ValueError, match=r"^unknown widget 'c'; registered widgets: \['a', 'b'\]$"):
        registry.get("c")


def test_a_second_registration_of_a_name_names_both_origins():
    """Guards against a plugin silently replacing a built-in (or another plugin's) entry."""
    registry: Registry[str] = Registry("widget", "widgets", lambda: None)
    registry.add("a", "A", first_entry)
    with pytest.raises(PluginError) as caught:
        registry.add("a", "again", second_entry)
    assert str(caught.value).startswith(f"widget 'a' is registered twice: first by {__name__} (")
    assert f"again by {__name__} (" in str(caught.value)
    assert registry.get("a") == "A"


def test_environments_tools_and_rewards_are_one_registry_each():
    """Guards against a kind going back to a hand-written dict with its own wording of the errors."""
    assert all(isinstance(r, Registry) for r in (_ENVS, _TOOLS, _REWARDS))
    assert "arith" in _ENVS.names() and "calculator" in _TOOLS.names() and "accuracy" in _REWARDS.names()
    for registry, name in ((_ENVS, "environment"), (_TOOLS, "tool"), (_REWARDS, "reward")):
        with pytest.raises(ValueError, match=f"^unknown {name} 'nope'; registered {name}s: "):
            registry.get("nope")
