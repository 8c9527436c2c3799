"""Isolation, first layer: the namespaces the sandbox lives in, and the filesystem it sees.

`NAMESPACES_SOURCE` is a piece of the bootstrap's source, not code that runs in this process:
sandbox_bootstrap.py joins it to the others and runs the whole as one program (it uses the
prelude's `libc` and `check`). The bootstrap calls `enter_namespaces` before it forks init;
init calls `prepare_filesystem` before it forks the worker. Every mount below is made in the
sandbox's private mount namespace, so it vanishes with it and is never seen by the host.

Namespaces (one `unshare`):
  - mount: private, and / is made MS_PRIVATE first so no mount propagates back to the host.
  - net: empty, loopback down, and with no abstract Unix sockets of the host.
  - pid: the code sees only this sandbox's processes; init is pid 1, and when init dies the
    kernel kills everything left in the namespace.
  - ipc, uts: no System V IPC objects or hostname shared with the host.
  - user, only when the caller is not root: it is what lets an unprivileged caller create the
    others. The uid/gid map is the identity, so the worker keeps the caller's uid and, with
    a non-zero uid, loses the namespace's capabilities at exec.

The filesystem, as `prepare_filesystem` leaves it:

    /            every mount of the host remounted read-only (keeping the flags a user
                 namespace locks: nosuid, nodev, noexec, atime flags)
    /proc        a fresh proc of this pid namespace, read-only: no /proc/self knob is writable;
                 /proc/keys and /proc/key-users (not namespaced) masked by /dev/null
    /tmp         a 64 KiB tmpfs, read-only once set up, holding only the two mount points
      work       the work dir: tmpfs of max_file_bytes, mode 0700, owned by the worker's uid,
                 holding main.py (the code)
      python     the interpreter's prefix, bound read-only when the interpreter lives under
                 it: it may live where the worker's uid cannot go (pyenv under /root, 0700)
    /dev         a read-only tmpfs with only null, zero, full, random and urandom (bound from
                 the host), the fd/stdin/stdout/stderr links, and /dev/shm (tmpfs of
                 max_file_bytes)

So the only writable places are the work dir and /dev/shm, both size-capped and gone with the
namespace. /dev has no terminal, disk, kmsg or vsock node: unprivileged, the code could
otherwise write to the caller's own tty. Reading world-readable files stays possible (see the
threat model in python_sandbox.py).
"""

NAMESPACES_SOURCE = r'''
import re

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
# Flags a remount must keep: in a user namespace the kernel locks them (EPERM otherwise).
KEEP = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
        "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
MNT_DETACH = 2
DEV_NODES = ("null", "zero", "full", "random", "urandom")
MASKED_PROC = ("keys", "key-users")
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_char_p]

def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
          f"mount {fstype or source} on {target}")

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
    for name in MASKED_PROC:  # not namespaced: they list the keys the caller's uid may view
        mount("/dev/null", f"/proc/{name}", None, MS_BIND)
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
'''
