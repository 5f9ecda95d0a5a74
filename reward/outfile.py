"""Result files that lose nothing: any text encodes, links are written through, an interrupted run resumes.

`check` and `score` append each finished chunk of records to `--out` at once, so Ctrl-C
keeps what is done. While a run is unfinished, a marker `OUT.partial` beside the file
holds the run's settings (and a digest of its input files); the same command again finds
it and continues after the records already there, and other settings are refused. A
write that fails (a full disk) switches to a fallback file in the temporary directory,
named in one line at the end, so no computed record is lost.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any


class OutputError(ValueError):
    """An output that cannot be used as asked (exit code 2), or a write that lost records (exit code 1)."""


def json_line(obj: Any) -> str:
    """`obj` as one JSON line; text that UTF-8 cannot hold (a lone surrogate) is kept as a `\\uXXXX` escape."""
    line = json.dumps(obj, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(obj)
    return line + "\n"


def input_clash(out: str | None, inputs: dict[str, str | None]) -> str | None:
    """Why `out` may not be written: it is one of the `inputs` (flag -> path, links followed), or None."""
    if out is None:
        return None
    for flag, path in inputs.items():
        if path is not None and os.path.realpath(path) == os.path.realpath(out):
            return f"{out} is also {flag}; choose another output file"
    return None


def digest(paths: Sequence[str | None]) -> str:
    """SHA-256 over the contents of the input files, to tell a resumed run's inputs from other ones."""
    h = hashlib.sha256()
    for path in paths:
        if path is not None:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        h.update(b"\0")
    return h.hexdigest()


class ResultsFile:
    """Records appended to `path` (through a link, if it is one) as they finish.

    Args:
        path: the output file.
        settings: what decides the records (options, input digest); a resumed run must match.
        label: the command's name, for the messages.
        overwrite: start over even when `path` holds an interrupted run.
    """

    def __init__(self, path: str, settings: dict[str, Any], label: str, overwrite: bool = False):
        self.path = os.path.realpath(path)
        self.shown = path
        self.label = label
        self._marker = f"{os.path.abspath(path)}.partial"  # beside the name given, not a link's target
        self._settings = json.loads(json.dumps(settings))
        self._overwrite = overwrite
        self._file = None
        self._fallback: str | None = None
        self._failure: str | None = None
        self.written = 0

    def resume(self, matches: Callable[[list[dict]], bool]) -> list[dict]:
        """Open the file; return the records an interrupted run with the same settings left (else none).

        `matches(records)` says whether they are the first records this run plans; an
        interrupted run with other settings or records is an OutputError.
        """
        done: list[dict] = []
        if not self._overwrite and os.path.exists(self._marker):
            try:
                with open(self._marker, encoding="utf-8") as f:
                    before = json.load(f)
            except (OSError, ValueError):
                before = None
            if before != self._settings:
                raise OutputError(f"{self.shown} holds an interrupted {self.label} run with other settings or "
                                  f"inputs{_difference(before, self._settings)}; rerun that command, or pass "
                                  "--overwrite to start over")
            done, size = _complete_records(self.path)
            if not matches(done):
                raise OutputError(f"{self.shown} holds results of other runs; pass --overwrite to start over")
            with open(self.path, "r+b") as f:
                f.truncate(size)  # a line cut off by the interrupt
        with open(self._marker, "w", encoding="utf-8") as f:
            json.dump(self._settings, f)
        self._file = open(self.path, "a" if done else "w", encoding="utf-8")
        self.written = len(done)
        if done:
            print(f"{self.label}: resuming after the {len(done)} results already in {self.shown}", file=sys.stderr)
        return done

    def append(self, records: Sequence[dict]) -> None:
        """Write `records` now; after a failed write they go to the fallback file."""
        text = "".join(json_line(r) for r in records)
        if self._fallback is None:
            try:
                self._file.write(text)
                self._file.flush()
                self.written += len(records)
                return
            except OSError as e:
                self._failure = f"{e.strerror or e}"
                fd, self._fallback = tempfile.mkstemp(prefix=f"precisecoder-{self.label}-", suffix=".jsonl")
                os.close(fd)
        try:
            with open(self._fallback, "a", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise OutputError(f"cannot write {self.shown} ({self._failure}) nor {self._fallback} "
                              f"({e.strerror or e}): {len(records)} results lost") from None

    def close(self, finished: bool) -> str | None:
        """Close the file; a finished run drops the marker. Returns the one-line report of a failed write."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError as e:
                self._failure = self._failure or f"{e.strerror or e}"
        if self._failure is not None:
            return (f"error: writing {self.shown} failed ({self._failure}) after {self.written} results; "
                    f"the others are in {self._fallback}")
        if finished:
            os.unlink(self._marker)
        return None


def interrupted(out: ResultsFile) -> str:
    """Close `out` after Ctrl-C and say, in one line, what is kept and how to go on."""
    failure = out.close(finished=False)
    return failure or (f"precisecoder {out.label}: interrupted; {out.written} results are in {out.shown} and "
                       "the same command resumes")


def _complete_records(path: str) -> tuple[list[dict], int]:
    """The records of the complete lines of `path`, and the byte length they take."""
    records, size = [], 0
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            try:
                records.append(json.loads(raw))
            except ValueError:
                break
            size += len(raw)
    return records, size


def _difference(before: Any, now: dict[str, Any]) -> str:
    if not isinstance(before, dict):
        return ""
    keys = [k for k in now if before.get(k) != now[k]]
    shown = ["input files changed" if k == "inputs" else f"{k}: {before.get(k)!r} there, {now[k]!r} now"
             for k in keys[:3]]
    return f" ({', '.join(shown)})" if shown else ""
