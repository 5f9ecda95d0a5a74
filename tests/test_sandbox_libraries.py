"""Library environments in the sandbox: the host's interpreter, an environment's packages (read-only, the
project's own source invisible), modules preloaded before the servers fork, and no state a run leaves
in them for the next (docs/sandbox.md, "Library environments")."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from reward.fleet import Fleet
from reward.sandbox import STDLIB_ONLY, Job, Limits, SandboxWorker, library_env, resolve_isolation
from reward.schema import AssertTests, Task

LIMITS = Limits(timeout_s=60.0, memory_mb=1024)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def worker():
    """One worker whose proxy runs all go through the judge's test process (not the host's direct judge)."""
    w = SandboxWorker(resolve_isolation("auto"), libraries=library_env())
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
    with pytest.raises(ValueError, match="runs Python 3.12.1"):
        library_env(fake_python(tmp_path / "py312", "3.12.1"))
    with pytest.raises(ValueError, match="no working Python"):
        library_env(str(tmp_path / "missing"))


def test_verdicts_are_cached_per_environment():
    job = Job("x = 1\n", AssertTests("assert x == 1\n"), LIMITS)
    with Fleet(workers=1) as host_env, Fleet(workers=1, libraries=STDLIB_ONLY) as bare:
        assert host_env._key(job) != bare._key(job)
        assert host_env.libraries.site_dirs and not bare.libraries.site_dirs


MUTATE = ("import random\nimport matplotlib\nimport numpy as np\nimport pandas as pd\n"
          "np.pi = 3.0\nnp.set_printoptions(precision=2)\nnp.seterr(all='raise')\nrandom.seed(0)\nnp.random.seed(0)\n"
          "matplotlib.rcParams['lines.linewidth'] = 9.0\npd.set_option('display.max_rows', 5)\n")
STATE = ("import math, random\nimport matplotlib\nimport numpy as np\nimport pandas as pd\n"
         "STATE = [np.pi == math.pi, np.get_printoptions()['precision'], np.geterr()['divide'],\n"
         "         matplotlib.rcParams['lines.linewidth'], pd.get_option('display.max_rows'),\n"
         "         random.random(), float(np.random.rand())]\n")


def pristine() -> str:
    """Tests (after `STATE`) that hold in a fresh interpreter: defaults as this host has them, unseeded draws."""
    import random

    import matplotlib
    import numpy as np
    import pandas as pd

    defaults = [True, np.get_printoptions()["precision"], np.geterr()["divide"],
                matplotlib.rcParamsDefault["lines.linewidth"], pd.get_option("display.max_rows")]
    random.seed(0)
    np.random.seed(0)
    seeded = [random.random(), float(np.random.rand())]
    return (f"assert STATE[:5] == {defaults!r}, STATE\n"
            f"assert STATE[5] != {seeded[0]!r} and STATE[6] != {seeded[1]!r}, STATE\n")


@pytest.mark.parametrize("mode", ["proxy", "inprocess"])
def test_a_run_leaves_preloaded_modules_pristine_for_the_next(worker, mode):
    """A run (program and tests) mutates numpy, pandas, matplotlib and random state; the next sees none of it.

    Each run is a fork of a server that preloaded them: its changes die with it."""
    mutated = run(worker, MUTATE, MUTATE + "assert np.pi == 3.0\n", mode)
    assert mutated.passed, mutated.stderr
    state = STATE + "print(STATE[6])\n"
    draws = []
    for _ in range(2):
        result = run(worker, state, STATE + pristine(), mode)
        assert result.passed, result.stderr
        draws.append(result.stdout)
    assert draws[0] != draws[1], draws  # numpy's unseeded draws differ run to run (reseeded in each fork)


def fake_python(root, version: str) -> str:
    """A directory whose bin/python answers `library_env`'s probe as Python `version` would."""
    major, minor = version.split(".")[:2]
    python = root / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\necho '[[{major}, {minor}], \"cpython-{major}{minor}\", \"{version}\", []]'\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return str(root)


