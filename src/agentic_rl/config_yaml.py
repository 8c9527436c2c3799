"""Reading YAML for configs: strictly (a repeated key is an error, never the last value silently)
and within bounds (size, values once aliases are expanded, depth), so a hostile or broken file
stops with an error instead of exhausting memory or the recursion limit. `read_config_file`
(below) reads files through it, `--set`/`--option`/`--arg` values too, and `config_extends` counts its
expansion against the same bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agentic_rl.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20
"""A config file larger than this (1 MiB) is refused: configs are a few kilobytes."""
MAX_CONFIG_VALUES = 100_000
"""Values (scalars, lists, mappings) a config may hold once its YAML aliases and `extends` are
expanded; the largest shipped config holds a few hundred. An alias bomb or a chain of files that
extend the next twice over stops here, before it fills memory."""
MAX_CONFIG_DEPTH = 100
"""Nesting a config may have (the deepest shipped one: 6)."""


class DuplicateKeyError(yaml.YAMLError):
    """A mapping repeats a key; plain YAML would silently keep the last value."""


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that rejects a repeated key in a mapping, naming the key and lines."""


def _no_duplicate_keys(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *anchor` merges may be overridden by explicit keys, by design
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            if key in first_line:
                raise DuplicateKeyError(
                    f"duplicate key {key!r} at line {line} (first at line {first_line[key]}); "
                    "YAML would keep only the last value: remove one of them"
                )
            first_line[key] = line
        except TypeError:  # an unhashable key: construct_mapping below reports it
            break
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicate_keys)


class Replacing(dict):
    """A mapping tagged `!replace` in a config file: over an `extends` base it replaces the base's
    mapping instead of merging into it (config_extends.py)."""


def _replacing(loader: _StrictLoader, node: yaml.Node) -> Replacing:
    if not isinstance(node, yaml.MappingNode):
        raise yaml.constructor.ConstructorError(
            None, None, "!replace applies to a mapping, e.g. `env: !replace {name: squares}`", node.start_mark
        )
    return Replacing(_no_duplicate_keys(loader, node, deep=True))


_StrictLoader.add_constructor("!replace", _replacing)


class ConfigBoundError(ValueError):
    """YAML beyond MAX_CONFIG_VALUES or MAX_CONFIG_DEPTH; the caller names where it came from."""


def load_yaml(text: str) -> Any:
    """`text` as YAML, strictly (no repeated key) and within the config bounds (ConfigBoundError)."""
    try:
        value = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise ConfigBoundError(f"nested deeper than {MAX_CONFIG_DEPTH} levels") from None
    check_config_bounds(value)
    return value


def check_config_bounds(value: Any) -> None:
    """ConfigBoundError when `value`, its aliases expanded (each use counted: YAML shares the object),
    holds more than MAX_CONFIG_VALUES values or nests deeper than MAX_CONFIG_DEPTH. Iterative and
    stopping at the bound, so an alias bomb costs at most MAX_CONFIG_VALUES steps."""
    stack, seen = [(value, 1)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            raise ConfigBoundError(
                f"holds more than {MAX_CONFIG_VALUES} values once its aliases and `extends` are "
                "expanded (a YAML alias bomb?); a config holds a few hundred"
            )
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigBoundError(f"nested deeper than {MAX_CONFIG_DEPTH} levels")
        if isinstance(node, dict):
            stack.extend((item, depth + 1) for pair in node.items() for item in pair)
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds (an empty file is {}), strictly parsed (no repeated keys),
    within config_yaml.py's bounds; a path that is not a regular file (`/dev/zero`, a FIFO) is refused unread."""
    file = Path(path)
    if file.exists() and not file.is_file():
        raise ConfigError(f"config file {path} is not a regular file; give the path of a YAML file")
    try:
        with open(file, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes; a config is a few kilobytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    try:
        loaded = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    except ConfigBoundError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(loaded).__name__}")
    return loaded
