"""The `python` tool: run model-written code in a throwaway, locked-down Linux process.

    from agentic_rl.tools.python_sandbox import run_python, SandboxLimits
    result = run_python("print(6 * 7)")          # SandboxResult(ok=True, stdout="42\\n", ...)
    get_tool("python").call({"code": "print(6 * 7)"})   # "42\\n" (the observation string)

Tests: `.venv/bin/pytest tests/test_python_sandbox.py -q` runs every hostile program for real.

How a call runs (three processes, none of them forked from a thread with Python code in
between, so calls from a thread pool are safe: no preexec_fn, no shared mutable state):

    caller ──Popen──► bootstrap (python -I -S -c _BOOTSTRAP, new session, minimal env)
                        │ unshare(mount, net, pid, ipc, uts [+ user when not root])
                        └─fork─► init = pid 1 of the new pid namespace (stays privileged)
                                   │ mounts: / private, every mount read-only, fresh /proc,
                                   │         tmpfs work dir + /dev/shm, interpreter bound ro
                                   └─fork─► worker: setsid, rlimits, drop uid, no_new_privs,
                                            exec python -I -S -u -B main.py

The caller reads stdout/stderr incrementally (stdout's head and stderr's tail, at most
`max_output_bytes` + one 64 KiB read each are ever held) and stops the sandbox on overflow
or at the wall-clock deadline. Stopping = SIGTERM
to the bootstrap, which SIGKILLs init; the kernel then kills everything in the pid namespace
and init's exit is reported only after they are all gone, so nothing outlives the call. A
SIGKILL to the bootstrap's process group is the fallback, and init has PDEATHSIG=SIGKILL.

Threat model (what is enforced, and how):
  - Wall clock: `timeout_s`, enforced by the caller. CPU: RLIMIT_CPU per process (SIGXCPU).
  - Memory: RLIMIT_AS per process, so a big allocation raises MemoryError.
  - Processes: RLIMIT_NPROC. As root the worker runs under a fresh random uid (>= 2**31, no
    passwd entry) so the count covers this sandbox only and parallel sandboxes cannot signal
    each other. Unprivileged, the worker keeps the caller's uid, and the cap is set to the
    uid's current task count + `max_processes` (racy with the user's other processes).
  - Output: more than `max_output_bytes` on stdout, or 16x that on stderr, kills the
    sandbox; the cut is reported (exit_reason output_truncated + a marker), never silent.
  - Files: the whole mount tree is remounted read-only in the private mount namespace; the
    only writable places are a size-capped tmpfs work dir and a tmpfs /dev/shm, both gone
    when the namespace dies. RLIMIT_FSIZE caps single files. /proc is this pid namespace's
    own, mounted read-only. /dev is a fresh read-only tmpfs holding only null, zero, full,
    random, urandom, shm and the fd links: no terminal, disk, kmsg or vsock node. As root,
    the worker's uid also has no rights to root-owned 0600 files or /etc/shadow.
  - Network: an empty network namespace (loopback down, no abstract Unix sockets of the host)
    and a seccomp filter: socket() is refused (EACCES) for every family but AF_INET/AF_INET6,
    which only reach the empty namespace (ENETUNREACH). So no Unix socket (a socket file on
    the host, or abstract), no netlink, no vsock to a VM host, no packet socket.
    socketpair() only makes connected SOCK_STREAM pairs (asyncio needs one); io_uring is
    refused, since its operations would bypass the filter. The filter is applied last, after
    no_new_privs, and inherited by every child. x86_64 and aarch64 are supported; on another
    architecture the sandbox refuses to start.
  - Signals: the worker is in its own session and pid namespace, so it cannot name any
    process outside it (its parent is pid 1 = init, which ignores signals from inside), and
    as root its uid could not signal them anyway.
  - Environment: only PATH, LANG, HOME, TMPDIR (and LD_LIBRARY_PATH when the interpreter
    needs it). `-I -S`: no site-packages, no PYTHON* variables, no user site: stdlib only.
Not enforced:
  - Aggregate memory: a program may hold up to `max_processes` x `memory_bytes` (no cgroup).
  - Reading world-readable files (the stdlib, /etc/passwd, this repository if its
    permissions allow), and /sys (read-only). Kernel exploits: the seccomp filter only
    restricts sockets and io_uring, it does not shrink the kernel's attack surface.
  - Unprivileged: files readable by the calling user are readable by the code.
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
(DESIGN.md invariant 7).
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time

from agentic_rl.tools.base import Tool, ToolError, ToolUnavailable, register_tool
from agentic_rl.tools.sandbox_bootstrap import BOOTSTRAP
from agentic_rl.tools.sandbox_limits import SandboxLimits
from agentic_rl.tools.sandbox_observation import format_observation
from agentic_rl.tools.sandbox_result import SandboxResult, classify_exit, failed_result

_MAX_CODE_BYTES = 1_000_000  # a model turn is far shorter; this only bounds the stdin write
_STOP_GRACE_S = 2.0
# stderr is kept as a tail window (tracebacks end with the error) and the run is killed only
# once it has written this many times max_output_bytes to stderr.
_STDERR_KILL_FACTOR = 16  # how long the bootstrap gets to tear the namespace down before SIGKILL
# Fixed paths inside the sandbox's private /tmp, so tracebacks (observations the policy is
# trained on) are the same on every run and machine: no random temp-dir names.
_SANDBOX_WORK = "/tmp/work"
_SANDBOX_PYTHON = "/tmp/python"


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


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run `code` as a program in a fresh sandbox (see the module docstring) and wait for it."""
    started = time.monotonic()
    code_bytes = code.encode("utf-8", errors="replace")
    if len(code_bytes) > _MAX_CODE_BYTES:
        # The model's fault, not the host's: an ordinary error it can learn from.
        return failed_result(started, "error", f"code longer than {_MAX_CODE_BYTES} bytes")
    # stdin carries one JSON line of config, then the code: nothing lands on the host disk.
    payload = json.dumps(_sandbox_config(limits)).encode() + b"\n" + code_bytes
    status_read, status_write = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", BOOTSTRAP, str(status_write)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd="/",
            start_new_session=True, close_fds=True, pass_fds=(status_write,),
        )
    except OSError as exc:
        os.close(status_read)
        return failed_result(started, "sandbox_error", f"cannot start the sandbox: {exc}")
    finally:
        os.close(status_write)
    try:
        return _supervise(proc, status_read, payload, limits, started)
    finally:
        os.close(status_read)


