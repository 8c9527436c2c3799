"""Isolation, second layer: a seccomp filter that narrows which sockets the code can open.

`SECCOMP_SOURCE` is a piece of the bootstrap's source, not code that runs in this process
(sandbox_bootstrap.py joins the pieces; this one uses the prelude's `libc` and `check`). The
worker calls `install_seccomp` as its last step before exec, after no_new_privs (which seccomp
needs once the worker has no capabilities, and which stops a setuid binary from shedding the
filter); every child of the code inherits it.

What the filter decides; every other syscall is allowed, so this is a narrow fence around the
network, not an allow-list that shrinks the kernel's attack surface:
  - socket(): allowed only for AF_INET and AF_INET6, which reach only the empty network
    namespace, so connect() fails with ENETUNREACH as on a machine without a network. Every
    other family gets EACCES: Unix sockets (a socket file on the host, or abstract), netlink,
    vsock (the VM host), packet sockets.
  - socketpair(): only SOCK_STREAM, a connected pair that cannot be re-pointed (asyncio
    needs one).
  - io_uring_setup, io_uring_enter, io_uring_register: EACCES, since io_uring's operations
    would bypass the filter.
  - a syscall through a foreign ABI (a 32-bit one, or x32 on x86_64): the process is killed,
    since the syscall numbers tested here would not mean the same there.

The filter is classic BPF, written as (code, jt, jf, k) tuples, packed 8 bytes each. It knows
the syscall numbers of x86_64 and aarch64; on another architecture `seccomp_filter` raises,
so the bootstrap reports a setup error rather than run the code without the filter.
"""

SECCOMP_SOURCE = r'''
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
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
'''
