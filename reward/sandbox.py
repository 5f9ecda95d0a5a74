"""Run untrusted Python programs against their tests, with the verdict decided outside the program.

A `SandboxWorker` holds two long-lived sandboxes, each a pre-warmed bare
interpreter inside bubblewrap (new pid, network, ipc, uts and mount namespaces;
a read-only view of only the host's interpreter, the system libraries and the
site-packages of a library environment (`library_env`), every other
site-packages and dist-packages directory hidden; a scrubbed environment; as
root, a dedicated unprivileged uid each):

- the program sandbox runs a zygote (`reward/sandbox_server.py`) that never
  reads a request: per run it forks a process in fresh user, pid, mount, IPC and
  network namespaces with a new session keyring and a seccomp filter, which this
  host process places in the worker's cgroup (memory, pids and CPU limits for the
  whole run, the judge's test process included) before sending it the program.
  That process never holds the tests, the expected output or the verdict;
- the judge sandbox (`reward/sandbox_judge.py`) runs `assert` tests in a fresh
  process whose view of the program is proxies: calls cross as plain data
  (`reward/sandbox_codec.py`) over a socket between the two sandboxes.

`io` runs are scripts whose stdout lands in a memfd that this process compares
as a bounded stream. This process never waits on a socket a program holds past
the run's deadline: it reads without blocking (`reward/sandbox_streams.py`), or,
judging plain asserts itself, with every read bounded by the deadline. Tasks whose
tests need more than plain data (`AssertTests.mode == "inprocess"`, and
`UnittestTests`) run program and tests in one process under a harness set up before
the program loads (`reward/sandbox_harness.py`); the host accepts only its verdict,
which carries a token sent with the job, and only if it names every test the source
defines.

Where bubblewrap or user namespaces are unavailable, `isolation="rlimits"` runs
the same servers without namespaces and warns loudly: use it only on programs
you trust. See docs/sandbox.md for the threat model.
"""

from __future__ import annotations

import array
import ast
import collections
import dataclasses
import fcntl
import functools
import glob
import hashlib
import json
import math
import os
import secrets
import select
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from collections.abc import Callable, Iterable
from typing import Literal

from reward import sandbox_direct
from reward.cgroups import RunCgroup
from reward.modes import mode_of
from reward.sandbox_codec import MAX_BYTES, CodecError, frame, send_frame
from reward.sandbox_streams import FrameReader, fd_chunks, output_matches
from reward.sandbox_harness import expected_tests
from reward.schema import AssertTests, IOTests, Task, Tests, UnittestTests, tests_to_json

Status = Literal["pass", "fail", "error", "timeout", "oom", "killed", "unverifiable"]
Isolation = Literal["auto", "bwrap", "rlimits"]

_HERE = Path(__file__).parent
CODEC_SOURCE = (_HERE / "sandbox_codec.py").read_text()
SPARES_SOURCE = "\n".join([CODEC_SOURCE, (_HERE / "sandbox_preload.py").read_text(),
                           (_HERE / "sandbox_spares.py").read_text()])
# The harness's run-time part is sealed in the run process (`reward/sandbox_harness.py`), so it travels as text.
ZYGOTE_SOURCE = "\n".join([SPARES_SOURCE, (_HERE / "sandbox_seccomp.py").read_text(),
                           f"HARNESS_RUNTIME = {(_HERE / 'sandbox_harness_runtime.py').read_text()!r}",
                           (_HERE / "sandbox_harness.py").read_text(), (_HERE / "sandbox_server.py").read_text()])
JUDGE_SOURCE = SPARES_SOURCE + "\n" + (_HERE / "sandbox_judge.py").read_text()
# Part of every job's cache key: a verdict cached by other sandbox code is not reused.
SANDBOX_DIGEST = hashlib.sha256((ZYGOTE_SOURCE + JUDGE_SOURCE + (_HERE / "sandbox_direct.py").read_text()
                                 ).encode()).hexdigest()[:16]
# Real uids handed to sandboxes when running as root (two per live worker). Far above the
# ranges that systems hand out (users, systemd's dynamic 61184-65519, subuid blocks), so
# no other process shares a sandbox's uid or its process count.
UID_BASE, UID_COUNT = 2_100_000_000, 1000
UID_LOCK_DIR = Path(tempfile.gettempdir()) / "precisecoder-sandbox-uids"
EXCERPT = 2048
STARTUP_S = 30.0
GRACE_S = 10.0  # how long a killed run may take to be reported before the worker counts as dead
WATCHDOG_MARGIN_S = 2 * STARTUP_S + GRACE_S  # beyond a job's own time limits, before its worker is killed
MAX_TIMEOUT_S = 86_400.0
MAX_MEMORY_MB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one test run (defaults: 5 s wall clock, 1 GiB for the whole run; docs/sandbox.md).

    `loopback=True` brings up the loopback device of the run's own network
    namespace, for tests that talk to a server the program starts; it is still
    the run's alone.
    """

    timeout_s: float = 5.0
    memory_mb: int = 1024
    max_processes: int = 64
    max_file_mb: int = 16
    max_open_files: int = 256
    tmp_mb: int = 64
    loopback: bool = False

    def __post_init__(self):
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t <= MAX_TIMEOUT_S:
            raise ValueError(f"timeout_s must be a finite number in (0, {MAX_TIMEOUT_S:g}], got {t!r}")
        for name in ("memory_mb", "max_processes", "max_file_mb", "max_open_files", "tmp_mb"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_MEMORY_MB:
                raise ValueError(f"{name} must be an integer in [1, {MAX_MEMORY_MB}], got {v!r}")
        if not isinstance(self.loopback, bool):
            raise ValueError(f"loopback must be a bool, got {self.loopback!r}")

    def to_json(self) -> dict:
        """The limits as a dict (`dataclasses.asdict` without its deep copy: every field is a number or bool)."""
        return dict(self.__dict__)


def job_deadline_s(job: Job) -> float:
    """The longest a worker may spend on `job` before a watchdog kills it: its runs' limits plus margins."""
    cases = len(job.tests.cases) if isinstance(job.tests, IOTests) else 1
    return cases * (job.limits.timeout_s + GRACE_S) + WATCHDOG_MARGIN_S


