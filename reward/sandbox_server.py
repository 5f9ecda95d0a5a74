"""The pre-warmed run server that lives inside one sandbox worker.

Stdlib only: its source is handed to a bare interpreter (`python -I -S -c`)
inside the sandbox, so it can import nothing from this project. It reads one
JSON request per line on stdin and answers one JSON line on stdout.

Per run it forks a child that enters fresh pid and mount namespaces (when the
server owns a user namespace), mounts private tmpfs on /tmp and /dev/shm and an
empty one on /proc, drops every capability, applies the rlimits and becomes pid 1 of
its namespace; when it exits or is killed, the kernel kills everything it
started. The verdict of an `assert` run is a random token that the harness
relays only after the test code returned and the interpreter shut down.
"""

import atexit
import base64
import builtins
import ctypes
import json
import os
import random
import resource
import select
import signal
import sys
import time
import traceback
import types

# Modules that programs commonly import: loaded once here, shared copy-on-write by every run.
PRELOAD = ("bisect", "collections", "copy", "dataclasses", "datetime", "decimal", "fractions", "functools",
           "hashlib", "heapq", "itertools", "math", "operator", "re", "statistics", "string", "typing")
for _name in PRELOAD:
    __import__(_name)

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER = 0x00020000, 0x20000000, 0x10000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 38, 36
EXCERPT = 2048
SCRATCH = "/tmp/.runs"
PROCESSES_IN_USE = 0  # processes the run's uid had before it (see sandbox.py), added to its NPROC limit

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
    """Own a user namespace (uid mapped to itself) so runs can get pid/mount namespaces."""
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(CLONE_NEWUSER), "unshare(user)")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def drop_capabilities():
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")


def mount_tmpfs(target, size_mb):
    opts = f"size={size_mb}m,nr_inodes=4096,mode=1777".encode()
    _check(libc.mount(b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts), f"mount {target}")


def set_limits(limits, processes_in_use):
    cpu = int(limits["timeout_s"]) + 1
    mem = limits["memory_mb"] << 20
    for res, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem),
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


def child_run(req, isolated, fds):
    """Body of the run process (pid 1 of its namespace when isolated). Never returns."""
    try:
        if isolated:
            mount_tmpfs("/tmp", req["limits"]["tmp_mb"])
            if os.path.isdir("/dev/shm"):
                mount_tmpfs("/dev/shm", req["limits"]["tmp_mb"])
            # A fresh procfs cannot be mounted under bubblewrap's locked /proc; an empty
            # tmpfs hides the server's processes (and its memory) from the run instead.
            mount_tmpfs("/proc", 1)
            drop_capabilities()
        # A process group of its own: kill(0, ...) from the run must not reach the server.
        os.setsid()
        os.chdir("/tmp")
        for target, fd in ((0, fds["stdin"]), (1, fds["stdout"]), (2, fds["stderr"])):
            os.dup2(fd, target)
        low = 3
        for fd in sorted((fds["token_r"], fds["verdict_w"])):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 1024)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        random.seed()
        set_limits(req["limits"], PROCESSES_IN_USE)
    except BaseException:
        traceback.print_exc()
        os.write(fds["verdict_w"], b"start")
        os._exit(70)
    code = 0
    namespace = fresh_main()
    stage = "program"
    try:
        program = compile(req["program"], "main.py", "exec")
        tests = compile(req["tests"], "tests.py", "exec") if req["kind"] == "assert" else None
        exec(program, namespace)
        if tests is not None:
            stage = "tests"
            exec(tests, namespace)
        stage = "done"
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except MemoryError:
        stage = "oom"
        code = 1
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
        code = 1
        if stage == "tests" and isinstance(sys.exc_info()[1], AssertionError):
            stage = "assertion"
    shut_down_like_interpreter()
    try:
        if stage == "done":
            # Only a run whose tests returned and whose interpreter shut down relays the token. The
            # token pipe is open from the start: code that deliberately reads and replays it could
            # forge a pass (a documented limit of any in-process harness).
            token = os.read(fds["token_r"], 64)
            os.write(fds["verdict_w"], token)
        else:
            os.write(fds["verdict_w"], stage.encode())
    except BaseException:
        pass
    os._exit(code & 0xFF)


def shut_down_like_interpreter():
    """What `python main.py` does before exiting: join non-daemon threads, run atexit handlers, flush.

    A run whose threads or exit handlers outlast the wall-clock limit is killed and fails, as
    the spec asks of a run that completes its tests but does not exit in time.
    """
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


def excerpt(path):
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(EXCERPT)
        text = head.decode("utf-8", "replace")
        return text + (f"\n... [{size - EXCERPT} more bytes]" if size > EXCERPT else "")
    except OSError:
        return ""


