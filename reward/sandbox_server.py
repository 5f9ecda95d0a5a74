"""The zygote that forks run processes inside a program sandbox, and the run process itself.

Stdlib only: `reward/sandbox_codec.py`, `reward/sandbox_spares.py` and
`reward/sandbox_seccomp.py` followed by this source is handed to a
bare interpreter (`python -I -S -c`) inside the sandbox.

The zygote never reads a request. Its control channel (a SOCK_SEQPACKET
socket from the host) carries only "run" commands with descriptors attached (a
stream socket to the host, the socket to the judge, stdin, stdout, stderr), and
it answers with the exit status of each run. The zygote is pid 1 of a pid
namespace its own user namespace owns; for a run it forks one process into a
new pid namespace (pid 1 there), which enters a fresh user, mount, IPC and
network namespace itself. Its network namespace holds only
a loopback device, down: no run can reach another, nor leave state (TIME_WAIT
sockets on chosen ports) for the next to read. The run process joins a new
session keyring, mounts private size-capped tmpfs on /tmp and /dev/shm and an
empty one on /proc, drops every capability, says hello to the host (who places
it in the run's cgroup, identifying it by the kernel-checked sender pid), reads
the job (the program, its limits, and for `inprocess` tests the test code) and
installs its seccomp filter (`reward/sandbox_seccomp.py`) before the program starts.

An `assert` run in `proxy` mode executes the program and then serves calls from
the judge (`reward/sandbox_judge.py`) over its socket: an operation (a call, an
attribute, `len`, `==`, ...) on arguments of plain data and handles in; a
result, the mutated arguments and any exception out. Objects that are not
plain data stay here and cross as handles. It never sees the tests. An `io` run is a script with the case's stdin; its stdout goes to a
descriptor the host reads and compares.
"""

import atexit
import builtins
import copy
import ctypes
import fcntl
import json
import operator
import os
import random
import resource
import socket
import sys
import traceback
import types

# Modules that programs commonly import: loaded once here, shared copy-on-write by every run.
PRELOAD = ("bisect", "collections", "copy", "dataclasses", "datetime", "decimal", "fractions", "functools",
           "hashlib", "heapq", "itertools", "logging", "math", "operator", "re", "statistics", "string", "typing",
           "unittest", "unittest.mock")
for _name in PRELOAD:
    __import__(_name)
PRELOADED_BYTES = 0  # address space the library environment's preloaded modules take (set by `zygote_main`)

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER, CLONE_NEWIPC = 0x00020000, 0x20000000, 0x10000000, 0x08000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV = 2, 4
SIOCSIFFLAGS, IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x8914, 0x1, 0x8, 0x40
PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, PR_SET_SECCOMP = 38, 36, 1, 22
KEYCTL_JOIN_SESSION_KEYRING = 1
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
MUTABLE = (list, dict, set, bytearray)
MAX_CONSTANT_BYTES = 1 << 20  # a larger module-level value is not copied to the tests

libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter_user_namespace():
    """Own a user namespace (our uid and gid mapped to themselves): it lets us make the others."""
    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(CLONE_NEWUSER), "unshare(user)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)  # no file object: this runs for every spare
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def become_pid_namespace_init(control):
    """Fork into a new pid namespace that our own user namespace owns; only the child returns, as its pid 1.

    Owning its pid namespace lets the zygote put its children back into it with
    setns after giving each spare a new one (`fork_in_new_pid_namespace`). The
    parent waits for the child and exits with it.
    """
    _check(libc.unshare(CLONE_NEWPID), "unshare(pid)")
    pid = os.fork()
    if pid == 0:
        return
    control.close()  # else the host would not see the server's end close when the child dies
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def fork_in_new_pid_namespace(own_namespace):
    """os.fork() whose child is pid 1 of a new pid namespace, in one fork (no intermediate process).

    unshare(CLONE_NEWPID) only chooses the namespace of the caller's next
    children, and may not be repeated until setns puts them back into the
    caller's own namespace (`own_namespace`, a descriptor of it), which it may
    do because its user namespace owns that namespace.
    """
    _check(libc.unshare(CLONE_NEWPID), "unshare(pid)")
    try:
        pid = os.fork()
    except BaseException:
        _check(libc.setns(own_namespace, CLONE_NEWPID), "setns(pid)")
        raise
    if pid != 0:
        _check(libc.setns(own_namespace, CLONE_NEWPID), "setns(pid)")
    return pid


