"""Helpers the tests trust are the reference's, not the program's (reward/trusted_helpers.py).

HumanEval/32, /38 and /50 check an answer with a helper the program defines (`poly`,
`encode_cyclic`, `encode_shift`); with the program's own helper, stubs pass."""

from __future__ import annotations

import pytest

from reward.data.build import bind_trusted_helpers
from reward.data.sources import humaneval_problems
from reward.fleet import Fleet
from reward.sandbox import Job, Limits
from reward.schema import AssertTests
from reward.trusted_helpers import HEADER, bind_helpers, helper_names

PROBLEMS = {p.base_id: p for p in humaneval_problems()}
FAST = Limits(timeout_s=30.0, memory_mb=256)
STUBS = {  # a helper replaced so that a wrong answer checks out
    "HumanEval/32": "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 0.0\n",
    "HumanEval/38": "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n",
    "HumanEval/50": "def encode_shift(s):\n    return s\n\ndef decode_shift(s):\n    return s\n",
}


def test_data_build_finds_exactly_the_humaneval_tests_that_call_program_helpers():
    _, found = bind_trusted_helpers(list(PROBLEMS.values()))
    assert found == {"HumanEval/32": ["poly"], "HumanEval/38": ["encode_cyclic"], "HumanEval/50": ["encode_shift"]}


def test_entry_points_and_tests_own_names_are_never_helpers():
    solution = "import math\nK = 3\ndef scale(x):\n    return x * K\ndef f(x):\n    return scale(x) + 1\n" \
               "def g(x):\n    return math.sqrt(x)\n"
    assert helper_names("assert f(1) == 4\nassert g(4) == 2\n", solution) == []  # MBPP style: entry points
    assert helper_names("def check(c):\n    assert c(1) == scale(1) + 1\ncheck(f)\n", solution) == ["scale"]
    assert helper_names("def scale(x):\n    return x\ndef check(c):\n    assert c(1) == scale(1)\ncheck(f)\n",
                        solution) == []
    tests, names = bind_helpers("def check(c):\n    assert c(1) == scale(1) + 1\ncheck(f)\n", solution)
    assert names == ["scale"] and tests.startswith(HEADER + "import math\n\nK = 3\n\ndef scale(x):")
    assert helper_names("def check(:\n", solution) == [] and bind_helpers("x", "def (") == ("x", [])


@pytest.fixture(scope="module")
def fleet():
    with Fleet(workers=2, cache=False, isolation="bwrap") as f:
        yield f


@pytest.mark.parametrize("base_id", sorted(STUBS))
def test_stubbed_helpers_no_longer_pass(fleet, base_id):
    problem = PROBLEMS[base_id]
    bound = AssertTests(bind_helpers(problem.tests.code, problem.solution)[0])
    raw, stub, reference = fleet.run([Job(STUBS[base_id], problem.tests, FAST), Job(STUBS[base_id], bound, FAST),
                                      Job(problem.solution, bound, FAST)])
    assert raw.passed  # the hole: the program's own helper vouches for its answer
    assert stub.status == "fail", stub.stderr[-500:]
    assert reference.passed, reference.stderr[-500:]
