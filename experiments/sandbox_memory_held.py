"""How much of the host's memory one sandboxed `python` call can hold, against its cap.

    .venv/bin/python experiments/sandbox_memory_held.py            # every attack, default limits
    .venv/bin/python experiments/sandbox_memory_held.py sockets    # one attack by name
    ... --repeats 5                                                 # runs per attack (3)

Each attack is a program the policy could write. It grabs what it can, prints how much it
thinks it holds, and sleeps, while this script samples the host's used memory (MemTotal -
MemAvailable - the free pages in the per-CPU lists) every 20 ms. "held" is the peak of used
memory over its median in the second before the call, minus what the other processes of the
host (the trainer, a queued job) grew by in the same sample: so a job beside it moves the
number by its own noise only (its page cache, say). The per-CPU lists are free memory that
MemFree, and so MemAvailable, leaves out: on kernel 6.18 with 24 GiB they grew to 325 MiB (each
CPU's auto-tuned `high`) as the killed processes of `children` freed theirs, which read as
"held" up to 676 MiB under a 512 MiB cap until they were counted as free (--trace shows it). "cgroup peak" is what the call's cgroup recorded (the kernel's own count of what
it charged; 0 where no cgroup is made). The row says how the last run ended.

    ... children --repeats 20 --trace                               # one line per run

--trace prints, for each run, where the host's memory went at its peak sample: "held", the
live call cgroups' usage at that same sample, the bytes over it, and the change since the
baseline of each /proc/meminfo field that could hold them (MemFree falls by what is taken), and of
the free pages in the per-CPU lists, which MemFree (and so MemAvailable) does not count.

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
    "sockets": _FILL_SOCKETS
    + """
pairs = fill(29)
print("pairs", len(pairs), flush=True)
time.sleep(2)
""",
    "sockets4": _FILL_SOCKETS
    + """
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


TRACED = (
    "MemFree",
    "PerCPUFree",
    "AnonPages",
    "AnonHugePages",
    "Shmem",
    "Cached",
    "SReclaimable",
    "SUnreclaim",
    "PageTables",
    "KernelStack",
    "Percpu",
)
"""The /proc/meminfo fields --trace follows (bytes; where memory the cgroup does not count could sit)."""


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes, and "PerCPUFree": the free pages in the per-CPU lists of every zone
    (/proc/zoneinfo's pageset counts), which MemFree leaves out: pages a process freed sit there
    until the kernel drains them (each CPU's list may grow to its auto-tuned `high`)."""
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0]) * (1024 if value.strip().endswith("kB") else 1)
    with open("/proc/zoneinfo") as f:
        counts = [int(line.split()[1]) for line in f if line.strip().startswith("count:")]
    fields["PerCPUFree"] = sum(counts) * os.sysconf("SC_PAGE_SIZE")
    return fields


def _used(fields: dict[str, int]) -> int:
    """The host's used memory: neither available nor free in a per-CPU list."""
    return fields["MemTotal"] - fields["MemAvailable"] - fields["PerCPUFree"]


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


def _call_cgroups(peak: bool) -> int:
    """Over the live call cgroups of this process: the highest usage any has recorded (peak), or
    their usage now summed (0 without one)."""
    found = sandbox_memory and sandbox_memory._process_cgroup()
    if not found:
        return 0
    folder, version = found
    names = {
        (2, True): "memory.peak",
        (2, False): "memory.current",
        (1, True): "memory.max_usage_in_bytes",
        (1, False): "memory.usage_in_bytes",
    }
    values = []
    for name in os.listdir(folder):
        try:
            with open(os.path.join(folder, name, names[version, peak])) as f:
                values.append(int(f.read()))
        except OSError:
            continue
    return (max(values) if peak else sum(values)) if values else 0


def held_bytes(code: str, limits: SandboxLimits) -> tuple[int, int, object, dict[str, int]]:
    """(host bytes held at the peak, the call cgroup's peak, the SandboxResult, the trace: the
    cgroups' usage at the peak sample and each TRACED field's change since the baseline)."""
    own_ns = os.readlink("/proc/self/ns/pid")
    before, fields_before = [], []
    for _ in range(20):
        fields_before.append(_meminfo())
        before.append(_used(fields_before[-1]) - _rss_outside(own_ns))
        time.sleep(0.05)
    baseline = statistics.median(before)
    base_fields = {name: statistics.median(f[name] for f in fields_before) for name in TRACED}
    result = {}
    call = threading.Thread(target=lambda: result.update(r=run_python(code, limits)))
    call.start()
    peak, cgroup_peak, trace = baseline, 0, {}
    while call.is_alive():
        fields, outside, usage = _meminfo(), _rss_outside(own_ns), _call_cgroups(peak=False)
        used = _used(fields) - outside
        if used > peak:
            peak = used
            trace = {"cgroup_usage": usage, **{name: int(fields[name] - base_fields[name]) for name in TRACED}}
        cgroup_peak = max(cgroup_peak, _call_cgroups(peak=True))
        time.sleep(0.02)
    call.join()
    return int(peak - baseline), cgroup_peak, result["r"], trace


def main(names: list[str], repeats: int, trace: bool = False) -> None:
    limits = SandboxLimits(timeout_s=20.0, cpu_seconds=15)
    print(
        f"memory_bytes cap {limits.memory_bytes / 2**20:.0f} MiB, "
        f"max_processes {limits.max_processes}, max_file_bytes {limits.max_file_bytes / 2**20:.0f} MiB, "
        f"a cgroup per call: {bool(sandbox_memory and sandbox_memory.cgroups_available())}, "
        f"{repeats} runs each"
    )
    print(f"{'attack':<10} {'host MiB, median [min, max]':>28} {'cgroup peak':>11}  exit_reason  what it printed")
    for name in names or list(ATTACKS):
        rows = [held_bytes(ATTACKS[name], limits) for _ in range(repeats)]
        if trace:
            for held, _peak, result, at_peak in rows:
                over = held - at_peak.get("cgroup_usage", 0)
                print(
                    f"  run: held {held / 2**20:.0f} MiB, cgroups then {at_peak.get('cgroup_usage', 0) / 2**20:.0f}, "
                    f"over them {over / 2**20:+.0f} ({result.exit_reason}); meminfo change: "
                    + ", ".join(
                        f"{key} {value / 2**20:+.0f}" for key, value in at_peak.items() if key != "cgroup_usage"
                    )
                )
        held = sorted(row[0] / 2**20 for row in rows)
        result = rows[-1][2]
        said = " | ".join(sorted(set(result.stdout.split("\n")) - {""}))[:80]
        print(
            f"{name:<10} {statistics.median(held):>10.0f} [{held[0]:>5.0f}, {held[-1]:>5.0f}]"
            f"{max(row[1] for row in rows) / 2**20:>17.0f}  {result.exit_reason:<11}  {said}"
        )


if __name__ == "__main__":
    arguments = sys.argv[1:]
    repeats = int(arguments.pop(arguments.index("--repeats") + 1)) if "--repeats" in arguments else 3
    main([a for a in arguments if a not in ("--repeats", "--trace")], repeats, trace="--trace" in arguments)
