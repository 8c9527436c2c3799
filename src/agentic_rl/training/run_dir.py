"""The run directory: resolved config, metrics JSONL, TensorBoard events, checkpoints.

runs/<name>/
  run.json           the command and config that made the run, and its result once finished
                     (training/run_record.py: the rule for reusing a folder)
  run.lock           held by the running process: one run at a time (training/run_record.py)
  config.yaml        the config object actually used (never a hand-made copy)
  metrics.jsonl      one JSON object per logged step: {"step": k, "loss/total": ..., ...}, every key
                     defined in training/metric_keys.py;
                     a non-finite value is written as null (strict JSON)
  tb/                TensorBoard events of the same metrics
  checkpoints/       step-<k>/ directories, written atomically (see training/checkpoint.py)
  final/             the trained model (models/stage_output.py), exported last
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

import yaml

from agentic_rl.config import ConfigError, settings
from agentic_rl.strict_json import dumps, loads_strict, write_json
from agentic_rl.training.metric_keys import glossary_key

RECORD = "run.json"
"""What made the run: {"command", "config", "finished"} (training/run_record.py)."""
LOCK = "run.lock"
"""The folder's lock file: {"pid", "host", "started"} of the process that holds it."""
_HELD: dict[str, int] = {}
"""Folders (real paths) this process holds locked -> the lock file's descriptor."""


class RunFolderError(ConfigError):
    """A run folder that cannot be used as asked; the message names it and the way on."""


def lock_run_folder(folder: Path, key: str = "train.output_dir") -> None:
    """Hold `folder`'s lock until `unlock_run_folder` or this process ends (an advisory flock: the
    kernel drops it with its process, so a lock a dead run left is simply taken). A second holder is
    refused, naming the first; a folder this process already holds (a run of it that stopped on an
    error) is held on. The rule it serves: training/run_record.py."""
    real = os.path.realpath(folder)
    if real in _HELD:
        return
    handle = os.open(Path(folder) / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(handle, 4096).decode("utf-8", "replace")
        os.close(handle)
        try:
            who = json.loads(holder)
            named = f"pid {who['pid']} on {who['host']}, started {who['started']}"
        except (ValueError, KeyError, TypeError):
            named = "a process that has not yet written its pid"
        raise RunFolderError(
            f"{key}={folder} is in use by another run ({named}); wait for it to end, stop it, or choose another {key}"
        ) from None
    os.ftruncate(handle, 0)
    os.write(
        handle,
        json.dumps(
            {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        ).encode(),
    )
    _HELD[real] = handle


def unlock_run_folder(folder: Path) -> None:
    """Release `folder`'s lock if this process holds it (the lock file stays: its next holder rewrites it)."""
    handle = _HELD.pop(os.path.realpath(folder), None)
    if handle is not None:
        os.close(handle)  # closing the last descriptor drops the flock


class RunDir:
    """Owns one run's output folder. Only the main process writes (`enabled=False` elsewhere).

    Trainers get theirs from `run_record.start_run`, which checks the folder first and passes
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
            from torch.utils.tensorboard import SummaryWriter  # local: torch-free

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
        """End the run: TensorBoard flushed, the folder's lock released (training/run_record.py)."""
        if self._writer is not None:
            self._writer.close()
        unlock_run_folder(self.path)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl file; a null (a non-finite value when logged) reads as NaN."""
    rows = [loads_strict(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [{key: float("nan") if value is None else value for key, value in row.items()} for row in rows]
