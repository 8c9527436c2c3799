"""A child process killed with SIGKILL the moment a file appears: the resume tests' real crash."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_until(script: str, marker: Path, timeout: float = 600) -> None:
    """Run `script` in a child Python and SIGKILL it as soon as `marker` exists (asserts it did)."""
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert marker.exists(), proc.stderr.read().decode()[-3000:]