def limits_for(task: Task, default: Limits) -> Limits:
    """`default` with the task's own `timeout_s`, `memory_mb` and `loopback` where it sets them."""
    changes = {k: v for k, v in (("timeout_s", task.timeout_s), ("memory_mb", task.memory_mb),
                                 ("loopback", task.loopback or None)) if v is not None}
    return dataclasses.replace(default, **changes) if changes else default


@dataclasses.dataclass(frozen=True)
class Job:
    """One test run: a program, its tests and the limits to run them under.

    `retry_timeout=False` tells a fleet that retries timeouts not to retry this
    one (the scorer's window runs: a timeout there is a fail). It is not part of `key()`.
    """

    program: str
    tests: Tests
    limits: Limits = Limits()
    retry_timeout: bool = True

    def key(self) -> str:
        """Content address of the run (with the sandbox's own code): identical keys give identical verdicts."""
        parts = [self.program, tests_to_json(_resolved(self.tests)), self.limits.to_json(), SANDBOX_DIGEST]
        blob = json.dumps(parts, sort_keys=True, ensure_ascii=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    @property
    def mode(self) -> str:
        """How the tests run: `proxy` or `inprocess` (assert and unittest tests), or `io` (`reward.modes`)."""
        return mode_of(self.tests)


def _resolved(tests: Tests) -> Tests:
    """Assert tests with their chosen mode written out: a run's key says how it ran.

    Tests whose mode resolves to `proxy` keep the JSON (and the run keys) they had
    when `proxy` was the default.
    """
    if isinstance(tests, AssertTests) and tests.mode is None and mode_of(tests) == "inprocess":
        return AssertTests(tests.code, "inprocess")
    return tests


@dataclasses.dataclass(frozen=True)
class RunResult:
    """Outcome of one run; `passed` is decided outside the program's process (except `inprocess`).

    `infrastructure` is set by the host alone when the sandbox failed (nothing the
    program prints can set it): such a result says nothing about the program, and
    is never cached.
    """

    passed: bool
    status: Status
    duration_s: float
    stdout: str = ""
    stderr: str = ""
    cached: bool = False
    infrastructure: bool = False

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


# Modules the servers import before they fork (those the environment has): runs share them.
DEFAULT_PRELOAD = ("numpy", "pandas", "matplotlib", "matplotlib.pyplot", "sympy")
# Set in the sandboxes before anything is preloaded: one thread per library (a server must stay
# single-threaded to fork and enter namespaces, and idle thread stacks would eat the address-space
# limit), matplotlib without a display, its caches in the sandbox's own /tmp.
LIBRARY_ENV_VARS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                    "NUMEXPR_NUM_THREADS": "1", "VECLIB_MAXIMUM_THREADS": "1", "MPLBACKEND": "Agg",
                    "MPLCONFIGDIR": "/tmp"}
# Where the sandboxes see a library environment's site directories that are not under the interpreter's
# prefix or /usr: the host's layout (the path of the working tree holding a venv) stays out of view.
SANDBOX_SITE_ROOT = "/library-env"
# Top-level packages of this project: a library environment holding a copy of them is refused.
PROJECT_PACKAGES = ("reward", "jaxrl", "models")


@dataclasses.dataclass(frozen=True)
class LibraryEnv:
    """A Python environment whose packages sandboxed runs may import (read-only), and the preload list.

    `site_dirs` are the environment's site-packages directories: the only part of
    it the sandboxes see. `digest` names its contents (each directory's
    distributions and versions) so that verdicts cached under one environment are
    not reused under another.
    """

    prefix: str
    site_dirs: tuple[str, ...]
    preload: tuple[str, ...]
    digest: str

    def setup_json(self, paths: list[str]) -> str:
        """What the servers read (`reward/sandbox_preload.py`): the site directories as they see them, the
        modules to preload."""
        return json.dumps({"paths": paths, "preload": list(self.preload)})


STDLIB_ONLY = LibraryEnv("", (), (), "stdlib")


@functools.lru_cache(maxsize=4096)
def imported_packages(code: str) -> frozenset[str]:
    """Top-level packages that `code` imports anywhere (none when it does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return frozenset()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return frozenset(names)


def preload_for(jobs: Iterable[Job], allowed: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The modules of `allowed` that the jobs' run processes and their test processes import, in `allowed`'s
    order: a module counts where its top-level package is imported (`inprocess` tests in the run process)."""
    program, tests = set(), set()
    for job in jobs:
        program |= imported_packages(job.program)
        if not isinstance(job.tests, IOTests):
            (program if job.mode == "inprocess" else tests).update(imported_packages(job.tests.code))
    return tuple(tuple(m for m in allowed if m.split(".")[0] in side) for side in (program, tests))


