"""`precisecoder score` and `check` on repository task files (docs/reward.md, "Repository tasks").

`score_cli` and `check_cli` hand a task file whose first record has `repo` to `score_main` /
`check_main` here. Test runs go through `reward.repo_run.run_repo_task` (the sandbox's pytest runner,
imported when the first run starts); an installation without it stops with exit code 2 before any work.
Runs are made one at a time, in input order, each row written when its prediction is scored (a
repository run takes seconds, not milliseconds), so Ctrl-C loses at most the prediction in flight and
the same command resumes. `--workers` and `--isolation` are for single-file tasks; `--timeout` and
`--memory-mb`, when given, override the repository defaults (60 s, 2048 MiB) for tasks without their
own `timeout_s`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from reward.cli_args import first_tasks
from reward.outfile import OutputError, ResultsFile, digest, interrupted, json_line
from reward.repo_extract import RepoPrediction, TreeText, prediction_files, repo_prediction_from_json
from reward.repo_score import repo_verifier, score_repo_prediction, tree_reader
from reward.repo_task import DEFAULT_REPO_MEMORY_MB, DEFAULT_REPO_TIMEOUT_S, RepoTask, is_repo_record, \
    repo_task_from_json
from reward.schema import SchemaError, read_jsonl
from reward.score import aggregate, format_summary

RUNNER = "reward.repo_run"


def is_repo_task_file(path: str) -> bool:
    """Whether a task file holds repository tasks: its first record has `repo` (unreadable: False, so the
    single-file loader reports the problem)."""
    try:
        first = next(read_jsonl(path), None)
    except (SchemaError, OSError):
        return False
    return first is not None and is_repo_record(first[1])


def load_repo_tasks(path: str) -> list[RepoTask]:
    """Load and validate a repository task file; task ids must be unique."""
    tasks: list[RepoTask] = []
    seen: set[str] = set()
    for lineno, obj in read_jsonl(path):
        try:
            task = repo_task_from_json(obj)
        except ValueError as e:
            raise SchemaError(path, lineno, str(e)) from None
        if task.task_id in seen:
            raise SchemaError(path, lineno, f"duplicate task_id {task.task_id!r}")
        seen.add(task.task_id)
        tasks.append(task)
    return tasks


def load_repo_predictions(path: str, tasks: Mapping[str, RepoTask]) -> list[RepoPrediction]:
    """Load repository predictions; a malformed record or one for an unknown task is a SchemaError."""
    predictions = []
    for lineno, obj in read_jsonl(path):
        try:
            pred = repo_prediction_from_json(obj)
        except ValueError as e:
            raise SchemaError(path, lineno, str(e)) from None
        if pred.task_id not in tasks:
            raise SchemaError(path, lineno, f"prediction for unknown task {pred.task_id!r}")
        predictions.append(pred)
    return predictions


def runner_missing() -> str | None:
    """Why repository tasks cannot run here, or None when the pytest runner is installed."""
    if importlib.util.find_spec(RUNNER) is None:
        return f"repository tasks need {RUNNER} (the sandbox's pytest runner), which this installation lacks"
    return None


class _Trees:
    """Per task: its clean tree's reader (one per archive) and its `verify`."""

    def __init__(self, args: argparse.Namespace):
        self.task_dir = os.path.dirname(args.tasks)  # archives are relative to the task file's folder
        self._args = args
        self._readers: dict[str, TreeText] = {}

    def text(self, task: RepoTask) -> TreeText:
        if task.repo.archive not in self._readers:
            self._readers[task.repo.archive] = tree_reader(task, self.task_dir)
        return self._readers[task.repo.archive]

    def limits(self, task: RepoTask) -> dict[str, Any]:
        return {"timeout_s": task.timeout_s or self._args.timeout or DEFAULT_REPO_TIMEOUT_S,
                "memory_mb": self._args.memory_mb or DEFAULT_REPO_MEMORY_MB,
                "sandbox_env": self._args.sandbox_env}

    def verify(self, task: RepoTask):
        return repo_verifier(task, self.task_dir, **self.limits(task))


def _load(args: argparse.Namespace, with_predictions: bool) -> tuple[list[RepoTask], list[RepoPrediction] | None]:
    tasks = load_repo_tasks(args.tasks)
    by_id = {t.task_id: t for t in tasks}
    predictions = load_repo_predictions(args.predictions, by_id) if with_predictions else None
    return first_tasks(tasks, predictions, args.limit)


