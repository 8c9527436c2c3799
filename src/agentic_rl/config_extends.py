"""`extends:` in a config file: the whole file, or one section of it, starts from another file.

    # configs/experiments/plan-short-pipeline.yaml: plan-pipeline.yaml, with what differs
    extends: plan-pipeline.yaml
    output_dir: runs/plan-short
    sft:
      optim: {lr: 1.0e-3}      # the other sft.optim keys stay plan-pipeline.yaml's
      train: {steps: 80}

The rules, so that a file that extends another reads as its diff:
- The path is relative to the file that names it (not to the working directory); a file may
  extend a file that extends another.
- The extended file's mapping comes first and the keys written beside `extends` go over it. A
  mapping merges key by key, at every depth; any other value replaces, a list included (a list
  is one setting: `evals`, `sources` and `rewards` are given whole). A mapping tagged `!replace`
  replaces too, so a section can drop the base's keys: `env: !replace {name: squares}` keeps
  none of the base env's options.
- `extends` is a reserved key at every depth, and works in files only. `--set` overrides apply
  after every file is read, and an `extends` given there is refused (there is no file for it to
  be relative to).
- A file that extends itself, through any chain, is an error that names the chain.

The merged mapping is then loaded like any other (`config.load_config`): strict, with every key
used or rejected, and a run records the config it used in full (`config.yaml`), not the chain.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from agentic_rl.config_yaml import MAX_CONFIG_VALUES, Replacing, read_config_file
from agentic_rl.errors import ConfigError, quoted

EXTENDS = "extends"
"""The reserved key."""


def resolve_extends(data: dict[str, Any], path: str | Path) -> tuple[dict[str, Any], list[Path]]:
    """`data` (the mapping read from `path`) with every `extends` replaced by the file it names, and
    the files it read that way, in the order read (for error messages: a key may come from any).

    Each file is read once however often it is extended, and the whole expansion counts against
    MAX_CONFIG_VALUES as it is built: 25 files whose two sections each extend the next expand to
    2^24 copies, and stop at the bound instead of never finishing."""
    here = Path(path).resolve()
    read: list[Path] = []
    state = _Expansion(files={}, values=0)
    return _plain(_resolve(data, here, (here,), "", read, state)), read


@dataclasses.dataclass
class _Expansion:
    files: dict[Path, dict[str, Any]]
    """Each file read, by resolved path: read once per load."""
    values: int
    """Values built so far, against MAX_CONFIG_VALUES."""


def refuse_extends(data: Any, source: str, prefix: str = "") -> None:
    """Raise if an `extends` key is left in `data` after the files were resolved: it came from `--set`."""
    if isinstance(data, list):
        for index, item in enumerate(data):
            refuse_extends(item, source, f"{prefix}[{index}]")
    elif isinstance(data, dict):
        if EXTENDS in data:
            raise ConfigError(
                f"{source}: '{_key(prefix, EXTENDS)}' works only inside a config file (its path is "
                "relative to that file); write it there, or give the keys themselves with --set"
            )
        for key, value in data.items():
            refuse_extends(value, source, _key(prefix, key))


def _resolve(node: Any, here: Path, chain: tuple[Path, ...], prefix: str, read: list[Path], state: _Expansion) -> Any:
    """`node` from file `here` with its `extends` keys resolved; `chain` is the files being extended,
    and each file read is appended to `read`."""
    state.values += 1
    if state.values > MAX_CONFIG_VALUES:
        raise ConfigError(
            f"{here}: the config holds more than {MAX_CONFIG_VALUES} values once its `extends` are "
            f"expanded (at '{prefix}'); do sections extend files that extend others several times over?"
        )
    if isinstance(node, list):
        return [_resolve(item, here, chain, f"{prefix}[{index}]", read, state) for index, item in enumerate(node)]
    if not isinstance(node, dict):
        return node
    own = {
        key: _resolve(value, here, chain, _key(prefix, key), read, state)
        for key, value in node.items()
        if key != EXTENDS
    }
    if isinstance(node, Replacing):
        own = Replacing(own)
    if EXTENDS not in node:
        return own
    where = f"{here}: '{_key(prefix, EXTENDS)}'"
    target = node[EXTENDS]
    if not isinstance(target, str) or not target.strip():
        raise ConfigError(f"{where} must be the path of a YAML file, got {quoted(target)}")
    other = (here.parent / target).resolve()
    if other in chain:
        raise ConfigError(
            f"{where}: {target} extends itself: {' -> '.join(map(str, (*chain, other)))}; "
            "remove one `extends` of the chain"
        )
    if other not in state.files:
        try:
            state.files[other] = read_config_file(other)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
        read.append(other)
    return _merge(_resolve(state.files[other], other, (*chain, other), "", read, state), own)


def _merge(base: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """`own` over `base`: mappings merge key by key, any other value (or a `!replace` mapping) replaces."""
    merged = dict(base)
    for key, value in own.items():
        both_mappings = (
            isinstance(merged.get(key), dict) and isinstance(value, dict) and not isinstance(value, Replacing)
        )
        merged[key] = _merge(merged[key], value) if both_mappings else value
    return merged


def _plain(node: Any) -> Any:
    """`node` with every `!replace` mapping a plain dict again: the marker has done its work."""
    if isinstance(node, list):
        return [_plain(item) for item in node]
    if isinstance(node, dict):
        return {key: _plain(value) for key, value in node.items()}
    return node


def _key(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)
