"""Predictions of repository tasks (docs/reward.md, "Repository tasks"): records, the files they change, patches.

A prediction gives the new text of the files it changes in one of three forms, the first present
winning: `files` (path → text), `patch` (a unified diff against the buggy files, as SWE-bench's
`model_patch`), or `response` (the model's text: fenced blocks whose info string is `python`,
`python3` or `py` followed by a path, the last block of a path winning; with none, the last ```diff
or ```patch block, applied as a unified diff). A prediction whose files cannot be taken is invalid,
with the reason: a path that is absolute, holds `..`, is a test file or not a `.py` file; a patch that
does not parse or whose hunk does not apply; nothing to extract.

Choices the spec leaves open:
- A path block's info string is exactly two words, the language and the path; `python a.py extra`
  is not a path block. A relative path without `..` is normalized (`./pkg/a.py`, `pkg//a.py` name
  `pkg/a.py`); two names of one path make the prediction invalid. `files: {}` is a valid no-op.
- A patch applies as `git apply` does without fuzz: every hunk's context and removed lines must equal
  the file's lines exactly (whitespace included); a hunk may sit at another line than its header says
  (the nearest match to it is taken, never before the previous hunk's end), and its header's line
  counts must match its body. `--- /dev/null` creates a file (its base is empty); deleting a file
  (`+++ /dev/null`) is invalid, since a prediction is a set of file texts. Paths lose one leading
  `a/` or `b/`. The base of a path outside `buggy_files` is the tree's version (`tree_text`).
- Line ends are normalized to `\\n` (as the scorer reads programs) before a patch applies.
"""

from __future__ import annotations

import dataclasses
import difflib
import posixpath
import re
from collections.abc import Callable, Mapping
from typing import Any

from reward.diff import normalize_newlines
from reward.extract import _PYTHON_INFO, _language, answer_text, fenced_blocks
from reward.repo_task import RepoTask, path_problem
from reward.schema import _check_text

TreeText = Callable[[str], "str | None"]  # path -> the clean tree's text of it, None when the tree lacks it
_DIFF_INFO = frozenset({"diff", "patch"})
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_NEWLINE = "\\ No newline at end of file"


@dataclasses.dataclass(frozen=True)
class RepoPrediction:
    """A model's answer to a repository task: `files`, `patch` or `response` (the first present wins)."""

    task_id: str
    response: str | None = None
    files: dict[str, str] | None = None
    patch: str | None = None
    think_opened: bool | None = None


class PatchError(ValueError):
    """A unified diff that does not parse or does not apply exactly; the message says where."""


def repo_prediction_from_json(obj: Any) -> RepoPrediction:
    """Validate one repository prediction object; raises ValueError naming the bad field.

    A single-file record (`{"task_id", "response"}`) is a valid repository prediction too; its
    `code` field has no meaning here and is refused, so it is never silently ignored.
    """
    if not isinstance(obj, dict):
        raise ValueError("record must be a JSON object")
    if not isinstance(obj.get("task_id"), str):
        raise ValueError("missing field 'task_id'" if "task_id" not in obj else "field 'task_id' must be a string")
    if "code" in obj:
        raise ValueError("field 'code' is for single-file tasks; a repository prediction gives 'files', "
                         "'patch' or 'response'")
    response, files, patch = obj.get("response"), obj.get("files"), obj.get("patch")
    if response is None and files is None and patch is None:
        raise ValueError("a repository prediction needs a 'files', 'patch' or 'response' field")
    for key, value in (("response", response), ("patch", patch)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"field '{key}' must be a string")
    if files is not None and (not isinstance(files, dict)
                              or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())):
        raise ValueError("field 'files' must be an object of path -> text")
    for key in ("task_id", "response", "files", "patch"):
        _check_text(obj.get(key), key)
    think_opened = obj.get("think_opened")
    if think_opened is not None and not isinstance(think_opened, bool):
        raise ValueError("field 'think_opened' must be true or false")
    return RepoPrediction(obj["task_id"], response, files, patch, think_opened)


def repo_prediction_to_json(pred: RepoPrediction) -> dict[str, Any]:
    """The JSON object of a repository prediction; absent fields are not written."""
    obj: dict[str, Any] = {"task_id": pred.task_id}
    for key in ("response", "files", "patch", "think_opened"):
        if getattr(pred, key) is not None:
            obj[key] = getattr(pred, key)
    return obj


# Extraction -------------------------------------------------------------------


