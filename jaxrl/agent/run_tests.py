"""The agent's `run_tests` tool: the task's tests on the current file, as pass and fail counts.

The tests are cut into units so the counts mean something: each stdin/stdout
case is a unit; assert tests are cut at their top-level `assert` statements, each
unit being the statements that set up (imports, definitions, assignments before
it) plus that one assert. Tests with no top-level assert, or that do not parse,
are one unit. Every unit runs in the sandbox fleet like any scored program; the
model sees only the counts, never the tests.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence

from jaxrl.agent.env import TestRunner
from reward.sandbox import Job, Limits, RunResult, limits_for
from reward.schema import AssertTests, IOTests, Task, Tests
from reward.score import canonical_job

RunBatch = Callable[[Sequence[Job]], list[RunResult]]


def split_tests(tests: Tests) -> list[Tests]:
    """The tests cut into units, each counted as one passed or failed test."""
    if isinstance(tests, IOTests):
        return [IOTests((case,)) for case in tests.cases] or [tests]
    try:
        body = ast.parse(tests.code).body
    except SyntaxError:
        return [tests]
    lines = tests.code.split("\n")

    def source(node: ast.stmt) -> str:
        return "\n".join(lines[node.lineno - 1:node.end_lineno])

    units, setup = [], []
    for node in body:
        if isinstance(node, ast.Assert):
            units.append(AssertTests("\n".join([*setup, source(node)]) + "\n", tests.mode))
        else:
            setup.append(source(node))
    return units or [tests]


def runner_for(task: Task, run_batch: RunBatch, limits: Limits = Limits()) -> TestRunner:
    """`run_tests` for one task: a program -> (units passed, units failed) on `run_batch` (e.g. `Fleet.run`)."""
    units = split_tests(task.tests)
    task_limits = limits_for(task, limits)

    def run(program: str) -> tuple[int, int]:
        results = run_batch([canonical_job(program, unit, task_limits) for unit in units])
        passed = sum(r.passed for r in results)
        return passed, len(results) - passed

    return run
