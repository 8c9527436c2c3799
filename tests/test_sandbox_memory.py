"""The sandbox's memory in total: one cgroup per call, and the budget of calls at once.

The hostile programs that try to hold more than the cap (processes that add up, raised socket
buffers and pipes) are in tests/sandbox_hostile.py, run as root and unprivileged on both ways
into the root; these tests pin the parts: what a call reserves, how the budget admits calls,
how a call over its cgroup's cap ends, and that no cgroup outlives its call or its process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from agentic_rl.tools import sandbox_memory
from agentic_rl.tools.python_sandbox import SandboxLimits, run_python
from agentic_rl.tools.sandbox_memory import MemoryBudget, call_reservation, cgroups_available

CAPPED = pytest.mark.skipif(not cgroups_available(), reason="no memory cgroup can be made here")


def _wmem_default() -> int:
    with open("/proc/sys/net/core/wmem_default") as f:
        return int(f.read())


def test_a_call_reserves_its_cap_or_the_sum_of_its_parts():
    """Guards against the budget admitting calls by a number smaller than what each may hold:
    with a cgroup, the cap plus the socket queues no cgroup counts; without, every process at
    its own cap plus both tmpfs and the socket queues."""
    limits = SandboxLimits(memory_bytes=100 * 2**20, max_processes=4, max_open_files=32, max_file_bytes=2**20)
    sockets = 4 * 32 * _wmem_default()
    assert call_reservation(limits, capped=True) == 100 * 2**20 + sockets
    assert call_reservation(limits, capped=False) == 4 * 100 * 2**20 + 2 * 2**20 + sockets


def test_the_budget_runs_calls_at_once_only_while_their_sum_fits():
    """Guards against calls at once summing past the budget (the host's memory), and against a
    call bigger than the whole budget never running: it runs, alone."""
    budget = MemoryBudget(total=1000)
    order = []
    first_holds, release_first = threading.Event(), threading.Event()

    def first():
        with budget.hold(600):
            order.append("first in")
            first_holds.set()
            release_first.wait(5)
        order.append("first out")

    def second():
        first_holds.wait(5)
        with budget.hold(600):  # 1200 > 1000: waits for the first
            order.append("second in")
            assert budget.held == 600

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    first_holds.wait(5)
    time.sleep(0.2)
    assert order == ["first in"] and budget.held == 600  # the second is still waiting
    release_first.set()
    for thread in threads:
        thread.join(5)
    assert order == ["first in", "first out", "second in"] and budget.held == 0
    with budget.hold(4000):  # above the total: admitted when nothing else holds any
        assert budget.held == 4000
    assert budget.held == 0


@CAPPED
def test_a_call_over_its_cgroup_cap_is_a_memory_failure_and_leaves_no_cgroup():
    """Guards against what RLIMIT_AS never sees (a tmpfs file, here 80 MiB beside the
    process) going past memory_bytes with the process's own 60 MiB, against the kernel's kill
    at the cap reading as the code's own error, and against a call's cgroup staying behind."""
    code = """
with open("/tmp/work/a", "wb") as f:
    for _ in range(80):
        f.write(bytes(2**20))
block = bytearray(60 * 2**20)  # under RLIMIT_AS alone; past the cap with the file
for i in range(0, len(block), 4096):
    block[i] = 1
print("holds 140 MiB")
"""
    limits = SandboxLimits(memory_bytes=128 * 2**20, max_file_bytes=100 * 2**20, timeout_s=20.0)
    result = run_python(code, limits)
    assert (result.exit_reason, result.stdout) == ("memory", ""), result
    assert result.error == (
        "memory limit of 128 MiB for the whole call (every process, its files and kernel memory) exceeded"
    )
    folder, version = sandbox_memory._process_cgroup()
    assert [name for name in os.listdir(folder) if name.startswith("call-")] == []
    limit_file = "memory.max" if version == 2 else "memory.limit_in_bytes"
    with open(os.path.join(folder, limit_file)) as f:  # the calls at once, held by the kernel
        assert int(f.read()) == sandbox_memory.memory_budget().total


@CAPPED
def test_a_dead_process_cgroup_folder_is_removed_at_the_next_start():
    """Guards against cgroup folders piling up from trainers that were killed (SIGKILL skips
    their exit hook): the next process removes those whose pid is gone."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    script = f"""
import os
from agentic_rl.tools import sandbox_memory
mine = sandbox_memory._process_cgroup()[0]
folder = os.path.dirname(mine)  # where a process's folder goes: the stale one's place
os.rmdir(mine)
sandbox_memory._MADE.clear()  # the next call starts afresh, as a new process would
stale = os.path.join(folder, "agentic-rl-{dead.pid}")
os.makedirs(os.path.join(stale, "call-1"))
assert sandbox_memory.cgroups_available()
print(os.path.exists(stale), os.path.exists(sandbox_memory._process_cgroup()[0]))
"""
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert completed.stdout.split() == ["False", "True"], completed.stderr[-2000:]


@CAPPED
def test_threads_that_make_their_first_call_at_once_share_one_cgroup_folder():
    """Guards against the first calls of a rollout's tool threads racing to make the process's
    cgroup folder: a second maker found it existing, removed it as its own failed attempt, and every
    later call of the first maker failed with a sandbox_error."""
    script = """
import os, threading
from agentic_rl.tools import sandbox_memory
barrier, found = threading.Barrier(8), []
def first_call():
    barrier.wait()
    found.append(sandbox_memory._process_cgroup())
threads = [threading.Thread(target=first_call) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(len(set(found)), found[0] is not None and os.path.isdir(found[0][0]))
"""
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert completed.stdout.split() == ["1", "True"], completed.stderr[-2000:]
