"""Isolation, first layer: the namespaces the sandbox lives in.

`NAMESPACES_SOURCE` is a piece of the bootstrap's source, not code that runs in this process:
sandbox_bootstrap.py joins it to the others and runs the whole as one program (it uses the
prelude's `libc` and `check`). The bootstrap calls `enter_namespaces` before it forks init;
init calls `read_only_mounts` (through sandbox_root.py's `prepare_filesystem`, which builds
the root the code sees) before it forks the worker.

Namespaces (one `unshare`):
  - mount: private, and / is made MS_PRIVATE first so no mount propagates back to the host.
  - net: empty, loopback down, and with no abstract Unix sockets of the host.
  - pid: the code sees only this sandbox's processes; init is pid 1, and when init dies the
    kernel kills everything left in the namespace.
  - ipc, uts: no System V IPC objects or hostname shared with the host.
  - user, only when the caller is not root: it is what lets an unprivileged caller create the
    others. The uid/gid map is the identity, so the worker keeps the caller's uid and, with
    a non-zero uid, loses the namespace's capabilities at exec.

`read_only_mounts` remounts every mount of the host read-only in the private namespace,
keeping the flags a user namespace locks (nosuid, nodev, noexec, atime flags).
"""

NAMESPACES_SOURCE = r"""
import re

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
# Flags a remount must keep: in a user namespace the kernel locks them (EPERM otherwise).
KEEP = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
        "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
MNT_DETACH, MS_MOVE = 2, 8192
DEV_NODES = ("null", "zero", "full", "random", "urandom")
MASKED_PROC = ("keys", "key-users")
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_char_p]

def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
          f"mount {fstype or source} on {target}")

def enter_namespaces(cfg):
    # A cgroup namespace rooted where the bootstrap stands (the call's memory cgroup, joined
    # before): /proc/self/cgroup reads "/", not the caller's cgroup path and pid.
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
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
"""