def score_main(args: argparse.Namespace) -> int:
    """`precisecoder score` on repository tasks: one score row per prediction, then the aggregate table."""
    try:
        tasks, predictions = _load(args, True)
    except (SchemaError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    problem = runner_missing()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from reward.score_cli import score_from_json  # score_cli dispatches here

    by_id = {t.task_id: t for t in tasks}
    trees = _Trees(args)
    settings = dict(lam=args.lam, epsilon=args.epsilon, max_window_runs=args.max_window_runs,
                    think_opened=args.think_opened, timeout=args.timeout, memory_mb=args.memory_mb,
                    inputs=digest([args.tasks, args.predictions]))
    out = ResultsFile(args.out, settings, "score", overwrite=args.overwrite)
    try:
        done = out.resume(lambda rows: [r.get("task_id") for r in rows]
                          == [p.task_id for p in predictions[:len(rows)]])
        scores = [score_from_json(row) for row in done]
    except OutputError as e:
        print(f"error: --out {e}", file=sys.stderr)
        return 2
    except (TypeError, KeyError):
        print(f"error: --out {args.out} holds lines that are not scores; pass --overwrite to start over",
              file=sys.stderr)
        return 2
    try:
        for n, pred in enumerate(predictions[len(scores):], start=len(scores) + 1):
            task = by_id[pred.task_id]
            new = score_repo_prediction(task, pred, trees.verify(task), trees.text(task), lam=args.lam,
                                        epsilon=args.epsilon, max_window_runs=args.max_window_runs,
                                        think_opened=args.think_opened)
            out.append([new.to_json()])
            scores.append(new)
            if not args.no_progress:
                print(f"score: {n}/{len(predictions)} predictions", file=sys.stderr)
    except KeyboardInterrupt:
        print(interrupted(out), file=sys.stderr)
        return 130
    failure = out.close(finished=True)
    summary = aggregate(tasks, scores, args.lam)
    summary["test_runs"] = sum(s.runs for s in scores)
    predicted = {p.task_id for p in predictions}
    missing = [t.task_id for t in tasks if t.task_id not in predicted]
    if missing:
        print(f"warning: {len(missing)} tasks have no prediction and count as invalid: {', '.join(missing[:10])}",
              file=sys.stderr)
    print(format_summary(summary))
    print(f"test runs {summary['test_runs']}")
    if args.summary_json:
        try:
            with open(args.summary_json, "w", encoding="utf-8") as f:
                json.dump(summary, f, indent=2)
                f.write("\n")
        except OSError as e:
            failure = failure or f"error: writing --summary-json {args.summary_json} failed ({e.strerror or e})"
    if failure:
        print(failure, file=sys.stderr)
        return 1
    return 0


def check_main(args: argparse.Namespace) -> int:
    """`precisecoder check` on repository tasks: without predictions each task's solution files must pass and
    its buggy files fail (a clean task: only pass); with them, each prediction's files run. One record per
    run: task_id, target, mode (`pytest`), passed, status (the runner's `pass`, `fail`, `error` or
    `timeout`, or `invalid` when a prediction has no files), reason, duration_s."""
    try:
        tasks, predictions = _load(args, args.predictions is not None)
    except (SchemaError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not tasks:
        print(f"error: {args.tasks} holds no tasks", file=sys.stderr)
        return 2
    problem = runner_missing()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from reward.repo_run import run_repo_task  # present: runner_missing said so

    trees = _Trees(args)
    by_id = {t.task_id: t for t in tasks}
    runs: list[tuple[dict, RepoTask, dict[str, str] | None]] = []
    if predictions is None:
        for task in tasks:
            runs.append(({"task_id": task.task_id, "target": "solution"}, task, task.solution_files))
            if not task.is_clean:
                runs.append(({"task_id": task.task_id, "target": "buggy"}, task, task.buggy_files))
    else:
        for pred in predictions:
            task = by_id[pred.task_id]
            files, reason = prediction_files(pred, task, trees.text(task), args.think_opened)
            record = {"task_id": task.task_id, "target": "prediction"}
            runs.append((record if files is not None else {**record, "reason": reason}, task,
                         None if files is None else {**task.buggy_files, **files}))
    records = []
    try:
        for record, task, files in runs:
            record = {**record, "mode": "pytest"}
            if files is None:
                record.update(passed=False, status="invalid", reason=record.pop("reason"), duration_s=0.0)
            else:
                outcome = run_repo_task(task, files, trees.task_dir, **trees.limits(task))
                record.update(passed=outcome.status == "pass", status=outcome.status,
                              reason=None if outcome.status == "pass" else outcome.detail or outcome.status,
                              duration_s=round(outcome.seconds, 4))
            records.append(record)
            if args.out is None:
                print(json_line(record), end="")
    except KeyboardInterrupt:
        return 130
    if args.out is not None:
        with open(args.out, "w", encoding="utf-8") as f:
            f.writelines(json_line(r) for r in records)
    if predictions is not None:
        print(f"predictions: {sum(r['passed'] for r in records)}/{len(records)} passed", file=sys.stderr)
        return 0
    bad = sorted({r["task_id"] for r in records if (r["target"] == "solution") != r["passed"]
                  or r["status"] == "error"})
    print(f"tasks: {len(tasks) - len(bad)}/{len(tasks)} verified (solution passes, buggy files fail)", file=sys.stderr)
    for task_id in bad[:20]:
        print(f"  not verified: {task_id}", file=sys.stderr)
    return 1 if bad else 0
