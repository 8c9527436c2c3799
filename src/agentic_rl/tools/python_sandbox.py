"""The `python` tool: run model-written code in a throwaway, locked-down Linux process.

    from agentic_rl.tools.python_sandbox import run_python, SandboxLimits
    result = run_python("print(6 * 7)")          # SandboxResult(ok=True, stdout="42\\n", ...)
    get_tool("python").call({"code": "print(6 * 7)"})   # "42\\n" (the observation string)

Tests: `.venv/bin/pytest tests/test_python_sandbox.py -q` runs every hostile program for real.

How a call runs: `run_python` (sandbox_supervisor.py) starts a fresh interpreter, the
bootstrap, which unshares namespaces and forks init (pid 1 of a new pid namespace), which
builds a minimal read-only root (sandbox_root.py) and forks the worker, which drops its privileges and execs
`python -I -S -u -B main.py`. The caller reads bounded output until exit, the deadline or an
overflow, then tears the namespace down, so nothing outlives the call. No Python code runs
between fork and exec in the caller and no state is shared, so threads may call it at once.

Where each part lives (tools/):

    python_sandbox.py        the registered tool, its one-time host check, this threat model
    sandbox_limits.py        SandboxLimits: each cap, and what enforces it
    sandbox_supervisor.py    run_python: the caller's side (start, feed, bounded reads,
                             deadline, teardown)
    sandbox_bootstrap.py     the program that builds the sandbox: three processes, the
                             worker's rlimits and privilege drop, the protocol with the caller
    sandbox_namespaces.py    isolation: the namespaces, host mounts read-only
    sandbox_root.py          isolation: the minimal root the code sees (pivot_root / chroot)
    sandbox_seccomp.py       isolation: the seccomp filter (sockets, keyring, uncounted memory)
    sandbox_memory.py        the call's memory cgroup, and the budget of calls at once
    sandbox_result.py        SandboxResult, and how the way a run ended becomes exit_reason
    sandbox_observation.py   the observation text the policy reads

Threat model (what is enforced, and how):
  - Wall clock: `timeout_s`, enforced by the caller. CPU: RLIMIT_CPU per process (SIGXCPU).
  - Memory (sandbox_memory.py): the whole call in a memory cgroup of its own capped at
    `memory_bytes` (every process, tmpfs files, pipes and other kernel memory charged to it),
    where the host lets the caller make one (root, or a delegated cgroup v2 subtree); and
    RLIMIT_AS per process, so a big allocation raises MemoryError. Refused, since nothing would
    count it (sandbox_seccomp.py): System V shared memory and message queues, memfds (ENOSYS),
    POSIX message queues (RLIMIT_MSGQUEUE = 0), raising a socket's buffer or a pipe's size
    (EPERM); Unix socket queues stay at the host's default size. The calls at once reserve at
    most half of the host's memory (a call waits for room). The work dir and /dev/shm are
    tmpfs of max_file_bytes each.
  - Kernel keyring (not namespaced): keyctl, add_key and request_key are refused (EPERM), and
    /proc/keys and /proc/key-users are masked, so the code neither reads the caller's keys nor
    leaves keyrings behind.
  - Processes: RLIMIT_NPROC. As root the worker runs under a fresh random uid (>= 2**31, no
    passwd entry) so the count covers this sandbox only and parallel sandboxes cannot signal
    each other. Unprivileged, the worker keeps the caller's uid, and the cap is set to the
    uid's current task count + `max_processes` (racy with the user's other processes).
  - Output: more than `max_output_bytes` on stdout, or 16x that on stderr, kills the
    sandbox; the cut is reported (exit_reason output_truncated + a marker), never silent.
  - Files (sandbox_root.py): the code's root is a fresh read-only tmpfs holding only the
    interpreter's prefix (/tmp/python), the host's library dirs (/lib*, /usr/lib*,
    /usr/local/lib*) and /etc/ld.so.cache, all read-only, a size-capped tmpfs work dir, a
    tmpfs /dev/shm, this pid namespace's own /proc (read-only, /proc/keys masked) and a /dev
    of null, zero, full, random, urandom and the fd links. No other host file is in sight:
    no project folders, /etc, /home, /root, /var, /sys, /run or container metadata. It is
    entered by pivot_root and the host's tree detached; where / is the initramfs (pivot_root
    EINVAL) by a chroot, with the host's tree left beneath it, read-only and unreachable
    without a capability. RLIMIT_FSIZE caps single files.
  - Network (sandbox_namespaces.py, sandbox_seccomp.py): an empty network namespace (loopback
    down, no abstract Unix sockets of the host) and a seccomp filter: socket() is refused
    (EACCES) for every family but AF_INET/AF_INET6, which only reach the empty namespace
    (ENETUNREACH). So no Unix socket (a socket file on the host, or abstract), no netlink, no
    vsock to a VM host, no packet socket. socketpair() only makes connected SOCK_STREAM pairs
    (asyncio needs one); io_uring is refused, since its operations would bypass the filter. The
    filter is applied last, after no_new_privs, and inherited by every child. x86_64 and aarch64
    are supported; on another architecture the sandbox refuses to start.
  - Signals: the worker is in its own session and pid namespace, so it cannot name any
    process outside it (its parent is pid 1 = init, which ignores signals from inside), and
    as root its uid could not signal them anyway.
  - Environment: only PATH, LANG, HOME, TMPDIR (and LD_LIBRARY_PATH when the interpreter
    needs it). `-I -S`: no site-packages, no PYTHON* variables, no user site: stdlib only.
Not enforced:
  - Memory where no cgroup can be made: a program may hold up to `max_processes` x
    `memory_bytes`, plus 2 x `max_file_bytes` of tmpfs and bounded socket queues (8.3 GiB with
    the defaults), and the budget admits as many such calls at once as fit in half the host's
    memory, at least one.
  - Unix socket queues (no cgroup counts them): at most max_processes x max_open_files x
    net.core.wmem_default (208 MiB with the defaults) beyond the cap.
  - /proc/self/mountinfo names the host paths of the bound directories (the library dirs, the
    interpreter's prefix) and their devices: the kernel prints a bind mount's source path.
  - Reading what the root holds: the interpreter's prefix (for a venv's base interpreter,
    its whole install, site-packages included) and the host's library dirs (/usr/lib holds
    more than the interpreter loads). Kernel exploits: the seccomp filter only refuses the
    calls above (and a user namespace of its own: unshare or clone with CLONE_NEWUSER, and
    clone3), it does not shrink the kernel's attack surface.
  - If namespaces are unavailable (e.g. a container without CAP_SYS_ADMIN and with user
    namespaces disabled), the sandbox refuses to run (exit_reason "sandbox_error") instead
    of running the code with weaker isolation. `get_tool("python")` runs one probe
    (`check_sandbox`) and raises SandboxUnavailable then, so an env offering the tool fails
    when it is built; a later per-call sandbox_error raises it too, and stops the run.

Failed calls: `python()` raises ToolError (with the observation text: traceback, timeout
note, ...) whenever the run was not ok, so the env counts it in `tool_errors`.

Throughput: the calls of one turn (at most 8) run concurrently (envs/tool_env.py), and the
rollout engine runs the env steps of the episodes whose turns end in the same decode step on
`rollout.tool_workers` threads (default 4); decoding waits for them. Known limit, not fixed
here: episodes whose turns end in different decode steps run their calls one decode step after
another, so slow calls can stall the batch for up to timeout_s per such step. Overlapping tool
calls with decoding needs an asynchronous engine step, which must keep the run deterministic
(docs/design.md invariant 7).
"""

