"""The `inprocess` harness (reward/sandbox_harness.py): tests in the program's process, a verdict it cannot forge.

Each forgery family of issue 41 is prepended or appended to a wrong program; none
may pass, against a unittest task and against the same task in proxy mode. Right
programs of the unittest fixture set pass and their bugs fail (docs/sandbox.md,
"The inprocess harness").
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from reward.sandbox import Job, Limits, SandboxWorker, resolve_isolation
from reward.sandbox_harness import expected_tests, seal
from reward.schema import AssertTests, UnittestTests, load_tasks

LIMITS = Limits(timeout_s=20.0, memory_mb=512)
FIXTURES = Path(__file__).parent / "fixtures" / "unittest_tasks.jsonl"

TESTS = textwrap.dedent('''\
    import os
    import random
    import tempfile
    import unittest
    from unittest.mock import patch

    class TestCases(unittest.TestCase):
        def setUp(self):
            self.dir = tempfile.mkdtemp()
            with open(os.path.join(self.dir, "n.txt"), "w") as f:
                f.write("3")

        def test_total(self):
            self.assertEqual(total([1, 2, 3]), 6)

        def test_scale(self):
            self.assertEqual(scale([1, 2], 3), [3, 6])
            self.assertTrue(scale([1], 2) == [2])

        @patch("random.randint", return_value=4)
        def test_roll(self, mock_randint):
            self.assertEqual(roll(), 4)

        def test_file(self):
            self.assertEqual(read_number(os.path.join(self.dir, "n.txt")), 3)
    ''')
# The same tests as an `assert` module that runs unittest's own runner (how BigCodeBench tests ran `inprocess`
# before the `unittest` kind): the runner, loader and result are unittest's, frozen like TestCase. Such a module
# runs after the program loads, when `@patch` could not read its function's `__code__`: a `with patch` here.
RUNNER_TESTS = TESTS.replace('''@patch("random.randint", return_value=4)
    def test_roll(self, mock_randint):
        self.assertEqual(roll(), 4)''', '''def test_roll(self):
        with patch("random.randint", return_value=4):
            self.assertEqual(roll(), 4)''') + ("\nimport sys\nresult = unittest.TextTestRunner(stream=sys.stderr).run(\n"
                        "    unittest.TestLoader().loadTestsFromTestCase(TestCases))\nassert result.wasSuccessful()\n")
PROXY_TESTS = "assert total([1, 2, 3]) == 6\nassert scale([1, 2], 3) == [3, 6]\nassert scale([1], 2) == [2]\n"
RIGHT = textwrap.dedent('''\
    import random

    def total(xs):
        return sum(xs)

    def scale(xs, k):
        return [x * k for x in xs]

    def roll():
        return random.randint(1, 6)

    def read_number(path):
        with open(path) as f:
            return int(f.read())
    ''')
WRONG = RIGHT.replace("return sum(xs)", "return sum(xs) + 1").replace("x * k", "x + k").replace(
    "randint(1, 6)", "randint(1, 6) + 1").replace("int(f.read())", "int(f.read()) - 1")


def guarded(*lines: str) -> str:
    """Each line run at import inside try/except, so what counts is whether it works, not whether it raises."""
    return "".join(f"try:\n{textwrap.indent(line, '    ')}\nexcept BaseException:\n    pass\n" for line in lines)


FAKE_VERDICT = ("import json, os\nnames = ['TestCases.test_file', 'TestCases.test_roll', 'TestCases.test_scale',"
                " 'TestCases.test_total']\nbody = json.dumps({'op': 'verdict', 'token': '0' * 64, 'loaded': True,"
                " 'tests': [[n, 'pass'] for n in names] + [['tests', 'pass']], 'refused': []}).encode()\n"
                "frame = len(body).to_bytes(4, 'big') + body\nfor fd in range(1024):\n    try:\n"
                "        os.write(fd, frame)\n    except OSError:\n        pass\n")
FRAME_THIEF = ("def steal(frame):\n    while frame is not None:\n        for v in list(frame.f_locals.values()):\n"
               "            if hasattr(v, '__dict__') and 'assertEqual' in getattr(v, '__dict__', {}):\n"
               "                v.__dict__['assertEqual'] = lambda *a, **k: None\n"
               "        frame = frame.f_back\n")

# Appended after WRONG (so a redefinition wins): (family, id, code).
FORGERIES = [
    ("framework", "TestCase.run", guarded("import unittest\nunittest.TestCase.run = lambda self, result=None: None")),
    ("framework", "TestResult.wasSuccessful", guarded("import unittest\nunittest.TestResult.wasSuccessful = lambda self: True")),
    ("framework", "TestLoader.loadTestsFromTestCase", guarded(
        "import unittest\nunittest.TestLoader.loadTestsFromTestCase = lambda self, c: unittest.TestSuite()")),
    ("framework", "TextTestRunner.run", guarded(
        "import unittest\nunittest.TextTestRunner.run = lambda self, t: unittest.TestResult()")),
    ("framework", "TestCase.assertEqual", guarded("import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None")),
    ("framework", "TestCase.__call__", guarded("import unittest.case\nunittest.case.TestCase.__call__ = lambda *a, **k: None")),
    ("framework", "failureException", guarded(
        "import unittest\nunittest.TestCase.failureException = type('Quiet', (Exception,), {})")),
    ("framework", "test class methods", guarded(
        "import unittest\nfor c in unittest.TestCase.__subclasses__():\n"
        "    for n in list(vars(c)):\n        if n.startswith('test') or n == 'setUp':\n"
        "            setattr(c, n, lambda self, *a: None)")),
    ("framework", "test class data descriptor", guarded(
        "import unittest\nfor c in unittest.TestCase.__subclasses__():\n"
        "    c.assertEqual = property(lambda s: lambda *a, **k: None)")),
    ("framework", "builtins.AssertionError", guarded(
        "import builtins\nbuiltins.AssertionError = type('AssertionError', (Exception,), {})")),
    ("framework", "builtins.len and isinstance", guarded("import builtins\nbuiltins.len = lambda x: 0",
                                                        "import builtins\nbuiltins.isinstance = lambda *a: True")),
    ("framework", "unittest.case.safe_repr", guarded("import unittest.case\nunittest.case.safe_repr = None")),
    ("framework", "sys.modules unittest", guarded("import sys, types\nsys.modules['unittest'] = types.ModuleType('u')")),
    ("framework", "mock.patch", guarded("import unittest.mock\nunittest.mock._patch.__enter__ = lambda self: None")),
    ("equality", "__eq__ always true", "class Yes:\n    def __eq__(self, other):\n        return True\n"
                                      "    __hash__ = None\ndef total(xs):\n    return Yes()\n"
                                      "def scale(xs, k):\n    return Yes()\ndef roll():\n    return Yes()\n"
                                      "def read_number(p):\n    return Yes()\n"),
    ("equality", "lying int and list subclasses", "class I(int):\n    def __eq__(self, o):\n        return True\n"
                                                  "class L(list):\n    def __eq__(self, o):\n        return True\n"
                                                  "def total(xs):\n    return I(0)\ndef scale(xs, k):\n    return L()\n"
                                                  "def roll():\n    return I(0)\ndef read_number(p):\n    return I(0)\n"),
    ("early exit", "os._exit at import", "import os\nos._exit(0)\n"),
    ("early exit", "sys.exit at import", "import sys\nsys.exit(0)\n"),
    ("early exit", "os._exit in a call", "import os\ndef total(xs):\n    os._exit(0)\n"),
    ("early exit", "SystemExit in a call", "def total(xs):\n    raise SystemExit(0)\n"),
    ("early exit", "atexit", "import atexit, os\natexit.register(lambda: os._exit(0))\n"),
    ("early exit", "SIGKILL itself", "import os, signal\ndef total(xs):\n    os.kill(os.getpid(), signal.SIGKILL)\n"),
    ("early exit", "SIGTERM handler", guarded("import signal\nsignal.signal(signal.SIGTERM, lambda *a: None)") +
     "import os, signal\ndef total(xs):\n    os.kill(os.getpid(), signal.SIGTERM)\n"),
    ("early exit", "kill the parent", "import os, signal\ndef total(xs):\n" + textwrap.indent(
        guarded("os.kill(1, signal.SIGKILL)", "os.kill(os.getppid(), signal.SIGKILL)", "os.killpg(0, signal.SIGKILL)"),
        "    ") + "    return 0\n"),
    ("skipping", "skipTest in setUp", guarded(
        "import unittest\nunittest.TestCase.setUp = lambda self: self.skipTest('no')",
        "import unittest\nfor c in unittest.TestCase.__subclasses__():\n    c.setUp = lambda self: self.skipTest('no')")),
    ("skipping", "SkipTest from the program", "import unittest\ndef total(xs):\n    raise unittest.SkipTest('no')\n"
                                              "def scale(xs, k):\n    raise unittest.SkipTest('no')\n"
                                              "def roll():\n    raise unittest.SkipTest('no')\n"
                                              "def read_number(p):\n    raise unittest.SkipTest('no')\n"),
    ("skipping", "pytest.skip", "def total(xs):\n    import pytest\n    pytest.skip('no')\n"),
    ("channel", "fake verdicts on every descriptor", FAKE_VERDICT),
    ("channel", "fake verdicts from a call", "def total(xs):\n" + textwrap.indent(FAKE_VERDICT, "    ") +
     "    import os\n    os._exit(0)\n"),
    ("channel", "sys._getframe", FRAME_THIEF + "import sys, inspect\ndef total(xs):\n" + textwrap.indent(
        guarded("steal(sys._getframe(1))", "steal(inspect.currentframe().f_back)"), "    ") + "    return 0\n"),
    ("channel", "traceback frames", FRAME_THIEF + "def total(xs):\n    try:\n        raise ValueError\n"
                                                "    except ValueError as e:\n" + textwrap.indent(
        guarded("steal(e.__traceback__.tb_frame)"), "        ") + "    return 0\n"),
    ("channel", "generator frames", FRAME_THIEF + "def total(xs):\n    g = (x for x in xs)\n" + textwrap.indent(
        guarded("steal(g.gi_frame)"), "    ") + "    return 0\n"),
    ("channel", "signal handler frames", FRAME_THIEF + guarded(
        "import signal\nsignal.signal(signal.SIGALRM, lambda n, f: steal(f))\nsignal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)")
     + "def total(xs):\n    import time\n    time.sleep(0.05)\n    return 0\n"),
    ("channel", "tracing", FRAME_THIEF + guarded("import sys\nsys.settrace(lambda f, e, a: steal(f))",
                                                 "import sys\nsys.setprofile(lambda f, e, a: steal(f))")),
    ("channel", "threads' frames", FRAME_THIEF + "import sys, threading\ndef total(xs):\n" + textwrap.indent(
        guarded("for f in sys._current_frames().values():\n    steal(f)"), "    ") + "    return 0\n"),
    ("channel", "gc", "import gc\ndef total(xs):\n" + textwrap.indent(guarded(
        "for o in gc.get_objects():\n    if isinstance(o, dict) and 'assertEqual' in o:\n"
        "        o['assertEqual'] = lambda *a, **k: None",
        "for o in gc.get_referrers(total):\n    pass"), "    ") + "    return 0\n"),
    ("channel", "ctypes", guarded("import ctypes\nctypes.string_at(id(total), 64)",
                                  "import sys\nsys.modules['ctypes'].memmove") + "def total(xs):\n    return 0\n"),
    ("channel", "/proc", guarded("import os\nos.listdir('/proc/self/fd')", "open('/proc/self/mem', 'rb').read(1)",
                                 "import os\nos.chdir('/proc')")),
    ("channel", "the tests' code", "import unittest\ndef total(xs):\n" + textwrap.indent(guarded(
        "for c in unittest.TestCase.__subclasses__():\n    for f in vars(c).values():\n"
        "        if hasattr(f, '__code__'):\n            print(f.__code__.co_consts)",
        "for c in unittest.TestCase.__subclasses__():\n    c.test_total.__code__ = (lambda self: None).__code__"),
        "    ") + "    return 0\n"),
]


@pytest.fixture(scope="module")
def worker():
    w = SandboxWorker(resolve_isolation("auto"))
    yield w
    w.close()


def run(worker: SandboxWorker, program: str, tests) -> object:
    return worker.run(Job(program, tests, LIMITS))


def test_the_task_passes_with_the_right_program_and_fails_with_the_wrong_one(worker):
    right = run(worker, RIGHT, UnittestTests(TESTS))
    assert right.status == "pass", right.stderr
    assert "4 tests passed" in right.stderr
    wrong = run(worker, WRONG, UnittestTests(TESTS))
    assert wrong.status == "fail" and "0 of 4 tests passed" in wrong.stderr, wrong.stderr
    for name in ("test_total", "test_scale", "test_roll", "test_file"):
        assert f"TestCases.{name} (fail)" in wrong.stderr
    assert run(worker, RIGHT, AssertTests(PROXY_TESTS)).status == "pass"
    assert run(worker, RIGHT, AssertTests(PROXY_TESTS, "inprocess")).status == "pass"
    assert run(worker, RIGHT, AssertTests(RUNNER_TESTS, "inprocess")).status == "pass"
    assert run(worker, WRONG, AssertTests(RUNNER_TESTS, "inprocess")).status != "pass"


@pytest.mark.parametrize("family, name, code", FORGERIES, ids=[f"{f}: {n}" for f, n, _ in FORGERIES])
def test_no_forgery_passes(worker, family, name, code):
    """Every forgery, on a wrong program: not a pass in unittest, inprocess-assert (plain, and running
    unittest's runner) or proxy mode. Before the harness, 8 of these passed the runner form. That form
    is judged by unittest's runner, which counts a `SkipTest` the program raises as a skip: the
    skipping family is held only to the `unittest` kind there (docs/sandbox.md)."""
    runner = [] if family == "skipping" else [AssertTests(RUNNER_TESTS, "inprocess")]
    for tests in (UnittestTests(TESTS), AssertTests(PROXY_TESTS, "inprocess"), *runner, AssertTests(PROXY_TESTS)):
        result = run(worker, WRONG + "\n" + code, tests)
        assert result.status != "pass", (tests, result.stdout, result.stderr)


def test_forgeries_do_not_break_a_right_program_they_do_not_touch(worker):
    """The refusals are what fails a run: a right program with a harmless guarded forgery still passes."""
    result = run(worker, RIGHT + guarded("import unittest\nunittest.TestCase.run = None"), UnittestTests(TESTS))
    assert result.status == "pass", result.stderr


def test_a_refusal_fails_the_run_even_when_the_program_swallows_it(worker):
    result = run(worker, RIGHT + guarded("import gc\ngc.get_objects()"), UnittestTests(TESTS))
    assert result.status == "fail" and "refused in the sandbox: gc.get_objects" in result.stderr


def test_a_verdict_must_cover_every_test_of_the_source(worker):
    """The host holds the run to the tests it reads in the source: tests made at run time, or none, are an error."""
    dynamic = TESTS + "\nsetattr(TestCases, 'test_extra', lambda self: None)\n"
    result = run(worker, RIGHT, UnittestTests(dynamic))
    assert result.status == "error" and "differ from those the source defines" in result.stderr, result.stderr
    empty = run(worker, RIGHT, UnittestTests("import unittest\nif True:\n    class TestCases(unittest.TestCase):\n"
                                             "        def test_a(self):\n            pass\n"))
    assert empty.status == "error" and expected_tests("if True:\n    class T: pass\n") == []


def test_static_skips_are_skips_and_run_time_skips_fail(worker):
    tests = TESTS.replace("    def test_file(self):", "    @unittest.skip('later')\n    def test_file(self):")
    result = run(worker, RIGHT.replace("int(f.read())", "1 / 0"), UnittestTests(tests))
    assert result.status == "pass", result.stderr
    assert run(worker, RIGHT, UnittestTests(TESTS.replace("self.dir = tempfile", "self.skipTest('x')\n"
                                                          "        self.dir = tempfile"))).status == "fail"


def test_expected_tests_follow_unittests_loader():
    source = textwrap.dedent('''\
        import unittest
        class Base:
            def test_shared(self):
                pass
        class B(unittest.TestCase, Base):
            def test_b(self):
                pass
            def helper(self):
                pass
        class A(B):
            def test_a(self):
                pass
        class NotATest:
            def test_x(self):
                pass
        ''')
    assert expected_tests(source) == ["A.test_a", "A.test_b", "A.test_shared", "B.test_b", "B.test_shared"]


def test_sealed_code_ignores_its_globals_and_builtins():
    """What `seal` promises: the tests' names resolve in the private dict, whatever their `__globals__` holds."""
    names = {"len": len, "__compare__": lambda op, a, b: (op, a, b)}
    code = seal("X = 2\ndef f(v):\n    return len(v) + X\ndef g(a):\n    return a == X\n", "t.py", names,
                comparisons=True)
    globs = {"__builtins__": {"__build_class__": None}}
    exec(code, globs)
    globs["X"], globs["len"] = 100, None
    assert names["f"]([1]) == 3 and names["g"](5) == ("==", 5, 2)
    assert "X" in names and names["f"].__globals__ is globs


def test_the_fixture_unittest_tasks_verify(worker):
    """Hand-written unittest tasks (mock.patch, temp files, callbacks, classes, fixtures, subTest):
    every solution passes and every bug fails."""
    tasks = load_tasks(FIXTURES)
    assert len(tasks) >= 6 and all(isinstance(t.tests, UnittestTests) for t in tasks)
    for task in tasks:
        good = run(worker, task.solution, task.tests)
        assert good.status == "pass", (task.task_id, good.stderr)
        bad = run(worker, task.buggy_code, task.tests)
        assert bad.status == "fail", (task.task_id, bad.status, bad.stderr)


LIBRARY_TESTS = textwrap.dedent('''\
    import unittest
    import numpy as np
    import pandas as pd
    from numpy.testing import assert_allclose

    class TestCases(unittest.TestCase):
        def test_array(self):
            np.testing.assert_array_equal(double(np.array([1, 2])), np.array([2, 4]))

        def test_close(self):
            assert_allclose(double(np.array([0.5])), [1.0])

        def test_frame(self):
            pd.testing.assert_frame_equal(frame([1, 2]), pd.DataFrame({"x": [2, 4]}))
    ''')
LIBRARY_RIGHT = "import pandas as pd\ndef double(a):\n    return a * 2\ndef frame(xs):\n" \
                "    return pd.DataFrame({'x': [2 * x for x in xs]})\n"
LIBRARY_WRONG = LIBRARY_RIGHT.replace("a * 2", "a * 3").replace("2 * x", "3 * x")
LIBRARY_FORGERIES = [
    ("numpy.testing", guarded("import numpy.testing\nnumpy.testing.assert_array_equal = lambda *a, **k: None",
                              "import numpy.testing\nnumpy.testing.assert_allclose = lambda *a, **k: None")),
    ("pandas.testing", guarded("import pandas.testing\npandas.testing.assert_frame_equal = lambda *a, **k: None")),
    ("numpy internals", guarded("import numpy.testing._private.utils as u\nu.assert_array_compare = lambda *a, **k: None")),
    ("patched inside a call, restored after", "import numpy.testing, pandas.testing\n"
     "saved = (numpy.testing.assert_array_equal, numpy.testing.assert_allclose, pandas.testing.assert_frame_equal)\n"
     "def restore():\n    (numpy.testing.assert_array_equal, numpy.testing.assert_allclose,\n"
     "     pandas.testing.assert_frame_equal) = saved\n"
     "class Answer:\n    def __init__(self, v):\n        self.v = v\n    def __array__(self, dtype=None):\n"
     "        import numpy\n        return numpy.asarray(self.v)\n    def __del__(self):\n        restore()\n"
     "def quiet(*a, **k):\n    return None\n"
     "def double(a):\n    numpy.testing.assert_array_equal = numpy.testing.assert_allclose = quiet\n"
     "    return Answer(a * 3)\n"
     "def frame(xs):\n    pandas.testing.assert_frame_equal = quiet\n    return Answer(0)\n"),
]


@pytest.mark.parametrize("name, code", LIBRARY_FORGERIES, ids=[n for n, _ in LIBRARY_FORGERIES])
def test_no_library_forgery_passes(worker, name, code):
    """numpy.testing's and pandas.testing's asserts are called as they were before the program loaded."""
    pytest.importorskip("pandas")
    right = run(worker, LIBRARY_RIGHT, UnittestTests(LIBRARY_TESTS))
    if right.status == "error" and "No module named" in right.stderr:
        pytest.skip("numpy and pandas are not importable in the sandbox")
    assert right.status == "pass", right.stderr
    assert run(worker, LIBRARY_WRONG, UnittestTests(LIBRARY_TESTS)).status == "fail"
    result = run(worker, LIBRARY_WRONG + "\n" + code, UnittestTests(LIBRARY_TESTS))
    assert result.status != "pass", result.stderr


def test_what_the_program_sees_of_the_harness(worker):
    """No signal handler can be set, no frame had, no memory file opened: the program's view, from inside."""
    program = textwrap.dedent('''\
        import inspect, signal, sys
        SEEN = {"getframe": hasattr(sys, "_getframe"), "currentframe": inspect.currentframe()}
        try:
            signal.signal(signal.SIGUSR1, lambda *a: None)
            SEEN["signal"] = "set"
        except OSError:
            SEEN["signal"] = "refused"
        try:
            raise ValueError
        except ValueError as e:
            try:
                e.__traceback__.tb_frame
                SEEN["tb_frame"] = "read"
            except RuntimeError:
                SEEN["tb_frame"] = "refused"
        ''')
    tests = "assert SEEN == {'getframe': False, 'currentframe': None, 'signal': 'refused', 'tb_frame': 'refused'}\n"
    result = run(worker, program, AssertTests(tests, "inprocess"))
    assert result.status == "pass", result.stderr
    opened = run(worker, guarded("open('/proc/self/mem', 'rb')"), AssertTests("pass\n", "inprocess"))
    assert opened.status == "fail" and "refused in the sandbox: open /proc/self/mem" in opened.stderr


def test_check_gives_the_harness_account_as_the_reason():
    from reward.check_cli import failure_reason
    from reward.sandbox import RunResult
    result = RunResult(False, "fail", 0.1, stderr="FAIL: T.test_a (test): AssertionError: 1 != 2\n\n"
                                                  "[tests] 1 of 2 tests passed; not passed: T.test_a (fail)")
    assert failure_reason(result, False, inprocess=True) == "1 of 2 tests passed; not passed: T.test_a (fail)"
