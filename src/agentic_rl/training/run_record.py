"""The one rule for reusing a run folder, for every training command (sft, rm, grpo, ppo, and the
pipeline's stages, which run them).

A run folder records what made it, in `run.json` (strict JSON, written before any training):

    {"command": "sft", "config": {...the resolved config...}, "finished": null}
    {"command": "sft", "config": {...}, "finished": {"step": 25, "result": {...}}}   after final/

Its paths are relative to the folder (`"final": "final"`), so a copied or moved folder returns its
own final/; a record whose result lies outside its folder, or that is not what a run writes (a
hand edit, a truncation), stops the rerun naming the file and the way on.

A rerun into the same `train.output_dir` with `train.resume: true` (the default):

    no record, no checkpoint       a new run
    another command                stops: names both commands
    another config                 stops before any work, naming each differing key with both
                                   values; only RESUMABLE_KEYS may differ
    a checkpoint past train.steps  stops (CheckpointError): it would "resume" with nothing to run
    finished, same config          says so and returns the recorded result (config.yaml is left
                                   as it was); a larger train.steps trains on from the last step
    otherwise                      resumes from the newest intact checkpoint (training/loop.py)

One run at a time: the folder is locked (`run.lock`, an advisory flock held by the main process)
before its record is read, and released when the run ends or its process dies. A second launch
into a folder in use stops at once, naming the holder's pid, host and start; a lock left by a
process that died is free again (the kernel drops it with the process), so it is simply taken.

`train.resume: false` starts over: the folder's previous run (run.json, config.yaml,
metrics.jsonl, tb/, checkpoints/, final/) is deleted first, named as it goes. A folder holding any
of those without a run.json is not a run of ours (a user's own files) and is refused, never
deleted. A folder from before run.json existed is compared by its config.yaml on resume (its
command is then unknown).

Each checkpoint carries its run's record too (training/checkpoint.py), so a resume is checked
against the config that trained the weights it restores, not only the folder's run.json: a
deleted or edited run.json cannot resume a checkpoint under another lr or seed.

Why a record and not just the checkpoint: a checkpoint restores the optimizer and schedule of the
config that wrote it, so a rerun with a new learning rate logged and trained on the old one while
config.yaml claimed the new one; and `sft` resumed a `grpo` folder's checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from agentic_rl.config import settings
from agentic_rl.strict_json import dumps, loads_strict
from agentic_rl.training.checkpoint import RUN_RECORD as CHECKPOINT_RECORD
from agentic_rl.training.checkpoint import (
    CheckpointError,
    checkpoint_record,
    complete_checkpoints,
    latest_checkpoint,
    step_of,
)
from agentic_rl.training.run_dir import RECORD, RunDir, RunFolderError, lock_run_folder, unlock_run_folder

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
_PREVIOUS_RUN = (RECORD, "config.yaml", "metrics.jsonl", "tb", "checkpoints", "final")


def usable_output_dir(path: str | Path, key: str = "train.output_dir") -> Path:
    """`path` as a Path, created if missing; an empty, file or uncreatable path is an error naming it."""
    if not str(path).strip():
        raise RunFolderError(
            f"{key} is empty; set it to a folder for this run (e.g. runs/sft): an empty path would "
            "write the run into the current directory"
        )
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(f"{key}={path} is a file, not a folder; choose another {key}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunFolderError(
            f"{key}={path} cannot be created ({exc.strerror}: {exc.filename}); choose another {key}"
        ) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise RunFolderError(f"{key}={path} is not writable; choose another {key}")
    return folder


def start_run(command: str, cfg: Any, process: Any, tensorboard: bool = True) -> RunDir:
    """The RunDir of `command` run with `cfg`, after the rule above; `process` is the accelerator
    (or accelerate's PartialState): every rank checks, only the main one writes.

    When the folder holds this same run, finished, `run_dir.finished` is its recorded result and
    nothing was written; the caller returns it."""
    folder = usable_output_dir(cfg.train.output_dir)
    if process.is_main_process:
        lock_run_folder(folder)  # before the record is read: a second launch stops here
    config = _json_ready(cfg)
    finished = None
    try:
        if cfg.train.resume:
            finished = _check_previous(folder, command, config, cfg.train.steps, defaults=_json_ready(type(cfg)()))
        else:
            _previous_run(folder)  # refuses a folder that is not a run's before anything is deleted
    except BaseException:
        unlock_run_folder(folder)  # refused: the folder is free for the rerun the message suggests
        raise
    process.wait_for_everyone()  # every rank has read the old record before the main one replaces it
    if finished is not None:
        process.print(
            f"{command}: the run in {folder} finished at step {finished['step']}; nothing to train "
            f"(result: {finished['result'].get('final', folder)}). Raise train.steps to train on, set "
            "train.resume=false to start over, or choose another train.output_dir."
        )
        run_dir = RunDir(folder, enabled=False)
        run_dir.finished = _restore_history(finished["result"])
        unlock_run_folder(folder)
        return run_dir
    if not cfg.train.resume and process.is_main_process:
        _delete_previous_run(folder, process.print)
    return RunDir(
        folder,
        cfg,
        enabled=process.is_main_process,
        tensorboard=tensorboard,
        record={"command": command, "config": config},
    )


def _check_previous(
    folder: Path, command: str, config: dict[str, Any], steps: int, defaults: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """Raise if `folder` holds another run; the finished record if it holds this one, finished.
    `defaults`: the command's default config, for keys newer than the record (see `differing_keys`)."""
    record = _read_record(folder)
    if record is not None and record["command"] not in (None, command):
        raise RunFolderError(
            f"train.output_dir={folder} holds a `{record['command']}` run ({folder / RECORD}); `{command}` cannot "
            f"resume it. Choose another train.output_dir, or set train.resume=false to delete that run and start over there."
        )
    if record is not None:
        differing = differing_keys(record["config"], config, defaults)
        if differing:
            raise RunFolderError(_another_config(folder, record["source"], differing))
    for checkpoint in complete_checkpoints(folder / "checkpoints"):
        _check_checkpoint_record(checkpoint, record, command, config, defaults)
    newest = latest_checkpoint(folder / "checkpoints")
    if newest is not None and step_of(newest) > steps:
        raise CheckpointError(
            f"{newest} is at step {step_of(newest)}, beyond train.steps={steps}: there is nothing left to run and "
            f"its weights were not trained for this config. Set train.steps >= {step_of(newest)} to continue it, "
            "train.resume=false to start over, or choose another train.output_dir."
        )
    finished = record.get("finished") if record is not None else None
    if finished is None or finished["step"] != steps:
        return None  # running, killed, or finished at fewer steps: the loop resumes
    final = finished["result"].get("final")
    if final is None:
        return finished
    inside = (folder / final).resolve()  # recorded relative to the folder; an older record's absolute path alike
    if not inside.is_relative_to(folder.resolve()):
        raise RunFolderError(
            f"{record['source']} names its result {final}, outside {folder}: a finished run's result is "
            "its own final/. Set train.resume=false to start over there, or choose another train.output_dir"
        )
    if not inside.exists():
        return None  # final/ deleted: resume re-exports it
    return {**finished, "result": {**finished["result"], "final": str(folder / final)}}


def _check_checkpoint_record(
    checkpoint: Path,
    record: dict[str, Any] | None,
    command: str,
    config: dict[str, Any],
    defaults: dict[str, Any] | None,
) -> None:
    """Raise unless `checkpoint` was written by this command under this config (by the record inside
    it, whatever the folder's run.json says); one from before records were kept is resumed only
    under the folder's record, which the caller checked."""
    where = checkpoint / CHECKPOINT_RECORD
    try:
        own = checkpoint_record(checkpoint)
    except (OSError, ValueError) as exc:
        raise RunFolderError(
            f"{where} cannot be read ({type(exc).__name__}: {exc}); delete {checkpoint} to resume "
            "from an older checkpoint, or set train.resume=false to start over there"
        ) from None
    if own is None:
        if record is None:
            raise RunFolderError(
                f"{checkpoint} carries no record of the config that trained it and {checkpoint.parent.parent} has no "
                f"{RECORD}: resuming it could continue another config's weights and optimizer. Set train.resume=false "
                "to start over there, or choose another train.output_dir."
            )
        return
    if not isinstance(own, dict) or own.get("command") != command or not isinstance(own.get("config"), dict):
        kind = own.get("command") if isinstance(own, dict) else None
        raise RunFolderError(
            f"{checkpoint} was written by a `{kind}` run ({where}); `{command}` cannot resume it. Set "
            "train.resume=false to start over there, or choose another train.output_dir."
        )
    differing = differing_keys(own["config"], config, defaults)
    if differing:
        raise RunFolderError(_another_config(checkpoint.parent.parent, str(where), differing))


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


def _another_config(folder: Path, source: str, differing: list[tuple[str, Any, Any]]) -> str:
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


def _read_record(folder: Path) -> dict[str, Any] | None:
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
    return {"command": None, "config": _json_ready(config), "finished": None, "source": str(legacy)}


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


def _previous_run(folder: Path) -> list[str]:
    """The names of what `folder`'s previous run wrote (those of _PREVIOUS_RUN it holds). RunFolderError
    when it holds any but no run.json: a user's own config.yaml, final/ or checkpoints/, or a run from
    before records were kept, which `train.resume=false` must not delete."""
    found = [name for name in _PREVIOUS_RUN if (folder / name).exists()]
    if found and not (folder / RECORD).is_file():
        raise RunFolderError(
            f"train.output_dir={folder} holds {', '.join(found)} but no {RECORD}: it is not a run folder of this "
            "toolkit (or one from before run records), so train.resume=false will not delete them. Move or delete "
            "them yourself, or choose another train.output_dir."
        )
    return found


def _delete_previous_run(folder: Path, log) -> None:
    found = _previous_run(folder)
    if found:
        log(f"train.resume=false: starting over in {folder}; deleting the previous run's {', '.join(found)}")
    for name in found:
        path = folder / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def _restore_history(result: dict[str, Any]) -> dict[str, Any]:
    """The recorded result, with history rows' nulls (non-finite values when written) as NaN."""
    if "history" not in result:
        return result
    rows = [{key: float("nan") if value is None else value for key, value in row.items()} for row in result["history"]]
    return {**result, "history": rows}


def _json_ready(cfg: Any) -> dict[str, Any]:
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
