"""The `python` tool's sandbox, with every hostile program run for real.

Run: .venv/bin/pytest tests/test_python_sandbox.py -q   (about 45 s on 2 busy cores; the
hostile list of tests/sandbox_hostile.py runs four times: as this user and, as root, again as
uid 65534, each through pivot_root and through the chroot fallback)

Each hostile test ends with `_assert_host_unharmed`: this process is alive (trivially, we
are running), the sentinel outside the sandbox is byte- and mtime-identical, nothing new
appeared next to it, and the tool still answers `print(1+1)` with "2".
"""

from __future__ import annotations

import ast
import concurrent.futures
import json
import os
import shutil
import socket
import tempfile
import time
import uuid

import pytest

from agentic_rl.tools.base import Tool, ToolError, get_tool
from agentic_rl.tools.python_sandbox import SandboxLimits, format_observation, python, run_python
from agentic_rl.tools.sandbox_landlock import landlock_abi

import sandbox_hostile

IS_ROOT = os.geteuid() == 0
SENTINEL_TEXT = "sentinel: must never change\n"
# Both ways into the sandbox's root (sandbox_root.py): pivot_root, and the chroot fallback.
ROOT_SWITCHES = pytest.mark.parametrize("pivot_root", [True, False], ids=["pivot_root", "chroot_fallback"])


@pytest.fixture
def outside_dir():
    """A world-writable dir outside /tmp holding a world-writable sentinel file.

    World-writable on purpose: file permissions do not protect it, so only the sandbox's
    read-only mounts can. /var/tmp because the sandbox replaces /tmp with its own tmpfs,
    which would make a /tmp path "safe" merely by being invisible.
    """
    base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
    path = tempfile.mkdtemp(prefix="sandbox-outside-", dir=base)
    os.chmod(path, 0o777)
    sentinel = os.path.join(path, "sentinel.txt")
    with open(sentinel, "w") as f:
        f.write(SENTINEL_TEXT)
    os.chmod(sentinel, 0o666)
    os.utime(sentinel, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    yield path
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    os.rmdir(path)


def _assert_host_unharmed(outside_dir: str) -> None:
    sentinel = os.path.join(outside_dir, "sentinel.txt")
    assert sorted(os.listdir(outside_dir)) == ["sentinel.txt"]
    with open(sentinel) as f:
        assert f.read() == SENTINEL_TEXT
    assert os.stat(sentinel).st_mtime_ns == 1_000_000_000_000_000_000
    assert python("print(1+1)") == "2\n"


def _failed_call(code: str) -> str:
    """The observation of a python call that must fail (ToolError), i.e. count as a tool error."""
    with pytest.raises(ToolError) as failure:
        python(code)
    return str(failure.value)


_processes_with_marker = sandbox_hostile.live_processes_with


# ---------------------------------------------------------------- results the model sees


def test_tool_schema_comes_from_the_docstring():
    """Guards against a schema the model cannot use: wrong name, missing `code`, empty text."""
    schema = Tool.from_function(python, name="python").schema["function"]
    assert schema["name"] == "python"
    assert schema["description"].startswith("Run Python code and return what it prints")
    assert schema["parameters"]["properties"]["code"]["type"] == "string"
    assert schema["parameters"]["required"] == ["code"]


def test_printed_output_is_the_observation():
    """Guards against losing stdout or mixing the sandbox's own noise into it."""
    assert python("import math\nprint(math.comb(10, 3))\nprint('done')") == "120\ndone\n"


def test_no_output_says_to_print():
    """Guards against an empty observation the model cannot tell from a hang."""
    assert python("x = 6 * 7") == "[no output; use print() to show values]"


def test_exception_returns_stdout_then_traceback_tail():
    """Guards against swallowing the error, or keeping the traceback head and losing its name."""
    text = _failed_call("print('before')\ndef f():\n    return 1 / 0\nf()")
    assert text.startswith("before\nTraceback (most recent call last):")
    assert text.endswith("ZeroDivisionError: division by zero")
    assert 'File "/tmp/work/main.py", line 3, in f' in text  # fixed path: deterministic text


def test_syntax_error_is_reported():
    """Guards against a syntax error looking like a program that printed nothing."""
    result = run_python("def f(:\n    pass")
    assert (result.ok, result.exit_reason) == (False, "error")
    assert result.error == "SyntaxError: invalid syntax"
    assert format_observation(result, 4096).endswith("SyntaxError: invalid syntax")


def test_nonzero_exit_without_traceback_is_an_error():
    """Guards against sys.exit(3) being reported as success, and sys.exit(200) (> 128, not
    a signal number) crashing the result classification."""
    result = run_python("import sys\nprint('partial')\nsys.exit(3)")
    assert (result.ok, result.exit_reason, result.returncode) == (False, "error", 3)
    assert _failed_call("import sys\nprint('partial')\nsys.exit(3)") == "partial\n[exit status 3]"
    assert run_python("raise SystemExit(200)").error == "exit status 200"


def test_truncation_is_marked_never_silent():
    """Guards against cutting output silently, so the model takes a prefix for the answer."""
    text = _failed_call("print('a' * 5000)")
    assert text == "a" * 4096 + "\n[output truncated after 4096 bytes]"


def test_long_traceback_keeps_its_last_lines():
    """Guards against a huge exception message pushing the error type out of the observation."""
    text = _failed_call("print('kept')\nraise ValueError('y' * 10000 + ' the end')")
    assert text.startswith("kept\n[output truncated: only 4096 bytes of output are shown]")
    assert text.endswith("y the end")


def test_limits_reject_values_that_cannot_work():
    """Guards against a memory cap so low that every call fails with a confusing error."""
    with pytest.raises(ValueError, match="below 64 MiB"):
        SandboxLimits(memory_bytes=10 * 2**20)
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)