def normalize(text):
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def reap_all(block):
    """Reap every leftover descendant (orphans of a run are reparented to this subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def one_process(req, isolated, stdin_text):
    """Run the program once; returns (status detail dict, stdout text)."""
    limits = req["limits"]
    os.makedirs(SCRATCH, exist_ok=True)
    paths = {name: os.path.join(SCRATCH, name) for name in ("stdin", "stdout", "stderr")}
    with open(paths["stdin"], "w") as f:
        f.write(stdin_text)
    fds = {"stdin": os.open(paths["stdin"], os.O_RDONLY),
           "stdout": os.open(paths["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
           "stderr": os.open(paths["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)}
    token_r, token_w = os.pipe()
    verdict_r, verdict_w = os.pipe()
    fds.update(token_r=token_r, verdict_w=verdict_w)
    token = base64.b32encode(os.urandom(20))
    os.write(token_w, token)
    report_r, report_w = os.pipe()
    start = time.monotonic()
    first = os.fork()
    if first == 0:
        # Intermediate: enter fresh namespaces, fork the run (pid 1 there), report its pid, leave.
        try:
            os.close(report_r)
            if isolated:
                _check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID), "unshare(pid, mount)")
            pid = os.fork()
            if pid == 0:
                os.close(report_w)
                child_run(req, isolated, fds)
            os.write(report_w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(report_w)
    for fd in (fds["stdin"], fds["stdout"], fds["stderr"], token_r, verdict_w):
        os.close(fd)
    os.waitpid(first, 0)
    pid_text = os.read(report_r, 32)
    os.close(report_r)
    status = {"timeout": False, "exit": None, "signal": None}
    if not pid_text:
        status["exit"] = 70  # the run could not be started; its verdict pipe stays empty
    else:
        run_pid = int(pid_text)
        pidfd = os.pidfd_open(run_pid)
        deadline = start + limits["timeout_s"]
        ready, _, _ = select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            status["timeout"] = True
            kill = os.killpg if not isolated else os.kill
            try:
                kill(run_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, wait_status = os.waitpid(run_pid, 0)
        os.close(pidfd)
        if os.WIFSIGNALED(wait_status):
            status["signal"] = os.WTERMSIG(wait_status)
        else:
            status["exit"] = os.WEXITSTATUS(wait_status)
        if not isolated and not status["timeout"]:
            try:
                os.killpg(run_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    reap_all(block=isolated)
    status["duration_s"] = time.monotonic() - start
    verdict = os.read(verdict_r, 128) if select.select([verdict_r], [], [], 0)[0] else b""
    os.close(verdict_r)
    os.close(token_w)
    status["verdict"] = "pass" if verdict == token else verdict.decode("ascii", "replace")
    with open(paths["stdout"], "rb") as f:
        stdout = f.read().decode("utf-8", "replace")
    status["stdout"] = stdout[:EXCERPT]
    status["stderr"] = excerpt(paths["stderr"])
    for path in paths.values():
        os.unlink(path)
    return status, stdout


def classify(status, ok, kind):
    """Map a finished run to pass, fail, error, timeout, oom or killed."""
    if status["timeout"] or status["signal"] == signal.SIGXCPU:
        return "timeout"
    if ok:
        return "pass"
    if status["verdict"] == "oom" or (status["exit"] and "MemoryError" in status["stderr"]):
        return "oom"
    if status["signal"] is not None:
        return "killed"
    if kind == "assert":
        return "error" if status["verdict"] in ("program", "tests", "start") else "fail"
    return "error" if status["exit"] != 0 else "fail"


def handle(req, isolated):
    """Run one job: a single process for `assert`, one per case for `io` (stops at the first failure)."""
    if req["kind"] == "assert":
        status, _ = one_process(req, isolated, "")
        verdict = classify(status, status["verdict"] == "pass" and status["exit"] == 0, "assert")
        return {"status": verdict, "duration_s": status["duration_s"],
                "stdout": status["stdout"], "stderr": status["stderr"]}
    total = 0.0
    for stdin_text, expected in req["cases"]:
        status, stdout = one_process(req, isolated, stdin_text)
        total += status["duration_s"]
        ok = status["exit"] == 0 and normalize(stdout) == normalize(expected)
        verdict = classify(status, ok, "io")
        if verdict != "pass":
            break
    return {"status": verdict, "duration_s": total, "stdout": status["stdout"], "stderr": status["stderr"]}


def main():
    global PROCESSES_IN_USE
    isolated = sys.argv[1] == "isolated"
    PROCESSES_IN_USE = int(sys.argv[2])
    if isolated:
        enter_user_namespace()
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    out = sys.stdout
    out.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            reply = handle(req, isolated)
        except Exception:
            reply = {"status": "error", "duration_s": 0.0, "stdout": "",
                     "stderr": "sandbox server: " + traceback.format_exc()[-EXCERPT:]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
