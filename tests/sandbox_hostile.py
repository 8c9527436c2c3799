"""Hostile programs for the python sandbox, with the host-side bait each one goes for.

    python tests/sandbox_hostile.py [BAIT_DIR] [--chroot]   # all of them, one JSON line each

`tests/test_python_sandbox.py` runs `probe()` in-process (as this test's user, root in CI) and
runs this file as a script under an unprivileged uid, so both callers face the same list.

Each program prints ESCAPED when its attack worked. A program is *contained* when it did not
print ESCAPED and the host side saw nothing: no connection or datagram reached a listener, the
sentinel file is unchanged, nothing new appeared next to it, and no process it started is left.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
import tempfile
import time
import uuid

from agentic_rl.tools import sandbox_supervisor
from agentic_rl.tools.python_sandbox import SandboxLimits, run_python
from agentic_rl.tools.sandbox_landlock import landlock_abi
from agentic_rl.tools.sandbox_memory import cgroups_available

# {name: code}; the code is formatted with the bait's paths and addresses (see `_bait`).
HOSTILE = {
    "unix_stream_socket_file": """
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect({stream_path!r}); s.sendall(b"hello"); print("ESCAPED", s.recv(10))""",
    "unix_dgram_socket_file": """
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(b"hello", {dgram_path!r}); print("ESCAPED")""",
    "unix_dgram_via_socketpair": """
import socket
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
a.sendto(b"hello", {dgram_path!r}); print("ESCAPED")""",
    "unix_stream_socketpair_reconnect": """
import socket
a, b = socket.socketpair()
try:
    a.connect({stream_path!r}); print("ESCAPED")
except OSError as exc:
    a.sendto(b"hello", {dgram_path!r}); print("ESCAPED")""",
    "unix_abstract_socket": """
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect({abstract_name!r}); s.sendall(b"hello"); print("ESCAPED")""",
    "unix_socket_by_raw_syscall": """
import ctypes, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(41, 1, 1, 0)  # x86_64 socket(AF_UNIX, SOCK_STREAM, 0)
if fd < 0:
    fd = libc.syscall(198, 1, 1, 0)  # aarch64
if fd >= 0:
    s = socket.socket(fileno=fd); s.connect({stream_path!r}); s.sendall(b"hello"); print("ESCAPED")""",
    "tcp_localhost": """
import socket
socket.create_connection(("127.0.0.1", {tcp_port}), timeout=1).sendall(b"hello"); print("ESCAPED")""",
    "udp_localhost": """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b"hello", ("127.0.0.1", {udp_port})); print("ESCAPED")""",
    "vsock_to_the_vm_host": """
import socket
s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
s.settimeout(1)
try:
    s.connect((2, 22)); print("ESCAPED")
except (ConnectionResetError, ConnectionRefusedError):
    print("ESCAPED: the VM host answered")""",
    "netlink_socket": """
import socket
socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); print("ESCAPED")""",
    "io_uring_setup": """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
if libc.syscall(425, 4, params) >= 0:
    print("ESCAPED")""",
    "keyring_read_the_callers_key": """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
# (add_key, request_key, keyctl) on x86_64, then aarch64
for add_key, request_key, keyctl in ((248, 249, 250), (217, 218, 219)):
    key = libc.syscall(keyctl, 10, -3, b"user", {key_description!r}.encode(), 0)  # KEYCTL_SEARCH @s
    if key >= 0:
        buffer = ctypes.create_string_buffer(256)
        size = libc.syscall(keyctl, 11, key, buffer, 256)  # KEYCTL_READ
        print("ESCAPED", buffer.raw[:max(size, 0)])
        break
try:
    if {key_description!r} in open("/proc/keys").read():
        print("ESCAPED: /proc/keys lists the caller's key")
except OSError:
    pass""",
    "keyring_add_a_key": """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for add_key, keyctl in ((248, 250), (217, 219)):
    for ring in (-3, -4, -5):  # the session, user and user-session keyrings
        if libc.syscall(add_key, b"user", b"sandbox-added", b"x", 1, ring) >= 0:
            print("ESCAPED: added a key to keyring", ring)
    if libc.syscall(keyctl, 1, b"sandbox-session") >= 0:  # KEYCTL_JOIN_SESSION_KEYRING
        print("ESCAPED: joined a new session keyring")""",
    "memory_sysv_shm_beyond_the_address_space_cap": """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
