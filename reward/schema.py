"""Task and prediction records (JSONL) exactly as docs/reward.md defines them.

Loading validates every field and raises `SchemaError` naming the file, the
line and the field, so a bad record is fixed at its source instead of
surfacing later as a wrong reward. `write_tasks` / `write_predictions` write
records that load back identically.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Iterator
from typing import Any, Union

from reward.diff import diff
from reward.outfile import json_line


class SchemaError(ValueError):
    """A record that does not follow the schema; the message says where and why."""

    def __init__(self, path: str | os.PathLike, line: int, message: str):
        self.path, self.line = str(path), line
        super().__init__(f"{path}:{line}: {message}")


TEST_MODES = ("proxy", "inprocess")


@dataclasses.dataclass(frozen=True)
class AssertTests:
    """Test code run against the program's top-level names.

    `mode` says how (docs/sandbox.md): `proxy` runs the tests in a separate
    trusted process where the program's names are proxies that pass plain data;
    `inprocess` runs them in the program's process, for tests that need more
    (patching what the program uses, files it reads, seeded generators), under a
    harness set up before the program loads whose verdict resists forgery
    (docs/sandbox.md, "The inprocess harness", says what it stops and what it does
    not). None (the default) lets `reward.modes.choose_mode` decide from the code.
    A task file that sets `proxy` for tests that need the program's process is
    refused when it loads (`tests_from_json`): there a correct program would fail.
    Code may still build such tests, to exercise the judge's own process.
    """

    code: str
    mode: str | None = None

    def __post_init__(self):
        if self.mode is not None and self.mode not in TEST_MODES:
            raise ValueError(f"field 'tests.mode' must be one of {', '.join(TEST_MODES)}, got {self.mode!r}")


@dataclasses.dataclass(frozen=True)
class IOCase:
    stdin: str
    stdout: str


@dataclasses.dataclass(frozen=True)
class IOTests:
    """Stdin/stdout cases; the program runs as a script once per case."""

    cases: tuple[IOCase, ...]


@dataclasses.dataclass(frozen=True)
class UnittestTests:
    """A test module of `unittest.TestCase` classes, run in the program's process (mode `inprocess`).

    Every `test*` method of every TestCase subclass the module defines runs, classes and
    methods in name order as unittest's loader orders them, with fixtures, cleanups and
    `subTest` as unittest runs them. The program's top-level names are visible to the tests.
    """

    code: str

    @property
    def mode(self) -> str:
        return "inprocess"


Tests = Union[AssertTests, IOTests, UnittestTests]


@dataclasses.dataclass(frozen=True)
class Task:
    """One debugging task (C buggy program, x prompt, T tests, reference fix)."""

    task_id: str
    base_id: str
    prompt: str
    buggy_code: str
    solution: str
    tests: Tests
    epsilon: int | None = None
    timeout_s: float | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)
    memory_mb: int | None = None
    loopback: bool = False

    @property
    def forgeable(self) -> bool:
        """Whether the program could forge its verdict: never, since `inprocess` runs are hardened too
        (docs/sandbox.md, "Test modes"). Kept so that readers of older configs and tasks still work."""
        return False

    @property
    def is_clean(self) -> bool:
        """A clean task has no fault: diff(buggy_code, solution) has no block (m = 0).

        That is `buggy_code == solution`, or the two differ only in blank lines
        and trailing whitespace, which the spec's diff ignores.
        """
        return self.buggy_code == self.solution or not diff(self.buggy_code, self.solution)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A model's answer to a task: raw `response` text and/or an extracted `code`.

    `think_opened` says whether the prompt the response continues already opened
    a `<think>` block (then the response must close it to have an answer); None
    leaves it to the scorer's default (`--think-opened`, else False).
    """

    task_id: str
    response: str | None = None
    code: str | None = None
    think_opened: bool | None = None


def tests_to_json(tests: Tests) -> dict[str, Any]:
    """The JSON object form of a test spec."""
    if isinstance(tests, AssertTests):
        obj = {"kind": "assert", "code": tests.code}
        if tests.mode is not None:
            obj["mode"] = tests.mode
        return obj
    if isinstance(tests, UnittestTests):
        return {"kind": "unittest", "code": tests.code}
    return {"kind": "io", "cases": [{"stdin": c.stdin, "stdout": c.stdout} for c in tests.cases]}


