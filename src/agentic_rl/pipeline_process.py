"""How each pipeline stage runs: in a process of its own, started by a fork server that has already
imported the toolkit, and ending when the pipeline process ends."""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from typing import Any

PRELOADED = ["torch", "transformers", "peft", "agentic_rl.training.grpo", "agentic_rl.evaluation.runner"]
"""What every stage imports (~8 s a stage on 2 cores): imported once, by the fork server, not by each stage."""


def stage_context(multiprocessing: Any) -> Any:
    """The start method of the stage processes: a fork server that has imported torch and the toolkit
    (but never run a kernel, started a thread pool or touched CUDA), so each stage is a fresh
    process, whose memory returns to the system when it ends, without paying the imports again.
    Where there is no fork server (Windows), a plain spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    return context


def end_with_the_pipeline(pipeline_pid: int) -> None:
    """Make this stage process end when the pipeline process does, however that ends (a kill, kill -9,
    a crash). Without it a stage outlives its pipeline: its parent is the fork server, which itself
    stays up while any stage it started lives, so the stage went on training into its folder unseen,
    sharing the cores with whatever ran next. A daemon thread waits for the pipeline's exit (a
    pidfd where Linux has one, else a poll each second) and sends this process SIGTERM; the loop's
    checkpoints are written atomically, so a rerun resumes from the newest. A pipeline already gone
    ends the stage here. Windows: nothing is done (os.kill would terminate, not probe)."""
    if sys.platform == "win32":
        return

    try:
        handle: int | None = os.pidfd_open(pipeline_pid)
    except ProcessLookupError:
        sys.exit(1)
    except (AttributeError, OSError):  # no pidfd_open (not Linux, or a kernel before 5.3)
        handle = None

    def wait_for_the_pipeline() -> None:
        if handle is not None:
            select.select([handle], [], [])
        else:
            while True:
                try:
                    os.kill(pipeline_pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait_for_the_pipeline, name="end-with-the-pipeline", daemon=True).start()