def enter_run_namespaces(network):
    """Put a spare (already pid 1 of its pid namespace) into the network namespace lent to it and a
    fresh user, mount and IPC namespace.

    The network namespace is entered first, while the spare is still in the zygote's user namespace:
    that namespace owns it, so the run holds no capability over it (it can bring up no device, set no
    sysctl) and can leave in it only what `network_is_empty` reads.
    """
    _check(libc.setns(network, CLONE_NEWNET), "setns(net)")
    enter_user_namespace()
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare(mount, ipc)")


# A network namespace's state that a run without capabilities over it can leave behind, as
# /proc/net/sockstat{,6} and ip6_flowlabel show it: every socket of any family (sockets in flight in
# an SCM_RIGHTS cycle included), TCP TIME_WAIT entries (not sockets), IP fragment queues. The other
# figures of those files (orphans, allocations, memory of TCP and UDP) are the whole kernel's.
EMPTY_NETWORK = {("sockets", "used"), ("TCP", "tw"), ("FRAG", "memory"), ("FRAG6", "memory")}
REUSE_NETWORK = True  # False: a new network namespace for every run (bench_sandbox.py prices the reuse)


def network_is_empty(sockstat, sockstat6, flowlabels):
    """True when the texts of a namespace's sockstat, sockstat6 (None without IPv6) and ip6_flowlabel
    (None without IPv6) show none of `EMPTY_NETWORK` and no flow label; unreadable or unknown: False."""
    seen = set()
    for line in (sockstat + (sockstat6 or "")).splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        for key, value in zip(fields[::2], fields[1::2]):
            if (name, key) in EMPTY_NETWORK:
                if value != "0":
                    return False
                seen.add((name, key))
    required = {f for f in EMPTY_NETWORK if sockstat6 is not None or not f[0].endswith("6")}
    return seen == required and (flowlabels is None or len(flowlabels.splitlines()) <= 1)


def _read_net(name, optional=False):
    try:
        fd = os.open(f"/proc/thread-self/net/{name}", os.O_RDONLY)
    except FileNotFoundError:
        if optional:
            return None
        raise
    try:
        return os.read(fd, 1 << 16).decode()
    finally:
        os.close(fd)


class NetworkNamespaces:
    """The runs' network namespaces, made by the zygote and lent one to each spare.

    A namespace comes back when its run process has been reaped (and with it every process of
    the run's pid namespace); it is lent again only if `network_is_empty` holds for it then, else it
    is closed and the kernel frees it. Making a namespace and freeing it is the largest fixed cost
    of a run; an empty one is as clean as a new one for a run that can change only its sockets.
    """

    def __init__(self):
        _check(libc.unshare(CLONE_NEWNET), "unshare(net)")  # a home our user namespace owns
        self.home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        self.free, self.lent = [], {}

    def lend(self):
        """A namespace for the next spare (its descriptor, which the spare closes with the rest)."""
        if self.free:
            return self.free.pop()
        _check(libc.unshare(CLONE_NEWNET), "unshare(net)")
        try:
            return os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        finally:
            _check(libc.setns(self.home, CLONE_NEWNET), "setns(net)")

    def lent_to(self, pid, network):
        self.lent[pid] = network

    def returned(self, pid):
        """Spare `pid` was reaped: keep its namespace if the run left it empty."""
        network = self.lent.pop(pid, None)
        if network is None:
            return
        clean = False
        if REUSE_NETWORK:
            _check(libc.setns(network, CLONE_NEWNET), "setns(net)")
            try:
                clean = network_is_empty(_read_net("sockstat"), _read_net("sockstat6", True),
                                         _read_net("ip6_flowlabel", True))
            except OSError:
                clean = False
            finally:
                _check(libc.setns(self.home, CLONE_NEWNET), "setns(net)")
        if clean:
            self.free.append(network)
        else:
            os.close(network)