def tests_from_json(obj: Any) -> Tests:
    """Parse a test spec object; raises ValueError with the offending field."""
    if not isinstance(obj, dict):
        raise ValueError("field 'tests' must be an object")
    kind = obj.get("kind")
    if kind == "assert":
        code = obj.get("code")
        if not isinstance(code, str):
            raise ValueError("field 'tests.code' must be a string")
        tests = AssertTests(code, obj.get("mode"))
        if tests.mode == "proxy":
            from reward.modes import proxy_refusal  # reward.modes imports this module
            refusal = proxy_refusal(code)
            if refusal:
                raise ValueError(refusal)
        return tests
    if kind == "unittest":
        code = obj.get("code")
        if not isinstance(code, str):
            raise ValueError("field 'tests.code' must be a string")
        if obj.get("mode", "inprocess") != "inprocess":
            raise ValueError(f"field 'tests.mode' of unittest tests must be 'inprocess', got {obj['mode']!r}")
        return UnittestTests(code)
    if kind == "io":
        cases = obj.get("cases")
        if not isinstance(cases, list) or not cases:
            raise ValueError("field 'tests.cases' must be a non-empty list")
        parsed = []
        for i, case in enumerate(cases):
            if not isinstance(case, dict):
                raise ValueError(f"field 'tests.cases[{i}]' must be an object")
            for key in ("stdin", "stdout"):
                if not isinstance(case.get(key), str):
                    raise ValueError(f"field 'tests.cases[{i}].{key}' must be a string")
            parsed.append(IOCase(case["stdin"], case["stdout"]))
        return IOTests(tuple(parsed))
    raise ValueError(f"field 'tests.kind' must be 'assert', 'unittest' or 'io', got {kind!r}")


_REQUIRED_STR = ("task_id", "base_id", "prompt", "buggy_code", "solution")
MAX_TIMEOUT_S = 86_400.0
MAX_MEMORY_MB = 1 << 20


def _check_text(value: Any, field: str) -> None:
    """Every string in `value` (keys included) must be valid Unicode: no lone surrogates."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"field '{field}' contains a lone surrogate (not valid Unicode)") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k, field)
            _check_text(v, field)
    elif isinstance(value, list):
        for v in value:
            _check_text(v, field)


def positive_seconds(value: Any, field: str) -> float:
    """A finite wall-clock limit in (0, 1 day]; raises ValueError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= MAX_TIMEOUT_S:
        raise ValueError(f"field '{field}' must be a finite number of seconds in (0, {MAX_TIMEOUT_S:g}], "
                         f"got {value!r}")
    return float(value)


