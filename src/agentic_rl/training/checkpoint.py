"""Atomic checkpoints: accelerate's state (model, optimizer, scheduler, RNG) + trainer state.

    checkpoints/
      step-000040/                 complete checkpoints only
        (accelerate save_state files: model, optimizer, scheduler, random_states_<rank>.pkl)
        trainer_state.pt           {"step": 40, "objective": {...}}  (data position, cached batch)
      .tmp-step-000050/            being written; never read; removed on the next save

A checkpoint directory appears under its final name only once fully written (os.replace of
the temporary directory), so a kill at any moment leaves either the old set or the new one.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^step-(\d+)$")


def latest_checkpoint(folder: Path) -> Path | None:
    """The complete checkpoint with the highest step in `folder`, or None."""
    if not folder.exists():
        return None
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name)) and (p / "trainer_state.pt").exists()]
    return max(found)[1] if found else None


def save_checkpoint(accelerator: Any, folder: Path, step: int, trainer_state: dict[str, Any], keep: int) -> Path:
    """Write a complete checkpoint for `step` atomically; keep only the newest `keep`."""
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
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        _prune(folder, keep)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Any, path: Path) -> dict[str, Any]:
    """Restore accelerate's state from `path` and return the trainer state."""
    accelerator.load_state(str(path))
    return torch.load(path / "trainer_state.pt", weights_only=False)


def _prune(folder: Path, keep: int) -> None:
    complete = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name)))
    for _, path in complete[: max(0, len(complete) - keep)]:
        shutil.rmtree(path)
