"""Kernel-wide state as a channel between runs (docs/sandbox.md, "Kernel-wide state between runs").

The principle: a run must not observe any state another run can change. Each case of
`CHANNELS` (tests/sandbox_battery.py) is a writer that sets such state and a reader that
tries to read it back, through one fleet; the reader's tests pass only if it learned
nothing. Each reader learned its writer's number (or the kernel-wide figure) before the
seccomp filter refused the read. The other tests check what the filter must keep working,
and what the survey says a run sees of the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reward.fleet import Fleet
from reward.sandbox import Job, Limits
from reward.schema import AssertTests
from sandbox_battery import CHANNEL_SECRET, CHANNELS

FAST = Limits(timeout_s=30.0, memory_mb=256)  # far above what any case needs: no verdict depends on load


@pytest.fixture(scope="module")
def fleet():
    with Fleet(workers=2, cache=False, isolation="bwrap") as f:
        yield f


def job(program: str, tests: str = "") -> Job:
    return Job(textwrap.dedent(program), AssertTests(textwrap.dedent(tests)), FAST)


@pytest.mark.parametrize("name", sorted(CHANNELS))
def test_a_run_cannot_read_what_another_run_left_in_the_kernel(fleet, name):
    writer, reader, tests, concurrent = CHANNELS[name]
    if concurrent:  # two workers: the writer holds its state while the reader looks
        _, read = fleet.run([job(writer), job(reader, tests)])
    else:
        fleet.run([job(writer)])
        read = fleet.run([job(reader, tests)])[0]
    assert read.passed, read.stderr


DEV_NULL_LOCK_WRITER = f"""
    import fcntl, os, struct, time
    fd = os.open("/dev/null", os.O_RDWR)
    fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, {CHANNEL_SECRET}, 1, 0))
    time.sleep(2.5)
"""
DEV_NULL_LOCK_READER = """
    import errno, fcntl, os, struct, time
    def taken(fd, start, length):
        try:
            fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, start, length, 0))
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                return True
            raise
        fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_UNLCK, 0, start, length, 0))
        return False
    def learned():
        fd = os.open("/dev/null", os.O_RDWR)
        time.sleep(1)
        low, high = 0, 1 << 20
        if not taken(fd, low, high):
            return None
        while high - low > 1:  # bisect the writer's byte
            middle = (low + high) // 2
            low, high = (low, middle) if taken(fd, low, middle - low) else (middle, high)
        return low
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="device nodes of a worker's own need root (mknod)")
def test_a_lock_on_a_device_node_is_not_a_channel(fleet):
    """Writable files shared by every sandbox would let F_SETLK alone find another run's lock range by
    bisection; the host's /dev/null was one. Each worker's sandbox now has device nodes of its own."""
    reader = job(DEV_NULL_LOCK_READER, "assert learned() is None, learned()\n")
    _, read = fleet.run([job(DEV_NULL_LOCK_WRITER), reader])
    assert read.passed, read.stderr


REFUSED = """
    import ctypes, errno, mmap, os, socket
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.mmap.restype = ctypes.c_void_p
    NR = {"x86_64": {"cachestat": 451, "io_setup": 206, "clone": 56},
          "aarch64": {"cachestat": 451, "io_setup": 0, "clone": 220}}
    FILE = os.path.join(os.path.dirname(os.__file__), "os.py")
    fd = os.open(FILE, os.O_RDONLY)
    def errno_of(call):
        if call == "mincore":
            where = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, ctypes.c_long(0))
            ret = libc.mincore(ctypes.c_void_p(where), ctypes.c_size_t(4096), ctypes.create_string_buffer(1))
        elif call == "cachestat":
            ret = libc.syscall(NR[os.uname().machine]["cachestat"], fd, (ctypes.c_uint64 * 2)(0, 4096),
                               ctypes.create_string_buffer(64), 0)
        elif call == "io_setup":
            ret = libc.syscall(NR[os.uname().machine]["io_setup"], 8, ctypes.byref(ctypes.c_ulong(0)))
        elif call == "madvise_pageout":
            where = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, ctypes.c_long(0))
            ret = libc.madvise(ctypes.c_void_p(where), ctypes.c_size_t(4096), 21)
        elif call == "clone_pidfd":
            ret = libc.syscall(NR[os.uname().machine]["clone"], 0x1000 | 17, None, ctypes.byref(ctypes.c_int()),
                               None, None)  # CLONE_PIDFD | SIGCHLD
            if ret == 0:
                os._exit(0)
        elif call == "sysinfo":
            ret = libc.sysinfo(ctypes.create_string_buffer(256))
        else:
            try:
                {"fadvise": lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED),
                 "peer_pidfd": lambda: socket.socketpair()[0].getsockopt(socket.SOL_SOCKET, 77, 4),
                 "pass_pidfd": lambda: socket.socketpair()[0].setsockopt(socket.SOL_SOCKET, 76, 1),
                 "pwritev2_nowait": lambda: os.pwritev(os.open("/tmp/x", os.O_RDWR | os.O_CREAT), [b"x"], 0,
                                                       os.RWF_NOWAIT)}[call]()
                return 0
            except OSError as e:
                return e.errno
        return 0 if ret >= 0 else ctypes.get_errno()
"""


@pytest.mark.parametrize("call,expected", [("mincore", "EPERM"), ("cachestat", "EPERM"), ("madvise_pageout", "EPERM"),
                                           ("fadvise", "EPERM"),
                                           ("pwritev2_nowait", "EOPNOTSUPP"), ("io_setup", "ENOSYS"),
                                           ("sysinfo", "EPERM"), ("clone_pidfd", "EPERM"),
                                           ("peer_pidfd", "ENOPROTOOPT"), ("pass_pidfd", "ENOPROTOOPT")])
