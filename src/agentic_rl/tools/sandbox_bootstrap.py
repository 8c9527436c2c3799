"""The bootstrap: the program that builds the sandbox around the code, and its protocol.

`BOOTSTRAP` is Python source, run by the caller as `python -I -S -c BOOTSTRAP STATUS_FD`
(sandbox_supervisor.py). It imports only the standard library, so it starts in ~20 ms and
needs nothing of ours to be importable; and because it is a fresh interpreter rather than a
`preexec_fn`, no Python code runs between fork and exec in the caller, which is what makes
concurrent calls from a thread pool safe.

It is put together from pieces that share one global namespace when it runs:

    BOOTSTRAP = PRELUDE             libc (ctypes), check(): raise OSError with errno's text
              + NAMESPACES_SOURCE   the namespaces, host mounts read-only (sandbox_namespaces.py)
              + ROOT_SOURCE         the minimal root the code sees (sandbox_root.py)
              + LANDLOCK_SOURCE     no file of /proc but the machine's (sandbox_landlock.py)
              + SECCOMP_SOURCE      the seccomp filter (sandbox_seccomp.py)
              + PROCESS_SOURCE      the three processes, the worker's limits, main()

The three processes:

    caller ──Popen──► bootstrap (new session, PATH and LANG only, cwd /)
                        │ enter_namespaces: unshare mount, net, pid, ipc, uts, cgroup [+ user if not root]
                        └─fork─► init = pid 1 of the new pid namespace (stays privileged)
                                   │ prepare_filesystem: a minimal tmpfs root (interpreter and
                                   │   libraries bound ro, tmpfs work dir, fresh /proc and /dev),
                                   │   entered by pivot_root (or chroot where / is the initramfs)
                                   └─fork─► worker: setsid, rlimits, drop uid, no_new_privs,
                                            Landlock, seccomp, exec python -I -S -u -B main.py

  - The bootstrap stays in the caller's pid namespace (unshare moves only its children into
    the new one), so the caller can signal it, and it relays init's exit status.
  - init is pid 1: it reaps orphans (a daemon the code double-forks), and when it exits the
    kernel kills every process left in the namespace, which is why nothing outlives a call.
    It keeps its privileges, since it mounts, but never runs the code. PDEATHSIG=SIGKILL ties
    it to the bootstrap. Its command line is blanked first (the code may read /proc/1/cmdline).
  - The bootstrap joins the call's memory cgroup before anything else (cfg "cgroup_procs",
    made by sandbox_memory.py), so every process of the call is counted in it.
  - The worker drops everything, in this order, the seccomp filter last: setsid (a
    killpg(0) from the code reaches only its own group), stdin from /dev/null, the rlimits
    (RLIMIT_AS, NPROC, FSIZE, NOFILE, CORE = 0, MSGQUEUE = 0, and CPU with SIGKILL 1 s
    after SIGXCPU), then
    as root a fresh uid and gid with no supplementary groups (which drops every capability),
    no_new_privs, Landlock (no file of /proc but the machine's), the seccomp filter, and exec. Unprivileged, RLIMIT_NPROC counts all the
    user's tasks, so the cap is the user's current count (`user_tasks`) + max_processes,
    which races with the user's other processes.

Protocol with the caller:
  - stdin: one line of JSON config (built by `_sandbox_config` in sandbox_supervisor.py),
    then the code, up to EOF. Nothing is written to the host's disk.
  - STATUS_FD (argv[1]): a setup failure is written there as "sandbox setup failed: ..." and
    the bootstrap exits with 125. The worker's copy is close-on-exec, so EOF on it with no
    bytes means the code started. The code's stderr never carries setup errors.
  - stdout/stderr: the worker inherits both; they carry only the code's own output.
  - Exit status: the worker's, relayed by init and then the bootstrap (128 + N for death by
    signal N).
  - SIGTERM means "stop": the bootstrap SIGKILLs init, and the kernel kills every process of
    the pid namespace; the bootstrap's wait returns only once they are all gone.
"""