def _sandbox_config(limits: SandboxLimits) -> dict:
    """Everything the bootstrap needs, as JSON-able values (it imports nothing of ours)."""
    is_root = os.geteuid() == 0
    # A fresh uid per call (as root): RLIMIT_NPROC then counts this sandbox only, and
    # concurrent sandboxes cannot signal or ptrace each other. 2**31.. is unused by distros.
    uid = 2**31 + secrets.randbelow(2**30) if is_root else os.getuid()
    gid = uid if is_root else os.getgid()
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    # The interpreter may live where the sandbox uid cannot go (pyenv under /root, mode 0700).
    # Binding its prefix read-only at a fixed path makes it reachable without changing perms.
    if exe.startswith(prefix + os.sep):
        bound_prefix = _SANDBOX_PYTHON
        worker_exe = os.path.join(bound_prefix, os.path.relpath(exe, prefix))
    else:
        prefix, bound_prefix, worker_exe = None, None, exe
    work_dir = _SANDBOX_WORK
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work_dir, "TMPDIR": work_dir}
    if bound_prefix and os.path.isdir(os.path.join(prefix, "lib")):
        # libpython may be found through an absolute RPATH that the sandbox cannot reach.
        env["LD_LIBRARY_PATH"] = os.path.join(bound_prefix, "lib")
    return {
        "is_root": is_root, "uid": uid, "gid": gid, "work_dir": work_dir,
        "prefix": prefix, "bound_prefix": bound_prefix, "exe": worker_exe, "env": env,
        "cpu_seconds": limits.cpu_seconds, "memory_bytes": limits.memory_bytes,
        "max_processes": limits.max_processes, "max_file_bytes": limits.max_file_bytes,
        "max_open_files": limits.max_open_files,
    }


def _supervise(proc: subprocess.Popen, status_fd: int, payload: bytes, limits: SandboxLimits,
               started: float) -> SandboxResult:
    """Feed config and code, collect bounded output until exit or a limit, always tear down."""
    try:
        proc.stdin.write(payload)
    except BrokenPipeError:
        pass  # the bootstrap died in setup; its status message says why
    finally:
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass
    deadline = started + limits.timeout_s
    stdout_fd, stderr_fd = proc.stdout.fileno(), proc.stderr.fileno()
    streams = {stdout_fd: bytearray(), stderr_fd: bytearray(), status_fd: bytearray()}
    outcome = _read_bounded(streams, stderr_fd, deadline, limits.max_output_bytes)
    if outcome == "eof":
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            outcome = "timeout"
    if outcome != "eof":
        _stop(proc)
    else:
        proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    stdout = bytes(streams[stdout_fd][: limits.max_output_bytes])
    stderr = bytes(streams[stderr_fd][: limits.max_output_bytes])
    setup_error = bytes(streams[status_fd]).decode("utf-8", errors="replace")
    return classify_exit(outcome, proc.returncode, stdout, stderr, setup_error, limits, started)


def _read_bounded(streams: dict[int, bytearray], tail_fd: int, deadline: float,
                  cap: int) -> str:
    """Read every fd until EOF on all ("eof"), "timeout", or too much output ("overflow").

    Every fd but `tail_fd` keeps its first cap + 1 bytes; the extra byte is how overflow is
    seen. `tail_fd` (stderr) keeps its last `cap` bytes, because a traceback's end names the
    error, and overflows only past _STDERR_KILL_FACTOR * cap bytes. No buffer ever grows past
    cap + one read.
    """
    stderr_total = 0
    with selectors.DefaultSelector() as selector:
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                buffer = streams[key.fd]
                if key.fd == tail_fd:
                    stderr_total += len(chunk)
                    buffer += chunk
                    del buffer[: max(0, len(buffer) - cap)]
                    if stderr_total > _STDERR_KILL_FACTOR * cap:
                        return "overflow"
                else:
                    buffer += chunk[: cap + 1 - len(buffer)]
                    if len(buffer) > cap:
                        return "overflow"
    return "eof"


def _stop(proc: subprocess.Popen) -> None:
    """Tear the sandbox down; on return no process of it is left.

    SIGTERM asks the bootstrap to SIGKILL init and wait until the pid namespace is empty.
    If it has not exited within the grace period, SIGKILL its whole process group. The
    bootstrap is not reaped before that killpg, so its pid (= the pgid) cannot be reused.
    """
    try:
        proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    grace_end = time.monotonic() + _STOP_GRACE_S
    while time.monotonic() < grace_end:
        try:
            exited = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # already reaped (e.g. by Popen.poll elsewhere): it has exited
            break
        if exited is not None:
            break
        time.sleep(0.005)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
