"""The caller's side of a sandboxed run: start the bootstrap, feed it, watch it, tear it down.

    from agentic_rl.tools.sandbox_supervisor import run_python
    run_python("print(6 * 7)", SandboxLimits(timeout_s=2.0))   # SandboxResult(ok=True, ...)

`run_python` blocks until the run is over and leaves nothing behind; it keeps no state
between calls, so any number of threads may call it at once. One call:

    encode the code (over 1 MB: an ordinary "error", the model's fault)
    wait for room in the memory budget, then make the call's cgroup (sandbox_memory.py)
    _sandbox_config: uid, paths, environment, limits and the cgroup, as one JSON line
    Popen the bootstrap (sandbox_bootstrap.py: new session, PATH and LANG only, cwd /)
    _supervise: write config + code to its stdin, then
        _read_bounded: stdout, stderr and the status pipe until EOF, deadline or overflow
        _stop when it did not end by itself
    classify_exit (sandbox_result.py): how it ended -> SandboxResult; a SIGKILL with an OOM
        kill in the cgroup is "memory"; the cgroup is removed

Design choices:
  - Bounded memory. stdout keeps its head (max_output_bytes + 1 bytes: the extra byte is how
    overflow is seen), stderr its tail (a traceback ends with the error's name), so at most
    max_output_bytes + one 64 KiB read per stream is ever held. Too much stdout, or 16 times
    max_output_bytes of stderr, kills the run: the cut is reported, never silent.
  - One deadline. `timeout_s` runs from before the Popen to the last byte and the exit.
  - Teardown that cannot leak. `_stop` sends SIGTERM to the bootstrap, which SIGKILLs init:
    the kernel then kills the whole pid namespace. After a grace period, SIGKILL to the
    bootstrap's process group; init also has PDEATHSIG=SIGKILL. The bootstrap is reaped only
    after that killpg, so its pid (= the group id) cannot have been reused.
  - Fixed paths. The code runs as /tmp/work/main.py and the interpreter is bound at
    /tmp/python, inside the sandbox's own root (`_interpreter_in_root` lists what that root
    holds), so tracebacks (observations the policy is trained on) are the same on every run
    and machine: no random temp-dir names.
  - A fresh uid per call, as root: RLIMIT_NPROC then counts this sandbox only, and
    concurrent sandboxes cannot signal each other. Unprivileged, the worker keeps the
    caller's uid, and the bootstrap sets the process cap relative to the user's tasks.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time

from agentic_rl.tools.sandbox_bootstrap import BOOTSTRAP
from agentic_rl.tools.sandbox_limits import SandboxLimits
from agentic_rl.tools.sandbox_memory import CallCgroup, call_reservation, cgroups_available, memory_budget
from agentic_rl.tools.sandbox_result import SandboxResult, classify_exit, failed_result

_MAX_CODE_BYTES = 1_000_000  # a model turn is far shorter; this only bounds the stdin write
_STOP_GRACE_S = 2.0  # how long the bootstrap gets to tear the namespace down before SIGKILL
# stderr is kept as a tail window (tracebacks end with the error) and the run is killed only
# once it has written this many times max_output_bytes to stderr.
_STDERR_KILL_FACTOR = 16
# Fixed paths inside the sandbox's private /tmp, so tracebacks (observations the policy is
# trained on) are the same on every run and machine: no random temp-dir names.
_SANDBOX_WORK = "/tmp/work"
_SANDBOX_PYTHON = "/tmp/python"
# The host's library directories (and the loader's index of them), bound read-only at their
# own paths in the sandbox's root: the stdlib's extension modules load libc, libssl, libffi,
# ... from there. A symlink among them (/lib -> usr/lib) is recreated as a symlink.
_LIBRARY_DIRS = (
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/libx32",
    "/usr/local/lib",
    "/usr/local/lib64",
)
_LOADER_FILES = ("/etc/ld.so.cache",)
# pivot_root into the new root, or (False) the chroot fallback that sandbox_root.py takes where
# the host's / is the initramfs. Only the tests set it, to run that path here too.
_USE_PIVOT_ROOT = True


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run `code` as a program in a fresh sandbox (see the module docstring) and wait for it."""
    code_bytes = code.encode("utf-8", errors="replace")
    if len(code_bytes) > _MAX_CODE_BYTES:
        # The model's fault, not the host's: an ordinary error it can learn from.
        return failed_result(time.monotonic(), "error", f"code longer than {_MAX_CODE_BYTES} bytes")
    capped = cgroups_available()
    with memory_budget().hold(call_reservation(limits, capped)):
        started = time.monotonic()  # the wait for room is not the code's time
        try:
            cgroup = CallCgroup.create(limits.memory_bytes) if capped else None
        except OSError as exc:
            return failed_result(started, "sandbox_error", f"cannot make the call's cgroup: {exc}")
        try:
            result = _run(code_bytes, limits, cgroup, started)
            # The kernel's OOM kill at the cap is a SIGKILL; the code's own errors stay its own.
            if cgroup is not None and result.returncode == 128 + signal.SIGKILL and cgroup.oom_kills():
                message = (
                    f"memory limit of {limits.memory_bytes // 2**20} MiB for the whole call "
                    "(every process, its files and kernel memory) exceeded"
                )
                result = dataclasses.replace(result, exit_reason="memory", error=message)
            return result
        finally:
            if cgroup is not None:
                cgroup.remove()


