"""The resume tests' crashes: a child process killed with SIGKILL the moment a file appears
(`run_until`), and a run interrupted in process at a given step, then rerun (`interrupt_then_resume`)."""

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


def interrupt_then_resume(monkeypatch, objective_cls, train, cfg, step: int = 2):
    """Run `train(cfg)` until `objective_cls.step(trainer, step)` raises, then run it again (it
    resumes from the newest checkpoint); returns the second run's result."""
    import pytest

    class Killed(Exception):
        pass

    original = objective_cls.step

    def dies(self, trainer, at):
        if at == step:
            raise Killed()
        return original(self, trainer, at)

    monkeypatch.setattr(objective_cls, "step", dies)
    with pytest.raises(Killed):
        train(cfg)
    monkeypatch.setattr(objective_cls, "step", original)
    return train(cfg)
