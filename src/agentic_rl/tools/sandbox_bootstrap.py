"""The bootstrap: the program that builds the sandbox around the model's code, and its protocol.

`BOOTSTRAP` is Python source, run by the caller as `python -I -S -c BOOTSTRAP STATUS_FD`
(sandbox_supervisor.py). It imports only the standard library, so it starts in ~20 ms and
needs nothing of ours to be importable; and because it is a fresh interpreter rather than a
`preexec_fn`, no Python code runs between fork and exec in the caller, which is what makes
concurrent calls from a thread pool safe.

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

BOOTSTRAP = r'''
import ctypes, json, os, re, resource, signal, sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
# Flags a remount must keep: in a user namespace the kernel locks them (EPERM otherwise).
KEEP = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
        "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2
MNT_DETACH = 2
DEV_NODES = ("null", "zero", "full", "random", "urandom")
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_char_p]

def check(ret, what):
    if ret != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")

def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
          f"mount {fstype or source} on {target}")

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

def enter_namespaces(cfg):
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if not cfg["is_root"]:
        flags |= CLONE_NEWUSER
    check(libc.unshare(flags), "unshare")
    if not cfg["is_root"]:
        # Identity map: the worker keeps its uid, and its capabilities in this user
        # namespace vanish at exec (non-zero uid).
        for name, text in (("setgroups", "deny"), ("uid_map", f"{cfg['uid']} {cfg['uid']} 1"),
                           ("gid_map", f"{cfg['gid']} {cfg['gid']} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)

def read_only_mounts():
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount may leak to the host
    with open("/proc/self/mountinfo") as f:
        entries = [line.split() for line in f]
    for fields in entries:
        # The kernel escapes space, tab, newline and backslash as octal, e.g. \040.
        target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        options = fields[5].split(",")
        if "ro" in options:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in options:
            flags |= KEEP.get(option, 0)
        mount(None, target, None, flags)

def minimal_dev(shm_size):
    # A fresh /dev with only the harmless nodes: the host's /dev holds terminals the caller
    # owns (unprivileged, the code could write to the user's tty), disks, kmsg and vsock.
    os.mkdir("/tmp/hostdev")
    mount("/dev", "/tmp/hostdev", None, MS_BIND | MS_REC)
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in DEV_NODES:
        open(f"/dev/{name}", "w").close()  # the mount point
        mount(f"/tmp/hostdev/{name}", f"/dev/{name}", None, MS_BIND)
    check(libc.umount2(b"/tmp/hostdev", MNT_DETACH), "umount /tmp/hostdev")
    os.rmdir("/tmp/hostdev")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{name}")
    os.mkdir("/dev/shm")
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={shm_size},mode=1777")
    mount(None, "/dev", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)

def prepare_filesystem(cfg, code):
    read_only_mounts()
    # This pid namespace's processes only, and read-only: no /proc/self/* knob is writable.
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
    # A private, tiny, read-only /tmp holds just the two fixed mount points.
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
    for path in (cfg["work_dir"], cfg["bound_prefix"]):
        if path:
            os.mkdir(path)
    owner = f"uid={cfg['uid']},gid={cfg['gid']}"
    size = cfg["max_file_bytes"]
    mount("tmpfs", cfg["work_dir"], "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=0700,{owner}")
    minimal_dev(size)
    if cfg["prefix"]:
        mount(cfg["prefix"], cfg["bound_prefix"], None, MS_BIND | MS_REC)
        mount(None, cfg["bound_prefix"], None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
    # Read-only from now on: unprivileged, the worker would own this tmpfs and could write.
    mount(None, "/tmp", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    main = os.path.join(cfg["work_dir"], "main.py")
    with open(main, "wb") as f:
        f.write(code)
    os.chown(main, cfg["uid"], cfg["gid"])

# seccomp: socket() only for AF_INET/AF_INET6 (useless in the empty network namespace; they
# fail with ENETUNREACH as on a machine without network), socketpair() only SOCK_STREAM (a
# connected pair that cannot be re-pointed: asyncio needs it), io_uring refused (its
# operations would bypass this filter). Everything else is allowed. Unix sockets (path or
# abstract), netlink, vsock (the VM host), packet sockets: EACCES at socket().
# (audit arch, socket, socketpair, io_uring_setup..register, x32 bit or 0)
SYSCALLS = {"x86_64": (0xC000003E, 41, 53, (425, 426, 427), 0x40000000),
            "aarch64": (0xC00000B7, 198, 199, (425, 426, 427), 0)}
AF_INET, AF_INET6, SOCK_STREAM, SOCK_TYPE_MASK, EACCES = 2, 10, 1, 0xF, 13
RET_ALLOW, RET_ERRNO, RET_KILL = 0x7FFF0000, 0x00050000, 0x80000000

def seccomp_filter(machine):
    import struct
    if machine not in SYSCALLS:
        raise OSError(f"no socket filter for CPU architecture {machine!r}; the sandbox supports "
                      f"{sorted(SYSCALLS)}")
    arch, nr_socket, nr_socketpair, nr_uring, x32 = SYSCALLS[machine]
    LD, JEQ, JGE, AND, RET = 0x20, 0x15, 0x35, 0x54, 0x06
    deny = RET_ERRNO | EACCES
    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, arch), (RET, 0, 0, RET_KILL),  # a foreign ABI: kill
            (LD, 0, 0, 0)]
    if x32:
        prog += [(JGE, 0, 1, x32), (RET, 0, 0, RET_KILL)]
    for nr in nr_uring:
        prog += [(JEQ, 0, 1, nr), (RET, 0, 0, deny)]
    prog += [(JEQ, 0, 5, nr_socket),                 # not socket(): to socketpair's test
             (LD, 0, 0, 16),                           # args[0], low word: the family
             (JEQ, 1, 0, AF_INET), (JEQ, 0, 1, AF_INET6),
             (RET, 0, 0, RET_ALLOW), (RET, 0, 0, deny),
             (JEQ, 0, 4, nr_socketpair),               # not socketpair(): allow
             (LD, 0, 0, 24), (AND, 0, 0, SOCK_TYPE_MASK),  # args[1] without NONBLOCK/CLOEXEC
             (JEQ, 1, 0, SOCK_STREAM), (RET, 0, 0, deny),
             (RET, 0, 0, RET_ALLOW)]
    return b"".join(struct.pack("=HBBI", *op) for op in prog)

def install_seccomp():
    code = seccomp_filter(os.uname().machine)
    buffer = ctypes.create_string_buffer(code, len(code))
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    prog = Prog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    zero = ctypes.c_ulong(0)
    check(libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog),
                     zero, zero), "seccomp")

def exec_worker(cfg, status_fd, nproc):
    os.setsid()  # killpg(0, ...) from the code now reaches only its own group
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.chdir(cfg["work_dir"])
    for limit, value in ((resource.RLIMIT_AS, cfg["memory_bytes"]),
                         (resource.RLIMIT_NPROC, nproc),
                         (resource.RLIMIT_FSIZE, cfg["max_file_bytes"]),
                         (resource.RLIMIT_NOFILE, cfg["max_open_files"]),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_seconds"], cfg["cpu_seconds"] + 1))
    if cfg["is_root"]:
        os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])  # drops every capability
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    install_seccomp()  # last: from here on, no socket but AF_INET/6 (see SYSCALLS)
    os.set_inheritable(status_fd, False)  # closes at exec: EOF on it means "started"
    os.execve(cfg["exe"], [cfg["exe"], "-I", "-S", "-u", "-B", "main.py"], cfg["env"])

def run_init(cfg, code, status_fd, nproc):
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
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
'''