chunk, held = 64 << 20, 0
while held <= {memory_bytes} + chunk:
    segment = libc.shmget(0, chunk, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    if segment < 0:
        break
    address = libc.shmat(segment, None, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        break
    ctypes.memset(address, 1, chunk)  # the pages are really held
    libc.shmdt(ctypes.c_void_p(address))  # detached: no longer in the address space
    held += chunk
if held > {memory_bytes}:
    print("ESCAPED: holds", held >> 20, "MiB of System V shared memory")""",
    "memory_memfd_beyond_the_address_space_cap": """
import os
chunk, held, fds = 15 << 20, 0, []
block = b"1" * chunk
while held <= {memory_bytes} + chunk:
    try:
        fd = os.memfd_create("hold")
        os.write(fd, block)
    except OSError:
        break
    fds.append(fd)
    held += chunk
if held > {memory_bytes}:
    print("ESCAPED: holds", held >> 20, "MiB in memfds")""",
    "memory_sysv_message_queues": """
import ctypes, struct
libc = ctypes.CDLL(None, use_errno=True)
message = ctypes.create_string_buffer(struct.pack("l", 1) + b"x" * 8000)  # mtype 1, the text
held = 0
for _ in range(20000):
    queue = libc.msgget(0, 0o1600)
    if queue < 0 or libc.msgsnd(queue, message, 8000, 0o4000) != 0:  # IPC_NOWAIT
        break
    held += 8000
if held > 64 << 20:
    print("ESCAPED: holds", held >> 20, "MiB in message queues")""",
    "memory_tmpfs_in_own_mount_namespace": """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000 | 0x00020000) == 0:  # CLONE_NEWUSER | CLONE_NEWNS
    if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"size=4g") == 0:
        chunk, held = 15 << 20, 0
        block = b"1" * chunk
        try:
            while held <= {memory_bytes} + chunk:
                with open(f"/dev/shm/{{held}}", "wb") as f:
                    f.write(block)
                held += chunk
        except OSError:
            pass
        if held > {memory_bytes}:
            print("ESCAPED: holds", held >> 20, "MiB in a tmpfs of its own")""",
    "memory_socket_queues_raised": """
import array, fcntl, socket
pairs, queued = [], 0
for _ in range(29):
    a, b = socket.socketpair()
    for sock, option in ((a, socket.SO_SNDBUF), (b, socket.SO_RCVBUF), (a, 32), (b, 33)):  # 32, 33: *FORCE
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, 1 << 30)
        except OSError:
            pass
    a.setblocking(False)
    try:
        while True:
            a.send(b"x" * 65536)
    except OSError:
        pass
    size = array.array("i", [0])
    fcntl.ioctl(a.fileno(), 0x5411, size)  # SIOCOUTQ: the bytes this socket holds in the kernel
    queued += size[0]
    pairs.append((a, b))
# At the host's default buffer a socket holds wmem_default, plus one send's overshoot.
if queued > 29 * ({wmem_default} + 65536 + 4096):
    print("ESCAPED: holds", queued >> 20, "MiB in 29 socket queues")""",
    "memory_pipes_resized": """
import fcntl, os
r, w = os.pipe()
try:
    fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
except OSError:
    pass
if fcntl.fcntl(w, 1032) > 65536:  # F_GETPIPE_SZ
    print("ESCAPED: a pipe of", fcntl.fcntl(w, 1032) >> 10, "KiB")""",
    "memory_processes_add_up": """
import os, select, signal, time
chunk = 150 << 20  # under the per-process cap: each alone may hold it
r, w = os.pipe()
children = []
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        block = bytearray(chunk)
        for i in range(0, chunk, 4096):
            block[i] = 1
        os.write(w, b"1")
        time.sleep(30)  # hold it until the count below
        os._exit(0)
    children.append(pid)