def test_parallel_calls_do_not_mix_results():
    """Guards against shared state between concurrent calls from the rollout thread pool."""
    code = "import time\ntime.sleep(0.1)\nprint({i} * {i})"
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda i: run_python(code.format(i=i)), range(8)))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(8)]


# ------------------------------------------------------------------------ hostile programs


def test_infinite_loop_times_out_on_the_wall_clock(outside_dir):
    """Guards against a `while True: pass` that hangs the episode (and the trainer)."""
    limits = SandboxLimits(timeout_s=1.0, cpu_seconds=30)
    started = time.monotonic()
    result = run_python("print('started')\nwhile True:\n    pass", limits)
    elapsed = time.monotonic() - started
    assert (result.exit_reason, result.error) == ("timeout", "timed out after 1 s")
    assert result.stdout == "started\n"  # output before the timeout is kept (unbuffered)
    assert elapsed < 1.0 + 1.5
    assert format_observation(result, 4096) == "started\n[timed out after 1 s]"
    _assert_host_unharmed(outside_dir)


def test_cpu_limit_stops_a_busy_loop_before_the_wall_clock(outside_dir):
    """Guards against RLIMIT_CPU not being applied in the worker."""
    limits = SandboxLimits(timeout_s=10.0, cpu_seconds=1)
    result = run_python("while True:\n    pass", limits)
    assert result.exit_reason == "timeout"
    assert result.error == "CPU time limit of 1 s exceeded"
    assert result.duration_s < 8.0  # 1 s of CPU; wall time is longer on a loaded machine
    _assert_host_unharmed(outside_dir)


def test_fork_bomb_hits_the_process_cap_and_leaves_no_process_behind(outside_dir):
    """Guards against RLIMIT_NPROC not applying (it never binds root) and against children
    outliving the call. Fan-out is bounded (at most 100 forks, each child asleep) so a
    broken sandbox cannot take this machine down."""
    marker = f"sandbox-fork-marker-{uuid.uuid4().hex}"
    code = f"""
import os, sys
forks, failure = 0, None
for _ in range(100):
    try:
        pid = os.fork()
    except OSError as exc:
        failure = type(exc).__name__
        break
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "{marker}"])
    forks += 1
print(forks, failure)
"""
    limits = SandboxLimits(max_processes=8)
    result = run_python(code, limits)
    forks, failure = result.stdout.split()
    assert result.exit_reason == "ok", result
    assert failure == "BlockingIOError"  # EAGAIN from fork: the cap, not the loop's end
    assert int(forks) < limits.max_processes
    assert _processes_with_marker(marker) == []
    _assert_host_unharmed(outside_dir)