from agentic_rl.tools.sandbox_namespaces import NAMESPACES_SOURCE
from agentic_rl.tools.sandbox_root import ROOT_SOURCE
from agentic_rl.tools.sandbox_landlock import LANDLOCK_SOURCE
from agentic_rl.tools.sandbox_seccomp import SECCOMP_SOURCE

PRELUDE = r"""
import ctypes, os

libc = ctypes.CDLL(None, use_errno=True)

def check(ret, what):
    if ret != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
"""

PROCESS_SOURCE = r"""
import json, resource, signal, sys

PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38

def exit_code(status):
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)

def fail(status_fd, exc):
    os.write(status_fd, f"sandbox setup failed: {exc}".encode())
    os._exit(125)

def user_tasks(uid):
    # Unprivileged RLIMIT_NPROC counts all of the user's tasks, so the cap is relative.
    count = 0
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields["Threads"])
        except (OSError, ValueError, KeyError):
            continue
    return count

def exec_worker(cfg, status_fd, nproc):
    os.setsid()  # killpg(0, ...) from the code now reaches only its own group
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.chdir(cfg["work_dir"])
    for limit, value in ((resource.RLIMIT_AS, cfg["memory_bytes"]),
                         (resource.RLIMIT_NPROC, nproc),
                         (resource.RLIMIT_FSIZE, cfg["max_file_bytes"]),
                         (resource.RLIMIT_NOFILE, cfg["max_open_files"]),
                         (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_MSGQUEUE, 0)):  # no POSIX message queue memory
        resource.setrlimit(limit, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_seconds"], cfg["cpu_seconds"] + 1))
    if cfg["is_root"]:
        os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])  # drops every capability
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    hide_proc_files()  # no file of /proc but the machine's (sandbox_landlock.py)
    install_seccomp()  # last: no socket but AF_INET/6, no keyring, no shm (sandbox_seccomp.py)
    os.set_inheritable(status_fd, False)  # closes at exec: EOF on it means "started"
    os.execve(cfg["exe"], [cfg["exe"], "-I", "-S", "-u", "-B", "main.py"], cfg["env"])

def blank_command_line():
    # init is pid 1 of the code's /proc, and /proc/1/cmdline anyone may read: it would show the
    # caller's interpreter path and this whole program. The argument area (fields 48-49 of
    # /proc/self/stat) is init's own memory; zeroed, cmdline reads "sandbox-init".
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])
    ctypes.memset(start, 0, end - start)
    ctypes.memmove(start, b"sandbox-init", min(12, end - start - 1))

def run_init(cfg, code, status_fd, nproc):
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        blank_command_line()
        prepare_filesystem(cfg, code)
        worker = os.fork()
        if worker == 0:
            exec_worker(cfg, status_fd, nproc)
    except BaseException as exc:
        fail(status_fd, exc)
    os.close(status_fd)
    while True:  # pid 1 reaps orphans; when the worker exits, the namespace dies with us
        pid, status = os.wait()
        if pid == worker:
            os._exit(exit_code(status))

def main():
    status_fd = int(sys.argv[1])
    cfg = json.loads(sys.stdin.buffer.readline())
    code = sys.stdin.buffer.read()
    try:
        if cfg["cgroup_procs"]:  # the call's memory cgroup (sandbox_memory.py): every process after
            with open(cfg["cgroup_procs"], "w") as f:
                f.write(str(os.getpid()))
        nproc = cfg["max_processes"] + (0 if cfg["is_root"] else user_tasks(cfg["uid"]))
        enter_namespaces(cfg)
        init = os.fork()
    except BaseException as exc:
        fail(status_fd, exc)
    if init == 0:
        run_init(cfg, code, status_fd, nproc)
    os.close(status_fd)
    # The caller's SIGTERM means "stop": kill init, then wait, which returns only once the
    # kernel has killed and reaped every process of the pid namespace.
    signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(init, signal.SIGKILL))
    _, status = os.waitpid(init, 0)
    os._exit(exit_code(status))

main()
"""

BOOTSTRAP = PRELUDE + NAMESPACES_SOURCE + ROOT_SOURCE + LANDLOCK_SOURCE + SECCOMP_SOURCE + PROCESS_SOURCE
