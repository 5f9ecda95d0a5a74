"""Repository task records (docs/reward.md, "Repository tasks"): a fault in a source tree with its own tests.

A repository task names a clean tree (an archive of the package's source with its test
suite), the files the fault changes as the model sees them (`buggy_files`), the same paths
after the reference fix (`solution_files`), and the pytest node ids that must pass.
Loading validates every field and raises ValueError naming the field, as `reward.schema`
does for single-program tasks.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from typing import Any

from reward.schema import _check_text, positive_seconds

DEFAULT_REPO_TIMEOUT_S = 60.0
DEFAULT_REPO_MEMORY_MB = 2048
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True)
class RepoSource:
    """The clean tree: a `.tar.gz` (or a directory) at `archive`, relative to the task file's directory."""

    name: str
    version: str
    archive: str
    sha256: str


@dataclasses.dataclass(frozen=True)
class PytestTests:
    """Node ids that must be collected and pass: the fault's `fail_to_pass` and the guard `pass_to_pass`."""

    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]

    @property
    def node_ids(self) -> tuple[str, ...]:
        return self.fail_to_pass + self.pass_to_pass


@dataclasses.dataclass(frozen=True)
class RepoTask:
    """One repository-level debugging task (buggy files shown to the model, reference fix, pytest ids)."""

    task_id: str
    base_id: str
    prompt: str
    repo: RepoSource
    buggy_files: dict[str, str]
    solution_files: dict[str, str]
    tests: PytestTests
    context_files: tuple[str, ...] = ()
    epsilon: int | None = None
    timeout_s: float | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)

    @property
    def is_clean(self) -> bool:
        return self.buggy_files == self.solution_files


def is_test_path(path: str) -> bool:
    """Whether `path` is a test file a prediction may not change (conftest, test_*, *_test, under test/ or tests/)."""
    parts = path.split("/")
    name = parts[-1]
    return (name == "conftest.py" or name.startswith("test_") or name.endswith("_test.py")
            or any(p in ("test", "tests") for p in parts[:-1]))


def path_problem(path: str) -> str | None:
    """Why `path` cannot name a file of the tree a prediction changes, or None when it can."""
    if not path or path.startswith("/") or "\\" in path:
        return f"path {path!r} must be relative, with '/'"
    if posixpath.normpath(path) != path or ".." in path.split("/"):
        return f"path {path!r} must be normalized, without '..'"
    if not path.endswith(".py"):
        return f"path {path!r} is not a .py file"
    if is_test_path(path):
        return f"path {path!r} is a test file"
    return None


def _files(obj: Any, field: str) -> dict[str, str]:
    if not isinstance(obj, dict) or not obj:
        raise ValueError(f"field '{field}' must be a non-empty object of path -> text")
    for path, text in obj.items():
        problem = path_problem(path)
        if problem:
            raise ValueError(f"field '{field}': {problem}")
        if not isinstance(text, str):
            raise ValueError(f"field '{field}.{path}' must be a string")
    return dict(obj)


def _node_ids(obj: Any, field: str) -> tuple[str, ...]:
    if not isinstance(obj, list) or not all(isinstance(n, str) and n for n in obj):
        raise ValueError(f"field '{field}' must be a list of pytest node ids")
    return tuple(obj)


def repo_task_from_json(obj: Any) -> RepoTask:
    """Validate one repository task object; raises ValueError naming the bad field."""
    if not isinstance(obj, dict):
        raise ValueError("record must be a JSON object")
    for key in ("task_id", "base_id", "prompt"):
        if not isinstance(obj.get(key), str):
            raise ValueError(f"missing field '{key}'" if key not in obj else f"field '{key}' must be a string")
    for key in ("repo", "buggy_files", "solution_files", "tests"):
        if key not in obj:
            raise ValueError(f"missing field '{key}'")
    for key in ("task_id", "base_id", "prompt", "repo", "buggy_files", "solution_files", "tests", "meta"):
        _check_text(obj.get(key), key)
    repo = obj["repo"]
    if not isinstance(repo, dict) or not all(isinstance(repo.get(k), str) for k in ("name", "version", "archive", "sha256")):
        raise ValueError("field 'repo' must be an object with string 'name', 'version', 'archive' and 'sha256'")
    if not _SHA256.fullmatch(repo["sha256"]):
        raise ValueError("field 'repo.sha256' must be 64 lowercase hex digits")
    buggy = _files(obj["buggy_files"], "buggy_files")
    solution = _files(obj["solution_files"], "solution_files")
    if set(buggy) != set(solution):
        raise ValueError("fields 'buggy_files' and 'solution_files' must name the same paths")
    tests = obj["tests"]
    if not isinstance(tests, dict) or tests.get("kind") != "pytest":
        raise ValueError("field 'tests.kind' must be 'pytest' for a repository task")
    f2p = _node_ids(tests.get("fail_to_pass", []), "tests.fail_to_pass")
    p2p = _node_ids(tests.get("pass_to_pass", []), "tests.pass_to_pass")
    if not f2p and not p2p:
        raise ValueError("field 'tests' must list at least one node id")
    context = obj.get("context_files", [])
    if not isinstance(context, list) or not all(isinstance(p, str) and not path_problem(p) for p in context):
        raise ValueError("field 'context_files' must be a list of relative .py paths of the tree")
    epsilon = obj.get("epsilon")
    if epsilon is not None and (isinstance(epsilon, bool) or not isinstance(epsilon, int) or epsilon < 0):
        raise ValueError("field 'epsilon' must be a non-negative integer")
    timeout_s = obj.get("timeout_s")
    if timeout_s is not None:
        timeout_s = positive_seconds(timeout_s, "timeout_s")
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise ValueError("field 'meta' must be an object")
    return RepoTask(obj["task_id"], obj["base_id"], obj["prompt"],
                    RepoSource(repo["name"], repo["version"], repo["archive"], repo["sha256"]),
                    buggy, solution, PytestTests(f2p, p2p), tuple(context), epsilon, timeout_s, meta)


def repo_task_to_json(task: RepoTask) -> dict[str, Any]:
    """The JSON object of a repository task; optional fields are written only when set."""
    obj: dict[str, Any] = {
        "task_id": task.task_id, "base_id": task.base_id, "prompt": task.prompt,
        "repo": dataclasses.asdict(task.repo),
        "buggy_files": task.buggy_files, "solution_files": task.solution_files,
        "tests": {"kind": "pytest", "fail_to_pass": list(task.tests.fail_to_pass),
                  "pass_to_pass": list(task.tests.pass_to_pass)},
    }
    if task.context_files:
        obj["context_files"] = list(task.context_files)
    if task.epsilon is not None:
        obj["epsilon"] = task.epsilon
    if task.timeout_s is not None:
        obj["timeout_s"] = task.timeout_s
    if task.meta:
        obj["meta"] = task.meta
    return obj


def is_repo_record(obj: Any) -> bool:
    """Whether a task record is a repository task (it has `repo`), so loaders can dispatch on it."""
    return isinstance(obj, dict) and "repo" in obj
