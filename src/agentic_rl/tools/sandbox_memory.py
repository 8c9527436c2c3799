"""What one sandboxed call may hold in all, the cgroup that caps it, and the budget of calls at once.

    with memory_budget().hold(call_reservation(limits, cgroups_available())):
        cgroup = CallCgroup.create(limits.memory_bytes)   # None where no cgroup can be made
        ...                                               # the bootstrap joins cgroup.procs_path
        cgroup.oom_kills(); cgroup.remove()

RLIMIT_AS caps one process. A call is up to `max_processes` processes, two tmpfs and the
kernel memory they pin (pipe buffers, page tables, socket queues), so the whole call is capped
by a memory cgroup of its own, where this host lets the caller make one:
  - cgroup v2 (the unified hierarchy), where this process's cgroup delegates the memory
    controller to its children: memory.max = memory_bytes, memory.swap.max = 0, and
    memory.oom.group = 1 (an OOM kills the whole call);
  - cgroup v1's memory hierarchy, where it is writable (root, typically):
    memory.limit_in_bytes and memory.memsw.limit_in_bytes = memory_bytes (no swap).
Both count every process of the call, its tmpfs files and the kernel memory charged to it
(pipes, page tables, slabs). The call's cgroup sits in this process's own folder,
`<own cgroup>/agentic-rl-<pid>/`, whose limit is the budget below, so the kernel holds the sum
of the calls at once too. A folder left by a process that died is removed at the next start.

What no cgroup counts: the queues of Unix sockets (the kernel does not charge them). The
seccomp filter keeps every socket's buffer at the host's default (sandbox_seccomp.py), so a call
queues at most max_processes x max_open_files x net.core.wmem_default there (16 x 64 x 208 KiB
= 208 MiB with the defaults).

Where no cgroup can be made (unprivileged without a delegated cgroup v2 subtree), the cap stays
per process, and what a call may hold is the sum of its parts (`call_reservation`): with the
defaults 16 x 512 MiB + 2 x 16 MiB of tmpfs + the socket queues, 8.3 GiB.

The budget (`memory_budget()`): calls run at once only while their reservations sum to at most
half of this host's memory (MemTotal); a call waits for room before its clock starts. One call
always fits, whatever it reserves: without a cgroup, a host of 24 GiB (budget 12 GiB, 8.3 GiB a
call) runs its calls one at a time.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import threading
import time
from typing import Any

from agentic_rl.tools.sandbox_limits import SandboxLimits

_PREFIX = "agentic-rl-"
_REMOVE_WAIT_S = 2.0  # how long a call's cgroup may stay busy after its processes were killed


def _meminfo_bytes(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":", 1)
            if name == field:
                return int(value.split()[0]) * 1024
    raise OSError(f"/proc/meminfo has no {field}")


def socket_queue_bytes(limits: SandboxLimits) -> int:
    """The most a call can queue in Unix sockets: every fd of every process one socket, each
    at the host's default send buffer (the filter refuses raising it)."""
    return limits.max_processes * limits.max_open_files * _wmem_default()


@functools.lru_cache(maxsize=None)
def _wmem_default() -> int:
    """net.core.wmem_default, read once: every call reserves by it, and it does not change under us."""
    with open("/proc/sys/net/core/wmem_default") as f:
        return int(f.read())


def call_reservation(limits: SandboxLimits, capped: bool) -> int:
    """Bytes one call may hold: its cgroup's cap, or (`capped` false) the sum of its parts."""
    if capped:
        return limits.memory_bytes + socket_queue_bytes(limits)
    return limits.max_processes * limits.memory_bytes + 2 * limits.max_file_bytes + socket_queue_bytes(limits)


class MemoryBudget:
    """Admission by bytes: `hold(n)` waits until n more fit under `total`, then holds them."""

    def __init__(self, total: int):
        self.total = total
        self.held = 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def hold(self, nbytes: int):
        with self._changed:
            # One call always fits, so a reservation above the total runs alone.
            self._changed.wait_for(lambda: self.held == 0 or self.held + nbytes <= self.total)
            self.held += nbytes
        try:
            yield
        finally:
            with self._changed:
                self.held -= nbytes
                self._changed.notify_all()


_ONCE = threading.Lock()  # the budget and the process's cgroup folder are made once, whichever thread asks first
_MADE: dict[str, Any] = {}


