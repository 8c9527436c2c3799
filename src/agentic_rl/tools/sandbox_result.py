"""`SandboxResult`, and how the way a run ended maps to one `exit_reason`.

The supervisor (sandbox_supervisor.py) knows four things when a run is over: how its reading
ended (`outcome`: "eof", "timeout" or "overflow"), the exit status that init reported for the
worker, the bounded stdout/stderr bytes, and any setup error the bootstrap wrote on its status
pipe. `classify_exit` turns them into a `SandboxResult`, in this order of precedence:

    setup error on the status pipe      -> sandbox_error     (the host's fault, not the code's)
    the caller's wall-clock deadline    -> timeout
    too much output                     -> output_truncated
    exit status 0                       -> ok
    stderr's last line is a MemoryError -> memory            (RLIMIT_AS)
    SIGXCPU, or SIGKILL after cpu_seconds of wall time
                                        -> timeout           (RLIMIT_CPU, soft then hard)
    anything else                       -> error             (traceback, exit(n), a signal)

Exit statuses follow the shell's convention: init reports death by signal N as 128 + N, so a
plain `exit(130)` reads the same as SIGINT; the error text then says "killed by SIGINT" only
when stderr is empty. `error` is a short human-readable reason; `returncode` is None when the
caller stopped the run (timeout, overflow) or could not start it.
"""

from __future__ import annotations

import dataclasses
import signal
import time

from agentic_rl.tools.sandbox_limits import SandboxLimits


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What one run produced. `stdout` (head) and `stderr` (tail) hold at most
    `max_output_bytes` bytes each."""

    ok: bool
    """True iff the code ran to completion with exit status 0."""
    stdout: str
    stderr: str
    exit_reason: str
    """One of: ok, error, timeout, memory, output_truncated, sandbox_error."""
    error: str
    """Human-readable reason when not ok (e.g. "timed out after 5.0 s"); "" when ok."""
    returncode: int | None
    """Worker exit status (128+N when killed by signal N); None when the caller stopped it."""
    duration_s: float


def classify_exit(
    outcome: str,
    returncode: int | None,
    stdout: bytes,
    stderr: bytes,
    setup_error: str,
    limits: SandboxLimits,
    started: float,
) -> SandboxResult:
    """The result of a finished run (see the module docstring for the order of the rules)."""
    out = stdout.decode("utf-8", errors="replace")
    err = stderr.decode("utf-8", errors="replace")
    if setup_error:
        return failed_result(started, "sandbox_error", setup_error.strip(), out, err, returncode)
    if outcome == "timeout":
        message = f"timed out after {limits.timeout_s:g} s"
        return failed_result(started, "timeout", message, out, err)
    if outcome == "overflow":
        return failed_result(
            started, "output_truncated", f"output truncated after {limits.max_output_bytes} bytes", out, err
        )
    if returncode == 0:
        return SandboxResult(True, out, err, "ok", "", 0, time.monotonic() - started)
    last_line = err.strip().splitlines()[-1] if err.strip() else ""
    if last_line.startswith("MemoryError"):
        message = f"memory limit of {limits.memory_bytes // 2**20} MiB exceeded"
        return failed_result(started, "memory", message, out, err, returncode)
    # SIGXCPU at the soft CPU limit; SIGKILL at the hard one if the code ignored SIGXCPU.
    # A SIGKILL before cpu_seconds of wall time is the code killing itself: an "error".
    elapsed = time.monotonic() - started
    if returncode == 128 + signal.SIGXCPU or (returncode == 128 + signal.SIGKILL and elapsed >= limits.cpu_seconds):
        message = f"CPU time limit of {limits.cpu_seconds} s exceeded"
        return failed_result(started, "timeout", message, out, err, returncode)
    if not last_line and returncode is not None and returncode > 128:
        # 128+N is how init reports death by signal N (a plain exit(130) reads the same).
        try:
            last_line = f"killed by {signal.Signals(returncode - 128).name}"
        except ValueError:
            pass
    return failed_result(started, "error", last_line or f"exit status {returncode}", out, err, returncode)


def failed_result(
    started: float, reason: str, error: str, stdout: str = "", stderr: str = "", returncode: int | None = None
) -> SandboxResult:
    """A not-ok result with exit_reason `reason`, timed from `started` (time.monotonic())."""
    return SandboxResult(False, stdout, stderr, reason, error, returncode, time.monotonic() - started)