from __future__ import annotations

import functools

from agentic_rl.tools.base import Tool, ToolError, ToolUnavailable, register_tool
from agentic_rl.tools.sandbox_limits import SandboxLimits
from agentic_rl.tools.sandbox_observation import format_observation
from agentic_rl.tools.sandbox_result import SandboxResult
from agentic_rl.tools.sandbox_supervisor import run_python

# The sandbox's public names, importable from here as before the split into sandbox_*.py.
__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "check_sandbox",
    "format_observation",
    "python",
    "python_tool",
    "run_python",
]


class SandboxUnavailable(ToolUnavailable):
    """This host cannot build the sandbox (no namespaces, no seccomp, ...); see the message."""


@functools.lru_cache(maxsize=None)
def check_sandbox() -> None:
    """Build one sandbox and run `print(1)` in it, once per process (a failure is not cached).

    Raises SandboxUnavailable naming the cause, so a host that cannot sandbox (rootless without
    user namespaces, no seccomp) is found when the tool is created, not one call at a time.
    """
    result = run_python("print(1)", SandboxLimits(timeout_s=30.0))
    if not (result.ok and result.stdout == "1\n"):
        raise SandboxUnavailable(
            f"the python tool's sandbox cannot run on this host: {result.error or result.stderr!r}. "
            "It needs Linux namespaces (root, or unprivileged user namespaces: "
            "sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0) and seccomp. "
            "Run where these are available, or drop 'python' from the env's tools."
        )


@register_tool("python")
def python_tool() -> Tool:
    """The registered `python` tool; checks once that the sandbox can run here."""
    check_sandbox()
    return Tool.from_function(python, name="python")


def python(code: str) -> str:
    """Run Python code and return what it prints (stdout), or the error traceback if it fails.

    Each call is a fresh, isolated interpreter with only the standard library: no network,
    no state kept between calls, a 5 second time limit and 4 KB of output. Use print() to
    see results.

    Args:
        code: A complete Python program, e.g. "import math\\nprint(math.comb(10, 3))".
    """
    result = run_python(code)
    if result.exit_reason == "sandbox_error":
        # Not the model's fault: the host cannot build the sandbox. Stop the run loudly.
        raise SandboxUnavailable(f"python sandbox unavailable: {result.error}")
    observation = format_observation(result, SandboxLimits().max_output_bytes)
    if not result.ok:  # traceback, timeout, MemoryError, non-zero exit, output cut: a failed call
        raise ToolError(observation)
    return observation
