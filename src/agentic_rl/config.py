"""Typed configs: dataclasses loaded from YAML, with `--set key=value` overrides.

Every command has one config dataclass. Each field carries a docstring (the string literal
right under it), which `describe()` turns into `--help` text. Loading is strict
(docs/design.md invariant 6): an unknown key, a wrong type or a value outside a `Literal` fails at
start with a `ConfigError` that names the key and what is allowed. No setting is ignored.

Numbers are checked here too, in one place (docs/design.md invariant 8): NaN and ±inf are rejected
for every key, typed or not (YAML reads `.nan`, `.inf`, and a float key the strings `nan`,
`inf`). A field annotated `PositiveInt` / `PositiveFloat` must be > 0, one annotated
`NonNegativeInt` / `NonNegativeFloat` must be >= 0, and one annotated with an `Interval`
(`Fraction` [0, 1], `OpenFraction` (0, 1), `FractionBelowOne` [0, 1)) must lie in it; all are
plain int and float to the rest of the code. A string annotated with a `Pattern` (`DeviceSetting`)
must match it.

Every config dataclass derives from `Config`, which runs the same checks of its typed fields
(the markers above and `Literal` values) when it is constructed, however: from YAML, `--set`
or directly in Python. So a check a marker states is never written again by hand in a
`__post_init__`, and `RolloutConfig(max_turns=0)` fails with the text a YAML file with
`max_turns: 0` gets, less the file and the section prefix, which Python does not know:
`RolloutConfig: 'max_turns' must be > 0, got 0`.

A key that another setting makes unused is refused, naming that setting (`refuse_unused`), e.g.
`value.model` with `value.critic: shared`. The rule is "a value other than the field's default":
a default value changes nothing whichever way it was given (and a config built in Python cannot
tell a default it was given from one it was not), so a config that spells out every default,
like `agentic-rl config` prints them, still loads.

    cfg = load_config(PipelineConfig, "configs/demo.yaml", overrides=["grpo.optim.lr=1e-5"])
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
from pathlib import Path
import math
import re
from typing import Annotated, Any, Literal, Sequence, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from agentic_rl.config_extends import refuse_extends, resolve_extends
from agentic_rl.config_yaml import ConfigBoundError, DuplicateKeyError, load_yaml, read_config_file
from agentic_rl.errors import QUOTE_LIMIT, ConfigError, quoted

T = TypeVar("T")


class _Positive:
    """Marker in `Annotated[...]`: the value must be > 0 (a count, a size, a rate)."""

    def __repr__(self) -> str:
        return "> 0"


PositiveInt = Annotated[int, _Positive()]
"""An int that must be > 0 (batch sizes, token limits, counts)."""
PositiveFloat = Annotated[float, _Positive()]
"""A finite float that must be > 0 (learning rate, epsilon)."""


class _NonNegative:
    """Marker in `Annotated[...]`: the value must be >= 0 (a count where 0 means none or off)."""

    def __repr__(self) -> str:
        return ">= 0"


NonNegativeInt = Annotated[int, _NonNegative()]
"""An int that must be >= 0 (0: none, or off)."""
NonNegativeFloat = Annotated[float, _NonNegative()]
"""A finite float that must be >= 0 (a weight, a temperature)."""


class Interval:
    """Marker in `Annotated[...]`: the value must lie in an interval, written as in mathematics:
    `Interval("[0, 1)")` holds 0 and every value below 1."""

    def __init__(self, spec: str) -> None:
        left, low, high, right = spec[0], *spec[1:-1].split(","), spec[-1]
        self.spec, self.low, self.high = spec, float(low), float(high)
        self.low_closed, self.high_closed = left == "[", right == "]"

    def holds(self, value: float) -> bool:
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return above and below

    def __repr__(self) -> str:
        return f"in {self.spec}"


Fraction = Annotated[float, Interval("[0, 1]")]
"""A float in [0, 1] (a discount γ, GAE's λ)."""
OpenFraction = Annotated[float, Interval("(0, 1)")]
"""A float in (0, 1) (a clip range: 1 − ε must stay above 0)."""
FractionBelowOne = Annotated[float, Interval("[0, 1)")]
"""A float in [0, 1) (a dropout rate, a weight that must stay below 1)."""


class Pattern:
    """Marker in `Annotated[...]`: the string must match `regex` in full; `shown` is how the message
    and `agentic-rl config` spell the values it allows."""

    def __init__(self, regex: str, shown: str) -> None:
        self.regex, self.shown = re.compile(regex), shown

    def holds(self, value: str) -> bool:
        return isinstance(value, str) and self.regex.fullmatch(value) is not None

    def __repr__(self) -> str:
        return f"one of {self.shown}"


DEVICE = Pattern(r"auto|cpu|cuda(:[0-9]+)?", "auto, cpu, cuda or cuda:N (N a GPU index, e.g. cuda:1)")
"""The values a device setting takes; models/device.py `resolve_device` turns one into a torch.device."""
DeviceSetting = Annotated[str, DEVICE]
"""Where a model runs: auto, cpu, cuda or cuda:N (`rollout.device`)."""


class Derived:
    """Marker in `Annotated[...]`: the field is computed from other settings, not a user key.
    Loading refuses the key with `why` (how it is derived), and `describe` leaves it out."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return "derived"


def _derived(hint: Any) -> Derived | None:
    return (
        next((mark for mark in get_args(hint)[1:] if isinstance(mark, Derived)), None)
        if get_origin(hint) is Annotated
        else None
    )


class Config:
    """Base of every config dataclass: its typed fields are checked when it is constructed.

    The checks are those of loading (`_coerce`): a marked field (`PositiveInt`, `NonNegativeFloat`,
    ...) must satisfy its marker, a `Literal` field must hold one of its values, a float must be
    finite. They run before the class's own `__post_init__` (which then only checks what no
    marker can state: relations between fields), once per instance, in the most derived class.
    The error is a ConfigError whose source is the class's name, e.g.
    `GRPOConfig: 'micro_batch_size' must be > 0, got 0`.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__post_init__")
        if own is None or getattr(own, "_checks_fields", False):
            return

        @functools.wraps(own)
        def __post_init__(self: Any) -> None:
            if type(self).__post_init__ is __post_init__:  # the most derived class's: check once
                check_fields(self)
            own(self)

        __post_init__._checks_fields = True  # type: ignore[attr-defined]
        cls.__post_init__ = __post_init__  # type: ignore[attr-defined]

    def __post_init__(self) -> None:
        if type(self).__post_init__ is Config.__post_init__:
            check_fields(self)

    def check(self) -> None:
        """The checks that need the registries, run by the validation step (`check_config`), never
        while loading: an env built from its options, a reward's name and parameters, an oracle where
        a stage replays one. Loading a config imports no plugin and builds no env; the command (or
        pipeline stage) imports the plugins, then calls this on every section. None here."""


