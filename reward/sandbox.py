"""Run untrusted Python programs with their tests in an isolated sandbox.

A `SandboxWorker` is one long-lived, pre-warmed Python server
(`reward/sandbox_server.py`) running inside bubblewrap: new pid, network, ipc,
uts and mount namespaces, a read-only view of only the interpreter and the
system libraries (no task files, no working tree, no home directories, no
site-packages), a private tmpfs, a scrubbed environment and, when we are root,
a dedicated unprivileged uid per worker so process limits cannot be shared.
The server then owns a user namespace, which lets each run fork into fresh pid
and mount namespaces of its own (see the server's docstring): runs never see
each other's files, memory or processes, and a run's whole process tree dies
with it. The fork from a warm interpreter is what makes a run cost a few
milliseconds instead of a fresh interpreter's tens.

Where bubblewrap or user namespaces are unavailable, `isolation="rlimits"`
runs the same server without namespaces (rlimits and process-group kill
only) and warns loudly: use it only on programs you trust.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Literal

from reward.schema import AssertTests, IOTests, Tests, tests_to_json

Status = Literal["pass", "fail", "error", "timeout", "oom", "killed"]
Isolation = Literal["auto", "bwrap", "rlimits"]

SERVER_SOURCE = (Path(__file__).parent / "sandbox_server.py").read_text()
# Real uids handed to sandbox workers when running as root (one per live worker). Far above
# the ranges that systems hand out (users, systemd's dynamic 61184-65519, subuid blocks),
# so no other process shares a worker's uid or its process count.
UID_BASE, UID_COUNT = 2_100_000_000, 1000
UID_LOCK_DIR = Path(tempfile.gettempdir()) / "precisecoder-sandbox-uids"


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one test run (docs/reward.md: 5 s wall clock, >= 1 GiB memory)."""

    timeout_s: float = 5.0
    memory_mb: int = 1024
    max_processes: int = 64
    max_file_mb: int = 16
    max_open_files: int = 256
    tmp_mb: int = 64

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        for name in ("memory_mb", "max_processes", "max_file_mb", "max_open_files", "tmp_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class Job:
    """One test run: a program, its tests and the limits to run them under."""

    program: str
    tests: Tests
    limits: Limits = Limits()

    def key(self) -> str:
        """Content address of the run: identical keys give identical verdicts."""
        blob = json.dumps([self.program, tests_to_json(self.tests), dataclasses.asdict(self.limits)],
                          sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def request(self) -> dict:
        """The wire form the sandbox server reads."""
        req = {"program": self.program, "limits": dataclasses.asdict(self.limits)}
        if isinstance(self.tests, AssertTests):
            req.update(kind="assert", tests=self.tests.code)
        elif isinstance(self.tests, IOTests):
            req.update(kind="io", cases=[[c.stdin, c.stdout] for c in self.tests.cases])
        else:
            raise TypeError(f"unknown tests type {type(self.tests).__name__}")
        return req


@dataclasses.dataclass(frozen=True)
class RunResult:
    """Outcome of one run; `passed` is decided by the harness, never by the program."""

    passed: bool
    status: Status
    duration_s: float
    stdout: str = ""
    stderr: str = ""
    cached: bool = False

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _interpreter() -> tuple[str, str]:
    """The real interpreter binary (not a venv shim) and its installation prefix."""
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    return exe, os.path.realpath(sys.base_prefix)


def _bwrap_command(uid: int | None) -> list[str]:
    """bubblewrap arguments exposing only the interpreter and system libraries, read-only.

    No --die-with-parent: its parent-death signal fires when the *thread* that
    started bwrap exits. The server exits on its own when its stdin closes,
    which happens when the owning process dies, and bwrap's namespace with it.
    """
    exe, prefix = _interpreter()
    cmd = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
           "--unshare-cgroup-try", "--new-session", "--clearenv",
           "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
           "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    if uid is None:
        cmd += ["--unshare-user"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    cmd += ["--ro-bind", "/usr", "/usr"]
    if os.path.exists("/etc/ld.so.cache"):
        cmd += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    if not prefix.startswith("/usr/"):
        cmd += ["--ro-bind", prefix, prefix]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for site in (Path(prefix) / "lib" / version / "site-packages", Path(prefix) / "local" / "lib" / version / "dist-packages"):
        if site.is_dir():
            cmd += ["--tmpfs", str(site)]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp", "--chdir", "/tmp"]
    if uid is not None:
        cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all"]
    return cmd + [exe, "-I", "-S", "-c", SERVER_SOURCE, "isolated", str(_processes_of_uid(uid))]


def _processes_of_uid(uid: int | None) -> int:
    """Processes (threads included) the run's real uid already has: RLIMIT_NPROC counts them too.

    A dedicated sandbox uid has none; a shared user uid (no root) has the user's own.
    """
    if uid is not None:
        return 0
    me, count = os.getuid(), 0
    for entry in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1 ").split()[0]) == me:
            count += int(fields.get("Threads", "1"))
    return count


class _UidLease:
    """An exclusive claim on one sandbox uid, held through a lock file while the worker lives."""

    def __init__(self):
        UID_LOCK_DIR.mkdir(parents=True, exist_ok=True)
        start = os.getpid() % UID_COUNT
        for i in range(UID_COUNT):
            uid = UID_BASE + (start + i) % UID_COUNT
            f = open(UID_LOCK_DIR / f"{uid}.lock", "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            self.uid, self._file = uid, f
            return
        raise RuntimeError("no free sandbox uid")

    def release(self):
        self._file.close()


_probe_lock = threading.Lock()
_probe_result: dict[str, str | None] = {}


def resolve_isolation(isolation: Isolation = "auto") -> Literal["bwrap", "rlimits"]:
    """Pick the isolation level; 'auto' uses bubblewrap when it works and warns when it does not."""
    if isolation == "rlimits":
        warnings.warn("sandbox isolation 'rlimits' runs programs WITHOUT namespaces: only rlimits "
                      "and a process-group kill stand between them and this machine", RuntimeWarning,
                      stacklevel=2)
        return "rlimits"
    with _probe_lock:
        if "error" not in _probe_result:
            _probe_result["error"] = _probe_bwrap()
    error = _probe_result["error"]
    if error is None:
        return "bwrap"
    if isolation == "bwrap":
        raise RuntimeError(f"bubblewrap sandbox unavailable: {error}")
    warnings.warn(f"SANDBOX DEGRADED: bubblewrap unavailable ({error}); falling back to rlimits only. "
                  "Untrusted programs can read this machine's files and reach the network. "
                  "Install bubblewrap (apt-get install bubblewrap).", RuntimeWarning, stacklevel=2)
    return "rlimits"


def _probe_bwrap() -> str | None:
    if shutil.which("bwrap") is None:
        return "bwrap not found on PATH"
    try:
        worker = SandboxWorker("bwrap")
    except (OSError, RuntimeError) as e:
        return str(e)
    try:
        result = worker.run(Job("x = 1", AssertTests("assert x == 1")))
    finally:
        worker.close()
    return None if result.passed else f"probe run failed: {result.status} {result.stderr[-300:]}"


class SandboxWorker:
    """One sandboxed run server; `run` is not thread-safe (one job at a time per worker)."""

    def __init__(self, isolation: Literal["bwrap", "rlimits"] = "bwrap"):
        self.isolation = isolation
        self._lease = _UidLease() if isolation == "bwrap" and os.geteuid() == 0 else None
        if isolation == "bwrap":
            cmd = _bwrap_command(self._lease.uid if self._lease else None)
        else:
            exe, _ = _interpreter()
            cmd = [exe, "-I", "-S", "-c", SERVER_SOURCE, "rlimits", str(_processes_of_uid(None))]
        self._pending = b""
        info_r, info_w = os.pipe()
        if isolation == "bwrap":
            cmd = cmd[:1] + ["--info-fd", str(info_w)] + cmd[1:]
        try:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, pass_fds=(info_w,),
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"} if isolation == "rlimits" else None,
                cwd=tempfile.gettempdir(), bufsize=0)
        finally:
            os.close(info_w)
        hello = self._readline(timeout_s=30)
        if hello is None or not hello.get("ready"):
            os.close(info_r)
            err = self._drain_stderr()
            self.close()
            raise RuntimeError(f"sandbox server did not start: {err.strip()[-500:]}")
        # Host pid of the sandbox's pid 1: killing it ends every process in the sandbox.
        self.sandbox_pid = self._proc.pid
        if isolation == "bwrap":
            with os.fdopen(info_r) as info:
                self.sandbox_pid = json.loads(info.read())["child-pid"]
        else:
            os.close(info_r)

    @property
    def uid(self) -> int | None:
        return self._lease.uid if self._lease else None

    def alive(self) -> bool:
        return self._proc.poll() is None

    def _readline(self, timeout_s: float) -> dict | None:
        """One reply line, or None if the server died or stayed silent past the timeout."""
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, 1 << 16) if ready else b""
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            return None

    def _drain_stderr(self) -> str:
        try:
            self._proc.kill()
            return (self._proc.stderr.read() or b"").decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def run(self, job: Job) -> RunResult:
        """Run one job; raises `WorkerDied` if the server is gone or stops answering."""
        if not self.alive():
            raise WorkerDied("sandbox server is not running")
        try:
            self._proc.stdin.write((json.dumps(job.request()) + "\n").encode())
        except (BrokenPipeError, OSError) as e:
            raise WorkerDied(f"sandbox server pipe broken: {e}") from None
        cases = len(job.tests.cases) if isinstance(job.tests, IOTests) else 1
        reply = self._readline(timeout_s=cases * job.limits.timeout_s + 10)
        if reply is None:
            self.close()
            raise WorkerDied("sandbox server died or hung during a run")
        return RunResult(passed=reply["status"] == "pass", status=reply["status"],
                         duration_s=reply["duration_s"], stdout=reply["stdout"], stderr=reply["stderr"])

    def close(self) -> None:
        """Kill the whole sandbox (its pid 1, hence every process in it) and release the uid."""
        for pid, kill in ((getattr(self, "sandbox_pid", None), os.kill), (self._proc.pid, os.killpg)):
            if pid is not None:
                try:
                    kill(pid, 9)
                except (ProcessLookupError, PermissionError):
                    pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            try:
                stream.close()
            except (OSError, ValueError):
                pass
        if self._lease is not None:
            self._lease.release()
            self._lease = None


class WorkerDied(RuntimeError):
    """The sandbox server crashed, was killed, or stopped answering."""
