"""A run's record: what made it, in `run.json` (strict JSON, written before any training), and
the rule for when a rerun is the same run (a run's life: training/run_dir.py).

    {"command": "sft", "config": {...the resolved config...}, "finished": null}
    {"command": "sft", "config": {...}, "finished": {"step": 25, "result": {...}}}   after final/

Its paths are relative to the folder (`"final": "final"`), so a copied or moved folder returns its
own final/; a record whose result lies outside its folder, or that is not what a run writes (a
hand edit, a truncation), stops the rerun naming the file and the way on. Two configs make the same
run when they differ only in RESUMABLE_KEYS (`differing_keys`). Each checkpoint carries the
record too (training/checkpoint.py).

Why a record and not just the checkpoint: a checkpoint restores the optimizer and schedule of the
config that wrote it, so a rerun with a new learning rate logged and trained on the old one while
config.yaml claimed the new one; and `sft` resumed a `grpo` folder's checkpoint.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from agentic_rl.config import settings
from agentic_rl.errors import ConfigError
from agentic_rl.strict_json import dumps, loads_strict

RECORD = "run.json"
"""What made the run: {"command", "config", "finished"}."""


class RunFolderError(ConfigError):
    """A run folder that cannot be used as asked; the message names it and the way on."""


LOOP_KEYS_WITHOUT_EFFECT = (
    "train.progress",
    "train.log_every",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.resume",
)
"""How a run is watched and saved: they change nothing it computes (the pipeline ignores them too)."""
RESUMABLE_KEYS = (*LOOP_KEYS_WITHOUT_EFFECT, "train.steps", "train.output_dir")
"""The keys a rerun may change and still resume. train.steps: a larger value trains on (a decaying
schedule then follows the new length from the resumed step on); one below the newest checkpoint's
step is refused. train.output_dir: the folder may be named by another path or moved."""
_SHOWN = 20  # differing keys listed in full; a folder of another kind of run differs in hundreds


def differing_keys(
    recorded: dict[str, Any], now: dict[str, Any], defaults: dict[str, Any] | None = None
) -> list[tuple[str, Any, Any]]:
    """(dotted key, recorded value, current value) for each key that differs, outside RESUMABLE_KEYS.

    A key the record lacks whose current value is its default in `defaults` is no difference: it is
    a setting added to the toolkit after that run was made (e.g. `plugins`, `rollout.device`), at the
    value the run had in effect. Set to anything else, it differs."""
    old, new, default = _flatten(recorded), _flatten(now), _flatten(defaults or {})
    missing = object()
    return [
        (key, old.get(key, "(absent)"), new.get(key, "(absent)"))
        for key in sorted(set(old) | set(new))
        if key not in RESUMABLE_KEYS
        and old.get(key, missing) != new.get(key, missing)
        and not (key not in old and key in default and new.get(key, missing) == default[key])
    ]


def another_config(folder: Path, source: str, differing: list[tuple[str, Any, Any]]) -> str:
    """The refusal of a resume under another config than `source` recorded, naming each differing key."""
    lines = "\n".join(f"  {key}: {_show(old)} (recorded) -> {_show(new)} (now)" for key, old, new in differing[:_SHOWN])
    if len(differing) > _SHOWN:
        lines += f"\n  ... and {len(differing) - _SHOWN} more keys"
    return (
        f"train.output_dir={folder} holds a run made with another config ({source}); resuming it would continue "
        f"that run's weights, optimizer and schedule under this config's name. Differing keys:\n{lines}\nSet "
        f"train.resume=false to delete that run and start over there, or choose another train.output_dir. Only "
        f"{', '.join(RESUMABLE_KEYS)} may change on resume."
    )


def read_record(folder: Path) -> dict[str, Any] | None:
    """run.json as {"command", "config", "finished", "source"}; a config.yaml alone (an older run
    folder) as a record with no command; None for a folder that holds no run."""
    path = folder / RECORD
    if path.exists():
        try:
            record = loads_strict(path.read_text())
            checked = {
                "command": record["command"],
                "config": record["config"],
                "finished": record.get("finished"),
                "source": str(path),
            }
            _check_record(checked)
            return checked
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RunFolderError(
                f"{path} cannot be read ({type(exc).__name__}: {exc}); set train.resume=false to start "
                "over in that folder, or choose another train.output_dir"
            ) from None
    legacy = folder / "config.yaml"
    if not legacy.exists():
        return None
    try:
        config = yaml.safe_load(legacy.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RunFolderError(
            f"{legacy} is not a run's config ({exc}); choose another train.output_dir, or set "
            "train.resume=false to start over there (it is deleted)"
        ) from None
    if not isinstance(config, dict):
        raise RunFolderError(
            f"{legacy} is not a run's config; choose another train.output_dir, or set "
            "train.resume=false to start over there (it is deleted)"
        )
    return {"command": None, "config": json_ready(config), "finished": None, "source": str(legacy)}


def _check_record(record: dict[str, Any]) -> None:
    """TypeError naming the first field of a run.json record that is not what a run writes."""
    if not isinstance(record["command"], str) or not isinstance(record["config"], dict):
        raise TypeError("its command must be a string and its config an object")
    finished = record["finished"]
    if finished is None:
        return
    if not isinstance(finished, dict) or set(finished) != {"step", "result"}:
        raise TypeError(f"its finished must be null or {{step, result}}, got {_show(finished)}")
    if type(finished["step"]) is not int or finished["step"] < 0 or not isinstance(finished["result"], dict):
        raise TypeError(
            f"its finished.step must be a whole number and finished.result an object, got {_show(finished)}"
        )
    if not isinstance(finished["result"].get("final", ""), str):
        raise TypeError(f"its finished.result.final must be a path, got {_show(finished['result']['final'])}")


def restore_history(result: dict[str, Any]) -> dict[str, Any]:
    """The recorded result, with history rows' nulls (non-finite values when written) as NaN."""
    if "history" not in result:
        return result
    rows = [{key: float("nan") if value is None else value for key, value in row.items()} for row in result["history"]]
    return {**result, "history": rows}


def json_ready(cfg: Any) -> dict[str, Any]:
    data = settings(cfg) if dataclasses.is_dataclass(cfg) else cfg
    return loads_strict(dumps(data))


def _flatten(value: Any, name: str = "") -> dict[str, Any]:
    """{"optim.lr": 0.001, "sources[0].n": 8, ...}: one entry per leaf; a list of sections by index."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{name}.{key}" if name else str(key)))
        return out
    if isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        out = {}
        for index, item in enumerate(value):
            out.update(_flatten(item, f"{name}[{index}]"))
        return out
    return {name: value}


def _show(value: Any) -> str:
    text = value if isinstance(value, str) and value == "(absent)" else dumps(value)
    return text if len(text) <= 200 else text[:200] + "..."
