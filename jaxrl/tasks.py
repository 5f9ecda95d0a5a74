"""Training tasks: files (or a cached on-the-fly build), clean rows, prompts, the Grain stream.

The stream is one Grain pipeline: task indices shuffled with the run's seed
(reshuffled each epoch), repeated, batched into the step's N tasks; each host
keeps its slice of the global batch and renders it with the paper's prompt and
the chat template (thinking on). Its iterator state (one integer) goes into the
checkpoint, so a resumed run sees the same tasks in the same order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grain

from jaxrl import prompts as P
from jaxrl.config import BuildSpec, DataConfig
from reward.extract import prompt_opens_think
from reward.sandbox import LibraryEnv
from reward.schema import SchemaError, Task, load_tasks

SPLIT_FILES = {"train": "train.jsonl", "val": "val.jsonl", "gt_debug": "gt_debug.jsonl"}


class DataError(ValueError):
    """Task files that cannot be used (missing, empty, malformed)."""


def build_dir(spec: BuildSpec) -> Path:
    """The cache directory of one build spec (a hash of the spec and of the builder's layout)."""
    from reward.data.build import LAYOUT

    record = {**dataclasses.asdict(spec), "layout": LAYOUT}
    key = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
    return Path(spec.cache_dir).expanduser() / f"{spec.source}-{key}"


def ensure_built(spec: BuildSpec, workers: int | None = None, isolation: str = "auto",
                 progress: bool = False, libraries: LibraryEnv | None = None) -> Path:
    """Build the task set of `spec` unless it is cached; returns its directory.

    The set is written to a temporary directory and renamed into place, so an
    interrupted build never leaves a half set behind; sandbox verdicts are cached
    across attempts, so a rerun replays them. `libraries`: the sandbox's library
    environment (None: this process's).
    """
    from reward.data.build import BuildConfig, build, write
    from reward.data.sources import humaneval_problems
    from reward.fleet import Fleet

    out = build_dir(spec)
    if (out / "manifest.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    problems = humaneval_problems()[: spec.problems]
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        with Fleet(workers=workers, cache_path=out.parent / f"{out.name}.runs.jsonl", isolation=isolation,
                   libraries=libraries) as fleet:
            result = build(problems, lambda jobs, phase: fleet.run(jobs, progress=progress and phase),
                           BuildConfig(seed=spec.seed, max_per_operator=spec.max_per_operator), progress=progress)
        write(result, tmp)
        try:
            os.rename(tmp, out)
        except OSError:  # another process finished the same build first
            if not (out / "manifest.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def task_paths(cfg: DataConfig, build: Path | None) -> dict[str, str | None]:
    """The train/val/gt_debug files: explicit paths first, else the built set's."""
    out: dict[str, str | None] = {}
    for split, name in SPLIT_FILES.items():
        explicit = getattr(cfg, split)
        out[split] = explicit if explicit is not None else (str(build / name) if build is not None else None)
    return out


def read_tasks(path: str | None, split: str, limit: int | None = None) -> list[Task]:
    """Tasks of one split (first `limit`), with a one-line error for a missing or bad file."""
    if path is None or limit == 0:
        return []
    if not Path(path).expanduser().is_file():
        raise DataError(f"data.{split}: no such file {path}")
    try:
        tasks = load_tasks(Path(path).expanduser())
    except SchemaError as e:
        raise DataError(f"data.{split}: {e}") from None
    return tasks[:limit] if limit is not None else tasks


def with_clean_rows(tasks: Sequence[Task], share: float, seed: int) -> list[Task]:
    """`tasks` plus clean rows, one per base problem at most, making `share` of the result.

    A clean row shows a training problem's reference program as the code to debug
    (buggy_code == solution), so the right answer is to change nothing.
    """
    if share == 0:
        return list(tasks)
    by_base: dict[str, Task] = {}
    for t in tasks:
        by_base.setdefault(t.base_id, t)
    want = min(len(by_base), round(share / (1 - share) * len(tasks)))
    chosen = random.Random(seed).sample(sorted(by_base), want)
    clean = [Task(f"{b}#clean", b, by_base[b].prompt, by_base[b].solution, by_base[b].solution, by_base[b].tests,
                  meta={"kind": "clean", "faults": 0, "split": "train"}) for b in sorted(chosen)]
    return list(tasks) + clean


@dataclasses.dataclass(frozen=True)
class Rendered:
    """One task with its prompt token ids; `think_opened`: the prompt itself opened `<think>`."""

    task: Task
    prompt_ids: tuple[int, ...]
    think_opened: bool


def render(task: Task, tokenizer: Any, prompt: str) -> Rendered:
    """The prompt's token ids: the paper's template in the chat template, thinking on."""
    text = tokenizer.render_chat(P.messages(prompt, task.prompt, task.buggy_code), enable_thinking=True)
    return Rendered(task, tuple(tokenizer.encode(text)), prompt_opens_think(text))


class TaskStream:
    """This host's share of each step's N tasks, rendered; shuffled with the seed, repeated.

    Args:
        tasks: the training tasks (the same list on every host).
        tasks_per_step: N, over all hosts.
        seed: the shuffle seed.
        tokenizer, prompt: how tasks are rendered.
        process_index, process_count: this host's slice of each global batch.
    """

    def __init__(self, tasks: Sequence[Task], tasks_per_step: int, seed: int, tokenizer: Any, prompt: str,
                 process_index: int = 0, process_count: int = 1):
        if not tasks:
            raise DataError("data.train: no training tasks")
        if tasks_per_step % process_count:
            raise DataError(f"data.tasks_per_step={tasks_per_step} does not split over {process_count} hosts")
        per_host = tasks_per_step // process_count
        lo = process_index * per_host
        tasks = list(tasks)

        def local(indices) -> list[Rendered]:
            return [render(tasks[int(i)], tokenizer, prompt) for i in indices[lo:lo + per_host]]

        ds = grain.MapDataset.source(range(len(tasks))).shuffle(seed=seed).repeat().batch(tasks_per_step).map(local)
        self._iter = iter(ds.to_iter_dataset())

    def __next__(self) -> list[Rendered]:
        return next(self._iter)

    def __iter__(self) -> TaskStream:
        return self

    def get_state(self) -> dict[str, Any]:
        """The iterator's position (JSON)."""
        return self._iter.get_state()

    def close(self) -> None:
        """Stop the iterator's prefetch threads (a run closes its stream when it ends)."""
        self._iter.close()

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from a position `get_state` returned."""
        self._iter.set_state(state)
