"""Library environments in the sandbox: the host's interpreter, an environment's packages (read-only, the
project's own source invisible), modules preloaded before the servers fork, and no state a run leaves
in them for the next (docs/sandbox.md, "Library environments")."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from reward.fleet import Fleet
from reward.sandbox import STDLIB_ONLY, Job, Limits, SandboxWorker, library_env, resolve_isolation
from reward.schema import AssertTests

LIMITS = Limits(timeout_s=60.0, memory_mb=1024)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def worker():
    """One worker whose proxy runs all go through the judge's test process (not the host's direct judge)."""
    w = SandboxWorker(resolve_isolation("auto"))
    w.direct = False
    yield w
    w.close()


def run(worker: SandboxWorker, program: str, tests: str = "", mode: str = "proxy"):
    return worker.run(Job(program, AssertTests(tests, mode=mode), LIMITS))


@pytest.mark.parametrize("mode", ["proxy", "inprocess"])
def test_runs_use_the_hosts_interpreter_and_standard_library(worker, mode):
    """Issue 42 item 7: the system's 3.11.2 (its libpython found first) ran programs; now the host's."""
    program = ("import os, sys\nVERSION, PREFIX = sys.version, sys.prefix\n"
               "STDLIB = os.path.dirname(os.path.realpath(os.__file__))\n")
    stdlib = os.path.dirname(os.path.realpath(os.__file__))
    tests = (f"assert VERSION == {sys.version!r}, VERSION\nassert PREFIX == {sys.base_prefix!r}, PREFIX\n"
             f"assert STDLIB == {stdlib!r}, STDLIB\n")
    result = run(worker, program, tests, mode)
    assert result.passed, result.stderr


@pytest.mark.parametrize("mode", ["proxy", "inprocess"])
def test_program_and_tests_import_the_environments_packages(worker, mode):
    """Both sides import numpy and pandas (values cross as plain data here: frames crossing is another matter)."""
    program = ("import numpy as np\nimport pandas as pd\n\n"
               "def totals(rows):\n    frame = pd.DataFrame(rows, columns=['k', 'v'])\n"
               "    return {k: int(v) for k, v in frame.groupby('k')['v'].sum().items()}\n\n"
               "def norm(xs):\n    return float(np.linalg.norm(np.array(xs)))\n")
    tests = ("import pandas as pd\nimport numpy as np\nrows = [['a', 1], ['b', 2], ['a', 3]]\n"
             "expected = pd.DataFrame(rows, columns=['k', 'v']).groupby('k')['v'].sum()\n"
             "assert totals(rows) == {k: int(v) for k, v in expected.items()}\n"
             "assert abs(norm([3, 4]) - float(np.hypot(3, 4))) < 1e-9\n")
    result = run(worker, program, tests, mode)
    assert result.passed, result.stderr


def test_the_project_and_its_source_are_not_visible(worker):
    """The environment's site-packages holds the editable install's finder, which points at the repository:
    the sandbox sees it empty, and the repository not at all."""
    if worker.isolation != "bwrap":
        pytest.skip("without bubblewrap the whole machine is visible")
    finders = [name[:-3] for d in worker.libraries.site_dirs for name in os.listdir(d)
               if name.startswith("__editable__") and name.endswith("_finder.py")]
    program = ("import importlib, os\nFOUND = []\n"
               "for name in ('reward', 'jaxrl', 'models', 'reward.sandbox'):\n"
               "    try:\n        importlib.import_module(name)\n        FOUND.append(name)\n"
               "    except ImportError:\n        pass\n"
               f"for finder in {finders!r}:\n    try:\n        importlib.import_module(finder).install()\n"
               "        FOUND.append(finder)\n    except (ImportError, AttributeError):\n        pass\n"
               f"SEEN = [p for p in {[HERE, os.path.realpath(HERE), '/work/main/reward']!r} if os.path.exists(p)]\n")
    result = run(worker, program, "assert FOUND == [], FOUND\nassert SEEN == [], SEEN\n", "inprocess")
    assert result.passed, result.stderr


def test_the_environment_is_read_only(worker):
    site = worker.libraries.site_dirs[0]
    program = (f"import os\ntry:\n    open(os.path.join({site!r}, 'planted.py'), 'w')\n    WROTE = True\n"
               "except OSError:\n    WROTE = False\n")
    assert run(worker, program, "assert not WROTE\n").passed


def test_stdlib_only_sees_no_package():
    w = SandboxWorker(resolve_isolation("auto"), libraries=STDLIB_ONLY)
    try:
        result = w.run(Job("import numpy\n", AssertTests(""), LIMITS))
    finally:
        w.close()
    assert result.status == "error" and "numpy" in result.stderr, result


def test_an_environment_of_another_python_version_is_refused(tmp_path):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\necho '[[3, 12], \"cpython-312\", \"3.12.1\", []]'\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(ValueError, match="runs Python 3.12.1"):
        library_env(str(tmp_path))
    with pytest.raises(ValueError, match="no working Python"):
        library_env(str(tmp_path / "missing"))


def test_verdicts_are_cached_per_environment():
    job = Job("x = 1\n", AssertTests("assert x == 1\n"), LIMITS)
    with Fleet(workers=1) as host_env, Fleet(workers=1, libraries=STDLIB_ONLY) as bare:
        assert host_env._key(job) != bare._key(job)
        assert host_env.libraries.site_dirs and not bare.libraries.site_dirs
