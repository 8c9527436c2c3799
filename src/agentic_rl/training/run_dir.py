"""A run's folder and its life, in one place: start (lock, check, record), resume, log,
checkpoint, finish. Every training command (sft, rm, grpo, ppo, and the pipeline's stages, which
run them) goes through it, in this order:

    run_dir = start_run("grpo", cfg, accelerator)           # stops if the folder holds another run
    if run_dir.finished is not None: return run_dir.finished
    start = run_dir.resume(objective, model, cfg.train, accelerator)    # training/loop.py, then
    run_dir.log(step, row); run_dir.save(objective, accelerator, step, keep)   # at each step
    run_dir.finish(steps, result); run_dir.close()

Below it, each called and never calling back: run_record.py (what run.json holds, and when a
rerun is the same run), run_lock.py (one run at a time), checkpoint.py (atomic, checksummed
checkpoints).

runs/<name>/
  run.json           the command and config that made the run, and its result once finished
                     (training/run_record.py)
  run.lock           held by the running process: one run at a time (training/run_lock.py)
  config.yaml        the config object actually used (never a hand-made copy)
  metrics.jsonl      one JSON object per logged step: {"step": k, "loss/total": ..., ...}, every key
                     defined in training/metric_keys.py;
                     a non-finite value is written as null (strict JSON)
  tb/                TensorBoard events of the same metrics
  checkpoints/       step-<k>/ directories, written atomically (see training/checkpoint.py)
  final/             the trained model (models/stage_output.py), exported last

A rerun into the same `train.output_dir` with `train.resume: true` (the default):

    no record, no checkpoint       a new run
    another command                stops: names both commands
    another config                 stops before any work, naming each differing key with both
                                   values; only RESUMABLE_KEYS may differ
    a checkpoint past train.steps  stops (CheckpointError): it would "resume" with nothing to run
    finished, same config          says so and returns the recorded result (config.yaml is left
                                   as it was); a larger train.steps trains on from the last step
    otherwise                      resumes from the newest intact checkpoint (`RunDir.resume`)

One run at a time: the folder is locked (training/run_lock.py) before its record is read, and
released when the run ends or its process dies.

`train.resume: false` starts over: the folder's previous run (run.json, config.yaml,
metrics.jsonl, tb/, checkpoints/, final/) is deleted first, named as it goes. A folder holding any
of those without a run.json is not a run of ours (a user's own files) and is refused, never
deleted. A folder from before run.json existed is compared by its config.yaml on resume (its
command is then unknown).

Each checkpoint carries its run's record too, so a resume is checked against the config that
trained the weights it restores, not only the folder's run.json: a deleted or edited run.json
cannot resume a checkpoint under another lr or seed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import yaml
from torch.utils.tensorboard import SummaryWriter

from agentic_rl.config import settings
from agentic_rl.models.finite import first_non_finite
from agentic_rl.strict_json import dumps, write_json
from agentic_rl.training.checkpoint import RUN_RECORD as CHECKPOINT_RECORD
from agentic_rl.training.checkpoint import (
    CheckpointError,
    checkpoint_record,
    complete_checkpoints,
    latest_checkpoint,
    load_latest_checkpoint,
    save_checkpoint,
    step_of,
)
from agentic_rl.training.metric_keys import glossary_key
from agentic_rl.training.run_lock import lock_run_folder, unlock_run_folder
from agentic_rl.training.run_record import (
    RECORD,
    RunFolderError,
    another_config,
    differing_keys,
    json_ready,
    read_record,
    restore_history,
)

_PREVIOUS_RUN = (RECORD, "config.yaml", "metrics.jsonl", "tb", "checkpoints", "final")
"""What a run writes into its folder: `train.resume: false` deletes these."""


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
    config = json_ready(cfg)
    finished = None
    try:
        if cfg.train.resume:
            finished = _check_previous(folder, command, config, cfg.train.steps, defaults=json_ready(type(cfg)()))
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
        run_dir.finished = restore_history(finished["result"])
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
    record = read_record(folder)
    if record is not None and record["command"] not in (None, command):
        raise RunFolderError(
            f"train.output_dir={folder} holds a `{record['command']}` run ({folder / RECORD}); `{command}` cannot "
            f"resume it. Choose another train.output_dir, or set train.resume=false to delete that run and start over there."
        )
    if record is not None:
        differing = differing_keys(record["config"], config, defaults)
        if differing:
            raise RunFolderError(another_config(folder, record["source"], differing))
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
        raise RunFolderError(another_config(checkpoint.parent.parent, str(where), differing))


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


class RunDir:
    """Owns one run's output folder. Only the main process writes (`enabled=False` elsewhere).

    Trainers get theirs from `start_run`, which checks the folder first and passes
    `record` ({"command", "config"}, written to run.json); `finished` is then the recorded result
    of a finished run that is not run again, else None."""

    def __init__(
        self,
        path: str | Path,
        config: Any | None = None,
        enabled: bool = True,
        tensorboard: bool = True,
        record: dict[str, Any] | None = None,
    ):
        self.path = Path(path)
        self.enabled = enabled
        self.finished: dict[str, Any] | None = None
        self.record = record
        """{"command", "config"} of this run (None for a RunDir that records nothing): run.json and each
        checkpoint carry it."""
        self._writer = None
        if not enabled:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        if record is not None:
            write_json(
                self.path / RECORD, {**record, "finished": None}
            )  # before config.yaml: it is what a rerun checks
        if config is not None:
            data = (
                settings(config) if dataclasses.is_dataclass(config) else config
            )  # derived values left out: it loads back
            (self.path / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        if tensorboard:
            self._writer = SummaryWriter(str(self.path / "tb"))

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append `metrics` for `step` to metrics.jsonl and TensorBoard."""
        undefined = sorted(key for key in metrics if glossary_key(key) is None)
        if undefined:
            raise KeyError(
                f"metric(s) {undefined} are not defined in agentic_rl/training/metric_keys.py; add each to "
                "GLOSSARY with its meaning"
            )
        if not self.enabled:
            return
        clean = {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}
        with open(self.path / "metrics.jsonl", "a") as handle:
            handle.write(dumps({"step": step, **clean}) + "\n")  # non-finite values as null
        if self._writer is not None:
            for key, value in clean.items():
                if isinstance(value, float) and math.isfinite(value):
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()

    def truncate_metrics(self, after_step: int) -> None:
        """Drop logged steps beyond `after_step` (a resumed run re-logs them exactly)."""
        metrics = self.path / "metrics.jsonl"
        if not self.enabled or not metrics.exists():
            return
        kept = [line for line in metrics.read_text().splitlines() if json.loads(line)["step"] <= after_step]
        metrics.write_text("".join(line + "\n" for line in kept))

    def resume(self, objective: Any, model: Any, loop: Any, accelerator: Any) -> int:
        """The step to start at: that of the newest intact checkpoint (restored), else 0. A checkpoint
        past loop.steps or with a non-finite weight is refused: resuming it would train nothing and
        export it as final/ (`start_run` refuses the first before any work; this is the check on
        what was actually loaded)."""
        # the newest intact checkpoint, its files verified against their checksums
        found = load_latest_checkpoint(accelerator, self.checkpoints) if loop.resume else None
        if found is None:
            self.truncate_metrics(0)  # killed before its first checkpoint: its logged steps are redone
            return 0
        path, state = found
        step = int(state["step"])
        if step > loop.steps:
            raise CheckpointError(
                f"{path} is at step {step}, beyond train.steps={loop.steps}; set train.steps >= {step} "
                "to continue it, train.resume=false to start over, or choose another train.output_dir."
            )
        bad = first_non_finite(model, trainable_only=False)
        if bad is not None:
            raise CheckpointError(
                f"{path} holds a non-finite weight ({bad!r}), though its checksums match: no finite run "
                "writes one (the loop stops first). Delete that checkpoint to resume from an older one, "
                "set train.resume=false to start over, or choose another train.output_dir."
            )
        objective.load_state_dict(state["objective"])
        self.truncate_metrics(step)
        accelerator.print(f"resumed from {path} at step {step}")
        return step

    def save(self, objective: Any, accelerator: Any, step: int, keep: int) -> None:
        """A checkpoint of step `step` (the objective's state with accelerate's), carrying this run's
        record; the `keep` newest are kept."""
        state = {"step": step, "objective": objective.state_dict()}
        save_checkpoint(accelerator, self.checkpoints, step, state, keep, record=self.record)

    def finish(self, step: int, result: dict[str, Any]) -> None:
        """Mark the run finished at `step` with `result` (what the trainer returns, JSON-ready), after
        final/ is written: a rerun with the same config returns this instead of running again. The
        result's `final` is recorded relative to the folder, so a copied or moved folder names its own."""
        if self.enabled and self.record is not None:
            if "final" in result:
                final = Path(os.path.relpath(Path(result["final"]).resolve(), self.path.resolve()))
                if final.parts[:1] == ("..",):
                    raise ValueError(f"the run's result {result['final']} is outside its folder {self.path}")
                result = {**result, "final": str(final)}
            write_json(self.path / RECORD, {**self.record, "finished": {"step": step, "result": result}})

    def close(self) -> None:
        """End the run: TensorBoard flushed, the folder's lock released."""
        if self._writer is not None:
            self._writer.close()
        unlock_run_folder(self.path)
