"""One run at a time in a folder: `run.lock`, an advisory flock the running process holds (a run's
life: training/run_dir.py). A second launch into a folder in use stops at once, naming the
holder's pid, host and start; a lock left by a process that died is free again (the kernel drops it
with the process), so it is simply taken."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from agentic_rl.training.run_record import RunFolderError

LOCK = "run.lock"
"""The folder's lock file: {"pid", "host", "started"} of the process that holds it."""
_HELD: dict[str, int] = {}
"""Folders (real paths) this process holds locked -> the lock file's descriptor."""


def lock_run_folder(folder: Path, key: str = "train.output_dir") -> None:
    """Hold `folder`'s lock until `unlock_run_folder` or this process ends (an advisory flock: the
    kernel drops it with its process, so a lock a dead run left is simply taken). A second holder is
    refused, naming the first; a folder this process already holds (a run of it that stopped on an
    error) is held on. The rule it serves: training/run_dir.py."""
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