def drop_capabilities():
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")


def mount_tmpfs(target, size_mb):
    opts = f"size={size_mb}m,nr_inodes=4096,mode=1777".encode()
    _check(libc.mount(b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts), f"mount {target}")


def loopback_up():
    """Bring up the loopback device of the run's own network namespace (`Limits.loopback`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING, b""))


def new_session_keyring():
    """A fresh anonymous session keyring: keys a run adds die with it (a run that cannot join one never starts)."""
    if SYS_KEYCTL is not None:
        libc.syscall.restype = ctypes.c_long
        if libc.syscall(SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"keyctl(join session keyring): {os.strerror(err)}")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def seccomp_program():
    """The filter of `reward/sandbox_seccomp.py` as a `struct sock_fprog` (and the array it points to), or None."""
    code = seccomp_filter(os.uname().machine)
    if code is None:
        return None
    insns = (ctypes.c_uint64 * len(code))(*[op | jt << 16 | jf << 24 | k << 32 for op, jt, jf, k in code])
    return _SockFprog(len(code), ctypes.addressof(insns)), insns


SECCOMP_PROGRAM = seccomp_program()  # built once in the zygote, shared by every run


def install_no_signal_handlers():
    """Stack `no_signal_handlers_filter` on the run's filter (`inprocess` runs, after the harness's set-up)."""
    code = no_signal_handlers_filter(os.uname().machine)
    if code is None:
        raise OSError("no seccomp filter for signal handlers on this architecture")
    insns = (ctypes.c_uint64 * len(code))(*[op | jt << 16 | jf << 24 | k << 32 for op, jt, jf, k in code])
    program = _SockFprog(len(code), ctypes.addressof(insns))
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")
    _check(libc.prctl(PR_SET_SECCOMP, 2, ctypes.byref(program), 0, 0), "prctl(seccomp filter)")


def install_seccomp():
    """Confine the run's syscalls with the seccomp filter (no_new_privs first, as the kernel requires)."""
    if SECCOMP_PROGRAM is None:
        return
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")
    _check(libc.prctl(PR_SET_SECCOMP, 2, ctypes.byref(SECCOMP_PROGRAM[0]), 0, 0), "prctl(seccomp filter)")


def set_limits(limits, processes_in_use):
    cpu = int(limits["timeout_s"]) + 1
    for res, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, (limits["memory_mb"] << 20) + PRELOADED_BYTES),
                       (resource.RLIMIT_NPROC, limits["max_processes"] + processes_in_use),
                       (resource.RLIMIT_FSIZE, limits["max_file_mb"] << 20),
                       (resource.RLIMIT_NOFILE, limits["max_open_files"]),
                       (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (value, value))


def fresh_main():
    """A new, empty `__main__` module for the run, as a fresh interpreter would have."""
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.argv = ["main.py"]
    return module.__dict__