def _run(code_bytes: bytes, limits: SandboxLimits, cgroup: CallCgroup | None, started: float) -> SandboxResult:
    # stdin carries one JSON line of config, then the code: nothing lands on the host disk.
    config = _sandbox_config(limits, cgroup.procs_path if cgroup is not None else None)
    payload = json.dumps(config).encode() + b"\n" + code_bytes
    status_read, status_write = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", BOOTSTRAP, str(status_write)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            cwd="/",
            start_new_session=True,
            close_fds=True,
            pass_fds=(status_write,),
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


def _sandbox_config(limits: SandboxLimits, cgroup_procs: str | None) -> dict:
    """Everything the bootstrap needs, as JSON-able values (it imports nothing of ours)."""
    is_root = os.geteuid() == 0
    # A fresh uid per call (as root): RLIMIT_NPROC then counts this sandbox only, and
    # concurrent sandboxes cannot signal or ptrace each other. 2**31.. is unused by distros.
    uid = 2**31 + secrets.randbelow(2**30) if is_root else os.getuid()
    gid = uid if is_root else os.getgid()
    binds, links, worker_exe, env = _interpreter_in_root()
    return {
        "is_root": is_root,
        "uid": uid,
        "gid": gid,
        "work_dir": _SANDBOX_WORK,
        "cgroup_procs": cgroup_procs,
        "root_binds": binds,
        "root_links": links,
        "pivot_root": _USE_PIVOT_ROOT,
        "exe": worker_exe,
        "env": env,
        "cpu_seconds": limits.cpu_seconds,
        "memory_bytes": limits.memory_bytes,
        "max_processes": limits.max_processes,
        "max_file_bytes": limits.max_file_bytes,
        "max_open_files": limits.max_open_files,
    }


@functools.lru_cache(maxsize=None)
def _interpreter_in_root() -> tuple[list, list, str, dict]:
    """What the sandbox's root holds so the interpreter runs there, and how it is started.

    Returns (binds: [host path, path in the root] pairs, sorted so parents come first; links:
    [path, target] of the host's symlinks among the library dirs; the executable's path in the
    root; the worker's environment). Computed once per process: none of it changes per call.
    """
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    work_dir = _SANDBOX_WORK
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work_dir, "TMPDIR": work_dir}
    binds, links = [], []
    for path in _LIBRARY_DIRS:
        if os.path.islink(path):
            links.append([path, os.readlink(path)])
        elif os.path.isdir(path):
            binds.append([path, path])
    binds += [[path, path] for path in _LOADER_FILES if os.path.isfile(path)]
    if exe.startswith(prefix + os.sep):
        # The interpreter may live where the sandbox uid cannot go (pyenv under /root, mode
        # 0700). Binding its prefix read-only at a fixed path makes it reachable without
        # changing permissions, and keeps tracebacks the same on every machine.
        binds.append([prefix, _SANDBOX_PYTHON])
        worker_exe = os.path.join(_SANDBOX_PYTHON, os.path.relpath(exe, prefix))
        if os.path.isdir(os.path.join(prefix, "lib")):
            # libpython may be found through an absolute RPATH that the sandbox cannot reach.
            env["LD_LIBRARY_PATH"] = os.path.join(_SANDBOX_PYTHON, "lib")
    else:
        # An executable outside its prefix finds the stdlib by its built-in, absolute prefix:
        # both stay at their host paths.
        binds += [[os.path.dirname(exe)] * 2, [prefix, prefix]]
        worker_exe = exe
    binds.sort(key=lambda pair: pair[1].count(os.sep))
    return binds, links, worker_exe, env


def _supervise(
    proc: subprocess.Popen, status_fd: int, payload: bytes, limits: SandboxLimits, started: float
) -> SandboxResult:
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


def _read_bounded(streams: dict[int, bytearray], tail_fd: int, deadline: float, cap: int) -> str:
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
