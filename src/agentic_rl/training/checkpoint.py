"""Atomic, checksummed checkpoints: accelerate's state (model, optimizer, scheduler, RNG) plus
trainer state, loaded as data, never as code (docs/design.md invariant 8).

    checkpoints/
      step-000040/                 complete checkpoints only
        (accelerate save_state files: model, optimizer, scheduler, random_states_<rank>.pkl)
        trainer_state.pt           {"step": 40, "objective": {...}}  (data position, cached batch)
        run.json                   {"command", "config"}: the run that wrote it (training/run_dir.py
                                   checks a resume against it, whatever the folder's run.json says)
        checksums.json             {"<file>": {"bytes": n, "sha256": ...}} for every file above
      .tmp-step-000050/            being written; never read; removed on the next save

A checkpoint directory appears under its final name only once fully written (os.replace of
the temporary directory), so a kill at any moment leaves either the old set or the new one.

Loading: `load_latest_checkpoint` verifies every file against checksums.json (written last at
save time) before anything is read, newest checkpoint first. A checkpoint with a missing,
truncated or changed file (or no checksums.json) is skipped with a warning naming it and the
file, and the next older one is tried; if checkpoints exist but none is intact, it raises
rather than silently starting over. Every pickle is read with `torch.load(weights_only=True)`
(accelerate's own loader does the same): tensors, plain containers and the few trainer-state
classes in `_STATE_CLASSES`; a pickle that would call anything else is refused. An RNG state
that passes its checksum but still cannot be read is a WARNING: the resume is then not exact.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import load

from agentic_rl.errors import RunStopped, quoted
from agentic_rl.rollout.trajectory import Span, Trajectory, TrajectoryBatch
from agentic_rl.strict_json import loads_strict, write_json
from agentic_rl.training.batches import PPOBatch, RolloutBatch

_NAME = re.compile(r"^step-(\d+)$")
_CHECKSUMS = "checksums.json"
RUN_RECORD = "run.json"
"""The record of the run that wrote a checkpoint: {"command", "config"}."""
_STATE_CLASSES = [Trajectory, Span, TrajectoryBatch, RolloutBatch, PPOBatch]  # the rollout batch kept across μ updates
logger = logging.getLogger(__name__)


class CheckpointError(RunStopped):
    """No intact checkpoint to resume from, though some exist; the message lists each one."""


def latest_checkpoint(folder: Path) -> Path | None:
    """The complete checkpoint with the highest step in `folder`, or None (not verified)."""
    found = complete_checkpoints(folder)
    return found[-1] if found else None


def step_of(checkpoint: Path) -> int:
    """The step in a checkpoint folder's name (step-000040 -> 40)."""
    return int(_NAME.match(checkpoint.name).group(1))


def save_checkpoint(
    accelerator: Any,
    folder: Path,
    step: int,
    trainer_state: dict[str, Any],
    keep: int,
    record: dict[str, Any] | None = None,
) -> Path:
    """Write a complete checkpoint for `step` atomically; keep only the newest `keep`. `record`: the
    run's {"command", "config"}, kept inside it (covered by its checksums)."""
    final = folder / f"step-{step:06d}"
    staging = folder / f".tmp-step-{step:06d}"
    if accelerator.is_main_process:
        folder.mkdir(parents=True, exist_ok=True)
        if staging.exists():
            shutil.rmtree(staging)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging), safe_serialization=False)
    if accelerator.is_main_process:
        torch.save(trainer_state, staging / "trainer_state.pt")
        if record is not None:
            write_json(staging / RUN_RECORD, record)
        write_json(staging / _CHECKSUMS, {name: _fingerprint(staging / name) for name in _files(staging)})
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        _prune(folder, keep)
    accelerator.wait_for_everyone()
    return final


