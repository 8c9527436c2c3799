"""How much of the host's memory one sandboxed `python` call can hold, against its cap.

    .venv/bin/python experiments/sandbox_memory_held.py            # every attack, default limits
    .venv/bin/python experiments/sandbox_memory_held.py sockets    # one attack by name
    ... --repeats 5                                                 # runs per attack (3)

Each attack is a program the policy could write. It grabs what it can, prints how much it
thinks it holds, and sleeps, while this script samples the host's used memory (MemTotal -
MemAvailable) every 20 ms. "held" is the peak of used memory over its median in the second
before the call, minus what the other processes of the host (the trainer, a queued job) grew
by in the same sample: so a job beside it moves the number by its own noise only (its page
cache, say). "cgroup peak" is what the call's cgroup recorded (the kernel's own count of what
it charged; 0 where no cgroup is made). The row says how the last run ended.

Attacks (issue 65, item 8):
  sockets   one process fills 29 Unix socketpairs after raising SO_SNDBUF/SO_RCVBUF to the
            host's maximum: kernel memory that RLIMIT_AS never counts.
  sockets4  4 processes of the call do the same.
  pipes     one process fills 30 pipes after raising each to the host's pipe-max-size.
  children  6 processes each touch 400 MiB (each under the per-process RLIMIT_AS of 512 MiB).
  tmpfs     the work dir and /dev/shm filled to their size.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time

from agentic_rl.tools.sandbox_limits import SandboxLimits
from agentic_rl.tools.sandbox_supervisor import run_python

try:
    from agentic_rl.tools import sandbox_memory
except ImportError:  # a commit before the call cgroups (PYTHONPATH=<worktree>/src): no peak
    sandbox_memory = None

_FILL_SOCKETS = """
import os, socket, time
def fill(count):
    pairs, refused = [], set()
    for _ in range(count):
        try:
            a, b = socket.socketpair()
        except OSError:
            break
        for sock, option in ((a, socket.SO_SNDBUF), (b, socket.SO_RCVBUF)):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, 1 << 30)
            except OSError as exc:
                refused.add(exc.strerror)
        a.setblocking(False)
        try:
            while True:
                a.send(b"x" * 65536)
        except OSError:
            pass
        pairs.append((a, b))
    if refused:
        print("setsockopt refused:", *refused, flush=True)
    return pairs
"""

ATTACKS = {
    "sockets": _FILL_SOCKETS + """
pairs = fill(29)
print("pairs", len(pairs), flush=True)
time.sleep(2)
""",
    "sockets4": _FILL_SOCKETS + """
for _ in range(3):
    if os.fork() == 0:
        fill(29)
        time.sleep(2)
        os._exit(0)
pairs = fill(29)
print("pairs", len(pairs), flush=True)
time.sleep(2.2)
""",
    "pipes": """
import fcntl, os, time
pipes = []
for _ in range(30):
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
    except OSError as exc:
        print("F_SETPIPE_SZ refused:", exc.strerror, flush=True)
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"x" * 65536)
    except OSError:
        pass
    pipes.append((r, w))
print("pipes", len(pipes), flush=True)
time.sleep(2)
""",
    "children": """
import os, time
for _ in range(5):
    if os.fork() == 0:
        block = bytearray(400 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        print("child holds 400 MiB", flush=True)
        time.sleep(2)
        os._exit(0)
block = bytearray(400 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
print("worker holds 400 MiB", flush=True)
time.sleep(2.2)
""",
    "tmpfs": """
import time
for path in ("/tmp/work/fill", "/dev/shm/fill"):
    try:
        with open(path, "wb") as f:
            for _ in range(64):
                f.write(b"x" * 2**20)
    except OSError as exc:
        print(path, exc.strerror, flush=True)
time.sleep(2)
""",
}


def _meminfo_used() -> int:
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0]) * 1024
    return fields["MemTotal"] - fields["MemAvailable"]


def _rss_outside(own_pid_ns: str) -> int:
    """Resident bytes of every process in this script's pid namespace (not the sandbox's)."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != own_pid_ns:
                continue
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            continue
    return total


def _cgroup_peak() -> int:
    """The highest usage any live call cgroup of this process has recorded (0 without one)."""
    found = sandbox_memory and sandbox_memory._process_cgroup()
    if not found:
        return 0
    folder, version = found
    peak = 0
    for name in os.listdir(folder):
        path = os.path.join(folder, name, "memory.peak" if version == 2 else "memory.max_usage_in_bytes")
        try:
            with open(path) as f:
                peak = max(peak, int(f.read()))
        except OSError:
            continue
    return peak


def held_bytes(code: str, limits: SandboxLimits) -> tuple[int, int, object]:
    """(host bytes held at the peak, the call cgroup's peak, the SandboxResult)."""
    own_ns = os.readlink("/proc/self/ns/pid")
    before = []
    for _ in range(20):
        before.append(_meminfo_used() - _rss_outside(own_ns))
        time.sleep(0.05)
    baseline = statistics.median(before)
    result = {}
    call = threading.Thread(target=lambda: result.update(r=run_python(code, limits)))
    call.start()
    peak, cgroup_peak = baseline, 0
    while call.is_alive():
        peak = max(peak, _meminfo_used() - _rss_outside(own_ns))
        cgroup_peak = max(cgroup_peak, _cgroup_peak())
        time.sleep(0.02)
    call.join()
    return int(peak - baseline), cgroup_peak, result["r"]


def main(names: list[str], repeats: int) -> None:
    limits = SandboxLimits(timeout_s=20.0, cpu_seconds=15)
    print(f"memory_bytes cap {limits.memory_bytes / 2**20:.0f} MiB, "
          f"max_processes {limits.max_processes}, max_file_bytes {limits.max_file_bytes / 2**20:.0f} MiB, "
          f"a cgroup per call: {bool(sandbox_memory and sandbox_memory.cgroups_available())}, "
          f"{repeats} runs each")
    print(f"{'attack':<10} {'host MiB, median [min, max]':>28} {'cgroup peak':>11}  exit_reason  what it printed")
    for name in names or list(ATTACKS):
        rows = [held_bytes(ATTACKS[name], limits) for _ in range(repeats)]
        held = sorted(row[0] / 2**20 for row in rows)
        result = rows[-1][2]
        said = " | ".join(sorted(set(result.stdout.split("\n")) - {""}))[:80]
        print(f"{name:<10} {statistics.median(held):>10.0f} [{held[0]:>5.0f}, {held[-1]:>5.0f}]"
              f"{max(row[1] for row in rows) / 2**20:>17.0f}  {result.exit_reason:<11}  {said}")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    repeats = int(arguments.pop(arguments.index("--repeats") + 1)) if "--repeats" in arguments else 3
    main([a for a in arguments if a != "--repeats"], repeats)