def prediction_files(pred: RepoPrediction, task: RepoTask, tree_text: TreeText,
                     think_opened: bool = False) -> tuple[dict[str, str] | None, str | None]:
    """The files a prediction writes (path → full text, line ends normalized) and None, or None and why
    the prediction is invalid.

    Args:
        tree_text: the clean tree's text of a path (None when the tree lacks it): the base a patch
            applies to outside `task.buggy_files`.
        think_opened: the default for predictions whose own `think_opened` is unset (see
            `reward.extract.extract_program`).
    """
    if pred.files is not None:
        return checked_files(pred.files)
    if pred.patch is not None:
        return _patched(task, pred.patch, tree_text)
    opened = think_opened if pred.think_opened is None else pred.think_opened
    answer = answer_text(pred.response or "", opened)
    if answer is None:
        return None, "think block never closed"
    blocks = fenced_blocks(answer)
    by_path = {}
    for info, content in blocks:
        words = info.split()
        if len(words) == 2 and words[0].lower() in _PYTHON_INFO:
            by_path[words[1]] = content  # the last block of a path wins
    if by_path:
        return checked_files(by_path)
    patches = [content for info, content in blocks if _language(info) in _DIFF_INFO]
    if patches:
        return _patched(task, patches[-1], tree_text)
    return None, "no python block with a path and no diff block"


def checked_files(files: Mapping[str, str]) -> tuple[dict[str, str] | None, str | None]:
    """The files with normalized paths (`./a.py` as `a.py`) and line ends, or None and the first path a
    prediction may not write (or one named twice)."""
    out: dict[str, str] = {}
    for path in sorted(files):
        name = _normalized(path)
        problem = path_problem(name) or (f"path {name!r} is given twice" if name in out else None)
        if problem:
            return None, problem
        out[name] = normalize_newlines(files[path])
    return out, None


def _normalized(path: str) -> str:
    """`./` and doubled slashes dropped from a relative path without `..` (the others stay, to be refused)."""
    if path.startswith("/") or ".." in path.split("/"):
        return path
    return posixpath.normpath(path)


def _patched(task: RepoTask, patch: str, tree_text: TreeText) -> tuple[dict[str, str] | None, str | None]:
    def base(path: str) -> str | None:
        return task.buggy_files[path] if path in task.buggy_files else tree_text(path)

    try:
        files = apply_patch(patch, base)
    except PatchError as e:
        return None, f"patch: {e}"
    if not files:
        return None, "patch: no file diff in it"
    return checked_files(files)


# Unified diffs ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Hunk:
    old_start: int
    old: tuple[str, ...]  # lines with their "\n" (the last may lack it), context and removed
    new: tuple[str, ...]  # context and added


def apply_patch(patch: str, base: Callable[[str], str | None]) -> dict[str, str]:
    """Apply a unified diff: path → the new text of every file it changes.

    Args:
        base: the text a path's hunks apply to (None: the file does not exist, so only `--- /dev/null`
            may create it).

    Raises:
        PatchError: the diff does not parse, names a file twice, changes a missing file, creates an
            existing one, deletes one, or has a hunk whose lines are not found exactly.
    """
    out: dict[str, str] = {}
    for old_path, new_path, hunks in _parse(normalize_newlines(patch)):
        if new_path is None:
            raise PatchError(f"it deletes {old_path!r}; a prediction can only write files")
        if new_path in out:
            raise PatchError(f"{new_path!r} appears twice")
        if old_path is not None and old_path != new_path:
            raise PatchError(f"it renames {old_path!r} to {new_path!r}")
        text = base(new_path)
        if old_path is None and text is not None:
            raise PatchError(f"it creates {new_path!r}, which exists")
        if old_path is not None and text is None:
            raise PatchError(f"{new_path!r} does not exist")
        out[new_path] = _apply_hunks(normalize_newlines(text or ""), hunks, new_path)
    return out


def _strip_prefix(name: str) -> str | None:
    """A header's path without its `a/` or `b/` and any tab-separated timestamp; None for /dev/null."""
    name = name.split("\t")[0].strip()
    if name == "/dev/null":
        return None
    return name[2:] if name.startswith(("a/", "b/")) else name