def memory_budget() -> MemoryBudget:
    """This process's budget for calls at once: half of the host's memory, in whole pages (a
    cgroup keeps its limit rounded down to a page, so the budget is the limit the kernel holds)."""
    with _ONCE:
        if "budget" not in _MADE:
            page = os.sysconf("SC_PAGE_SIZE")
            _MADE["budget"] = MemoryBudget(_meminfo_bytes("MemTotal") // 2 // page * page)
        return _MADE["budget"]


class CallCgroup:
    """One call's memory cgroup; `procs_path` is what the bootstrap writes its pid to."""

    def __init__(self, path: str, version: int):
        self.path = path
        self.version = version
        self.procs_path = os.path.join(path, "cgroup.procs")

    @classmethod
    def create(cls, memory_bytes: int) -> CallCgroup | None:
        """A fresh cgroup capped at `memory_bytes`, or None where this host offers none."""
        parent = _process_cgroup()
        if parent is None:
            return None
        folder, version = parent
        with _ONCE:  # what earlier calls could not remove yet
            left, _MADE["left"] = _MADE.get("left", []), []
        for stale in left:
            _remove_quietly(stale)
        path = os.path.join(folder, f"call-{time.monotonic_ns()}-{threading.get_ident()}")
        os.mkdir(path)
        cgroup = cls(path, version)
        try:
            _write_limits(path, version, memory_bytes, whole_call=True)
        except OSError:
            cgroup.remove()
            raise
        return cgroup

    def oom_kills(self) -> int:
        """How many of the call's processes the kernel killed for the cap."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with open(os.path.join(self.path, name)) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def remove(self) -> None:
        """rmdir, waiting for the call's last processes to be gone (a kill is asynchronous). One
        still busy after _REMOVE_WAIT_S is not the call's failure: the next call retries it."""
        deadline = time.monotonic() + _REMOVE_WAIT_S
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    with _ONCE:
                        _MADE.setdefault("left", []).append(self.path)
                    return
                time.sleep(0.01)


def cgroups_available() -> bool:
    """Whether each call gets a memory cgroup here (see the module docstring)."""
    return _process_cgroup() is not None


def _write_limits(path: str, version: int, memory_bytes: int, whole_call: bool) -> None:
    """Cap the cgroup at `path`; the swap files exist only where swap is accounted."""
    if version == 2:
        limits = [("memory.max", memory_bytes), ("memory.swap.max", 0)]
        limits += [("memory.oom.group", 1)] if whole_call else []
    else:  # memsw (memory + swap) after the memory limit: it may never be below it
        limits = [("memory.limit_in_bytes", memory_bytes), ("memory.memsw.limit_in_bytes", memory_bytes)]
    for name, value in limits:
        if name in ("memory.swap.max", "memory.memsw.limit_in_bytes") and not os.path.exists(os.path.join(path, name)):
            continue
        _write(os.path.join(path, name), str(value))


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _process_cgroup() -> tuple[str, int] | None:
    """(this process's folder for its calls' cgroups, cgroup version), made once; or None."""
    budget = memory_budget()
    with _ONCE:  # two threads' first calls at once must not both make (and one remove) the folder
        if "cgroup" not in _MADE:
            _MADE["cgroup"] = _make_process_cgroup(budget.total)
        return _MADE["cgroup"]


def _make_process_cgroup(total: int) -> tuple[str, int] | None:
    for version, folder in _own_memory_cgroups():
        mine = os.path.join(folder, f"{_PREFIX}{os.getpid()}")
        try:
            if version == 2:
                with open(os.path.join(folder, "cgroup.controllers")) as f:
                    if "memory" not in f.read().split():
                        continue
            _remove_stale(folder)
            os.mkdir(mine)
            if version == 2:  # EBUSY where this process's own cgroup holds processes
                _write(os.path.join(folder, "cgroup.subtree_control"), "+memory")
                _write(os.path.join(mine, "cgroup.subtree_control"), "+memory")
            _write_limits(mine, version, total, whole_call=False)
            atexit.register(_remove_process_folder, mine)
            return mine, version
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(mine)
    return None


def _own_memory_cgroups() -> list[tuple[int, str]]:
    """(version, folder) of this process's memory cgroup in each hierarchy mounted here."""
    with open("/proc/self/cgroup") as f:
        memberships = [line.rstrip("\n").split(":", 2) for line in f]
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    found = []
    for _, controllers, path in memberships:
        for fields in mounts:
            fstype = fields[fields.index("-") + 1]
            options = fields[-1].split(",")
            if controllers == "" and fstype == "cgroup2":
                version = 2
            elif fstype == "cgroup" and "memory" in controllers.split(",") and "memory" in options:
                version = 1
            else:
                continue
            root, point = fields[3], fields[4]
            if path == root or path.startswith(root.rstrip("/") + "/"):
                found.append((version, point + path[len(root.rstrip("/")) :]))
    return sorted(found)  # v1 first: where both exist, only v1 has the memory controller


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _remove_stale(folder: str) -> None:
    """Remove what a process that died left in `folder`: its calls' cgroups, then its own."""
    for name in os.listdir(folder):
        pid = name[len(_PREFIX) :]
        if not (name.startswith(_PREFIX) and pid.isdigit()) or os.path.exists(f"/proc/{pid}"):
            continue
        _remove_process_folder(os.path.join(folder, name))


def _remove_process_folder(path: str) -> None:
    """A process's folder: the calls' cgroups left in it, then itself (at its exit, or by the next process)."""
    with contextlib.suppress(OSError):
        for call in os.listdir(path):
            if call.startswith("call-"):
                _remove_quietly(os.path.join(path, call))
    _remove_quietly(path)