def check_config(config: Any, source: str = "config") -> None:
    """The validation step after loading: `check()` on every section of `config`, depth first (a
    section's own check runs after its sections'), each failure a ConfigError naming the file and
    the key as loading names them. The plugins the checks need are imported first by the caller
    (agentic_rl.validation)."""
    _check_section(config, "", source)


def _check_section(value: Any, prefix: str, source: str) -> None:
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_section(item, f"{prefix.rstrip('.')}[{index}].", source)
        return
    if not (dataclasses.is_dataclass(value) and not isinstance(value, type)):
        return
    for field in dataclasses.fields(value):
        _check_section(getattr(value, field.name), f"{prefix}{field.name}.", source)
    if isinstance(value, Config):
        try:
            value.check()
        except ConfigError:
            raise
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{source}: invalid value in {prefix.rstrip('.') or 'the top level'}: {exc}") from exc


def check_fields(config: Any) -> None:
    """Check `config`'s marked and `Literal` fields as loading checks them (ConfigError naming the
    field). A Literal spelled as YAML's boolean (`no`) and an int in a float field are stored as
    loading stores them ('no', 1.0); nothing else is changed."""
    cls = type(config)
    for name, hint in _checked_fields(cls):
        value = getattr(config, name)
        checked = _coerce(hint, value, name, cls.__name__)
        if type(checked) is not type(value):
            object.__setattr__(config, name, checked)  # also for frozen configs


@functools.cache
def _checked_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, hint) of each field of dataclass `cls` whose hint carries a marker or a Literal."""
    hints = get_type_hints(cls, include_extras=True)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls) if _has_checks(hints[f.name]))


def _has_checks(hint: Any) -> bool:
    origin = get_origin(hint)
    if origin in (Annotated, Literal) or hint is float:
        return True
    if origin in (Union, types.UnionType, list, tuple):
        return any(_has_checks(arg) for arg in get_args(hint) if arg is not Ellipsis)
    return False


RENAMED = {
    "runner": "rollout.backend",
    "env_options": "env: {name: ..., options: {...}}",
}
"""Keys that older configs used anywhere, and where they went: named in the unknown-key error. A
key renamed in one class only is in that class's `RENAMED_KEYS` (a ClassVar), e.g. EvalConfig's
batch_size, which names a count that is `max_concurrent` there and a step's size elsewhere."""


