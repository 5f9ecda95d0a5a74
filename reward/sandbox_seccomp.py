"""The seccomp filter of run processes: classic BPF that narrows the kernel a program can reach.

Stdlib only and free of `from __future__`: this source is prepended to the
zygote's (`reward/sandbox_server.py`), which installs the filter in each run
process just before the program starts. Denied, with an error the program sees:

- io_uring (setup, enter, register), perf_event_open, bpf, userfaultfd: large,
  often-exploited kernel surface no test needs (EPERM);
- new user namespaces: unshare or clone with CLONE_NEWUSER (EPERM), and clone3,
  whose flags a filter cannot read (ENOSYS, so libc falls back to clone);
- sockets of any family but AF_UNIX, AF_INET and AF_INET6 (EAFNOSUPPORT);
- any other syscall ABI (x32 numbers, 32-bit entry points): the run is killed.

And every way we know to read kernel-wide state that another run can change
(docs/sandbox.md, "Kernel-wide state between runs"): a run must not observe what
another run did.

- the page cache of shared files: posix_fadvise and madvise's MADV_COLD and
  MADV_PAGEOUT (EPERM: they could evict pages), mincore and cachestat (EPERM),
  preadv2 and pwritev2 with RWF_NOWAIT (EOPNOTSUPP, as for a file that cannot do
  it), Linux AIO (io_setup, io_submit: ENOSYS), whose requests may carry
  RWF_NOWAIT where a filter cannot read it;
- numbers from kernel-wide counters: socket and network-namespace cookies
  (getsockopt SO_COOKIE, SO_NETNS_COOKIE: ENOPROTOOPT, as on an older kernel);
  inode numbers of memfds (memfd_create, memfd_secret: EPERM) and of pidfds
  (pidfd_open, clone with CLONE_PIDFD: EPERM; getsockopt SO_PEERPIDFD and
  setsockopt SO_PASSPIDFD: ENOPROTOOPT). Pipes' and sockets' inode numbers stay
  readable (fstat): the measured channel that is left;
- locks on shared files: flock, and fcntl's F_GETLK, F_OFD_GETLK, F_SETLEASE and
  F_GETLEASE (EPERM); F_SETLK and the other setting commands stay, for programs
  (sqlite) that lock their own files in /tmp;
- the key quota of the uid: add_key, request_key and keyctl (EPERM; the run joins
  its session keyring before the filter is installed);
- sysinfo (EPERM): the machine's process count, free memory and load.
"""

AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
EPERM, ENOSYS, ENOPROTOOPT, EOPNOTSUPP, EAFNOSUPPORT = 1, 38, 92, 95, 97
CLONE_NEWUSER_FLAG, CLONE_PIDFD_FLAG = 0x10000000, 0x00001000
SOL_SOCKET, SO_COOKIE, SO_NETNS_COOKIE, SO_PASSPIDFD, SO_PEERPIDFD = 1, 57, 71, 76, 77
F_GETLK, F_OFD_GETLK, F_SETLEASE, F_GETLEASE = 5, 36, 1024, 1025  # F_GETLK64 is F_GETLK on 64-bit ABIs
RWF_NOWAIT = 0x8
MADV_COLD, MADV_PAGEOUT = 20, 21
X32_SYSCALL_BIT = 0x40000000
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
NR_OFFSET, ARCH_OFFSET = 0, 4  # struct seccomp_data, little-endian


def arg_offset(index):
    """Offset of the low word of args[index] in struct seccomp_data (the arguments checked here are ints)."""
    return 16 + 8 * index


SURFACE = ("io_uring_setup", "io_uring_enter", "io_uring_register", "perf_event_open", "bpf", "userfaultfd")
# Syscalls denied outright for what they read (or, for fadvise64, evict) of kernel-wide state.
STATE = ("fadvise64", "mincore", "cachestat", "flock", "add_key", "request_key", "keyctl", "sysinfo",
         "memfd_create", "memfd_secret", "pidfd_open")
AIO = ("io_setup", "io_submit")

# arch: (AUDIT_ARCH, syscall numbers)
ARCHES = {
    "x86_64": (0xC000003E, {
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "perf_event_open": 298,
        "bpf": 321, "userfaultfd": 323, "clone3": 435, "unshare": 272, "clone": 56, "socket": 41,
        "socketpair": 53, "getsockopt": 55, "fcntl": 72, "preadv2": 327, "pwritev2": 328, "fadvise64": 221,
        "mincore": 27, "cachestat": 451, "flock": 73, "add_key": 248, "request_key": 249, "keyctl": 250,
        "sysinfo": 99, "io_setup": 206, "io_submit": 209, "setsockopt": 54, "memfd_create": 319,
        "memfd_secret": 447, "pidfd_open": 434, "madvise": 28}),
    "aarch64": (0xC00000B7, {
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "perf_event_open": 241,
        "bpf": 280, "userfaultfd": 282, "clone3": 435, "unshare": 97, "clone": 220, "socket": 198,
        "socketpair": 199, "getsockopt": 209, "fcntl": 25, "preadv2": 286, "pwritev2": 287, "fadvise64": 223,
        "mincore": 232, "cachestat": 451, "flock": 32, "add_key": 217, "request_key": 218, "keyctl": 219,
        "sysinfo": 179, "io_setup": 0, "io_submit": 2, "setsockopt": 208, "memfd_create": 279,
        "memfd_secret": 447, "pidfd_open": 434, "madvise": 233}),
}