def shut_down_like_interpreter():
    """What `python main.py` does before exiting: join non-daemon threads, run atexit handlers, flush."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


# ---- the run process -------------------------------------------------------------------


def builtin_exception(exc):
    """The nearest built-in exception class of `exc` (a program's own class crosses as its base)."""
    for cls in type(exc).__mro__:
        if getattr(builtins, cls.__name__, None) is cls:
            return cls.__name__
    return "Exception"


def _safe_str(exc):
    try:
        return str(exc)[:2000]
    except BaseException:
        return ""


class Handles:
    """The program's objects that the judge holds by number: they never leave this process."""

    def __init__(self):
        self.objects = []
        self.numbers = {}

    def ref(self, value):
        """The wire form of a value that is not plain data: the same object gets the same number."""
        number = self.numbers.get(id(value))
        if number is None:
            number = self.numbers[id(value)] = len(self.objects)
            self.objects.append(value)  # held for the run, so its id is never reused
        return ["handle", number]

    def get(self, number):
        if number >= len(self.objects):
            raise CodecError("unknown handle")
        return self.objects[number]


# What the judge may ask of a handle, each run here by the real built-in on the program's objects.
OPS = {"call": lambda fn, /, *a, **k: fn(*a, **k), "getattr": getattr, "setattr": setattr, "delattr": delattr,
       "len": len, "iter": iter, "next": next, "bool": bool, "str": str, "repr": repr, "hash": hash,
       "format": format, "int": int, "float": float, "complex": complex, "index": operator.index,
       "abs": abs, "neg": operator.neg, "pos": operator.pos, "invert": operator.invert, "round": round,
       "reversed": reversed, "divmod": divmod, "pow": pow, "isinstance": isinstance, "issubclass": issubclass,
       "contains": operator.contains, "getitem": operator.getitem, "setitem": operator.setitem,
       "delitem": operator.delitem, "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
       "gt": operator.gt, "ge": operator.ge, "copy": copy.copy, "deepcopy": copy.deepcopy}
for _op in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "lshift", "rshift", "and", "or", "xor"):
    OPS[_op] = getattr(operator, _op + "_" if _op in ("and", "or") else _op)
    OPS["i" + _op] = getattr(operator, "i" + _op)


