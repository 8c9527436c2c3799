"""Isolation, the /proc layer: the code reads no file of /proc but a few of the machine's.

`LANDLOCK_SOURCE` is a piece of the bootstrap's source, not code that runs in this process
(sandbox_bootstrap.py joins it to the others; it uses the prelude's `libc` and `check`). The
worker calls `hide_proc_files` after no_new_privs and before the seccomp filter, so it binds the
worker and every process it starts.

Why: the sandbox's /proc is its own (its pid namespace, read-only), yet a process's own files there
describe the caller. /proc/self/mountinfo gives each bind mount's root as a path in the host's
filesystem (the interpreter's prefix: /root/.pyenv/versions/3.11.7, a user's home, a venv), and
no mount option changes that; a per-pid file cannot be masked by a bind mount, since the pids are
made as the code forks. Landlock (Linux 5.13+) can refuse them: a ruleset that handles reading
files (LANDLOCK_ACCESS_FS_READ_FILE) allows it beneath each top-level entry of the sandbox's root
but /proc, and on /proc's `PROC_READABLE` files, so every other file of /proc (mountinfo, mounts,
mountstats, maps, status, cgroup, environ, cmdline of every pid) is EACCES. Listing directories is
not handled: `os.listdir("/proc")` still shows the sandbox's pids. /dev/stdout and the other links
through /proc/self/fd still open (a pipe is no file of /proc).

Where the kernel has no Landlock (or it is disabled) the worker goes on without it: /proc's files
are readable then, mountinfo's roots included (docs/security.md says so). The rest of what /proc
showed of the caller is closed by other layers on every kernel: init's command line is blanked
(sandbox_bootstrap.py), /proc/self/cgroup reads "/" (a cgroup namespace, sandbox_namespaces.py),
and /proc/keys, /proc/key-users are masked (sandbox_root.py).
"""

import ctypes

LANDLOCK_SOURCE = r"""
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446  # x86_64 and aarch64
LANDLOCK_ACCESS_FS_READ_FILE, LANDLOCK_RULE_PATH_BENEATH = 1 << 2, 1
# The machine's, not the caller's; glibc reads /proc/stat for the processor count where /sys is
# absent, as it is here (os.cpu_count()).
PROC_READABLE = ("cpuinfo", "meminfo", "stat")

class LandlockRuleset(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]

class LandlockPathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

def hide_proc_files():
    handled = LandlockRuleset(LANDLOCK_ACCESS_FS_READ_FILE)
    ruleset = libc.syscall(LANDLOCK_CREATE_RULESET, ctypes.byref(handled), ctypes.sizeof(handled), 0)
    if ruleset < 0:
        return  # no Landlock here (ENOSYS, EOPNOTSUPP): /proc's files stay readable
    try:
        paths = [f"/{name}" for name in os.listdir("/") if name != "proc" and not os.path.islink(f"/{name}")]
        for path in paths + [f"/proc/{name}" for name in PROC_READABLE]:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = LandlockPathBeneath(LANDLOCK_ACCESS_FS_READ_FILE, fd)
                check(libc.syscall(LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0),
                      f"landlock rule for {path}")
            finally:
                os.close(fd)
        check(libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
"""


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers the sandbox's worker, 0 where it has none (the
    worker then reads /proc's files as before: the module docstring)."""
    libc = ctypes.CDLL(None, use_errno=True)
    version = libc.syscall(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(version, 0)