def _parse(patch: str) -> list[tuple[str | None, str | None, list[_Hunk]]]:
    """(old path, new path, hunks) per file of a unified diff; git's extended header lines are skipped."""
    lines = patch.split("\n")
    files: list[tuple[str | None, str | None, list[_Hunk]]] = []
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            if lines[i].startswith("@@"):
                raise PatchError(f"line {i + 1}: a hunk outside a file diff")
            i += 1
            continue
        old_path, new_path = _strip_prefix(lines[i][4:]), _strip_prefix(lines[i + 1][4:])
        if old_path is None and new_path is None:
            raise PatchError(f"line {i + 1}: both sides are /dev/null")
        hunks: list[_Hunk] = []
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            hunk, i = _parse_hunk(lines, i)
            hunks.append(hunk)
        if not hunks:
            raise PatchError(f"line {i}: the diff of {new_path or old_path!r} has no hunk")
        files.append((old_path, new_path, hunks))
    return files


def _parse_hunk(lines: list[str], i: int) -> tuple[_Hunk, int]:
    """The hunk whose header is lines[i], and the index after its body."""
    header = _HUNK.match(lines[i])
    if not header:
        raise PatchError(f"line {i + 1}: malformed hunk header {lines[i]!r}")
    old_start = int(header[1])
    old_count, new_count = (1 if n is None else int(n) for n in (header[2], header[4]))
    old: list[str] = []
    new: list[str] = []
    j = i + 1
    while (len(old) < old_count or len(new) < new_count) and j < len(lines):
        line = lines[j]
        tag, text = (line[:1], line[1:]) if line else (" ", "")  # an empty context line loses its space
        if tag not in " -+":
            break
        if tag in " -":
            old.append(text + "\n")
        if tag in " +":
            new.append(text + "\n")
        j += 1
        if j < len(lines) and lines[j] == _NO_NEWLINE:
            for side in ((old,) if tag == "-" else (new,) if tag == "+" else (old, new)):
                side[-1] = side[-1][:-1]
            j += 1
    if (len(old), len(new)) != (old_count, new_count):
        raise PatchError(f"line {i + 1}: the hunk holds {len(old)} old and {len(new)} new lines, "
                         f"its header says {old_count} and {new_count}")
    # In a zero-length range the start is the line before the hunk (0 = the top).
    return _Hunk(old_start if old_count else old_start + 1, tuple(old), tuple(new)), j


def _apply_hunks(text: str, hunks: list[_Hunk], path: str) -> str:
    """The text with every hunk applied, each at the exact match nearest its header's line."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    done = 0  # lines of `text` already copied or replaced
    for n, hunk in enumerate(hunks, start=1):
        at = _find(lines, hunk.old, hunk.old_start - 1, done)
        if at is None:
            raise PatchError(f"hunk {n} of {path!r} does not apply (its lines are not in the file at or after "
                             f"line {done + 1})")
        out += lines[done:at] + list(hunk.new)
        done = at + len(hunk.old)
    return "".join(out + lines[done:])


def _find(lines: list[str], old: tuple[str, ...], near: int, lowest: int) -> int | None:
    """The index ≥ `lowest` where `old` matches `lines` exactly, the nearest to `near` (earlier on a tie)."""
    starts = range(lowest, len(lines) - len(old) + 1)
    matches = [k for k in starts if tuple(lines[k:k + len(old)]) == old]
    return min(matches, key=lambda k: (abs(k - near), k)) if matches else None


def files_to_patch(buggy_files: Mapping[str, str], files: Mapping[str, str],
                   tree_text: TreeText | None = None) -> str:
    """The unified diff (`a/` and `b/` prefixes, git headers, as SWE-bench's `model_patch`) that takes the
    buggy files, or the tree's version of other paths, to `files`; `apply_patch` inverts it.

    A path outside `buggy_files` that `tree_text` does not know (or with no `tree_text`) is a new file.
    Unchanged paths, and new files with no line (a unified diff has no hunk for them), are left out;
    paths come in lexicographic order.
    """
    chunks = []
    for path in sorted(files):
        before = buggy_files[path] if path in buggy_files else tree_text(path) if tree_text else None
        old, new = normalize_newlines(before or ""), normalize_newlines(files[path])
        if old == new:
            continue
        body = list(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                         "/dev/null" if before is None else f"a/{path}", f"b/{path}"))
        header = [f"diff --git a/{path} b/{path}\n"] + (["new file mode 100644\n"] if before is None else [])
        chunks.append("".join(header + [_ended(line) for line in body]))
    return "".join(chunks)


def _ended(line: str) -> str:
    """A diff line with its newline, or followed by git's marker when the file's last line has none."""
    return line if line.endswith("\n") else f"{line}\n{_NO_NEWLINE}\n"