def test_detached_daemon_does_not_survive_the_call(outside_dir):
    """Guards against a double-forked setsid() child escaping a process-group kill."""
    marker = f"sandbox-daemon-marker-{uuid.uuid4().hex}"
    code = f"""
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "{marker}"])
    os._exit(0)
import time; time.sleep(0.2)
print("parent exits")
"""
    result = run_python(code)
    assert result.stdout == "parent exits\n"
    assert _processes_with_marker(marker) == []
    _assert_host_unharmed(outside_dir)


def test_memory_bomb_returns_a_memory_error(outside_dir):
    """Guards against a 4 GB allocation swapping or OOM-killing the trainer."""
    result = run_python("data = bytearray(4 * 10**9)\nprint(len(data))")
    assert result.exit_reason == "memory"
    assert result.error == "memory limit of 512 MiB exceeded"
    assert result.stderr.rstrip().endswith("MemoryError")
    assert _failed_call("data = bytearray(4 * 10**9)").endswith("MemoryError\n[memory limit of 512 MiB exceeded]")
    _assert_host_unharmed(outside_dir)


def test_huge_output_is_cut_fast_and_bounded(outside_dir):
    """Guards against buffering 100 MB of output in the trainer or waiting for all of it."""
    result = run_python("print('x' * 10**8)")
    assert result.exit_reason == "output_truncated"
    assert result.stdout == "x" * 4096
    assert result.duration_s < 4.0  # ~0.15 s when idle: killed at 4 KB, not at 100 MB
    text = _failed_call("print('x' * 10**8)")
    assert text.endswith("\n[output truncated after 4096 bytes]") and len(text) < 4200
    _assert_host_unharmed(outside_dir)


def test_endless_stderr_is_cut_too(outside_dir):
    """Guards against an unbounded stderr loop running to the timeout or filling memory."""
    result = run_python("import sys\nwhile True:\n    sys.stderr.write('e' * 1000)")
    assert result.exit_reason == "output_truncated"
    assert len(result.stderr) == 4096
    assert result.duration_s < 4.0
    _assert_host_unharmed(outside_dir)


def test_secret_files_cannot_be_read(outside_dir):
    """Guards against the code reading /etc/shadow or a 0600 file of the caller's: they are not
    in the sandbox's root at all, so this holds unprivileged too (the worker keeps the caller's
    uid there, and file permissions alone would let it read them)."""
    secret = os.path.join(outside_dir, "secret.txt")
    with open(secret, "w") as f:
        f.write("TOPSECRET-42")
    os.chmod(secret, 0o600)
    try:
        code = f"""
for path in ("/etc/shadow", {secret!r}):
    try:
        print(path, open(path).read())
    except OSError as exc:
        print(path, type(exc).__name__)
"""
        result = run_python(code)
        assert result.stdout == f"/etc/shadow FileNotFoundError\n{secret} FileNotFoundError\n"
    finally:
        os.unlink(secret)
    _assert_host_unharmed(outside_dir)


def test_files_outside_the_work_dir_cannot_be_changed(outside_dir):
    """Guards against overwriting, deleting, creating or chmod-ing files outside the sandbox,
    here in a world-writable dir where only the read-only mounts stand in the way."""
    sentinel = os.path.join(outside_dir, "sentinel.txt")
    outside_tmp = f"/tmp/sandbox-outside-{uuid.uuid4().hex}"
    attempts = [
        f"open({sentinel!r}, 'w').write('pwned')",
        f"os.unlink({sentinel!r})",
        f"os.utime({sentinel!r}, None)",
        f"os.chmod({outside_dir!r}, 0o700)",
        f"open({os.path.join(outside_dir, 'new.txt')!r}, 'w').write('x')",
        f"open({outside_tmp!r}, 'w').write('x')",
        "open('/etc/passwd', 'a').write('x')",
    ]
    code = "import os\n" + "".join(
        f"try:\n    {a}\n    print('CHANGED')\nexcept OSError as exc:\n    print(type(exc).__name__)\n"
        for a in attempts
    )
    code += "open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\n"
    result = run_python(code)
    lines = result.stdout.split()
    assert "CHANGED" not in lines and len(lines) == len(attempts) + 1, result
    assert lines[-1] == "ok"  # the work dir itself is writable
    assert not os.path.exists(outside_tmp)
    assert os.stat(outside_dir).st_mode & 0o777 == 0o777
    _assert_host_unharmed(outside_dir)


