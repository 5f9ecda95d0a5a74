"""Verify a task set, or run predictions against their tasks' tests, in the sandbox.

Without --predictions, every task's `solution` must pass and its `buggy_code`
must fail (a clean task only needs its solution to pass); the exit code is 1
when any task fails that check. With --predictions, each prediction's program
(its `code`, or the program extracted from its `response`) runs against its
task's tests. One JSON object per run goes to --out (or stdout):
task_id, target (solution, buggy or prediction), mode (how the tests ran:
proxy, inprocess or io), mode_reason (why that mode: what the tests need, or
"set in the task file"; `reward/modes.py`, docs/sandbox.md), passed, status,
reason, duration_s. `reason` says why a run did not pass (the exception,
"timeout", "no closed code block", why the judge could not verify it, ...) and
is null for a pass; the statuses are described in README.md and docs/reward.md.
The summary counts the tasks per mode and the `unverifiable` runs, and a task
with one is not verified. A file of repository tasks (records with `repo`) is run
by `reward/repo_cli.py` on the sandbox's pytest runner, mode `pytest`.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from reward import repo_cli
from reward.cli_args import (SANDBOX_ENV_HELP, first_tasks, megabytes, output_file_error, positive_int, sandbox_env,
                             seconds, user_path)
from reward.extract import missing_program_reason
from reward.fleet import Fleet
from reward.modes import choose_mode
from reward.sandbox import Job, Limits, RunResult, limits_for
from reward.outfile import OutputError, ResultsFile, digest, input_clash, interrupted, json_line
from reward.schema import IOTests, Prediction, SchemaError, Task, load_predictions, load_tasks
from reward.score import UNVERIFIABLE, program_of, unverifiable_reason


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", type=user_path, required=True,
                        help="task JSONL file (schema in docs/reward.md and README.md)")
    parser.add_argument("--predictions", type=user_path,
                        help="prediction JSONL file; omit to verify the task set itself")
    parser.add_argument("--out", type=user_path, help="write one JSON result per run here (default: stdout)")
    parser.add_argument("--limit", type=positive_int, help="only the first N tasks of --tasks (a quick try)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over when --out holds an interrupted run (by default the same command resumes it)")
    parser.add_argument("--think-opened", action="store_true",
                        help="the prompts ended inside an open <think> block (Qwen3.5/3.6, thinking on): a "
                             "response without </think> has no answer; a prediction's own think_opened wins")
    parser.add_argument("--workers", type=positive_int, default=None, help="sandbox workers (default: CPU count)")
    parser.add_argument("--timeout", type=seconds, default=None,
                        help="wall-clock seconds per run for tasks without timeout_s (default: 5; "
                             "repository tasks: 60)")
    parser.add_argument("--memory-mb", type=megabytes, default=None,
                        help="memory of a whole run in MiB for tasks without memory_mb (default: 1024; "
                             "repository tasks: 2048)")
    parser.add_argument("--isolation", choices=("auto", "bwrap", "rlimits"), default="auto",
                        help="sandbox isolation (default: auto = bubblewrap, else rlimits with a warning)")
    parser.add_argument("--sandbox-env", type=sandbox_env, metavar="PATH", help=SANDBOX_ENV_HELP)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def plan_runs(tasks: list[Task], predictions: list[Prediction] | None, default: Limits,
              think_opened: bool = False) -> tuple[list[dict], list[Job | None]]:
    """The runs to make: one record and one job (None when there is no program) per run.

    A prediction without a program gets its record's `reason` already (why extraction failed).
    """
    limits = {t.task_id: limits_for(t, default) for t in tasks}
    records: list[dict] = []
    jobs: list[Job | None] = []
    if predictions is None:
        for task in tasks:
            targets = [("solution", task.solution)] + ([] if task.is_clean else [("buggy", task.buggy_code)])
            for target, program in targets:
                records.append({"task_id": task.task_id, "target": target, **_mode(task)})
                jobs.append(Job(program, task.tests, limits[task.task_id]))
        return records, jobs
    by_id = {t.task_id: t for t in tasks}
    for pred in predictions:
        task = by_id[pred.task_id]
        program = program_of(pred, think_opened)
        record = {"task_id": pred.task_id, "target": "prediction", **_mode(task)}
        if program is None:
            opened = think_opened if pred.think_opened is None else pred.think_opened
            record["reason"] = missing_program_reason(pred.response or "", opened)
        records.append(record)
        jobs.append(None if program is None else Job(program, task.tests, limits[task.task_id]))
    return records, jobs


def _mode(task: Task) -> dict[str, str]:
    mode, reason = choose_mode(task.tests)
    return {"mode": mode, "mode_reason": reason}


def main(args: argparse.Namespace) -> int:
    problem = output_file_error(args.out) or input_clash(args.out, {"--tasks": args.tasks,
                                                                    "--predictions": args.predictions})
    if problem:
        print(f"error: --out {problem}", file=sys.stderr)
        return 2
    if repo_cli.is_repo_task_file(args.tasks):
        return repo_cli.check_main(args)
    args.timeout = args.timeout or Limits().timeout_s
    args.memory_mb = args.memory_mb or Limits().memory_mb
    try:
        tasks = load_tasks(args.tasks)
        predictions = load_predictions(args.predictions) if args.predictions else None
    except (SchemaError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if predictions is not None:
        known = {t.task_id for t in tasks}
        unknown = sorted({p.task_id for p in predictions} - known)
        if unknown:
            print(f"error: {args.predictions}: predictions for unknown tasks: {', '.join(unknown[:5])}"
                  + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""), file=sys.stderr)
            return 2
    tasks, predictions = first_tasks(tasks, predictions, args.limit)
    if not tasks:
        print(f"error: {args.tasks} holds no tasks", file=sys.stderr)
        return 2
    records, jobs = plan_runs(tasks, predictions, Limits(timeout_s=args.timeout, memory_mb=args.memory_mb),
                              args.think_opened)
    out = None
    if args.out:
        settings = dict(timeout=args.timeout, memory_mb=args.memory_mb, think_opened=args.think_opened,
                        inputs=digest([args.tasks, args.predictions]))
        out = ResultsFile(args.out, settings, "check", overwrite=args.overwrite)
        try:
            done = out.resume(lambda rs: [(r.get("task_id"), r.get("target")) for r in rs]
                              == [(r["task_id"], r["target"]) for r in records[:len(rs)]])
        except OutputError as e:
            print(f"error: --out {e}", file=sys.stderr)
            return 2
        records[:len(done)] = done
    else:
        done = []
    try:
        with Fleet(workers=args.workers, isolation=args.isolation, libraries=args.sandbox_env) as fleet:
            chunk = max(32, 8 * fleet.num_workers)
            for start in range(len(done), len(records), chunk):
                _run_chunk(fleet, records[start:start + chunk], jobs[start:start + chunk], args.no_progress)
                if out is not None:
                    out.append(records[start:start + chunk])
                else:
                    for record in records[start:start + chunk]:
                        print(json_line(record), end="")
    except KeyboardInterrupt:
        if out is None:
            raise
        print(interrupted(out), file=sys.stderr)
        return 130
    failure = out.close(finished=True) if out is not None else None
    code = _summarize(records, verifying=predictions is None)
    if failure:
        print(failure, file=sys.stderr)
        return 1
    return code


def _run_chunk(fleet: Fleet, records: list[dict], jobs: list[Job | None], quiet: bool) -> None:
    """Run one chunk's jobs and fill in their records (a record without a job is `invalid`)."""
    runnable = [i for i, job in enumerate(jobs) if job is not None]
    results = fleet.run([jobs[i] for i in runnable], progress=False if quiet else "check")
    for i, result in zip(runnable, results):
        records[i].update(passed=result.passed, status=result.status,
                          reason=failure_reason(result, isinstance(jobs[i].tests, IOTests),
                                                jobs[i].mode == "inprocess"),
                          duration_s=round(result.duration_s, 4))
    for record, job in zip(records, jobs):
        if job is None:
            record.update(passed=False, status="invalid", reason=record.pop("reason"), duration_s=0.0)