def _distributions(site_dirs: tuple[str, ...]) -> list[str]:
    return sorted(name for d in site_dirs for name in os.listdir(d) if name.endswith((".dist-info", ".egg-info")))


@functools.lru_cache(maxsize=16)
def library_env(path: str | None = None, preload: tuple[str, ...] = DEFAULT_PRELOAD) -> LibraryEnv:
    """The library environment at `path` (a venv or a Python prefix; None: the one this process runs in).

    Its interpreter must be this host's Python version (major.minor and cache tag): the
    sandbox always runs the host's own interpreter and only imports the environment's
    packages, whose compiled extensions are built for one ABI. "none" gives `STDLIB_ONLY`.

    Raises:
      ValueError: no Python at `path`, another Python version, or the project's own packages in it.
    """
    if path == "none":
        return STDLIB_ONLY
    prefix = os.path.realpath(sys.prefix if path is None else path)
    candidates = [os.path.join(prefix, "bin", name) for name in ("python3", "python")]
    python = sys.executable if path is None else next((p for p in candidates if os.path.exists(p)), candidates[0])
    probe = ("import json, site, sys; print(json.dumps([list(sys.version_info[:2]), sys.implementation.cache_tag, "
             "sys.version.split()[0], site.getsitepackages()]))")
    try:
        out = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, timeout=60, check=True)
        version, tag, full, sites = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise ValueError(f"sandbox env {path}: no working Python at {python} ({type(e).__name__})") from None
    if (tuple(version), tag) != (tuple(sys.version_info[:2]), sys.implementation.cache_tag):
        raise ValueError(f"sandbox env {path} runs Python {full}, the sandbox this host's {sys.version.split()[0]}: "
                         f"build the environment with Python {sys.version_info[0]}.{sys.version_info[1]} "
                         "(scripts/setup.sh bcb)")
    site_dirs = tuple(dict.fromkeys(os.path.realpath(d) for d in sites if os.path.isdir(d)))
    own = [os.path.join(d, p) for d in site_dirs for p in PROJECT_PACKAGES if os.path.isdir(os.path.join(d, p))]
    if own:
        raise ValueError(f"sandbox env {path} holds this project's own packages ({', '.join(own)}): programs "
                         "would see its source; use an environment without them (or an editable install)")
    digest = hashlib.sha256(json.dumps([full, site_dirs, _distributions(site_dirs), preload]).encode()).hexdigest()
    return LibraryEnv(prefix, site_dirs, tuple(preload), digest[:16])


def _interpreter() -> tuple[str, str]:
    """The real interpreter binary (not a venv shim) and its installation prefix."""
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    return exe, os.path.realpath(sys.base_prefix)


def _libpython_dir() -> str | None:
    """The directory of the libpython this process loaded (from /proc/self/maps), None if linked statically.

    The sandbox's loader must find this one, not another installation's
    (the system's 3.11.2 under /usr/lib while the host runs 3.11.7).
    """
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if os.path.basename(path).startswith("libpython"):
                    return os.path.dirname(os.path.realpath(path))
    except OSError:
        pass
    return None


def package_dirs(roots: list[str]) -> list[str]:
    """Every site-packages and dist-packages directory under the trees the sandbox can see."""
    found = set()
    for root in roots:
        for pattern in ("lib*/python*/*-packages", "local/lib*/python*/*-packages", "lib/python3/dist-packages",
                        "share/python*/*-packages"):
            for path in glob.glob(os.path.join(root, pattern)):
                if path.endswith(("site-packages", "dist-packages")) and os.path.isdir(path):
                    found.add(os.path.realpath(path))
    return sorted(found)


# The device nodes a sandbox's /dev holds (bubblewrap's --dev), by (major, minor).
DEVICE_NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9)}


def _own_device_nodes() -> str | None:
    """A new directory of `DEVICE_NODES` for one sandbox (root only), or None to keep the host's nodes.

    Locks live on inodes: with the host's /dev/null in every sandbox, a run's lock range on it is a
    number that a concurrent run finds by probing with F_SETLK (docs/sandbox.md, "Kernel-wide state
    between runs"). A worker's runs never overlap and a lock dies with its run, so nodes of the
    worker's own leave no other run's lock to probe. The caller removes the directory once the
    sandbox has bound the nodes.
    """
    if os.geteuid() != 0:
        return None
    directory = tempfile.mkdtemp(prefix="precisecoder-dev-")
    try:
        if os.statvfs(directory).f_flag & os.ST_NODEV:
            raise OSError("a nodev file system")
        for name, (major, minor) in DEVICE_NODES.items():
            path = os.path.join(directory, name)
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            os.chmod(path, 0o666)  # past the umask
    except OSError:
        shutil.rmtree(directory, ignore_errors=True)
        return None
    return directory



