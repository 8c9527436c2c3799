"""The validation step: what a command does with a config after loading it and before any model
loads. Loading (config.py) only parses; this step runs the user's code the config names:

    cfg = load_config(GRPOConfig, "my.yaml", ["env.name=squares"], plugins=["my_tasks.py"])
    validate(cfg, "my.yaml", flagged=["my_tasks.py"])   # plugins imported, envs built, names checked

1. The config's `plugins` are imported (plugin_loading.py), each announced with the file that
   named it (the config file, or --plugin), so a plugin's env and reward names check like built-in ones.
2. `check()` runs on every section (config.check_config): each env is built from its options, each
   reward's name and parameters are looked up, and each stage that replays an oracle finds one.

`load_and_validate` is both, as every command calls them (`pipeline` for the whole config, whose
stages' processes then only import its plugins); an error is a ConfigError naming the file, the
key and (after the message) the overrides, as loading's are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence, TypeVar

from agentic_rl.config import ConfigError, check_config, load_config_and_source, overrides_note
from agentic_rl.plugin_loading import load_plugins

T = TypeVar("T")


def validate(cfg: Any, source: str = "config", flagged: Sequence[str] = ()) -> None:
    """Import `cfg`'s plugins (those not in `flagged`, the --plugin flags, are named by `source`),
    then run every section's `check()`."""
    plugins = list(getattr(cfg, "plugins", None) or [])
    load_plugins([spec for spec in plugins if spec not in flagged], named_by=source)
    load_plugins([spec for spec in plugins if spec in flagged])
    check_config(cfg, source)
    term = getattr(
        cfg, "reward_model", None
    )  # grpo or ppo on its own: a weight needs its folder (the pipeline sets it)
    if term is not None:
        try:
            term.check_path()
        except ValueError as exc:
            raise ConfigError(f"{source}: invalid value in reward_model: {exc}") from None


def load_and_validate(
    cls: type[T],
    path: str | Path | None = None,
    overrides: Sequence[str] | None = None,
    plugins: Sequence[str] | None = None,
) -> T:
    """`load_config`, then `validate`: the config a command runs with."""
    cfg, source = load_config_and_source(cls, path, list(overrides or []), list(plugins or []))
    try:
        validate(cfg, source, flagged=list(plugins or []))
    except ConfigError as exc:
        if not overrides:
            raise
        raise ConfigError(f"{exc}\n  {overrides_note(path, source, overrides)}") from None
    return cfg
