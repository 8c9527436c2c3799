"""The one JSON writer: every JSON file and line agentic-rl writes goes through here.

    from agentic_rl.strict_json import dumps, write_json, loads_strict
    write_json(path, {"tool_success_rate": float("nan")})   # writes {"tool_success_rate": null}

Python's `json` writes NaN and Infinity as the bare words `NaN` / `Infinity`, which are not
JSON: strict parsers (jq, JavaScript, Go, `json.loads(s, parse_constant=...)`) reject the
file. Here a non-finite float becomes `null` (docs/design.md invariant 8). We chose null over
rejecting the write because the values that hit it are legitimate "undefined" metrics, e.g.
`tool_success_rate` over zero tool calls, or a grad norm when clipping is off; a training run
that goes non-finite is stopped by the loop (training/loop.py), not by its metrics file.
Readers that need numbers map null back to NaN (`training.run_dir.read_metrics` does).

numpy and torch scalars are written as plain numbers; anything else JSON cannot hold is
written as `str(value)` (paths, enums), as the call sites did before.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def to_strict(value: Any) -> Any:
    """`value` with every non-finite float replaced by None, recursively (dicts, lists, tuples)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {key: to_strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_strict(item) for item in value]
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item) and getattr(value, "ndim", 1) == 0:
        return to_strict(item())
    return value


def dumps(value: Any, indent: int | None = None) -> str:
    """Strict JSON text of `value` (non-finite floats as null, unknown objects as str)."""
    return json.dumps(to_strict(value), indent=indent, allow_nan=False, default=str)


def write_json(path: str | Path, value: Any, indent: int | None = 1) -> Path:
    """Write `value` to `path` atomically (a temporary file, then os.replace). A `path` that exists
    and is not a regular file is refused (`require_file_path`): the rename would replace it."""
    path = require_file_path(path)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(dumps(value, indent=indent) + "\n")
    os.replace(staging, path)
    return path


def require_file_path(path: str | Path) -> Path:
    """`path` as a Path, if writing a file there replaces nothing but a regular file; else a
    ValueError naming it and what it is. An atomic write renames over its target: onto a device
    node (as root, `--out /dev/full` replaced the host's /dev/full), a FIFO or a symlink it would
    replace the node or the link itself, silently."""
    path = Path(path)
    if path.is_symlink():
        kind = f"a symbolic link (to {os.readlink(path)})"
    elif not path.exists() or path.is_file():
        return path
    else:
        kind = (
            "a folder"
            if path.is_dir()
            else "a FIFO"
            if path.is_fifo()
            else "a socket"
            if path.is_socket()
            else "a device node"
        )
    raise ValueError(
        f"'{path}' is {kind}, and agentic-rl writes a regular file there, which would replace it: give the "
        "path of a regular file (or of none yet)"
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"not strict JSON: {name} (NaN/Infinity are not JSON values)")


def loads_strict(text: str) -> Any:
    """json.loads that rejects NaN, Infinity and -Infinity instead of accepting them."""
    return json.loads(text, parse_constant=_reject_constant)


def loads_data(text: str | bytes) -> Any:
    """JSON from outside (a demonstration line, a request body) as data that stays data: a key
    repeated in one object is a ValueError (readers disagree on which value counts, and the
    record's `role` must not be decided by the last one), and so is text that is not Unicode (a
    lone surrogate, `"a\\ud800b"`: no tokenizer can encode it), naming where it is."""
    value = json.loads(text, object_pairs_hook=_without_repeated_keys)
    where = first_unencodable(value)
    if where is not None:
        raise NotUnicodeError(where)
    return value


class NotUnicodeError(ValueError):
    """A string of parsed JSON that is not Unicode text; `where` is its path (`messages[0].content`)."""

    def __init__(self, where: str) -> None:
        super().__init__(f"{where or 'the value'} holds a lone surrogate (\\ud800-\\udfff), which is not Unicode text")
        self.where = where


def _without_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} appears twice in one object; keep one")
        out[key] = value
    return out


def first_unencodable(value: Any) -> str | None:
    """The path (`messages[0].content`) of a string or key in `value` that UTF-8 cannot encode (one
    of them, when several), "" for `value` itself, or None. Iterative: no recursion limit."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{path}.{key}" if path else str(key)
                try:
                    str(key).encode("utf-8")
                except UnicodeEncodeError:
                    return child_path.encode("utf-8", "backslashreplace").decode()
                stack.append((child, child_path))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{index}]") for index, child in enumerate(item))
    return None


def read_json(path: str | Path, fix: str) -> Any:
    """The JSON value in the file `path`; a ValueError naming the file, the line and column, and
    `fix` (what the user can do) when it is not UTF-8 JSON. For the toolkit's own records
    (run.json, DONE.json, stage and reward-model records), whose readers once raised a bare
    JSONDecodeError that named no file."""
    try:
        return loads_strict(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text, so not JSON; {fix}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg}); {fix}") from None
    except (ValueError, RecursionError) as exc:  # NaN/Infinity, too deeply nested
        raise ValueError(f"{path}: not valid JSON ({exc or type(exc).__name__}); {fix}") from None
