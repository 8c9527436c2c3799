"""`SandboxLimits`: the resource caps of one sandboxed run, and where each one is enforced.

    SandboxLimits()                                  # the `python` tool's limits
    SandboxLimits(timeout_s=30.0, memory_bytes=2**30)

Each field, what enforces it, and what the code sees when it reaches it:
  - timeout_s: the caller's deadline (sandbox_supervisor.py); the run is killed, "timeout".
  - cpu_seconds: RLIMIT_CPU per process (sandbox_bootstrap.py); SIGXCPU, then SIGKILL 1 s
    later; "timeout".
  - memory_bytes: the whole call, where a memory cgroup can be made (sandbox_memory.py): every
    process, its tmpfs files and the kernel memory charged to it; the kernel kills a process
    at the cap, "memory". And RLIMIT_AS per process; MemoryError, "memory".
  - max_processes: RLIMIT_NPROC (as root, under a fresh uid per run); fork() raises
    BlockingIOError, Thread.start() RuntimeError.
  - max_output_bytes: the caller's bounded reads; the run is killed, "output_truncated".
  - max_file_bytes: RLIMIT_FSIZE, and the size of the tmpfs work dir; a write raises OSError
    (ENOSPC or EFBIG).
  - max_open_files: RLIMIT_NOFILE; open() raises OSError (EMFILE).

The CPU, file and open-file caps hold per process. Memory is capped for the whole call by its
cgroup; where none can be made, per process only, so a program may hold up to max_processes x
memory_bytes in all, plus the two tmpfs (work dir and /dev/shm, max_file_bytes each). Either
way Unix socket queues are not counted, and are bounded instead (sandbox_memory.py), and memory
that RLIMIT_AS would not count (System V shm and message queues, memfds, POSIX queues) is refused
(see the threat model in python_sandbox.py).
The values are validated at construction, with a message that says what cannot work and why.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource caps for one sandboxed run. The defaults suit short arithmetic/scripting."""

    timeout_s: float = 5.0
    """Wall-clock seconds, from process start to the last byte of output."""
    cpu_seconds: int = 5
    """RLIMIT_CPU per process, in CPU seconds (SIGXCPU at the soft limit, SIGKILL 1 s later)."""
    memory_bytes: int = 512 * 2**20
    """The whole call's memory where a cgroup can be made, and RLIMIT_AS (address space) per
    process always (bytes). Below ~64 MB Python cannot start."""
    max_processes: int = 16
    """RLIMIT_NPROC: tasks (processes + threads) the sandbox uid may have, the worker included."""
    max_output_bytes: int = 4096
    """Bytes kept per stream: stdout's head, stderr's tail. More stdout (or 16x this on stderr)
    kills the run (exit_reason output_truncated). The tool's observation (stdout plus error
    text) holds at most this many bytes of output, and says so with a marker when cut."""
    max_file_bytes: int = 16 * 2**20
    """RLIMIT_FSIZE for any one file, and the size of each tmpfs: the work dir, /dev/shm (bytes)."""
    max_open_files: int = 64
    """RLIMIT_NOFILE."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.cpu_seconds < 1:
            raise ValueError(f"cpu_seconds must be >= 1, got {self.cpu_seconds}")
        if self.memory_bytes < 64 * 2**20:
            raise ValueError(
                f"memory_bytes={self.memory_bytes} is below 64 MiB: the interpreter itself "
                "would fail to start; raise it"
            )
        if self.max_processes < 1:
            raise ValueError(f"max_processes must be >= 1 (the worker), got {self.max_processes}")
        for name in ("max_output_bytes", "max_file_bytes", "max_open_files"):
            if getattr(self, name) < 16:
                raise ValueError(f"{name} must be >= 16, got {getattr(self, name)}")
