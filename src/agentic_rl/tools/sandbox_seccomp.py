"""Isolation, second layer: a seccomp filter on sockets, the kernel keyring and uncounted memory.

`SECCOMP_SOURCE` is a piece of the bootstrap's source, not code that runs in this process
(sandbox_bootstrap.py joins the pieces; this one uses the prelude's `libc` and `check`). The
worker calls `install_seccomp` as its last step before exec, after no_new_privs (which seccomp
needs once the worker has no capabilities, and which stops a setuid binary from shedding the
filter); every child of the code inherits it.

What the filter decides; every other syscall is allowed, so this is a narrow fence, not an
allow-list that shrinks the kernel's attack surface:
  - socket(): allowed only for AF_INET and AF_INET6, which reach only the empty network
    namespace, so connect() fails with ENETUNREACH as on a machine without a network. Every
    other family gets EACCES: Unix sockets (a socket file on the host, or abstract), netlink,
    vsock (the VM host), packet sockets.
  - socketpair(): only SOCK_STREAM, a connected pair that cannot be re-pointed (asyncio
    needs one).
  - `REFUSED`, each with its errno:
      io_uring_setup, io_uring_enter, io_uring_register: EACCES, since io_uring's operations
        would bypass the filter.
      add_key, request_key, keyctl: EPERM, as in the container runtimes' default profiles.
        The keyring is not namespaced: the code inherits the caller's session keyring, so it
        could read a key the trainer holds there and add its own; as root, each call's fresh
        uid would leave its user keyrings behind.
      shmget, msgget, memfd_create, memfd_secret: ENOSYS, what a kernel built without them
        says, so a library falls back to ordinary memory. RLIMIT_AS does not count a System V
        segment once detached, a queued message, or a memfd's pages (64 memfds x
        max_file_bytes), so each let a call capped at 512 MiB hold 540 MiB to 1 GiB more.
      clone3: ENOSYS (its flags are in memory the filter cannot read; glibc falls back to clone).
  - `REFUSED_ARGUMENTS`, refused only for some arguments:
      setsockopt(SOL_SOCKET, SO_SNDBUF / SO_RCVBUF / their FORCE forms): EPERM. A Unix
        socket's queue is kernel memory that neither RLIMIT_AS nor a cgroup counts: 29
        socketpairs raised to the host's maximum held 587 MiB under a 512 MiB cap.
      fcntl(F_SETPIPE_SZ): EPERM; a pipe keeps its 64 KiB.
      unshare and clone with CLONE_NEWUSER: EPERM. A user namespace of its own would give the
        code CAP_SYS_CHROOT, the way out of the chroot fallback (sandbox_root.py).
  - a syscall through a foreign ABI (a 32-bit one, or x32 on x86_64): the process is killed,
    since the syscall numbers tested here would not mean the same there.

The filter is classic BPF, written as (code, jt, jf, k) tuples, packed 8 bytes each. It knows
the syscall numbers of x86_64 and aarch64; on another architecture `seccomp_filter` raises,
so the bootstrap reports a setup error rather than run the code without the filter.
"""