def test_socket_cannot_reach_a_listener_on_localhost(outside_dir):
    """Guards against network access: the code must not reach a port this test listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        code = f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1)
    print("CONNECTED")
except OSError as exc:
    print(type(exc).__name__, exc.errno)
"""
        result = run_python(code)
        listener.settimeout(0.2)
        with pytest.raises(socket.timeout):
            listener.accept()  # no connection ever arrived
    assert result.stdout.startswith("OSError 101"), result  # ENETUNREACH: no route at all
    _assert_host_unharmed(outside_dir)


def test_signals_cannot_reach_the_caller(outside_dir):
    """Guards against the code killing pytest/the trainer via its parent, its process group,
    kill(-1), or the caller's real pid."""
    attempts = [
        "os.kill(os.getppid(), signal.SIGKILL)",
        "os.kill(os.getppid(), signal.SIGTERM)",
        f"os.kill({os.getpid()}, signal.SIGKILL)",
        "os.kill(-1, signal.SIGKILL)",
        "os.killpg(0, signal.SIGKILL)",
    ]
    parent_before = os.getppid()
    for attempt in attempts:
        result = run_python(f"import os, signal\n{attempt}\nprint('still here')")
        assert result.exit_reason in ("ok", "error"), (attempt, result)
    assert os.getppid() == parent_before  # we are alive, and our parent was not killed (we'd be re-parented)
    _assert_host_unharmed(outside_dir)


@ROOT_SWITCHES
def test_the_code_sees_a_minimal_root(pivot_root, monkeypatch):
    """Guards against the code seeing the host's tree (project folders, /var/tmp, /etc, home
    files, container metadata): / holds only the library dirs, the loader's index, the
    interpreter and work dir under /tmp, and the sandbox's own /dev and /proc, read-only."""
    from agentic_rl.tools import sandbox_supervisor

    monkeypatch.setattr(sandbox_supervisor, "_USE_PIVOT_ROOT", pivot_root)
    code = """
import os
print(sorted(os.listdir("/")), sorted(os.listdir("/tmp")), sorted(os.listdir("/dev")))
print(sorted(os.listdir("/etc")), os.access("/", os.W_OK), os.access("/tmp/work", os.W_OK))
"""
    result = run_python(code)
    binds, links, _, _ = sandbox_supervisor._interpreter_in_root()
    top = {path.split(os.sep)[1] for path, _ in links} | {target.split(os.sep)[1] for _, target in binds}
    assert {"usr", "tmp", "etc"} <= top <= {"lib", "lib32", "lib64", "libx32", "usr", "tmp", "etc"}
    listing = [
        str(sorted(top | {"dev", "proc"})),
        "['python', 'work']",
        "['fd', 'full', 'null', 'random', 'shm', 'stderr', 'stdin', 'stdout', 'urandom', 'zero']",
    ]
    assert result.stdout.splitlines() == [" ".join(listing), "['ld.so.cache'] False True"], result