def describe_names(namespace, handles):
    """What the judge may bind: plain data by value, stdlib modules by name, everything else as a handle."""
    names = {}
    for name, value in list(namespace.items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            names[name] = ["module", getattr(value, "__name__", "")]
            continue
        try:
            wire = to_wire(value, handle=handles.ref)
            if len(json.dumps(wire)) > MAX_CONSTANT_BYTES:
                wire = handles.ref(value)
        except (CodecError, RecursionError, TypeError, ValueError):
            wire = handles.ref(value)
        names[name] = ["value", wire]
    return names


def serve_calls(sock, handles):
    """Answer the judge's calls until it says exit; the run process's whole job in proxy mode."""
    while True:
        try:
            msg = recv_frame(sock)
        except (EOFError, OSError, CodecError):
            return
        if msg.get("op") != "call":
            return
        reply = answer_call(msg, handles)
        try:
            send_frame(sock, reply)
        except CodecError as e:
            send_frame(sock, {"op": "bad", "message": str(e)})


def answer_call(msg, handles):
    """Run one operation of the judge's on the program's objects; the reply holds plain data and handles."""
    try:
        fn = OPS[msg["fn"]]
        args = from_wire(msg["args"], handle=handles.get)
        kwargs = from_wire(msg["kwargs"], handle=handles.get)
    except (KeyError, TypeError, CodecError) as e:
        return {"op": "bad", "message": f"malformed call: {_safe_str(e)[:200]}"}
    try:
        result = fn(*args, **kwargs)
    except (StopIteration, StopAsyncIteration) as e:
        if fn is next:
            return {"op": "stop"}
        # As PEP 479 does for generators: else the judge's map() or all() would end early.
        return {"op": "raise", "type": "RuntimeError", "message": f"{type(e).__name__} raised: {_safe_str(e)}"}
    except Exception as e:
        return {"op": "raise", "type": builtin_exception(e), "message": _safe_str(e)}
    except BaseException as e:
        return {"op": "exit", "type": type(e).__name__, "message": _safe_str(e)}
    try:
        mutated = [[i, to_wire(a, handle=handles.ref)] for i, a in enumerate(args) if isinstance(a, MUTABLE)]
        mutated_kw = [[k, to_wire(v, handle=handles.ref)] for k, v in kwargs.items() if isinstance(v, MUTABLE)]
        return {"op": "ok", "result": to_wire(result, handle=handles.ref), "args": mutated, "kwargs": mutated_kw}
    except (CodecError, RecursionError, TypeError, ValueError) as e:
        return {"op": "bad", "message": f"{msg['fn']} returned {type(result).__name__}: {e}"}


def run_job(job, host, judge, runtime):
    """Execute the job in this process; never returns. `runtime`: the harness's sealed code and its names."""
    code = 0
    namespace = fresh_main()
    mode = job["mode"]
    if mode == "inprocess":
        run_inprocess(job, host, namespace, install_no_signal_handlers, runtime)
    host.close()  # nothing more goes to the host: the verdict is not ours to report
    try:
        program = compile(job["program"], "main.py", "exec")
        exec(program, namespace)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        report_load_failure(judge, e)
        finish(code)
    except BaseException as e:
        try:
            traceback.print_exc()
        except BaseException:
            pass
        report_load_failure(judge, e)
        finish(1)
    if mode == "proxy":
        handles = Handles()
        try:
            send_frame(judge, {"op": "ready", "names": describe_names(namespace, handles)})
        except (OSError, CodecError):
            finish(1)
        serve_calls(judge, handles)
    finish(0)


def report_load_failure(judge, exc):
    if judge is not None:
        try:
            send_frame(judge, {"op": "load_failed", "type": builtin_exception(exc) if isinstance(exc, Exception)
                               else type(exc).__name__, "message": _safe_str(exc)})
        except BaseException:
            pass


def finish(code):
    shut_down_like_interpreter()
    os._exit(code & 0xFF if isinstance(code, int) else 1)


def child_main(host, isolated, processes_in_use, network=None, runtime=None):
    """Body of a run process (pid 1 of its namespaces when isolated). Never returns.

    It is forked as a spare before any request exists; the host takes it for a
    run by sending the run's descriptors, then the job. `network`: the network
    namespace lent to it (isolated only).
    """
    try:
        if isolated:
            enter_run_namespaces(network)
        host.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the host learns our pid from the kernel
        new_session_keyring()
        send_frame(host, {"op": "hello"})
        host.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 0)  # else credentials crowd out the descriptors
        _, received, _, _ = socket.recv_fds(host, 1, 8)
        job = recv_frame(host)
        fds = dict(zip(job["fds"], received))
        judge = socket.socket(fileno=fds["judge"]) if "judge" in fds else None
        limits = job["limits"]
        if isolated:
            mount_tmpfs("/tmp", limits["tmp_mb"])
            if os.path.isdir("/dev/shm"):
                mount_tmpfs("/dev/shm", limits["tmp_mb"])
            # A fresh procfs cannot be mounted under bubblewrap's locked /proc; an empty
            # tmpfs hides the zygote's processes (and its memory) from the run instead.
            mount_tmpfs("/proc", 1)
            if limits.get("loopback"):
                # a namespace of its own, whose loopback it may bring up (and nobody else's)
                _check(libc.unshare(CLONE_NEWNET), "unshare(net)")
                loopback_up()
            drop_capabilities()
        os.setsid()  # kill(0, ...) from the run reaches only the run
        os.chdir("/tmp")
        for target, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
            os.dup2(fds[name], target)
        keep = sorted(fd for fd in (host.fileno(), judge.fileno() if judge else -1) if fd > 2)
        low = 3
        for fd in keep:
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 1 << 16)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        random.seed()
        set_limits(limits, processes_in_use)
        install_seccomp()
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
        os._exit(70)
    run_job(job, host, judge, runtime)


# ---- the zygote ------------------------------------------------------------------------

def zygote_main():
    global PRELOADED_BYTES
    PRELOADED_BYTES = load_libraries(sys.argv)  # before any fork: every run shares it
    control = socket.socket(fileno=int(sys.argv[1]))
    isolated = sys.argv[2] == "isolated"
    processes_in_use = int(sys.argv[3])
    fork, networks, lending = os.fork, None, [None]  # lending[0]: the namespace of the spare being forked
    if isolated:
        enter_user_namespace()
        networks = NetworkNamespaces()
        become_pid_namespace_init(control)
        own_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

        def fork():
            lending[0] = networks.lend()
            pid = fork_in_new_pid_namespace(own_namespace)
            if pid:
                networks.lent_to(pid, lending[0])
            return pid
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    control.send(frame({"op": "ready"})[4:])
    runtime = sealed_runtime()  # a local: only the frames of the runs (which none can read) hold it
    serve_spares(control, lambda sock: child_main(sock, isolated, processes_in_use, lending[0], runtime), fork,
                 reaped=networks.returned if networks else None)


if __name__ == "__main__":
    zygote_main()