SECCOMP_SOURCE = r"""
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
# seccomp: socket() only for AF_INET/AF_INET6 (useless in the empty network namespace; they
# fail with ENETUNREACH as on a machine without network), socketpair() only SOCK_STREAM (a
# connected pair that cannot be re-pointed: asyncio needs it), and REFUSED below. Everything
# else is allowed. Unix sockets (path or abstract), netlink, vsock (the VM host), packet
# sockets: EACCES at socket().
AF_INET, AF_INET6, SOCK_STREAM, SOCK_TYPE_MASK = 2, 10, 1, 0xF
EPERM, EACCES, ENOSYS = 1, 13, 38
# name: (x86_64 number, aarch64 number, errno returned)
REFUSED = {
    # io_uring's operations would bypass this filter.
    "io_uring_setup": (425, 425, EACCES), "io_uring_enter": (426, 426, EACCES),
    "io_uring_register": (427, 427, EACCES),
    # The kernel keyring is not namespaced: the code would read and add keys of the caller's
    # session keyring, and as root leave keyrings behind under each call's fresh uid. EPERM,
    # as in the container runtimes' default profiles.
    "add_key": (248, 217, EPERM), "request_key": (249, 218, EPERM), "keyctl": (250, 219, EPERM),
    # Memory that RLIMIT_AS does not count: System V shared memory and message queues (kept
    # after detaching, in the private IPC namespace) and memfds (64 files of max_file_bytes).
    # ENOSYS, as on a kernel built without them, so a library falls back to ordinary memory.
    "shmget": (29, 194, ENOSYS), "msgget": (68, 186, ENOSYS),
    "memfd_create": (319, 279, ENOSYS), "memfd_secret": (447, 447, ENOSYS),
    # clone3's flags are in memory the filter cannot read (CLONE_NEWUSER below): ENOSYS, as in
    # the container runtimes' default profiles, and glibc falls back to clone.
    "clone3": (435, 435, ENOSYS),
}
# (audit arch, socket, socketpair, x32 bit or 0, index into REFUSED's numbers)
ARCHES = {"x86_64": (0xC000003E, 41, 53, 0x40000000, 0),
          "aarch64": (0xC00000B7, 198, 199, 0, 1)}
RET_ALLOW, RET_ERRNO, RET_KILL = 0x7FFF0000, 0x00050000, 0x80000000

# Syscalls refused only for some arguments: name: (x86_64 number, aarch64 number, the argument
# checked (its low 32 bits), the values refused, the errno). "flags" tests a bit, "equals" a value.
#   setsockopt(fd, SOL_SOCKET, SO_SNDBUF | SO_RCVBUF | *FORCE, ...): a socket's buffer stays at the
#     host's default (net.core.wmem_default), since what a Unix socket queues is kernel memory no
#     cgroup and no rlimit counts; 29 socketpairs raised to wmem_max held 587 MiB under a 512 MiB cap.
#   fcntl(fd, F_SETPIPE_SZ, ...): a pipe keeps its 64 KiB.
#   unshare(CLONE_NEWUSER), clone(CLONE_NEWUSER): a user namespace of its own gives the code every
#     capability over it, CAP_SYS_CHROOT included, which in the chroot fallback (sandbox_root.py)
#     is the classic way out to the host's tree beneath the root (clone3: refused above).
SOL_SOCKET, SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE = 1, 7, 8, 32, 33
F_SETPIPE_SZ, CLONE_NEWUSER = 1031, 0x10000000
REFUSED_ARGUMENTS = {
    "fcntl": (72, 25, 1, ("equals", F_SETPIPE_SZ), EPERM),
    "unshare": (272, 97, 0, ("flags", CLONE_NEWUSER), EPERM),
    "clone": (56, 220, 0, ("flags", CLONE_NEWUSER), EPERM),
}
SETSOCKOPT = (54, 208)
BUFFER_OPTIONS = (SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE)

def seccomp_filter(machine):
    import struct
    if machine not in ARCHES:
        raise OSError(f"no socket filter for CPU architecture {machine!r}; the sandbox supports "
                      f"{sorted(ARCHES)}")
    arch, nr_socket, nr_socketpair, x32, column = ARCHES[machine]
    LD, JEQ, JGE, JSET, AND, RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
    arg = lambda index: 16 + 8 * index  # the low word of a syscall argument (little-endian)
    deny = RET_ERRNO | EACCES
    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, arch), (RET, 0, 0, RET_KILL),  # a foreign ABI: kill
            (LD, 0, 0, 0)]
    if x32:
        prog += [(JGE, 0, 1, x32), (RET, 0, 0, RET_KILL)]
    for numbers in REFUSED.values():
        prog += [(JEQ, 0, 1, numbers[column]), (RET, 0, 0, RET_ERRNO | numbers[2])]
    # Each block: skip it unless A (the syscall number) matches, then test, return, reload A.
    for numbers in REFUSED_ARGUMENTS.values():
        index, (test, value), errno = numbers[2], numbers[3], numbers[4]
        prog += [(JEQ, 0, 4, numbers[column]), (LD, 0, 0, arg(index)),
                 (JSET if test == "flags" else JEQ, 0, 1, value),
                 (RET, 0, 0, RET_ERRNO | errno), (RET, 0, 0, RET_ALLOW)]
    prog += [(JEQ, 0, 9, SETSOCKOPT[column]), (LD, 0, 0, arg(1)),
             (JEQ, 0, 5, SOL_SOCKET), (LD, 0, 0, arg(2))]
    prog += [(JEQ, 4 - i, 0, option) for i, option in enumerate(BUFFER_OPTIONS)]
    prog += [(RET, 0, 0, RET_ALLOW), (RET, 0, 0, RET_ERRNO | EPERM)]
    prog += [(JEQ, 0, 5, nr_socket),                 # not socket(): to socketpair's test
             (LD, 0, 0, arg(0)),                       # the family
             (JEQ, 1, 0, AF_INET), (JEQ, 0, 1, AF_INET6),
             (RET, 0, 0, RET_ALLOW), (RET, 0, 0, deny),
             (JEQ, 0, 4, nr_socketpair),               # not socketpair(): allow
             (LD, 0, 0, arg(1)), (AND, 0, 0, SOCK_TYPE_MASK),  # the type without NONBLOCK/CLOEXEC
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
"""