def _sandbox_mount_points_seen_by_its_bootstrap(code: str) -> list[tuple[str, str]]:
    """(mount point, fs type) of the sandbox's mount namespace as its bootstrap sees them, taken
    while `code` runs. The bootstrap never enters the root itself: pivot_root moves every root
    of the namespace along, a chroot only init's and the worker's."""
    marker = f"sandbox-mounts-{uuid.uuid4().hex}"
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        call = pool.submit(run_python, f"import time\nprint({marker!r})\n{code}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not call.done():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if b"def enter_root" not in f.read():
                            continue
                    with open(f"/proc/{pid}/mountinfo") as f:
                        mounts = [(line.split()[4], line.split(" - ")[1].split()[0]) for line in f]
                except OSError:
                    continue
                if ("/dev/shm", "tmpfs") in mounts and ("/tmp/work", "tmpfs") in mounts:
                    assert call.result().stdout.startswith(marker)
                    return mounts
            time.sleep(0.01)
    raise AssertionError(f"no sandbox bootstrap with a finished root seen: {call.result()}")


@ROOT_SWITCHES
def test_the_root_is_entered_by_pivot_root_or_by_the_chroot_fallback(pivot_root, monkeypatch):
    """Guards against the fallback being dead code (the tests of both paths running one), and
    against pivot_root leaving the host's tree in the namespace: after pivot_root the namespace
    holds the minimal root alone; the fallback keeps the host's / (read-only) beneath it."""
    from agentic_rl.tools import sandbox_supervisor

    monkeypatch.setattr(sandbox_supervisor, "_USE_PIVOT_ROOT", pivot_root)
    mounts = _sandbox_mount_points_seen_by_its_bootstrap("time.sleep(1.0)")
    roots = [fstype for point, fstype in mounts if point == "/"]
    if pivot_root:
        assert roots == ["tmpfs"], mounts
        assert not any(point.startswith(("/var", "/home", "/root")) for point, _ in mounts)
    else:
        assert len(roots) == 2 and roots[-1] == "tmpfs", mounts  # the host's /, then the root


def test_keyring_and_uncounted_memory_syscalls_are_refused_with_the_documented_errno():
    """Guards against the keyring calls (not namespaced: the caller's keys) and the memory
    that RLIMIT_AS does not count (SysV shm and message queues, memfds, POSIX message queues)
    being allowed, or refused with an errno a library would not read as "not here"."""
    code = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
x86 = os.uname().machine == "x86_64"
calls = {"keyctl": (250 if x86 else 219, 0, -3), "add_key": (248 if x86 else 217, b"user", b"k", b"v", 1, -3),
         "shmget": (29 if x86 else 194, 0, 4096, 0o1600), "msgget": (68 if x86 else 186, 0, 0o1600),
         "memfd_create": (319 if x86 else 279, b"m", 0)}
for name, args in calls.items():
    print(name, libc.syscall(*args), errno.errorcode[ctypes.get_errno()])
print("mq_open", libc.mq_open(b"/q", os.O_CREAT | os.O_RDWR, 0o600, None), errno.errorcode[ctypes.get_errno()])
for path in ("/proc/keys", "/proc/key-users"):
    try:
        print(repr(open(path).read()))
    except PermissionError:
        print("EACCES")
"""
    result = run_python(code)
    masked = ["EACCES"] * 2 if landlock_abi() else ["''"] * 2  # unreadable with Landlock, else /dev/null
    assert result.stdout.splitlines() == [
        "keyctl -1 EPERM",
        "add_key -1 EPERM",
        "shmget -1 ENOSYS",
        "msgget -1 ENOSYS",
        "memfd_create -1 ENOSYS",
        "mq_open -1 EMFILE",
        *masked,
    ], result


_PROC_PROBE = """
import os, sys
def read(path):
    try:
        return open(path).read()
    except PermissionError:
        return "EACCES"
print(read("/proc/self/mountinfo") == "EACCES", read("/proc/1/mounts") == "EACCES", read("/proc/self/status") == "EACCES")
print(sorted(set(line.split(":")[-1] for line in read("/proc/self/cgroup").splitlines())))
print(read("/proc/cpuinfo").startswith("processor"), os.cpu_count() >= 1, {"1", "2", "self"} <= set(os.listdir("/proc")))
"""


@ROOT_SWITCHES
def test_the_codes_proc_shows_nothing_of_the_caller(pivot_root, monkeypatch):
    """Guards against /proc naming the caller: mountinfo gives each bind mount's root as a host
    path (the interpreter's prefix under a user's home), /proc/self/cgroup the caller's cgroup path
    with its pid. With Landlock every file of /proc but cpuinfo, meminfo and stat is EACCES (the
    directory still lists the sandbox's pids, os.cpu_count() still works); where a kernel has
    none, the cgroup namespace alone still makes /proc/self/cgroup read "/"."""
    from agentic_rl.tools import sandbox_bootstrap, sandbox_supervisor

    if not landlock_abi():
        pytest.skip("this kernel has no Landlock: the mount files stay readable (docs/security.md)")
    monkeypatch.setattr(sandbox_supervisor, "_USE_PIVOT_ROOT", pivot_root)
    result = run_python(_PROC_PROBE)
    assert result.stdout.splitlines() == ["True True True", "['EACCES']", "True True True"], result

    without = sandbox_bootstrap.BOOTSTRAP.replace("    hide_proc_files()  #", "    pass  #")
    assert without != sandbox_bootstrap.BOOTSTRAP
    monkeypatch.setattr(sandbox_supervisor, "BOOTSTRAP", without)  # a kernel without Landlock
    result = run_python(_PROC_PROBE)
    assert result.stdout.splitlines() == ["False False False", "['/']", "True True True"], result


def test_environment_variables_are_not_leaked(outside_dir, monkeypatch):
    """Guards against API keys in the trainer's environment reaching model-written code,
    directly or through /proc/*/environ of processes it can see."""
    monkeypatch.setenv("AGENTIC_RL_TEST_SECRET", "hunter2-env-secret")
    code = """
import os
print(sorted(os.environ))
for pid in os.listdir("/proc"):
    try:
        print(pid, open(f"/proc/{pid}/environ", "rb").read()[:2000])
    except OSError as exc:
        pass
"""
    result = run_python(code, SandboxLimits(max_output_bytes=64000))
    assert result.ok, result
    assert "hunter2-env-secret" not in result.stdout
    visible = set(ast.literal_eval(result.stdout.splitlines()[0]))  # a printed list of names
    assert visible - {"LD_LIBRARY_PATH"} == {"HOME", "LANG", "PATH", "TMPDIR"}
    _assert_host_unharmed(outside_dir)


# --------------------------------------------- the hostile list, as root and unprivileged


def _uncontained(report: dict[str, dict]) -> dict[str, dict]:
    return {name: outcome for name, outcome in report.items() if not outcome["contained"]}


@ROOT_SWITCHES
def test_hostile_programs_are_contained_for_this_caller(pivot_root):
    """Guards against the sandbox reaching Unix-socket files (stream, datagram, via a
    socketpair, by raw syscall), abstract sockets, vsock (the VM host), netlink, io_uring,
    the caller's kernel keyring, memory that RLIMIT_AS does not count (System V shared memory
    and message queues, memfds, tmpfs files), writable /proc, /sys and device nodes, files
    outside its dir, or leaving a process behind. Before the seccomp filter and the minimal
    /dev, 8 of the first 19 programs got out; before the keyring and memory rules, 5 of the
    next 7 (reading the caller's key, adding keys, 640 MiB of shm, 540 MiB of memfds, 152 MiB
    of message queues, each under a 512 MiB address-space cap); before the minimal root, 2 of
    the last 2 (host files in sight, the sentinel reachable after a chroot escape). Both ways
    into the root run: pivot_root, and the chroot fallback taken where / is the initramfs."""
    report = sandbox_hostile.probe(pivot_root=pivot_root)
    assert len(report) == len(sandbox_hostile.HOSTILE) >= 28
    assert _uncontained(report) == {}


_UNPRIVILEGED_HARNESS = r"""
set -e
# In this private mount namespace only: make the interpreter's prefix reachable for uid 65534
# when it sits under a 0700 home (pyenv under /root), without changing any permission.
if [ -n "$HIDDEN_TOP" ]; then
    mount -t tmpfs tmpfs /mnt && mkdir /mnt/hold && mount --bind "$HIDDEN_TOP" /mnt/hold
    mount -t tmpfs -o mode=755 tmpfs "$(dirname "$HIDDEN_TOP")"
    mkdir -p "$HIDDEN_TOP" && mount --move /mnt/hold "$HIDDEN_TOP"
fi
exec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all "$@"
"""


def _first_hidden_directory(path: str) -> str | None:
    """The child of the first ancestor of `path` that others cannot traverse (/root/.pyenv
    for /root/.pyenv/versions/3.11.7), or None when `path` is reachable by any user."""
    parts = os.path.realpath(path).split(os.sep)
    for depth in range(1, len(parts)):
        ancestor = os.sep.join(parts[:depth]) or os.sep
        if not os.stat(ancestor).st_mode & 0o001:
            return os.sep.join(parts[: depth + 1])
    return None


@pytest.mark.skipif(
    not IS_ROOT or not (shutil.which("unshare") and shutil.which("setpriv")),
    reason="needs root (to become uid 65534) and util-linux unshare/setpriv",
)
@ROOT_SWITCHES
def test_hostile_programs_are_contained_for_an_unprivileged_caller(pivot_root):
    """Guards against the rootless path (user namespace, the worker keeps the caller's uid)
    being weaker: there the code could reach the caller's own 0600 socket. The same hostile
    list runs with the trainer itself as uid 65534."""
    import subprocess
    import sys

    from agentic_rl.tools import python_sandbox

    src_dir = os.path.dirname(os.path.dirname(os.path.dirname(python_sandbox.__file__)))  # .../src
    if any(_first_hidden_directory(p) for p in (sys.prefix, src_dir, os.path.dirname(__file__))):
        pytest.skip("the venv or the repository is not readable by other users")
    env = {
        **os.environ,
        "HIDDEN_TOP": _first_hidden_directory(sys.base_prefix) or "",
        "PYTHONPATH": os.pathsep.join([src_dir, os.environ.get("PYTHONPATH", "")]),
    }
    completed = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            _UNPRIVILEGED_HARNESS,
            "sh",
            sys.executable,
            os.path.join(os.path.dirname(__file__), "sandbox_hostile.py"),
            *([] if pivot_root else ["/var/tmp", "--chroot"]),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = [json.loads(line) for line in completed.stdout.splitlines()]
    assert {row["uid"] for row in rows} == {65534}
    assert [row["name"] for row in rows] == list(sandbox_hostile.HOSTILE)
    assert [row for row in rows if not row["contained"]] == []


def test_failed_calls_are_tool_errors_and_the_cli_says_so():
    """Guards against a traceback, timeout, MemoryError or non-zero exit counting as a
    successful call (inflating tool_success_rate and the tool rewards), and against
    `agentic-rl tools run python --code '1/0'` printing "ok": true."""
    import subprocess
    import sys

    for code in ("1/0", "import sys; sys.exit(2)", "bytearray(4 * 10**9)"):
        assert _failed_call(code)
    completed = subprocess.run(
        [sys.executable, "-m", "agentic_rl.cli", "tools", "run", "python", "--code", "1/0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    payload = json.loads(completed.stdout.strip().splitlines()[-1])
    assert (completed.returncode, payload["ok"]) == (1, False)
    assert payload["error"].endswith("ZeroDivisionError: division by zero")


def test_a_host_without_a_sandbox_fails_once_when_the_tool_is_made(monkeypatch):
    """Guards against a sandbox that cannot start (rootless, no user namespaces) being found
    one call at a time while training goes on with a dead tool: creating the tool raises."""
    from agentic_rl.tools import python_sandbox
    from agentic_rl.tools.python_sandbox import SandboxResult, SandboxUnavailable

    broken = SandboxResult(
        False, "", "", "sandbox_error", "sandbox setup failed: unshare: Operation not permitted", None, 0.0
    )
    monkeypatch.setattr(python_sandbox, "run_python", lambda code, limits=None: broken)
    python_sandbox.check_sandbox.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="unshare: Operation not permitted.*user namespaces"):
            get_tool("python")
        with pytest.raises(SandboxUnavailable):
            python("print(1)")  # a later per-call failure is not an observation either
    finally:
        python_sandbox.check_sandbox.cache_clear()