def test_the_filter_refuses_other_readers_of_kernel_wide_state(fleet, call, expected):
    """The page cache's other readers (mincore, cachestat, RWF_NOWAIT writes, Linux AIO's requests that
    may carry RWF_NOWAIT where no filter reads them), its eviction (fadvise, MADV_PAGEOUT), sysinfo, and the other ways
    to a pidfd (whose inode number counts the machine's processes)."""
    result = fleet.run([job(REFUSED, f"import errno\nassert errno_of({call!r}) == errno.{expected}, "
                                     f"errno_of({call!r})\n")])[0]
    assert result.passed, result.stderr


OWN_FILES_AND_POOLS = """
    import ctypes, fcntl, multiprocessing, os, sqlite3, struct, subprocess
    out = {}
    db = sqlite3.connect("/tmp/own.db")
    db.execute("create table t(x)")
    with db:
        db.executemany("insert into t values (?)", [(i,) for i in range(100)])
    other = sqlite3.connect("/tmp/own.db", timeout=0.05)
    out["rows"] = other.execute("select count(*) from t").fetchone()[0]
    db.execute("begin immediate")  # a write lock (fcntl F_SETLK) the other connection runs into
    try:
        other.execute("begin immediate")
        out["busy"] = False
    except sqlite3.OperationalError:
        out["busy"] = True
    db.rollback()
    fd = os.open("/tmp/own.lock", os.O_RDWR | os.O_CREAT)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 1, 0))
    with multiprocessing.Pool(2) as pool:
        out["pool"] = pool.map(abs, [-1, -2, -3])
    out["sorted"] = sorted(range(5000, 0, -1))[:2]
    by_value = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))(
        lambda a, b: a[0] - b[0])  # a callback: libffi's closures
    values = (ctypes.c_int * 5)(5, 1, 4, 2, 3)
    ctypes.CDLL(None).qsort(values, 5, ctypes.sizeof(ctypes.c_int), by_value)
    out["qsort"] = list(values)
    out["cpus"] = os.cpu_count() is not None
    out["child"] = subprocess.run(["sh", "-c", "echo 7"], capture_output=True,
                                  stdin=subprocess.DEVNULL).stdout
    with open("/dev/null", "w") as null, open("/dev/zero", "rb") as zero, open("/dev/urandom", "rb") as rand:
        out["devices"] = [null.write("x"), zero.read(2), len(rand.read(3))]
    try:
        with open("/dev/full", "w") as full:
            full.write("x")
    except OSError as e:
        out["devices"].append(e.errno == 28)  # ENOSPC
    with open(os.path.join(os.path.dirname(os.__file__), "os.py"), "rb") as f:
        out["preadv2"] = os.preadv(f.fileno(), [bytearray(4)], 0, 0)  # without RWF_NOWAIT
"""


def test_the_filter_keeps_locks_on_own_files_process_pools_and_subprocesses(fleet):
    """sqlite3 in /tmp (its fcntl locks on its own files, a busy second connection), OFD locks, a
    multiprocessing pool, sorting, a ctypes callback, a subprocess, the device nodes and preadv2 without
    RWF_NOWAIT work under the filter."""
    result = fleet.run([job(OWN_FILES_AND_POOLS, "assert out == {'rows': 100, 'busy': True, 'pool': [1, 2, 3], "
                                                 "'sorted': [1, 2], 'qsort': [1, 2, 3, 4, 5], 'cpus': True, "
                                                 "'child': b'7\\n', "
                                                 "'devices': [1, b'\\0\\0', 3, True], 'preadv2': 4}, out\n")])[0]
    assert result.passed, result.stderr


LIBRARIES = """
import sys
from reward.sandbox import ZYGOTE_SOURCE
code = {"__name__": "zygote source"}
exec(ZYGOTE_SOURCE, code)
code["install_seccomp"]()
import numpy, pandas
values = numpy.random.default_rng(0).random(10_000)
values.sort()
frame = pandas.DataFrame({"x": range(10), "y": list("ab") * 5})
assert frame.groupby("y").x.sum().to_dict() == {"a": 20, "b": 25}
assert float(numpy.linalg.inv(numpy.eye(4)).sum()) == 4.0 and values[0] <= values[-1]
print("ok")
"""


def test_numpy_and_pandas_import_and_work_under_the_filter():
    """The venv's numpy and pandas under the run's filter (installed here in a plain process: the
    sandbox hides site-packages today), for when the sandbox shows the project's packages."""
    pytest.importorskip("numpy")
    pytest.importorskip("pandas")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", LIBRARIES], cwd=root, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


SURVEY = """
    import os, socket
    seen = {"proc": os.listdir("/proc"), "sys": os.path.exists("/sys"), "tmp": os.listdir("/tmp"),
            "shm": os.listdir("/dev/shm"), "pid": os.getpid()}
    try:
        socket.sethostname("changed")
        seen["hostname"] = "changed"
    except OSError:
        seen["hostname"] = "refused"
    with open("/tmp/left", "w") as f:
        f.write("x")
    with open("/dev/shm/left", "w") as f:
        f.write("x")
"""


def test_what_a_run_sees_of_the_machine_is_its_own(fleet):
    """The survey's checks: /proc is an empty tmpfs, /sys is absent, /tmp and /dev/shm start empty in each
    run (files left by an earlier run are gone), the run is pid 1, and it cannot change the host name."""
    for _ in range(3):
        result = fleet.run([job(SURVEY, "assert seen == {'proc': [], 'sys': False, 'tmp': [], 'shm': [], "
                                        "'pid': 1, 'hostname': 'refused'}, seen\n")])[0]
        assert result.passed, result.stderr
