"""Typed configs: dataclasses loaded from YAML, with `--set key=value` overrides.

Every command has one config dataclass. Each field carries a docstring (the string literal
right under it), which `describe()` turns into `--help` text. Loading is strict
(DESIGN.md invariant 6): an unknown key, a wrong type or a value outside a `Literal` fails at
start with a `ConfigError` that names the key and what is allowed. No setting is ignored.

    cfg = load_config(GRPOConfig, "configs/demo.yaml", overrides=["train.lr=1e-5"])
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key and the fix."""


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Build `cls` from a YAML file (optional) plus `key.sub=value` overrides, strictly."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(loaded).__name__}")
        data = loaded
    for override in overrides or []:
        _apply_override(data, override)
    return from_dict(cls, data, prefix="", source=source)


def _apply_override(data: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override '{override}' must look like key.subkey=value")
    key, raw = override.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{override}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def from_dict(cls: type[T], data: Any, prefix: str = "", source: str = "config") -> T:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong types."""
    where = prefix.rstrip(".") or "the top level"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{where}' must be a mapping, got {data!r}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields))
        raise ConfigError(f"{source}: unknown key '{prefix}{unknown[0]}'; allowed keys in {where}: {allowed}")
    kwargs = {}
    for name, value in data.items():
        field_default = _nested_default(fields[name], hints[name])
        if field_default is not None and isinstance(value, dict):
            # A partial section overrides the field's own default instance, not the class defaults:
            # `train: {steps: 5}` keeps SFTConfig's train.output_dir = "runs/sft".
            # Shallow on purpose: nested sections merge again one level down (their own defaults),
            # and plain dict-valued options are replaced, never merged.
            value = {**dataclasses.asdict(field_default), **value}
        kwargs[name] = _coerce(hints[name], value, f"{prefix}{name}", source)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{source}: invalid value in {where}: {exc}") from exc


def _nested_default(field: dataclasses.Field, hint: Any) -> Any:
    if not dataclasses.is_dataclass(hint):
        return None
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    if field.default is not dataclasses.MISSING:
        return field.default
    return None


def _coerce(hint: Any, value: Any, key: str, source: str) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, prefix=f"{key}.", source=source)
    if origin is Literal:
        if isinstance(value, bool) and value not in args:  # YAML 1.1 reads no/off/yes/on as booleans
            spelled = [a for a in args if isinstance(a, str) and a.lower() in (("no", "off", "false") if not value else ("yes", "on", "true"))]
            value = spelled[0] if len(spelled) == 1 else value
        if value not in args:
            raise ConfigError(f"{source}: '{key}' must be one of {list(args)}, got {value!r}")
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key, source)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{source}: '{key}' got {value!r}, which fits none of {hint}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: '{key}' must be a list, got {value!r}")
        item = args[0] if args else Any
        items = [_coerce(item, v, f"{key}[{i}]", source) for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: '{key}' must be a mapping, got {value!r}")
        return dict(value)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: '{key}' must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: '{key}' must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads `3e-4` (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: '{key}' must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: '{key}' must be a string, got {value!r}")
        return value
    return value


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain data (what the run directory records)."""
    return dataclasses.asdict(cfg)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass `cls` (string literal after the annotation)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


def describe(cls: type, prefix: str = "") -> list[str]:
    """One line per leaf key: `key (type, default): doc`, recursing into nested configs."""
    lines = []
    docs = field_docs(cls)
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            lines.extend(describe(hint, prefix=f"{prefix}{f.name}."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "required"  # type: ignore[misc]
        )
        type_name = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
        lines.append(f"{prefix}{f.name} ({type_name}, default {default!r}): {docs.get(f.name, '')}")
    return lines