os.close(w)
reported, dead = 0, set()
deadline = time.monotonic() + 4
while reported + len(dead) < 6 and time.monotonic() < deadline:  # each holds, or died trying
    if select.select([r], [], [], 0.05)[0]:
        reported += len(os.read(r, 6))
    dead |= {{pid for pid in children if pid not in dead and os.waitpid(pid, os.WNOHANG)[0]}}
holding = [pid for pid in children if pid not in dead and os.waitpid(pid, os.WNOHANG)[0] == 0]
held = min(reported, len(holding)) * chunk  # the live ones that finished, at this moment
for pid in holding:
    os.kill(pid, signal.SIGKILL)
# With a cgroup the call holds memory_bytes in all; without, each process holds memory_bytes.
if held > ({memory_bytes} if {capped} else 16 * {memory_bytes}):
    print("ESCAPED: 6 processes held", held >> 20, "MiB at once")""",
    "user_namespace_of_its_own": """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000) == 0:  # CLONE_NEWUSER: every capability, CAP_SYS_CHROOT included
    print("ESCAPED: unshare(CLONE_NEWUSER)")
child = libc.syscall(56 if os.uname().machine == "x86_64" else 220, 0x10000000 | 17, 0, 0, 0, 0)
if child == 0:  # 17 = SIGCHLD: a fork into a user namespace of its own
    os._exit(0)
if child > 0:
    print("ESCAPED: clone(CLONE_NEWUSER)")
if libc.syscall(435, 0, 0) != -1 or ctypes.get_errno() != 38:
    print("ESCAPED: clone3 is not ENOSYS")""",
    "proc_shows_the_caller": """
import os
# The caller's interpreter, its prefix (a bind mount's root in mountinfo), the bootstrap's
# source, and the caller's pid in its memory cgroup's path. Without Landlock the mount files
# still name the prefix (sandbox_landlock.py): they are checked where the kernel has it.
files = ["cmdline", "environ", "comm", "cgroup", "maps"] + (["mountinfo", "mounts", "mountstats"] if {landlock} else [])
for pid in filter(str.isdigit, os.listdir("/proc")):
    for name in files:
        try:
            text = open(f"/proc/{{pid}}/{{name}}", "rb").read()
        except OSError:
            continue
        for secret in ({caller_executable!r}, {caller_prefix!r}, "def enter_root", "agentic-rl-{caller_pid}"):
            if secret.encode() in text:
                print("ESCAPED: /proc", pid, name, "shows", secret)""",
    "memory_work_dir_and_dev_shm_files": """
chunk, held = 1 << 20, 0
block = b"1" * chunk
for folder in (".", "/dev/shm"):
    for index in range(600):
        try:
            with open(f"{{folder}}/fill{{index}}", "wb") as f:
                f.write(block)
        except OSError:
            break
        held += chunk
if held > 64 << 20:
    print("ESCAPED: holds", held >> 20, "MiB in tmpfs files")""",
    "host_files_are_out_of_sight": """
import os
for path in ({sentinel!r}, {outside!r}, {source_dir!r}, "/var/tmp", "/home", "/root", "/etc/passwd",
             "/etc/hostname", "/.dockerenv", "/run", "/sys/kernel", "/boot", "/mnt", "/opt", "/srv"):
    if os.path.lexists(path):
        print("ESCAPED: sees", path)""",
    "escape_the_root": """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.unshare(0x10000000)  # CLONE_NEWUSER: every capability, in a user namespace of its own
try:  # the classic chroot escape: chroot into a subdirectory, climb out, chroot there
    os.mkdir("jail"); os.chroot("jail")
    for _ in range(30):
        os.chdir("..")
    os.chroot(".")
except OSError:
    pass
for path in ({sentinel!r}, "/proc/1/root" + {sentinel!r}, "/proc/1/cwd/" + {sentinel!r}):
    if os.path.lexists(path):
        print("ESCAPED: sees", path)""",
    "overwrite_sentinel": """
open({sentinel!r}, "w").write("pwned"); print("ESCAPED")""",
    "create_file_next_to_sentinel": """