def positive_megabytes(value: Any, field: str) -> int:
    """A memory limit in MiB, an integer in [1, 2**20]; raises ValueError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MEMORY_MB:
        raise ValueError(f"field '{field}' must be an integer number of MiB in [1, {MAX_MEMORY_MB}], got {value!r}")
    return value


def task_from_json(obj: Any) -> Task:
    """Validate one task object; raises ValueError naming the bad field."""
    if not isinstance(obj, dict):
        raise ValueError("record must be a JSON object")
    for key in _REQUIRED_STR:
        if key not in obj:
            raise ValueError(f"missing field '{key}'")
        if not isinstance(obj[key], str):
            raise ValueError(f"field '{key}' must be a string")
    if "tests" not in obj:
        raise ValueError("missing field 'tests'")
    for key in (*_REQUIRED_STR, "tests", "meta"):
        _check_text(obj.get(key), key)
    tests = tests_from_json(obj["tests"])
    epsilon = obj.get("epsilon")
    if epsilon is not None and (isinstance(epsilon, bool) or not isinstance(epsilon, int) or epsilon < 0):
        raise ValueError("field 'epsilon' must be a non-negative integer")
    timeout_s = obj.get("timeout_s")
    if timeout_s is not None:
        timeout_s = positive_seconds(timeout_s, "timeout_s")
    memory_mb = obj.get("memory_mb")
    if memory_mb is not None:
        memory_mb = positive_megabytes(memory_mb, "memory_mb")
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise ValueError("field 'meta' must be an object")
    loopback = obj.get("loopback", False)
    if not isinstance(loopback, bool):
        raise ValueError("field 'loopback' must be true or false")
    return Task(obj["task_id"], obj["base_id"], obj["prompt"], obj["buggy_code"], obj["solution"],
                tests, epsilon, timeout_s, meta, memory_mb, loopback)


def task_to_json(task: Task) -> dict[str, Any]:
    """The JSON object of a task; optional fields are written only when set."""
    obj: dict[str, Any] = {key: getattr(task, key) for key in _REQUIRED_STR}
    obj["tests"] = tests_to_json(task.tests)
    if task.epsilon is not None:
        obj["epsilon"] = task.epsilon
    if task.timeout_s is not None:
        obj["timeout_s"] = task.timeout_s
    if task.memory_mb is not None:
        obj["memory_mb"] = task.memory_mb
    if task.loopback:
        obj["loopback"] = True
    if task.meta:
        obj["meta"] = task.meta
    return obj


def prediction_from_json(obj: Any) -> Prediction:
    """Validate one prediction object; raises ValueError naming the bad field."""
    if not isinstance(obj, dict):
        raise ValueError("record must be a JSON object")
    if not isinstance(obj.get("task_id"), str):
        raise ValueError("missing field 'task_id'" if "task_id" not in obj else "field 'task_id' must be a string")
    response, code = obj.get("response"), obj.get("code")
    if response is None and code is None:
        raise ValueError("a prediction needs a 'response' or a 'code' field")
    for key, value in (("task_id", obj["task_id"]), ("response", response), ("code", code)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"field '{key}' must be a string")
        _check_text(value, key)
    think_opened = obj.get("think_opened")
    if think_opened is not None and not isinstance(think_opened, bool):
        raise ValueError("field 'think_opened' must be true or false")
    return Prediction(obj["task_id"], response, code, think_opened)


def prediction_to_json(pred: Prediction) -> dict[str, Any]:
    obj: dict[str, Any] = {"task_id": pred.task_id}
    if pred.response is not None:
        obj["response"] = pred.response
    if pred.code is not None:
        obj["code"] = pred.code
    if pred.think_opened is not None:
        obj["think_opened"] = pred.think_opened
    return obj


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """Yield (line number, parsed object) for each non-blank line; bad JSON or UTF-8 is a SchemaError."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SchemaError(path, lineno, f"not valid UTF-8 (byte {e.start + 1})") from None
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line, parse_constant=_reject_constant)
            except json.JSONDecodeError as e:
                raise SchemaError(path, lineno, f"malformed JSON: {e.msg} (column {e.colno})") from None
            except RecursionError:
                raise SchemaError(path, lineno, "malformed JSON: nested too deeply") from None
            except ValueError as e:
                raise SchemaError(path, lineno, str(e)) from None


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-standard JSON constant {name}")


def _load(path: str | os.PathLike, parse) -> list:
    records = []
    for lineno, obj in read_jsonl(path):
        try:
            records.append(parse(obj))
        except ValueError as e:
            raise SchemaError(path, lineno, str(e)) from None
    return records


def load_tasks(path: str | os.PathLike) -> list[Task]:
    """Load and validate a task JSONL file; task ids must be unique."""
    tasks = _load(path, task_from_json)
    seen: dict[str, int] = {}
    for i, task in enumerate(tasks):
        if task.task_id in seen:
            raise SchemaError(path, _line_of(path, i), f"duplicate task_id {task.task_id!r}")
        seen[task.task_id] = i
    return tasks


def _line_of(path: str | os.PathLike, index: int) -> int:
    """Line number of the index-th record (blank lines skipped), for error messages."""
    for i, (lineno, _) in enumerate(read_jsonl(path)):
        if i == index:
            return lineno
    return 0


def load_predictions(path: str | os.PathLike) -> list[Prediction]:
    """Load and validate a prediction JSONL file (several per task allowed)."""
    return _load(path, prediction_from_json)


def write_jsonl(path: str | os.PathLike, objects: Iterable[dict[str, Any]]) -> None:
    """Write objects one per line, atomically (a crash never leaves half a file).

    Any text survives (see `json_line`), and a link is written through: its target is replaced.
    """
    path = os.path.realpath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for obj in objects:
                f.write(json_line(obj))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_tasks(path: str | os.PathLike, tasks: Iterable[Task]) -> None:
    write_jsonl(path, (task_to_json(t) for t in tasks))


def write_predictions(path: str | os.PathLike, preds: Iterable[Prediction]) -> None:
    write_jsonl(path, (prediction_to_json(p) for p in preds))