def test_check_and_train_take_the_sandbox_env_option(tmp_path):
    """`check --sandbox-env`: none hides numpy (the solution errs), the default has it, another Python is refused
    (by `train` too, before it loads anything)."""
    import subprocess

    from reward.schema import write_tasks

    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, [Task("np", "np", "", "import numpy as np\ndef f(x):\n    return int(np.sum(x)) + 1\n",
                             "import numpy as np\ndef f(x):\n    return int(np.sum(x))\n",
                             AssertTests("assert f([1, 2]) == 3\n"))])

    def check(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "jaxrl.cli", "check", "--no-progress", "--workers", "1",
                               "--tasks", str(tasks), *args], capture_output=True, text=True, timeout=120)

    assert "1/1 verified" in check().stderr
    bare = check("--sandbox-env", "none")
    assert bare.returncode != 0 and "0/1 verified" in bare.stderr, bare.stderr
    other = fake_python(tmp_path / "py312", "3.12.1")
    refused = check("--sandbox-env", other)
    assert refused.returncode == 2 and "runs Python 3.12.1" in refused.stderr, refused.stderr
    train = subprocess.run([sys.executable, "-m", "jaxrl.cli", "train", "--config", "tiny", "--out",
                            str(tmp_path / "run"), "--sandbox-env", other], capture_output=True, text=True, timeout=120)
    assert train.returncode == 2 and "reward.sandbox_env" in train.stderr and "3.12.1" in train.stderr, train.stderr


BCB_ENV = os.path.join(HERE, ".venv-bcb")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(BCB_ENV), reason="no .venv-bcb here (scripts/setup.sh bcb makes it)")
def test_bigcodebench_libraries_import_in_the_sandbox():
    """Every third-party library of the 200 BigCodeBench problems imports from `.venv-bcb` in a run."""
    import ast
    import json

    data = Path(__file__).resolve().parents[2] / "shared" / "data" / "bigcodebench_pdb200.jsonl"  # ../shared/data
    rows = [json.loads(line) for line in data.open()] if data.exists() else []
    libs = {lib for row in rows for lib in ast.literal_eval(row["libs"])} - set(sys.stdlib_module_names)
    libs = sorted(libs) or ["sklearn"]
    program = "import importlib\nFAILED = []\n" + "".join(
        f"try:\n    importlib.import_module({lib!r})\nexcept Exception as e:\n    FAILED.append(({lib!r}, repr(e)))\n"
        for lib in libs)
    w = SandboxWorker(resolve_isolation("auto"), libraries=library_env(BCB_ENV))
    try:
        result = w.run(Job(program, AssertTests("assert FAILED == [], FAILED\n", mode="inprocess"),
                           Limits(timeout_s=120.0, memory_mb=2048)))
    finally:
        w.close()
    assert result.passed, result.stderr


def test_a_fleet_preloads_only_what_its_jobs_import():
    """Function tasks pay nothing for the preload list; the first batch importing pandas brings it into the
    run processes, the first whose tests import numpy into the test processes."""
    function = Job("def f(x):\n    return x + 1\n", AssertTests("assert f(1) == 2\n"), LIMITS)
    frame = Job("import pandas as pd\ndef f():\n    return len(pd.DataFrame({'a': [1, 2]}))\n",
                AssertTests("assert f() == 2\n"), LIMITS)
    probe = ("import sys\nLOADED = sorted(m for m in ('numpy', 'pandas', 'matplotlib') if m in sys.modules)\n"
             "import pandas\n")
    numpy_tests = Job("def f():\n    return 2\n", AssertTests("import numpy as np\nassert f() == np.int64(2)\n"),
                      LIMITS)
    with Fleet(workers=1, cache=False) as fleet:
        assert fleet.run([function])[0].passed
        assert (fleet._workers[0].libraries.preload, fleet._workers[0].judge_preload) == ((), ())
        assert fleet.run([frame])[0].passed
        assert (fleet._workers[0].libraries.preload, fleet._workers[0].judge_preload) == (("pandas",), ())
        assert fleet.run([numpy_tests])[0].passed
        assert (fleet._workers[0].libraries.preload, fleet._workers[0].judge_preload) == (("pandas",), ("numpy",))
        seen = fleet.run([Job(probe, AssertTests("assert LOADED == ['numpy', 'pandas'], LOADED\n"), LIMITS)])[0]
        assert seen.passed, seen.stderr  # already imported before the program's own import ran
        assert fleet.stats.worker_restarts == 0