import os
open(os.path.join({outside!r}, "new.txt"), "w").write("x"); print("ESCAPED")""",
    "remount_writable_in_own_user_namespace": """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
    raise OSError(ctypes.get_errno(), "unshare")
MS_REMOUNT, MS_BIND = 32, 4096
for target in (b"/", {outside!r}.encode(), b"/var/tmp", b"/var", b"/tmp"):
    libc.mount(None, target, None, MS_REMOUNT | MS_BIND, None)
open({sentinel!r}, "w").write("pwned"); print("ESCAPED")""",
    "proc_sys_write": """
for path in ("/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger",
             "/proc/self/oom_score_adj", "/proc/1/comm"):
    try:
        open(path, "w").write("1"); print("ESCAPED", path)
    except OSError:
        pass""",
    "sys_write": """
import glob
for path in ["/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/uevent_helper",
             *glob.glob("/sys/fs/cgroup/*")[:20], *glob.glob("/sys/class/net/*/mtu")]:
    try:
        open(path, "w").write("1"); print("ESCAPED", path)
    except OSError:
        pass""",
    "device_write": """
import glob
for path in ["/dev/tty", "/dev/console", "/dev/kmsg", "/dev/vsock", "/dev/vda", "/dev/mem",
             *glob.glob("/dev/pts/*"), *glob.glob("/dev/tty*")]:
    try:
        open(path, "w").write("1"); print("ESCAPED", path)
    except OSError:
        pass""",
    "detached_daemon_outlives_the_call": """
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(30)", {marker!r}])
    os._exit(0)
import time; time.sleep(0.2)""",
    "signal_the_caller": """