def deny(nr, errno):
    """Return `errno` for syscall `nr` (the syscall number is in the accumulator)."""
    return [(JEQ_K, 0, 1, nr), (RET_K, 0, 0, RET_ERRNO | errno)]


def deny_if_arg_in(nr, index, values, errno):
    """Return `errno` for syscall `nr` when args[index] is one of `values`; allow it otherwise."""
    prog = [(LD_W_ABS, 0, 0, arg_offset(index))]
    for i, value in enumerate(values):
        prog.append((JEQ_K, len(values) - i, 0, value))
    prog += [(RET_K, 0, 0, RET_ALLOW), (RET_K, 0, 0, RET_ERRNO | errno)]
    return [(JEQ_K, 0, len(prog), nr)] + prog


def deny_socket_options(nr, options):
    """ENOPROTOOPT for get/setsockopt `nr` at level SOL_SOCKET with one of `options`; allow the rest."""
    then = deny_if_arg_in(nr, 2, options, ENOPROTOOPT)[1:]  # the option test, once the level is SOL_SOCKET
    return [(JEQ_K, 0, len(then) + 3, nr), (LD_W_ABS, 0, 0, arg_offset(1)), (JEQ_K, 1, 0, SOL_SOCKET),
            (RET_K, 0, 0, RET_ALLOW)] + then


def seccomp_filter(machine):
    """The filter for `os.uname().machine` as (code, jt, jf, k) instructions, or None for an unknown arch."""
    if machine not in ARCHES:
        return None
    audit_arch, nr = ARCHES[machine]
    prog = [(LD_W_ABS, 0, 0, ARCH_OFFSET), (JEQ_K, 1, 0, audit_arch), (RET_K, 0, 0, RET_KILL_PROCESS),
            (LD_W_ABS, 0, 0, NR_OFFSET)]
    if machine == "x86_64":
        prog += [(JGE_K, 0, 1, X32_SYSCALL_BIT), (RET_K, 0, 0, RET_KILL_PROCESS)]
    for name in SURFACE + STATE:
        prog += deny(nr[name], EPERM)
    for name in AIO:
        prog += deny(nr[name], ENOSYS)
    prog += deny(nr["clone3"], ENOSYS)
    for name, flags in (("unshare", CLONE_NEWUSER_FLAG), ("clone", CLONE_NEWUSER_FLAG | CLONE_PIDFD_FLAG)):
        prog += [(JEQ_K, 0, 4, nr[name]), (LD_W_ABS, 0, 0, arg_offset(0)), (JSET_K, 0, 1, flags),
                 (RET_K, 0, 0, RET_ERRNO | EPERM), (RET_K, 0, 0, RET_ALLOW)]
    for name in ("socket", "socketpair"):
        prog += [(JEQ_K, 0, 6, nr[name]), (LD_W_ABS, 0, 0, arg_offset(0)), (JEQ_K, 3, 0, AF_UNIX),
                 (JEQ_K, 2, 0, AF_INET), (JEQ_K, 1, 0, AF_INET6), (RET_K, 0, 0, RET_ERRNO | EAFNOSUPPORT),
                 (RET_K, 0, 0, RET_ALLOW)]
    prog += deny_socket_options(nr["getsockopt"], (SO_COOKIE, SO_NETNS_COOKIE, SO_PEERPIDFD))
    prog += deny_socket_options(nr["setsockopt"], (SO_PASSPIDFD,))
    prog += deny_if_arg_in(nr["fcntl"], 1, (F_GETLK, F_OFD_GETLK, F_SETLEASE, F_GETLEASE), EPERM)
    prog += deny_if_arg_in(nr["madvise"], 2, (MADV_COLD, MADV_PAGEOUT), EPERM)
    for name in ("preadv2", "pwritev2"):  # flags: args[5]
        prog += [(JEQ_K, 0, 4, nr[name]), (LD_W_ABS, 0, 0, arg_offset(5)), (JSET_K, 0, 1, RWF_NOWAIT),
                 (RET_K, 0, 0, RET_ERRNO | EOPNOTSUPP), (RET_K, 0, 0, RET_ALLOW)]
    return prog + [(RET_K, 0, 0, RET_ALLOW)]

RT_SIGACTION = {"x86_64": 13, "aarch64": 134}


def no_signal_handlers_filter(machine):
    """A second filter for `inprocess` runs: rt_sigaction fails with EPERM, so no signal handler can be set.

    A Python signal handler is called with the frame that was running, which would hand the program
    the harness's and the tests' frames (`reward/sandbox_harness.py`); Python sets every handler
    through sigaction. None for an unknown arch (the harness then refuses to run).
    """
    if machine not in RT_SIGACTION:
        return None
    return [(LD_W_ABS, 0, 0, NR_OFFSET), (JEQ_K, 0, 1, RT_SIGACTION[machine]), (RET_K, 0, 0, RET_ERRNO | EPERM),
            (RET_K, 0, 0, RET_ALLOW)]