def renamed_keys(cls: type) -> dict[str, str]:
    """Old key -> where it went, for the keys of `cls`: RENAMED plus the class's own RENAMED_KEYS."""
    return {**RENAMED, **getattr(cls, "RENAMED_KEYS", {})}


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None, plugins: list[str] | None = None
) -> T:
    """Build `cls` from a YAML file (optional) plus `key.sub=value` overrides, strictly.

    Loading only loads: it parses, resolves `extends:` (config_extends.py), applies the overrides and
    checks every key's type and marker. It imports no plugin and builds no env: `plugins` (the
    `--plugin` flags) are appended to the config's `plugins` list, which the validation step
    (agentic_rl.validation.validate) imports before it checks env, reward and oracle names."""
    return load_config_and_source(cls, path, overrides, plugins)[0]


def load_config_and_source(
    cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None, plugins: list[str] | None = None
) -> tuple[T, str]:
    """`load_config`, and the source its errors name: the file and the files it extends ("defaults"
    or "--set" without one), for the validation step's errors and plugin announcements."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        data, extended = resolve_extends(read_config_file(path), path)
        source = f"{path}, extending {', '.join(map(str, extended))}" if extended else str(path)
    for override in overrides or []:
        _apply_override(data, override)
    if not overrides:
        _record_plugins(cls, data, plugins or [])
        return from_dict(cls, data, prefix="", source=source), source
    # The message first, then every override that went into the config it speaks of.
    source = source if path is not None else "--set"
    try:
        refuse_extends(data, source)
        _record_plugins(cls, data, plugins or [])
        return from_dict(cls, data, prefix="", source=source), source
    except ConfigError as exc:
        raise ConfigError(f"{exc}\n  {overrides_note(path, source, overrides)}") from None


def overrides_note(path: str | Path | None, source: str, overrides: list[str]) -> str:
    """What an error says after its message: the config file and every override that went into it."""
    given = f"--set {' '.join(map(_shown, overrides))}"
    return f"({given if path is None else f'config: {source} with {given}'})"


def _record_plugins(cls: type, data: dict[str, Any], extra: list[str]) -> None:
    """Append the `--plugin` flags (`extra`) to the config's `plugins` list; nothing is imported."""
    has_plugins = dataclasses.is_dataclass(cls) and any(f.name == "plugins" for f in dataclasses.fields(cls))
    if extra and not has_plugins:
        raise ConfigError(f"{cls.__name__} has no plugins key: this command loads no plugins")
    own = data.get("plugins", [])
    if extra and isinstance(own, list):  # anything else is not a list, which from_dict names
        data["plugins"] = [*own, *extra]


def _shown(override: str) -> str:
    """An override as an error quotes it: cut like `quoted` cuts a value, never megabytes long."""
    return override if len(override) <= QUOTE_LIMIT else quoted(override)


def _apply_override(data: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override {quoted(override)} must look like key.subkey=value")
    key, raw = override.split("=", 1)
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except (DuplicateKeyError, ConfigBoundError) as exc:
        raise ConfigError(f"override {_shown(override)}: {exc}") from exc
    except yaml.YAMLError:
        value = raw
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {quoted(override)}: '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def from_dict(cls: type[T], data: Any, prefix: str = "", source: str = "config") -> T:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong types."""
    where = prefix.rstrip(".") or "the top level"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{where}' must be a mapping, got {quoted(data)}")
    hints = get_type_hints(cls, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields))
        renamed = renamed_keys(cls)
        hint = f" ('{unknown[0]}' is now {renamed[unknown[0]]})" if unknown[0] in renamed else ""
        raise ConfigError(f"{source}: unknown key '{prefix}{unknown[0]}'{hint}; allowed keys in {where}: {allowed}")
    kwargs = {}
    for name, value in data.items():
        derived = _derived(hints[name])
        if derived is not None and value is None:
            continue  # unset, as config files written before the field was derived spell it: nothing to refuse or use
        if derived is not None:
            raise ConfigError(f"{source}: '{prefix}{name}' is not a setting: it is derived ({derived.why}); remove it")
        field_default = _nested_default(fields[name], hints[name])
        if field_default is not None and isinstance(value, dict):
            # A partial section overrides the field's own default instance, not the class defaults:
            # `train: {steps: 5}` keeps SFTConfig's train.output_dir = "runs/sft".
            # Shallow on purpose: nested sections merge again one level down (their own defaults),
            # and plain dict-valued options are replaced, never merged.
            value = {**settings(field_default), **value}
        kwargs[name] = _coerce(hints[name], value, f"{prefix}{name}", source)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{source}: invalid value in {where}: {exc}") from exc


