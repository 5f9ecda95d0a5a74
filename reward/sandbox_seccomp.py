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
"""

AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
EPERM, ENOSYS, EAFNOSUPPORT = 1, 38, 97
CLONE_NEWUSER_FLAG = 0x10000000
X32_SYSCALL_BIT = 0x40000000
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16  # struct seccomp_data, little-endian (low word of args[0])

# arch: (AUDIT_ARCH, denied syscalls, clone3, unshare, clone, socket, socketpair)
ARCHES = {
    "x86_64": (0xC000003E, {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                            "perf_event_open": 298, "bpf": 321, "userfaultfd": 323}, 435, 272, 56, 41, 53),
    "aarch64": (0xC00000B7, {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                             "perf_event_open": 241, "bpf": 280, "userfaultfd": 282}, 435, 97, 220, 198, 199),
}


def seccomp_filter(machine):
    """The filter for `os.uname().machine` as (code, jt, jf, k) instructions, or None for an unknown arch."""
    if machine not in ARCHES:
        return None
    audit_arch, denied, clone3, unshare, clone, sock, sockpair = ARCHES[machine]
    prog = [(LD_W_ABS, 0, 0, ARCH_OFFSET), (JEQ_K, 1, 0, audit_arch), (RET_K, 0, 0, RET_KILL_PROCESS),
            (LD_W_ABS, 0, 0, NR_OFFSET)]
    if machine == "x86_64":
        prog += [(JGE_K, 0, 1, X32_SYSCALL_BIT), (RET_K, 0, 0, RET_KILL_PROCESS)]
    for nr in sorted(denied.values()):
        prog += [(JEQ_K, 0, 1, nr), (RET_K, 0, 0, RET_ERRNO | EPERM)]
    prog += [(JEQ_K, 0, 1, clone3), (RET_K, 0, 0, RET_ERRNO | ENOSYS)]
    for nr in (unshare, clone):
        prog += [(JEQ_K, 0, 4, nr), (LD_W_ABS, 0, 0, ARG0_OFFSET), (JSET_K, 0, 1, CLONE_NEWUSER_FLAG),
                 (RET_K, 0, 0, RET_ERRNO | EPERM), (RET_K, 0, 0, RET_ALLOW)]
    for nr in (sock, sockpair):
        prog += [(JEQ_K, 0, 6, nr), (LD_W_ABS, 0, 0, ARG0_OFFSET), (JEQ_K, 3, 0, AF_UNIX), (JEQ_K, 2, 0, AF_INET),
                 (JEQ_K, 1, 0, AF_INET6), (RET_K, 0, 0, RET_ERRNO | EAFNOSUPPORT), (RET_K, 0, 0, RET_ALLOW)]
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