LOAD_FAILURE = "ERROR: the program did not load"  # the inprocess harness's line, with the exception


def failure_reason(result: RunResult, io: bool, inprocess: bool = False) -> str | None:
    """Why a run did not pass, from its status and the stderr excerpt; None for a pass.

    An error shows the last exception line of the run's traceback ("NameError: name 'y' is not
    defined"); a run that raised nothing says what happened instead (exited before the tests
    finished, wrong output, ...); an `inprocess` run, the harness's account (which tests did not pass,
    or why the program did not load: "the program did not load (line 1): ModuleNotFoundError: ...", or
    what the harness refused: "refused in the sandbox: import ctypes").
    """
    if result.status == "pass":
        return None
    if result.status == "timeout":
        return "timeout"
    if result.status == "oom":
        return "out of memory"
    if result.status == "killed":
        return "killed by a signal"
    if result.status == UNVERIFIABLE:
        return unverifiable_reason(result)
    exception = last_exception(result.stderr)
    if exception is not None:
        return exception
    _, marker, detail = result.stderr.rpartition("[tests] ")
    if inprocess and marker and detail.strip():
        lines = result.stderr.splitlines()
        load = next((line.removeprefix("ERROR: ") for line in lines if line.startswith(LOAD_FAILURE)), None)
        refused = next((line.replace("REFUSED:", "refused in the sandbox:", 1) for line in lines
                        if line.startswith("REFUSED: ")), None)
        return (load or refused or detail.strip().splitlines()[0])[:200]
    if result.stderr.rstrip().endswith("more bytes]"):
        return f"{result.status} (its exception, if any, lies past the stderr excerpt)"
    if io:
        return "wrong output" if result.status == "fail" else "nonzero exit status"
    return "exited before the tests finished"