def settings(config: Any) -> Any:
    """dataclasses.asdict without the Derived fields: the keys a config file may hold (what a run
    writes to its config.yaml, so that file loads back as --config)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        hints = get_type_hints(type(config), include_extras=True)
        return {
            f.name: settings(getattr(config, f.name))
            for f in dataclasses.fields(config)
            if _derived(hints[f.name]) is None
        }
    if isinstance(config, (list, tuple)):
        return type(config)(settings(item) for item in config)
    if isinstance(config, dict):
        return {key: settings(item) for key, item in config.items()}
    return copy.deepcopy(config)


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
    if origin is Annotated:
        value = _coerce(args[0], value, key, source)
        if any(isinstance(mark, _Positive) for mark in args[1:]) and not value > 0:
            raise ConfigError(f"{source}: '{key}' must be > 0, got {quoted(value)}")
        if any(isinstance(mark, _NonNegative) for mark in args[1:]) and not value >= 0:
            raise ConfigError(f"{source}: '{key}' must be >= 0, got {quoted(value)}")
        for mark in args[1:]:
            if isinstance(mark, Interval) and not mark.holds(value):
                raise ConfigError(f"{source}: '{key}' must be {mark!r}, got {quoted(value)}")
            if isinstance(mark, Pattern) and not mark.holds(value):
                raise ConfigError(f"{source}: '{key}' must be {mark.shown}, got {quoted(value)}")
        return value
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, prefix=f"{key}.", source=source)
    if origin is Literal:
        if isinstance(value, bool) and value not in args:  # YAML 1.1 reads no/off/yes/on as booleans
            spelled = [
                a
                for a in args
                if isinstance(a, str) and a.lower() in (("no", "off", "false") if not value else ("yes", "on", "true"))
            ]
            value = spelled[0] if len(spelled) == 1 else value
        if value not in args:
            raise ConfigError(f"{source}: '{key}' must be one of {list(args)}, got {quoted(value)}")
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
        raise ConfigError(
            errors[0] if len(errors) == 1 else f"{source}: '{key}' got {quoted(value)}, which fits none of {hint}"
        )
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: '{key}' must be a list, got {quoted(value)}")
        item = args[0] if args else Any
        items = [_coerce(item, v, f"{key}[{i}]", source) for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: '{key}' must be a mapping, got {quoted(value)}")
        _reject_non_finite(value, key, source)
        return dict(value)
    if hint is Any:
        _reject_non_finite(value, key, source)
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: '{key}' must be true or false, got {quoted(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: '{key}' must be an integer, got {quoted(value)}")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads `3e-4` (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: '{key}' must be a number, got {quoted(value)}")
        _reject_non_finite(value, key, source)
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: '{key}' must be a string, got {quoted(value)}")
        return value
    return value


def _reject_non_finite(value: Any, key: str, source: str) -> None:
    """ConfigError naming the key if `value` is, or holds, a NaN or infinite float."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(
            f"{source}: '{key}' must be a finite number, got {quoted(value)}; "
            "NaN and inf would make the run's losses and weights NaN"
        )
    if isinstance(value, dict):
        for sub_key, item in value.items():
            _reject_non_finite(item, f"{key}.{sub_key}", source)
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _reject_non_finite(item, f"{key}[{index}]", source)


def refuse_unused(section: Any, names: Sequence[str], *, prefix: str, used_with: str, now: str) -> None:
    """ValueError naming the first field of `names` (fields of the dataclass instance `section`)
    whose value is not its default: a setting the run would ignore (docs/design.md invariant 6). A
    nested section is named by its first key that differs (`rollout.sampling.top_p`).

    `prefix` is the section's key ("value."), `used_with` the setting that would use the field
    ("value.critic: separate"), `now` what it is instead ("value.critic is 'shared'")."""
    for field in dataclasses.fields(section):
        value, default = getattr(section, field.name), _class_default(field)
        if field.name in names and value != default:
            if dataclasses.is_dataclass(value) and type(value) is type(default):  # a nested section: name its key
                refuse_unused(
                    value,
                    [f.name for f in dataclasses.fields(value)],
                    prefix=f"{prefix}{field.name}.",
                    used_with=used_with,
                    now=now,
                )
            raise ValueError(
                f"{prefix}{field.name}={quoted(getattr(section, field.name))} is only used with {used_with} "
                f"({now}), so the run would ignore it; remove it, or set {used_with}"
            )


def _class_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()  # type: ignore[misc]


def require_model(model: str) -> None:
    """The check every command with a `model` key runs: one is required (there is no default model)."""
    if not model:
        raise ValueError("model is required: --model NAME (a built-in name, a folder, a hub id or a stage's final/)")
