"""BigCodeBench's released format as problems to plant bugs in (`precisecoder data import-bcb`).

A record (one JSON object a line) has `task_id` (`BigCodeBench/N`),
`complete_prompt` (imports, signature and docstring), `canonical_solution` (the
body), `test` (a module defining `class TestCases(unittest.TestCase)`),
`entry_point` and `libs` (a list, or a string holding a Python list, of the
modules it imports); `instruct_prompt`, `code_prompt` and `doc_struct` are read
but not needed. The program is `complete_prompt + canonical_solution`, whose
prompt lines are frozen (bugs go into the body), and the tests are
`UnittestTests(test)`, which run in the program's process (`reward.modes`).
"""

from __future__ import annotations

import ast
import collections
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from reward.check_cli import last_exception
from reward.data.sources import Problem, _each, _records, _text
from reward.schema import UnittestTests

SOURCE = "bigcodebench"


def _libs(rec: dict[str, Any]) -> list[str]:
    """The record's `libs`: a list of names, or a string holding one (as the release has it)."""
    value = rec.get("libs", [])
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise ValueError(f"field 'libs' must hold a Python list, got {value[:80]!r}") from None
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise TypeError("field 'libs' must be a list of module names")
    return value


def bcb_problem(rec: dict[str, Any]) -> Problem:
    """One BigCodeBench record as a problem: program, unittest tests, frozen prompt lines."""
    prompt = _text(rec, "complete_prompt")
    _libs(rec)
    return Problem(_text(rec, "task_id"), SOURCE, prompt, prompt + _text(rec, "canonical_solution"),
                   UnittestTests(_text(rec, "test")), frozen_lines=prompt.count("\n"))


def bcb_problems(path: str | os.PathLike) -> list[Problem]:
    """The problems of a BigCodeBench JSONL file (a JSON list also loads).

    Raises:
        SourceError: a malformed file or record, naming it.
    """
    return _each(path, _records(path), bcb_problem)


def bcb_libraries(path: str | os.PathLike) -> dict[str, list[str]]:
    """task_id -> the libraries its record names (`libs`)."""
    return dict(_each(path, _records(path), lambda rec: (_text(rec, "task_id"), _libs(rec))))


_NETWORK = ("gaierror", "ConnectionError", "URLError", "Temporary failure in name resolution",
            "Network is unreachable", "Connection refused", "MaxRetryError", "NewConnectionError")


def drop_category(reason: str) -> str:
    """A short class of why a reference failed: `missing library X`, `network`, `files`, `timeout`,
    `refused by the inprocess harness: ...`, else the exception's type.

    `reason` is the build's "status: exception line" (`problems_dropped_reasons`).
    """
    status, _, detail = reason.partition(": ")
    detail = re.sub(r"^the program did not load \(line \d+\): ", "", detail)
    refused = detail.partition("refused in the sandbox: ")[2]
    if refused:
        return f"refused by the inprocess harness: {refused.split(';')[0].strip()}"
    missing = detail.partition("No module named ")[2]
    if missing:
        return f"missing library {missing.strip(chr(39)).split('.')[0]}"
    if any(word in detail for word in _NETWORK):
        return "network"
    if detail.startswith(("FileNotFoundError", "PermissionError", "IsADirectoryError", "OSError")):
        return f"files ({detail.split(':')[0]})"
    if status in ("timeout", "oom", "killed", "unverifiable"):
        return status
    return detail.split(":")[0] or status


def library_coverage(libraries: dict[str, list[str]], kept: Sequence[str],
                     dropped: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per library: how many problems name it, how many of those were kept, and why the others were dropped
    (`drop_category`, counted).

    Args:
        libraries: task_id -> libraries (`bcb_libraries`).
        kept: ids of the problems whose reference passed.
        dropped: id -> why its reference failed (the build's `problems_dropped_reasons`).
    """
    kept_ids = set(kept)
    out: dict[str, dict[str, Any]] = {}
    for lib in sorted({lib for libs in libraries.values() for lib in libs}):
        ids = [i for i, libs in libraries.items() if lib in libs and (i in kept_ids or i in dropped)]
        reasons = collections.Counter(drop_category(dropped[i]) for i in ids if i in dropped)
        out[lib] = {"problems": len(ids), "kept": sum(i in kept_ids for i in ids),
                    "dropped": dict(reasons.most_common())}
    return out


def plain_python_failure(rec: dict[str, Any], timeout_s: float = 60.0) -> str | None:
    """Run a record's reference with its tests in plain Python, unsandboxed, in a fresh directory:
    None when every test passes, else why not ("status: exception line", as `drop_category` reads).

    The baseline a sandboxed verdict is measured against (tests, `scripts/sandbox_modes.py`);
    only for references you trust.
    """
    source = (_text(rec, "complete_prompt") + _text(rec, "canonical_solution") + "\n" + _text(rec, "test")
              + "\nimport unittest\nunittest.main(argv=['tests'], verbosity=0)\n")
    with tempfile.TemporaryDirectory() as cwd:
        try:
            proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, errors="replace",
                                  timeout=timeout_s, cwd=cwd, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return "timeout: timeout"
    if proc.returncode == 0:
        return None
    return f"error: {last_exception(proc.stderr) or proc.stderr.strip()[-200:]}"