def sandbox_environment(libraries: LibraryEnv) -> dict[str, str]:
    """The whole environment of a sandbox's servers (and so of every run)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    libdir = _libpython_dir()
    if libdir is not None:
        env["LD_LIBRARY_PATH"] = libdir
    if libraries.site_dirs:
        env.update(LIBRARY_ENV_VARS)
    return env


def _under(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _ro_bind_with_parents(path: str, made: set[str], at: str | None = None) -> list[str]:
    """bubblewrap arguments binding `path` read-only at `at` (default: the same place), its missing parents
    made 0755 (`made`: the parents made so far).

    bubblewrap would copy the host's modes of the parents it makes: /root is 0700, so
    a sandbox uid could not reach an interpreter under /root/.pyenv (and the loader
    fell back to the system's libpython).
    """
    at = path if at is None else at
    cmd = []
    parent = os.path.dirname(at)
    parents = []
    while parent not in ("/", "") and parent not in made:
        parents.append(parent)
        parent = os.path.dirname(parent)
    for p in reversed(parents):
        made.add(p)
        cmd += ["--perms", "0755", "--dir", p]
    return cmd + ["--ro-bind", path, at]


def _bwrap_command(uid: int | None, source: str, args: list[str], libraries: LibraryEnv = STDLIB_ONLY,
                   devices: str | None = None) -> list[str]:
    """bubblewrap arguments exposing only the interpreter, the system libraries and `libraries`, read-only.

    `devices`: a directory from `_own_device_nodes`, bound over the host's nodes in /dev.

    No --die-with-parent: its parent-death signal fires when the *thread* that
    started bwrap exits. The servers exit on their own when their control socket
    closes, which happens when the owning process dies, and bwrap's namespace with them.
    """
    exe, prefix = _interpreter()
    cmd = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
           "--unshare-cgroup-try", "--new-session", "--clearenv"]
    for name, value in sandbox_environment(libraries).items():
        cmd += ["--setenv", name, value]
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
    made: set[str] = set()
    if not _under(prefix, ["/usr"]):
        cmd += _ro_bind_with_parents(prefix, made)
    libdir = _libpython_dir()
    if libdir is not None and not _under(libdir, ["/usr", prefix]):
        cmd += _ro_bind_with_parents(libdir, made)
    for site in package_dirs(["/usr", prefix]):
        if site not in libraries.site_dirs:
            cmd += ["--tmpfs", site, "--remount-ro", site]
    inside = []
    for i, site in enumerate(libraries.site_dirs):
        seen = site if _under(site, ["/usr", prefix]) else f"{SANDBOX_SITE_ROOT}/{i}"
        if seen != site:
            cmd += _ro_bind_with_parents(site, made, seen)
        for finder in sorted(glob.glob(os.path.join(site, "__editable__*"))):
            cmd += ["--ro-bind", "/dev/null", seen + finder[len(site):]]  # their finders name the sources
        inside.append(seen)
    cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp", "--chdir", "/tmp"]
    for name in DEVICE_NODES if devices else ():
        cmd += ["--dev-bind", os.path.join(devices, name), f"/dev/{name}"]
    if uid is not None:
        cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all"]
    return cmd + [exe, "-I", "-S", "-c", source, *args, libraries.setup_json(inside)]


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
    """An exclusive claim on one sandbox uid, held through a lock file while the sandbox lives."""

    def __init__(self):
        UID_LOCK_DIR.mkdir(parents=True, exist_ok=True)
        start = (os.getpid() * 7 + threading.get_ident()) % UID_COUNT
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
        worker = SandboxWorker("bwrap", libraries=STDLIB_ONLY)
    except (OSError, RuntimeError) as e:
        return str(e)
    try:
        result = worker.run(Job("x = 1", AssertTests("assert x == 1")))
    except (OSError, RuntimeError) as e:
        return str(e)
    finally:
        worker.close()
    return None if result.passed else f"probe run failed: {result.status} {result.stderr[-300:]}"


_cgroup_warned = threading.Event()


def _warn_no_cgroup() -> None:
    if not _cgroup_warned.is_set():
        _cgroup_warned.set()
        warnings.warn("no writable cgroup (v1 memory+pids or v2): memory and process limits hold per process "
                      "only, not per run (see docs/sandbox.md)", RuntimeWarning, stacklevel=3)


class WorkerDied(RuntimeError):
    """A sandbox server crashed, was killed, or stopped answering."""


class _Server:
    """One sandboxed server process and its SOCK_SEQPACKET control socket."""

    def __init__(self, source: str, isolation: str, role: str, libraries: LibraryEnv = STDLIB_ONLY):
        self.lease = _UidLease() if isolation == "bwrap" and os.geteuid() == 0 else None
        uid = self.lease.uid if self.lease else None
        host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.control = host_end
        self._poll = select.poll()
        self._poll.register(host_end, select.POLLIN)
        self.spares: collections.deque[tuple[int, socket.socket, object]] = collections.deque()
        self.on_spare: Callable[[socket.socket], object] | None = None  # prepares a spare as it arrives
        self.exits: dict[int, tuple[int | None, int | None]] = {}
        args = [str(server_end.fileno()), "isolated" if isolation == "bwrap" else "rlimits",
                str(_processes_of_uid(uid))]
        exe, _ = _interpreter()
        info_r, info_w = os.pipe()
        devices = _own_device_nodes() if isolation == "bwrap" and role == "zygote" else None
        if isolation == "bwrap":
            cmd = _bwrap_command(uid, source, args, libraries, devices)
            cmd = cmd[:1] + ["--info-fd", str(info_w)] + cmd[1:]
        else:
            cmd = [exe, "-I", "-S", "-c", source, *args, libraries.setup_json(list(libraries.site_dirs))]
        self.sandbox_pid: int | None = None
        self._errors = tempfile.TemporaryFile()  # the server's own stderr: read only if it fails to start
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._errors,
                start_new_session=True, pass_fds=(info_w, server_end.fileno()),
                env=sandbox_environment(libraries) if isolation == "rlimits" else None,
                cwd=tempfile.gettempdir())
        except OSError:
            for fd in (info_r, info_w):
                os.close(fd)
            server_end.close()
            if devices:
                shutil.rmtree(devices, ignore_errors=True)
            self.close()
            raise
        os.close(info_w)
        server_end.close()
        try:
            hello = self.receive(STARTUP_S)
        finally:
            if devices:  # bound in the sandbox by now (or never): the mounts keep the nodes
                shutil.rmtree(devices, ignore_errors=True)
        if hello is None or hello.get("op") != "ready":
            os.close(info_r)
            err = self._stderr()
            self.close()
            raise RuntimeError(f"sandbox {role} did not start: {err.strip()[-500:]}")
        self.sandbox_pid = self.proc.pid
        if isolation == "bwrap":
            with os.fdopen(info_r) as info:
                self.sandbox_pid = json.loads(info.read())["child-pid"]
        else:
            os.close(info_r)

    def _stderr(self) -> str:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
            self._errors.seek(0)
            return self._errors.read(1 << 16).decode("utf-8", "replace")
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return ""

    def take(self) -> tuple[int, socket.socket, object]:
        """A spare process (its pid in the server's namespace, our socket to it, what `on_spare` returned).

        Asks the server for the next one."""
        deadline = time.monotonic() + STARTUP_S
        while not self.spares:
            if not self.pump(deadline - time.monotonic()):
                raise WorkerDied("sandbox server made no spare process")
        spare = self.spares.popleft()
        self.send({"op": "more"})
        return spare

    def _readable(self, timeout_s: float) -> bool:
        """Whether a control message waits, within the timeout (poll, not select: any descriptor number)."""
        return bool(self._poll.poll(math.ceil(max(0.0, timeout_s) * 1000)))

    def pump(self, timeout_s: float) -> bool:
        """Read one control message (a spare or an exit status) within the timeout; False if none came."""
        if not self._readable(timeout_s):
            return False
        try:
            data, fds, _, _ = socket.recv_fds(self.control, 1 << 16, 1)
        except OSError as e:
            raise WorkerDied(f"sandbox server gone: {e}") from None
        if not data:
            raise WorkerDied("sandbox server closed its control socket")
        msg = json.loads(data)
        if msg.get("op") == "spare" and fds:
            sock = socket.socket(fileno=fds[0])
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self.spares.append((msg["pid"], sock, self.on_spare(sock) if self.on_spare else None))
        else:
            for fd in fds:
                os.close(fd)
            if msg.get("op") == "exit":
                self.exits[msg["pid"]] = (msg.get("exit"), msg.get("signal"))
        return True

    def send(self, msg: dict, fds: list[int] = ()) -> None:
        try:
            socket.send_fds(self.control, [json.dumps(msg).encode()], list(fds))
        except OSError as e:
            raise WorkerDied(f"sandbox server gone: {e}") from None

    def receive(self, timeout_s: float) -> dict | None:
        """One control message, or None if the server died or stayed silent past the timeout."""
        if not self._readable(timeout_s):
            return None
        try:
            data = self.control.recv(1 << 16)
        except OSError:
            return None
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    def alive(self) -> bool:
        return self.proc.poll() is None if hasattr(self, "proc") else False

    def kill(self) -> None:
        """SIGKILL the sandbox's pid 1 (hence every process in it) and bubblewrap; descriptors stay open."""
        proc = getattr(self, "proc", None)
        for pid, kill in ((self.sandbox_pid, os.kill), (proc.pid if proc else None, os.killpg)):
            if pid is not None:
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def close(self) -> None:
        """Kill the whole sandbox (its pid 1, hence every process in it) and release the uid."""
        proc = getattr(self, "proc", None)
        self.kill()
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._errors.close()
        self.control.close()
        for _, sock, _ in self.spares:
            sock.close()
        self.spares.clear()
        if self.lease is not None:
            self.lease.release()
            self.lease = None


def _memfd(name: str, data: bytes = b"") -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    if data:
        os.write(fd, data) if len(data) < (1 << 20) else _write_all(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _excerpt(fd: int) -> str:
    size = os.fstat(fd).st_size
    text = os.pread(fd, EXCERPT, 0).decode("utf-8", "replace")
    return text + (f"\n... [{size - EXCERPT} more bytes]" if size > EXCERPT else "")


def _job_frame(job: Job, token: str = "") -> bytes | None:
    """The job as the run process receives it, or None when it is over the codec's message limit.

    An `inprocess` job carries its tests, their kind and `token`, which only the harness's verdict can carry back.
    """
    mode = job.mode
    msg = {"op": "job", "mode": mode, "fds": ["stdin", "stdout", "stderr"] + (["judge"] if mode == "proxy" else []),
           "program": job.program, "limits": job.limits.to_json()}
    if mode == "inprocess":
        msg.update(tests=job.tests.code, kind="unittest" if isinstance(job.tests, UnittestTests) else "assert",
                   token=token)
    try:
        return frame(msg)
    except CodecError:
        return None


def _expected_tests(tests: Tests) -> list[str] | None:
    """The tests an `inprocess` verdict must report, read from their source (None: it does not parse)."""
    if not isinstance(tests, UnittestTests):
        return ["tests"]
    try:
        return expected_tests(tests.code)
    except (SyntaxError, ValueError, RecursionError):
        return None


def _harness_verdict(out: _Outcome, token: str, expected: list[str] | None) -> tuple[str | None, str]:
    """The status an `inprocess` run's verdict gives (None: no verdict came, or it lacks a test) and its detail.

    Only a frame with the run's token counts: the program cannot produce one.
    """
    verdicts = [v for v in out.verdicts if v.get("token") == token]
    if not verdicts:
        return None, "no verdict from the harness: the run ended before its tests did"
    v = verdicts[0]
    if not v.get("loaded"):
        return "error", "the tests could not be set up or the program did not load"
    tests = v.get("tests") or []
    statuses = {name: status for name, status in tests}
    failing = [f"{name} ({status})" for name, status in tests if status not in ("pass", "skip")]
    if v.get("refused"):
        return "fail", "refused in the sandbox: " + "; ".join(v["refused"][:5])
    if not expected or sorted(statuses) != sorted(expected) or len(tests) != len(expected):
        return "error", f"the tests that ran differ from those the source defines ({len(tests)} ran)"
    if failing:
        worst = "fail" if any(s == "fail" for s in statuses.values()) else "error"
        passed = len(tests) - len(failing)
        return worst, f"{passed} of {len(tests)} tests passed; not passed: " + ", ".join(failing[:10])
    if expected and all(s == "skip" for s in statuses.values()):
        return "fail", "every test was skipped"
    return "pass", f"{len(tests)} tests passed"


def _recv_hello(sock: socket.socket) -> int | None:
    """Read a spare's hello frame; returns its pid as the kernel reports it to us (not as it claims)."""
    sock.settimeout(STARTUP_S)
    try:
        data, ancillary, _, _ = sock.recvmsg(64, socket.CMSG_SPACE(12))
    except TimeoutError:
        raise WorkerDied("a spare process did not say hello") from None
    finally:
        sock.settimeout(None)
    if not data:
        return None
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return array.array("i", payload[:12])[0]
    return None


@dataclasses.dataclass
class _Outcome:
    exit: int | None = None
    signal: int | None = None
    exited: bool = False
    timed_out: bool = False
    judge: dict | None = None
    verdicts: list = dataclasses.field(default_factory=list)  # inprocess: the frames that claim to be verdicts
    duration_s: float = 0.0
    stdout: str = ""
    stderr: str = ""
    oom: bool = False
    matches: bool = False  # io: stdout equals the case's expected output


class SandboxWorker:
    """A program sandbox, a judge sandbox and a cgroup; `run` is not thread-safe (one job at a time)."""

    def __init__(self, isolation: Literal["bwrap", "rlimits"] = "bwrap", cgroup: bool = True,
                 libraries: LibraryEnv | None = None, judge_preload: tuple[str, ...] | None = None):
        """`libraries`: the packages runs may import and the modules both servers preload (default: this
        process's environment, nothing preloaded; `Fleet` chooses the preload from its jobs);
        `judge_preload`, other modules for the judge's server."""
        self.isolation = isolation
        self.libraries = library_env(None, ()) if libraries is None else libraries
        self.judge_preload = self.libraries.preload if judge_preload is None else judge_preload
        # Plain assert tests (`reward.sandbox_direct.plan_of`) are judged in this process, not a test
        # process; False sends every proxy run to the judge (to compare the two, or to price it).
        self.direct = True
        self._program: _Server | None = None
        self._judge: _Server | None = None
        # Two cgroups used in turn: the next run's spare waits in one while a run uses the other,
        # so placing a process in its cgroup (slow on cgroup v1) happens off a run's critical path.
        self._groups: list[RunCgroup] = []
        self._next_group = 0
        self._group_limits: dict[int, tuple[int, int]] = {}
        try:
            self._program = _Server(ZYGOTE_SOURCE, isolation, "zygote", self.libraries)
            self._judge = _Server(JUDGE_SOURCE, isolation, "judge",
                                  dataclasses.replace(self.libraries, preload=self.judge_preload))
            self._program.on_spare = self._adopt
            if cgroup:
                for i in range(2):
                    group = RunCgroup.create(f"precisecoder-{os.getpid()}-{id(self):x}-{i}")
                    if group is None:
                        break
                    self._groups.append(group)
                if len(self._groups) < 2:
                    for group in self._groups:
                        group.remove()
                    self._groups = []
                    _warn_no_cgroup()
        except BaseException:
            self.close()
            raise
        self.sandbox_pid = self._program.sandbox_pid

    @property
    def uid(self) -> int | None:
        """The program sandbox's uid (root only)."""
        return self._program.lease.uid if self._program and self._program.lease else None

    @property
    def uids(self) -> list[int]:
        """Uids of both sandboxes (root only)."""
        return [s.lease.uid for s in (self._program, self._judge) if s is not None and s.lease is not None]

    @property
    def cgroup_version(self) -> int | None:
        return self._groups[0].version if self._groups else None

    @property
    def cpu_bounded(self) -> bool:
        """Whether each run gets at most about one CPU (its cgroup's quota)."""
        return bool(self._groups) and all(group.cpu_bounded for group in self._groups)

    def alive(self) -> bool:
        return bool(self._program and self._judge and self._program.alive() and self._judge.alive())

    def kill(self) -> None:
        """Kill both sandboxes now, from any thread: a `run` in progress ends with `WorkerDied` (then `close`)."""
        for server in (self._program, self._judge):
            if server is not None:
                server.kill()

    def run(self, job: Job) -> RunResult:
        """Run one job; raises `WorkerDied` if a server is gone or stops answering."""
        if not self.alive():
            raise WorkerDied("sandbox server is not running")
        token = secrets.token_hex(32) if job.mode == "inprocess" else ""
        message = _job_frame(job, token)
        if message is None:
            return RunResult(False, "error", 0.0, stderr=f"refused unrun: the job is over the sandbox's "
                             f"{MAX_BYTES >> 20} MiB limit on one message")
        if isinstance(job.tests, IOTests):
            total = 0.0
            for case in job.tests.cases:
                out = self._one(job, message, case.stdin, case.stdout)
                total += out.duration_s
                status = _classify(out, out.exited and out.exit == 0 and out.matches, "io")
                if status != "pass":
                    break
            return RunResult(status == "pass", status, total, out.stdout, out.stderr)
        mode = job.mode
        out = self._one(job, message, "")
        if mode == "proxy":
            ok = out.exited and out.judge is not None and out.judge.get("outcome") == "pass"
        else:
            harness_status, detail = _harness_verdict(out, token, _expected_tests(job.tests))
            out.judge = {"outcome": harness_status, "detail": detail}
            ok = out.exited and harness_status == "pass"
        status = _classify(out, ok, mode)
        stderr = out.stderr
        if out.judge is not None and out.judge.get("detail"):
            stderr = (stderr + "\n" if stderr else "") + "[tests] " + str(out.judge["detail"])[-EXCERPT:]
        return RunResult(status == "pass", status, out.duration_s, out.stdout, stderr)

    def _one(self, job: Job, message: bytes, stdin: str, expected: str | None = None) -> _Outcome:
        """One run process (and, in proxy mode, one test process) from start to verdict inputs.

        `message` is the job's frame (`_job_frame`); `expected`, an io case's expected stdout.
        """
        limits, mode = job.limits, job.mode
        owned: list = []
        try:
            local_pid, host, (pid, group) = self._program.take()
            owned.append(host)
            pidfd = os.pidfd_open(pid)
            owned.append(pidfd)
            if group is not None:
                wanted = (limits.memory_mb, limits.max_processes)
                if self._group_limits.get(id(group)) != wanted:
                    group.set_limits(*wanted)
                    self._group_limits[id(group)] = wanted
                oom_before = group.oom_kills()
            stdout_fd, stderr_fd = _memfd("stdout"), _memfd("stderr")
            stdin_fd = _memfd("stdin", stdin.encode("utf-8", "surrogatepass"))
            owned += [stdout_fd, stderr_fd, stdin_fd]
            fds = {"stdin": stdin_fd, "stdout": stdout_fd, "stderr": stderr_fd}
            judge = direct = None
            plan = sandbox_direct.plan_of(job.tests.code) if mode == "proxy" and self.direct else None
            if mode == "proxy":
                call_program, call_judge = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                owned += [call_program, call_judge]
                fds["judge"] = call_program.fileno()
            if plan is not None:
                direct = (call_judge, plan)  # this process judges: no test process (reward/sandbox_direct.py)
            elif mode == "proxy":
                _, judge_sock, _ = self._judge.take()
                owned.append(judge_sock)
                judge_pid = _recv_hello(judge_sock)
                judge_pidfd = os.pidfd_open(judge_pid)
                owned.append(judge_pidfd)
                if group is not None:
                    group.add(judge_pid)  # what the program makes the tests hold counts against its run
                tests_fd = _memfd("tests", job.tests.code.encode("utf-8", "surrogatepass"))
                owned.append(tests_fd)
                socket.send_fds(judge_sock, [b"F"], [call_judge.fileno(), tests_fd])
                send_frame(judge_sock, {"op": "tests", "limits": limits.to_json()})
                judge = (judge_sock, judge_pidfd)
            socket.send_fds(host, [b"F"], list(fds.values()))
            if mode == "proxy":
                call_program.close()
                if direct is None:
                    call_judge.close()
            try:
                host.sendall(message)
            except OSError:
                pass  # it died already: its exit report follows
            out = self._wait(mode, local_pid, host, pid, pidfd, judge, group, limits.timeout_s, direct)
            out.stdout = _excerpt(stdout_fd)
            out.stderr = _excerpt(stderr_fd)
            if expected is not None:
                out.matches = output_matches(fd_chunks(stdout_fd), expected)
            if group is not None:
                out.oom = group.oom_kills() > oom_before
            return out
        except (OSError, CodecError, TypeError, ValueError) as e:
            self.close()
            raise WorkerDied(f"sandbox run failed: {type(e).__name__}: {e}") from None
        finally:
            for item in owned:
                _close(item)

    def _adopt(self, sock: socket.socket) -> tuple[int, RunCgroup | None]:
        """A new spare run process: its pid (from the kernel) and the cgroup it now waits in."""
        pid = _recv_hello(sock)
        if pid is None:
            raise WorkerDied("a spare run process died before saying hello")
        group = None
        if self._groups:
            group = self._groups[self._next_group]
            self._next_group = 1 - self._next_group
            group.add(pid)
        return pid, group

    def _wait(self, mode: str, local_pid: int, host: socket.socket, pid: int, pidfd: int,
              judge: tuple[socket.socket, int] | None, group: RunCgroup | None, timeout_s: float,
              direct: tuple[socket.socket, sandbox_direct.Plan] | None = None) -> _Outcome:
        """Wait for the run's end (and the judge's outcome) or its deadline; kill it at the deadline.

        With `direct` (the run's end of the tests' socket and their plan) this process judges first.
        """
        out = _Outcome()
        sel = selectors.DefaultSelector()
        program, judge_server = self._program, self._judge
        sel.register(program.control, selectors.EVENT_READ, "program")
        sel.register(judge_server.control, selectors.EVENT_READ, "judge_server")
        readers = {}
        if mode == "inprocess":
            readers["host"] = FrameReader(host)
            sel.register(host, selectors.EVENT_READ, "host")
        if judge is not None:
            readers["judge"] = FrameReader(judge[0])
            sel.register(judge[0], selectors.EVENT_READ, "judge")
        start = time.monotonic()
        deadline, killed = start + timeout_s, False
        try:
            if direct is not None:
                outcome, detail, late = sandbox_direct.judge(direct[0], direct[1], deadline)
                out.judge = {"outcome": outcome, "detail": detail}
                if late or outcome != "pass":
                    out.timed_out = late
                    self._kill(pid, pidfd, None, group)
                    killed, deadline = True, time.monotonic() + GRACE_S
            while True:
                if local_pid in program.exits and not out.exited:
                    out.exited = True
                    out.exit, out.signal = program.exits.pop(local_pid)
                    out.duration_s = time.monotonic() - start
                if out.exited and (judge is None or out.judge is not None):
                    break
                now = time.monotonic()
                if now >= deadline:
                    if killed:
                        raise WorkerDied("sandbox run did not report its end")
                    out.timed_out = killed = True
                    self._kill(pid, pidfd, judge, group)
                    deadline = now + GRACE_S
                    continue
                for key, _ in sel.select(deadline - now):
                    if key.data == "program":
                        program.pump(0)
                    elif key.data == "judge_server":
                        judge_server.pump(0)
                        judge_server.exits.clear()
                    elif key.data == "host":
                        try:
                            frames, closed = readers["host"].read()
                        except CodecError:
                            frames, closed = [], True
                        out.verdicts += [msg for msg in frames if msg.get("op") == "verdict"]
                        if closed:
                            sel.unregister(host)
                    elif key.data == "judge":
                        try:
                            frames, closed = readers["judge"].read()
                        except CodecError:
                            frames, closed = [], True
                        if not frames and not closed:
                            continue  # part of the outcome: the rest follows, or the deadline
                        out.judge = frames[0] if frames else {
                            "outcome": "killed", "detail": "the test process ended without an outcome"}
                        sel.unregister(judge[0])
                        if out.judge.get("outcome") != "pass" and not out.exited and not killed:
                            self._kill(pid, pidfd, None, group)
                            killed, deadline = True, time.monotonic() + GRACE_S
            if self.isolation == "rlimits":
                _killpg(pid)
            if group is not None:
                group.kill_all()
            return out
        finally:
            sel.close()

    def _kill(self, pid: int, pidfd: int, judge: tuple[socket.socket, int] | None, group: RunCgroup | None) -> None:
        """End the run: its namespace's pid 1 (hence all of it), its cgroup, its process group, its test."""
        for fd in (pidfd, judge[1] if judge else None):
            if fd is not None:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.isolation == "rlimits":
            _killpg(pid)
        if group is not None:
            group.kill_all(wait_s=0.0)

    def close(self) -> None:
        """Kill both sandboxes, remove the cgroup, release the uids."""
        for server in (self._program, self._judge):
            if server is not None:
                server.close()
        self._program = self._judge = None
        for group in self._groups:
            group.remove()
        self._groups = []


def _classify(out: _Outcome, ok: bool, mode: str) -> Status:
    """Map a finished run to pass, fail, error, timeout, oom, killed or unverifiable (the judge's own verdict)."""
    if out.timed_out or out.signal == signal.SIGXCPU:
        return "timeout"
    if ok:
        return "pass"
    if mode == "proxy" and (out.judge or {}).get("outcome") == "unverifiable":
        return "unverifiable"
    judge_detail = str((out.judge or {}).get("detail", ""))
    if out.oom or "MemoryError" in out.stderr[-600:] or "MemoryError" in judge_detail[-600:]:
        return "oom"
    if out.signal is not None and out.signal != signal.SIGKILL or (out.signal == signal.SIGKILL and out.judge is None):
        return "killed"
    if mode == "proxy":
        return "fail" if (out.judge or {}).get("outcome") == "fail" else "error"
    if mode == "inprocess":
        return (out.judge or {}).get("outcome") or "fail"
    return "error" if out.exit != 0 else "fail"


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _close(item) -> None:
    try:
        item.close() if hasattr(item, "close") else os.close(item)
    except OSError:
        pass
