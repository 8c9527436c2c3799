"""Isolation, first layer (files): the minimal root the code sees, built on a fresh tmpfs.

`ROOT_SOURCE` is a piece of the bootstrap's source, not code that runs in this process:
sandbox_bootstrap.py joins it to the others (it uses the prelude's `libc` and `check`, and
sandbox_namespaces.py's `mount` and flags). init calls `prepare_filesystem` before it forks
the worker. Every mount is made in the sandbox's private mount namespace, so it vanishes with
it and is never seen by the host.

The root, as `prepare_filesystem` leaves it (a 64 KiB tmpfs, read-only once built):

    /tmp/work    the work dir: tmpfs of max_file_bytes, mode 0700, owned by the worker's uid,
                 holding main.py (the code)
    /tmp/python  the interpreter's prefix (executable and stdlib), bound read-only: it may live
                 where the worker's uid cannot go (pyenv under /root, 0700)
    /lib, /usr/lib, ... the host's library directories (`root_entries` in sandbox_supervisor.py
                 lists them: /lib*, /usr/lib*, /usr/local/lib*), bound read-only at their own
                 paths, and the links among them (/lib -> usr/lib), because the stdlib's
                 extension modules load libc, libssl, libffi, ... from there
    /etc/ld.so.cache  the dynamic loader's index of those libraries, read-only
    /proc        a fresh proc of this pid namespace, read-only; /proc/keys and /proc/key-users
                 (not namespaced) masked by /dev/null; pid 1 (init) reads as "sandbox-init",
                 not the caller's interpreter path and the bootstrap's source. The worker reads
                 none of its files but the machine's where the kernel has Landlock
                 (sandbox_landlock.py): mountinfo names the host path of each bind's source
    /dev         a read-only tmpfs with only null, zero, full, random and urandom (bound from
                 the host), the fd/stdin/stdout/stderr links, and /dev/shm (tmpfs of
                 max_file_bytes)

Nothing else of the host is there: no /etc (passwd, hostname), /home, /root, /var, /sys, /run,
project folders or container metadata. So the only writable places are the work dir and
/dev/shm, both size-capped, and /dev has no terminal, disk, kmsg or vsock node (unprivileged,
the code could otherwise write to the caller's own tty).

How the switch is made, and where it falls back:
  - pivot_root(".", ".") in the new root, then the old root is detached (umount2 MNT_DETACH):
    the host's tree is then gone from the namespace, not merely out of sight.
  - pivot_root fails with EINVAL when the host's / is the initramfs `rootfs` (some minimal VMs
    and containers), or when the supervisor asks for the fallback (`pivot_root` false in the
    config, which the tests do to cover this path). Then the new root is moved onto / and init
    chroots into it before it forks the worker. The host's mounts stay in the namespace beneath
    it, all read-only; reaching them takes a chroot escape, which needs CAP_SYS_CHROOT (the
    worker has no capability, and the seccomp filter refuses it the user namespace of its own
    where it would have every one: the kernel would allow that here, since the new root is
    mounted on / rather than chrooted into) or /proc/<pid>/root of a process outside the
    chroot, and every process of this pid namespace (init, the worker and its children) is
    inside it.
Before either, every host mount is remounted read-only (`read_only_mounts`), so the library
directories' submounts are read-only too, and the fallback's hidden tree cannot be written.
"""

ROOT_SOURCE = r"""
ST_FLAGS = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME,
            4096: MS_RELATIME}
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
NEW_ROOT = "/tmp"  # the host's /tmp is only the mount point of the new root's tmpfs
EINVAL = 22

def bind_read_only(source, target):
    # Keep the flags the source mount has (a user namespace locks nosuid, nodev, noexec, atime).
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
    host_flags = os.statvfs(source).f_flag
    for st_flag, ms_flag in ST_FLAGS.items():
        if host_flags & st_flag:
            flags |= ms_flag
    mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, flags)

def make_mount_point(path, is_dir):
    if os.path.lexists(path):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if is_dir:
        os.mkdir(path)
    else:
        open(path, "w").close()

def minimal_dev(root, shm_size):
    # A fresh /dev with only the harmless nodes: the host's /dev holds terminals the caller
    # owns (unprivileged, the code could write to the user's tty), disks, kmsg and vsock.
    dev = root + "/dev"
    os.mkdir(dev)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in DEV_NODES:
        open(f"{dev}/{name}", "w").close()  # the mount point
        mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm")
    mount("tmpfs", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={shm_size},mode=1777")
    mount(None, dev, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)

def fresh_proc(root):
    # This pid namespace's processes only, and read-only: no /proc/self/* knob is writable.
    os.mkdir(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
    for name in MASKED_PROC:  # not namespaced: they list the keys the caller's uid may view
        mount("/dev/null", f"{root}/proc/{name}", None, MS_BIND)

def enter_root(root, use_pivot_root):
    os.chdir(root)
    if use_pivot_root:
        if libc.syscall(PIVOT_ROOT[os.uname().machine], b".", b".") == 0:
            # The old root is stacked on "."; detach it, and the host's tree is gone.
            check(libc.umount2(b".", MNT_DETACH), "umount the host's root")
            os.chdir("/")
            return
        if ctypes.get_errno() != EINVAL:
            check(-1, "pivot_root")
    # The fallback (see the module docstring): / is the initramfs, or the tests asked for it.
    mount(root, "/", None, MS_MOVE)
    os.chroot(".")
    os.chdir("/")

def prepare_filesystem(cfg, code):
    read_only_mounts()
    root = NEW_ROOT
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
    for path, target in cfg["root_links"]:
        os.makedirs(os.path.dirname(root + path), exist_ok=True)
        os.symlink(target, root + path)
    for source, target in cfg["root_binds"]:  # sorted: a parent is bound before its children
        make_mount_point(root + target, os.path.isdir(source))
        bind_read_only(source, root + target)
    os.makedirs(root + cfg["work_dir"])
    owner = f"uid={cfg['uid']},gid={cfg['gid']}"
    size = cfg["max_file_bytes"]
    mount("tmpfs", root + cfg["work_dir"], "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={size},mode=0700,{owner}")
    fresh_proc(root)
    minimal_dev(root, size)
    enter_root(root, cfg["pivot_root"])
    # Read-only from now on: unprivileged, the worker would own this tmpfs and could write.
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    main = os.path.join(cfg["work_dir"], "main.py")
    with open(main, "wb") as f:
        f.write(code)
    os.chown(main, cfg["uid"], cfg["gid"])
"""