def load_latest_checkpoint(accelerator: Any, folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """(path, trainer state) of the newest intact checkpoint, restored into accelerate's objects;
    None when `folder` holds no checkpoint. Skipped ones are named in a warning."""
    skipped = []
    for path in reversed(complete_checkpoints(folder)):
        problem = verify_checkpoint(path)
        if problem is None:
            if skipped:
                logger.warning("resuming from %s; skipped newer damaged checkpoint(s): %s", path, "; ".join(skipped))
            return path, load_checkpoint(accelerator, path)
        skipped.append(f"{path.name} ({problem})")
    if skipped:
        raise CheckpointError(
            f"no intact checkpoint in {folder}: {'; '.join(skipped)}. Delete the damaged "
            "folders to start over, or set train.resume=false."
        )
    return None


def checkpoint_record(path: Path) -> dict[str, Any] | None:
    """The {"command", "config"} a checkpoint was written with, or None (one from before records were
    kept). A record that is not valid JSON raises ValueError."""
    file = path / RUN_RECORD
    return loads_strict(file.read_text()) if file.exists() else None


def verify_checkpoint(path: Path) -> str | None:
    """None if every file matches checksums.json, else what is wrong (names the file)."""
    try:
        recorded = loads_strict((path / _CHECKSUMS).read_text())
    except FileNotFoundError:
        return f"no {_CHECKSUMS}: written by an older version or incomplete"
    except (OSError, ValueError) as exc:
        return f"{_CHECKSUMS} is unreadable: {exc}"
    extra = sorted(set(_files(path)) - set(recorded) - {_CHECKSUMS})
    if extra:
        return f"unexpected file {extra[0]}"
    for name, facts in recorded.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != facts["bytes"]:
            return f"{name} has {file.stat().st_size} bytes, {facts['bytes']} were written (truncated?)"
        if _fingerprint(file)["sha256"] != facts["sha256"]:
            return f"{name} changed since it was written (sha256 mismatch)"
    return None


def load_checkpoint(accelerator: Any, path: Path) -> dict[str, Any]:
    """Restore accelerate's state from `path` and return the trainer state (weights-only loads)."""
    _warn_if_rng_unreadable(path, accelerator.process_index)
    try:
        accelerator.load_state(str(path))  # accelerate loads with weights_only=True
        with torch.serialization.safe_globals(_STATE_CLASSES):
            return torch.load(path / "trainer_state.pt", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, ValueError, KeyError, EOFError) as exc:
        # Refused (a pickle that would run code) or not this run's shapes: the check held, but the
        # user got a raw UnpicklingError/RuntimeError with no file and no way on.
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
        shown = [
            lines[0],
            *[line for line in lines[1:] if "mismatch" in line][:1],
        ]  # torch's "size mismatch for w: ..."
        raise CheckpointError(
            f"checkpoint {path} cannot be restored ({type(exc).__name__}: "
            f"{' '.join(quoted(line) for line in shown)}): it holds "
            "something other than this run's weights and state (a crafted or foreign file, or "
            f"tensors of another shape). Delete {path} to resume from an older checkpoint, or set "
            "train.resume=false (or use another output_dir) to start over"
        ) from exc


def _warn_if_rng_unreadable(path: Path, rank: int) -> None:
    """accelerate reports an unreadable RNG state at INFO only; make it a WARNING."""
    rng = path / f"random_states_{rank}.pkl"
    try:
        load(rng)
    except Exception as exc:  # noqa: BLE001 - any failure means the same thing here
        logger.warning(
            "the RNG state %s cannot be read (%s: %s); the resume continues but is NOT exact: "
            "sampling and data order will differ from an uninterrupted run",
            rng,
            type(exc).__name__,
            exc,
        )


def complete_checkpoints(folder: Path) -> list[Path]:
    """Finished checkpoint folders (a trainer_state.pt inside), oldest step first."""
    if not folder.exists():
        return []
    found = [
        (int(m.group(1)), p)
        for p in folder.iterdir()
        if (m := _NAME.match(p.name)) and (p / "trainer_state.pt").exists()
    ]
    return [p for _, p in sorted(found)]


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _fingerprint(path: Path) -> dict[str, Any]:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _prune(folder: Path, keep: int) -> None:
    complete = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name)))
    for _, path in complete[: max(0, len(complete) - keep)]:
        shutil.rmtree(path)
