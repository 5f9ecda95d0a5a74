"""Argument types and checks shared by the reward CLIs: bad input ends in one line and exit code 2."""

from __future__ import annotations

import argparse
import math
import os
from typing import TYPE_CHECKING

from reward.schema import MAX_MEMORY_MB, MAX_TIMEOUT_S

if TYPE_CHECKING:
    from reward.sandbox import LibraryEnv


def _int_at_least(text: str, low: int, kind: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0, "an integer")


def token_budget(text: str) -> int | None:
    """argparse type: a token budget, an integer >= 0, or `none` for no budget."""
    if text.lower() == "none":
        return None
    return _int_at_least(text, 0, "an integer >= 0 or none")


def seconds(text: str) -> float:
    """argparse type: a finite wall-clock limit in (0, 1 day]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds in (0, {MAX_TIMEOUT_S:g}], got {text!r}")
    return value


def megabytes(text: str) -> int:
    """argparse type: a memory limit in MiB."""
    value = positive_int(text)
    if value > MAX_MEMORY_MB:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_MEMORY_MB}, got {value}")
    return value


def user_path(text: str) -> str:
    """argparse type: a path as the user typed it (relative to the working directory, `~` expanded), made absolute.

    Resolved once where it enters the program, so nothing downstream (Orbax, worker
    processes, a changed directory) sees a relative path.
    """
    if not text:
        raise argparse.ArgumentTypeError("must be a path, got an empty string")
    return os.path.abspath(os.path.expanduser(text))


def first_tasks(tasks: list, predictions: list | None, limit: int | None) -> tuple[list, list | None]:
    """`--limit N`: the first N tasks and the predictions for them (all when `limit` is None)."""
    if limit is None:
        return tasks, predictions
    kept = {t.task_id for t in tasks[:limit]}
    return tasks[:limit], None if predictions is None else [p for p in predictions if p.task_id in kept]


def output_file_error(path: str | None) -> str | None:
    """Why `path` cannot be written as an output file (checked before any run starts), or None."""
    if path is None:
        return None
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{path}: is a directory"
    if not os.path.isdir(parent):
        return f"{path}: directory {parent} does not exist"
    if not os.access(parent, os.W_OK):
        return f"{path}: directory {parent} is not writable"
    return None


def output_dir_error(path: str) -> str | None:
    """Why `path` cannot be used (or made) as an output directory, or None."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            return f"{path}: exists and is not a directory"
        return None if os.access(path, os.W_OK) else f"{path}: directory is not writable"
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        return f"{path}: cannot be created under {parent}"
    return None


def sandbox_env_path(text: str) -> str:
    """argparse type: a library environment's path made absolute, or `none` as typed."""
    return text if text == "none" else user_path(text)


def sandbox_env(text: str) -> LibraryEnv:
    """argparse type: `--sandbox-env PATH`, the library environment of sandboxed runs (`none`: the standard
    library only), checked here (a Python of another version is refused) and returned as a `LibraryEnv`."""
    from reward.sandbox import library_env

    try:
        return library_env(sandbox_env_path(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


SANDBOX_ENV_HELP = ("a Python environment (venv or prefix) whose packages sandboxed programs and tests may import, "
                    "read-only; `none` for the standard library only (default: the one precisecoder runs in)")