import os, signal
for pid in ({caller_pid}, -1, 1):
    try:
        os.kill(pid, 0); os.kill(pid, signal.SIGSTOP) if pid == {caller_pid} else None
        if pid == {caller_pid}: print("ESCAPED")
    except OSError:
        pass""",
}


# (add_key, keyctl) syscall numbers, and the keyctl operations the bait uses.
_KEY_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}
_KEY_SPEC_SESSION_KEYRING, _KEYCTL_UNLINK = -3, 9
_KEY_SECRET = b"keyring-secret-of-the-caller"


def _add_bait_key(description: str) -> int | None:
    """Put a secret in this process's session keyring, as a trainer's credentials might be
    (a session keyring is installed if there is none); its key id, or None if refused here."""
    add_key, _ = _KEY_SYSCALLS[os.uname().machine]
    libc = ctypes.CDLL(None, use_errno=True)
    key = libc.syscall(add_key, b"user", description.encode(), _KEY_SECRET, len(_KEY_SECRET), _KEY_SPEC_SESSION_KEYRING)
    return key if key >= 0 else None


def _remove_bait_key(key: int | None) -> None:
    if key is not None:
        _, keyctl = _KEY_SYSCALLS[os.uname().machine]
        ctypes.CDLL(None, use_errno=True).syscall(keyctl, _KEYCTL_UNLINK, key, _KEY_SPEC_SESSION_KEYRING)


def keyring_users() -> set[int]:
    """The uids that own keys or keyrings now (/proc/key-users; as root it lists every uid)."""
    try:
        with open("/proc/key-users") as f:
            return {int(line.split(":")[0]) for line in f}
    except OSError:
        return set()


def _bait(root: str) -> tuple[dict, dict]:
    """Listeners and files the programs go for, in a world-writable dir under `root`."""
    outside = tempfile.mkdtemp(prefix="sandbox-bait-", dir=root)
    os.chmod(outside, 0o777)
    sentinel = os.path.join(outside, "sentinel.txt")
    with open(sentinel, "w") as f:
        f.write("sentinel\n")
    os.chmod(sentinel, 0o666)  # only the sandbox's mounts protect it
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stream_path = os.path.join(outside, "stream.sock")
    stream.bind(stream_path)
    stream.listen(4)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dgram_path = os.path.join(outside, "dgram.sock")
    dgram.bind(dgram_path)
    for path in (stream_path, dgram_path):
        os.chmod(path, 0o777)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract_name = f"\0agentic-rl-bait-{uuid.uuid4().hex}"
    abstract.bind(abstract_name)
    abstract.listen(4)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    listeners = {"stream": stream, "dgram": dgram, "abstract": abstract, "tcp": tcp, "udp": udp}
    for listener in listeners.values():
        listener.setblocking(False)
    values = {
        "outside": outside,
        "sentinel": sentinel,
        "stream_path": stream_path,
        "dgram_path": dgram_path,
        "abstract_name": abstract_name,
        "tcp_port": tcp.getsockname()[1],
        "udp_port": udp.getsockname()[1],
        "caller_pid": os.getpid(),
        "memory_bytes": SandboxLimits().memory_bytes,
        "key_description": f"agentic-rl-bait-{uuid.uuid4().hex}",
        "source_dir": os.path.dirname(os.path.abspath(__file__)),
        "capped": cgroups_available(),
        "caller_executable": os.path.realpath(sys.executable),
        "caller_prefix": os.path.realpath(sys.base_prefix),
        "landlock": landlock_abi() > 0,
        "wmem_default": int(open("/proc/sys/net/core/wmem_default").read()),
    }
    return values, listeners


def _host_saw_something(listeners: dict) -> list[str]:
    """Names of listeners that received a connection or a datagram."""
    hits = []
    for name, listener in listeners.items():
        try:
            if listener.type == socket.SOCK_STREAM:
                listener.accept()[0].close()
            else:
                listener.recv(100)
            hits.append(name)
        except (BlockingIOError, InterruptedError):
            pass
    return hits


def live_processes_with(marker: str) -> list[int]:
    """Pids of live processes whose command line contains `marker` (zombies have none)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def probe(root: str = "/var/tmp", pivot_root: bool = True) -> dict[str, dict]:
    """Run every hostile program; {name: {"contained": bool, "why": ..., "stdout": ...}}.

    pivot_root=False runs them in the chroot fallback of sandbox_root.py, which the sandbox
    takes where the host's / is the initramfs.
    """
    sandbox_supervisor._USE_PIVOT_ROOT = pivot_root
    values, listeners = _bait(root)
    limits = SandboxLimits(timeout_s=5.0)
    assert limits.memory_bytes == values["memory_bytes"]  # what the memory programs go beyond
    report = {}
    bait_key = _add_bait_key(values["key_description"])
    try:
        for name, template in HOSTILE.items():
            marker = f"sandbox-marker-{uuid.uuid4().hex}"
            keyring_users_before = keyring_users()
            result = run_python(template.format(marker=marker, **values), limits)
            time.sleep(0.01)  # let a datagram or connection that got out land
            problems = []
            if result.exit_reason == "sandbox_error":
                problems.append(f"sandbox_error: {result.error}")
            if "ESCAPED" in result.stdout:
                problems.append("printed ESCAPED")
            problems += [f"{hit} listener reached" for hit in _host_saw_something(listeners)]
            with open(values["sentinel"]) as f:
                if f.read() != "sentinel\n":
                    problems.append("sentinel changed")
            extra = sorted(set(os.listdir(values["outside"])) - {"sentinel.txt", "stream.sock", "dgram.sock"})
            if extra:
                problems.append(f"new files {extra}")
            if _KEY_SECRET.decode() in result.stdout:
                problems.append("read the caller's key")
            if keyring_users() - keyring_users_before:
                problems.append(f"keys left behind by uids {sorted(keyring_users() - keyring_users_before)}")
            if live_processes_with(marker):
                problems.append("a process outlived the call")
            report[name] = {
                "contained": not problems,
                "why": problems,
                "stdout": result.stdout[-300:],
                "error": result.error[-300:],
            }
    finally:
        sandbox_supervisor._USE_PIVOT_ROOT = True
        _remove_bait_key(bait_key)
        for listener in listeners.values():
            listener.close()
        for entry in os.listdir(values["outside"]):
            os.unlink(os.path.join(values["outside"], entry))
        os.rmdir(values["outside"])
    return report


if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if a != "--chroot"]
    report = probe(arguments[0] if arguments else "/var/tmp", pivot_root="--chroot" not in sys.argv)
    for name, outcome in report.items():
        print(json.dumps({"name": name, "uid": os.getuid(), **outcome}))