def last_exception(stderr: str, limit: int = 200) -> str | None:
    """The exception line ("Type: message") of the last traceback in a stderr text, or None."""
    _, found, tail = stderr.rpartition("Traceback (most recent call last):")
    if not found:
        return None
    line = next((line for line in tail.split("\n")[1:] if line and not line[0].isspace()), None)
    return None if line is None else line[:limit]


def _summarize(records: list[dict], verifying: bool) -> int:
    """Print the summary line; in verification mode return 1 if any task failed it."""
    modes = Counter({r["task_id"]: r["mode"] for r in records}.values())
    print("tasks per mode: " + ", ".join(f"{m} {n}" for m, n in sorted(modes.items()))
          + " (each row's mode_reason says why)", file=sys.stderr)
    statuses = Counter(r["status"] for r in records)
    detail = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()) if k != UNVERIFIABLE)
    unverifiable = f"unverifiable {statuses[UNVERIFIABLE]} (the judge could not verify them)"
    if not verifying:
        passed = sum(r["passed"] for r in records)
        print(f"predictions: {passed}/{len(records)} passed ({detail}); {unverifiable}", file=sys.stderr)
        return 0
    bad = sorted({r["task_id"] for r in records
                  if (r["target"] == "solution") != r["passed"] or r["status"] == UNVERIFIABLE})
    tasks = len({r["task_id"] for r in records})
    print(f"tasks: {tasks - len(bad)}/{tasks} verified (solution passes, buggy code fails); "
          f"runs: {detail}; {unverifiable}", file=sys.stderr)
    for task_id in bad[:20]:
        print(f"  not verified: {task_id}", file=sys.stderr)
    return 1 if bad else 0
