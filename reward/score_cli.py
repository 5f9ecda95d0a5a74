"""Score predictions with the PreciseCoder reward (specified in docs/reward.md).

Writes one JSON object per prediction to --out, in input order: task_id, valid,
unit, precision, recall, f1, edited_lines, faults, faults_fixed, noop, damage,
reward, and the diagnostics blocks (predicted blocks), components (reference
and predicted block indices, verified, essential, cap, credit), runs
(distinct test runs the prediction needed) and window_search_capped (the
essential-subset search hit --max-window-runs), status (`scored`, or
`unverifiable` when the judge could not verify a run: then reason says why,
unit and reward are 0, and the row is left out of the aggregates and counted
there), and for repository tasks edited_files (the paths the prediction
changes; `reward/repo_cli.py` scores those files). Then prints the aggregate table of
the task set. A malformed record, or a prediction for a task not in --tasks,
stops with an error naming the file and line; tasks without a prediction are
listed and count as invalid predictions.
"""

from __future__ import annotations

import argparse
import json
import sys

from reward import repo_cli
from reward.cli_args import (SANDBOX_ENV_HELP, first_tasks, megabytes, non_negative_int, output_file_error,
                             positive_int, sandbox_env, seconds, user_path)
from reward.fleet import Fleet
from reward.sandbox import Limits
from reward.outfile import OutputError, ResultsFile, digest, input_clash, interrupted
from reward.schema import Prediction, SchemaError, Task, load_tasks, prediction_from_json, read_jsonl
from reward.score import (DEFAULT_EPSILON, DEFAULT_LAMBDA, DEFAULT_MAX_WINDOW_RUNS, ComponentResult, Score,
                          aggregate, format_summary, score_predictions)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", type=user_path, required=True, help="task JSONL file (schema in docs/reward.md)")
    parser.add_argument("--predictions", type=user_path, required=True,
                        help="prediction JSONL file ({task_id, response | code, think_opened?}, or for repository "
                             "tasks {task_id, files | patch | response}; see docs/reward.md)")
    parser.add_argument("--out", type=user_path, required=True,
                        help="write one score object per prediction here (JSONL)")
    parser.add_argument("--lambda", dest="lam", metavar="LAMBDA", type=float, default=DEFAULT_LAMBDA,
                        help="weight λ of f1 in the reward (1 − λ)·unit + λ·f1 (default: 1/3)")
    parser.add_argument("--epsilon", type=non_negative_int, default=DEFAULT_EPSILON,
                        help="ε of the credit cap for tasks without their own (default: 1)")
    parser.add_argument("--max-window-runs", type=non_negative_int, default=DEFAULT_MAX_WINDOW_RUNS,
                        help="most essential-subset windows tried per prediction; past it the unsettled "
                             f"components count all their edits as essential (default: {DEFAULT_MAX_WINDOW_RUNS})")
    parser.add_argument("--think-opened", action="store_true",
                        help="the prompts ended inside an open <think> block (Qwen3.5/3.6, thinking on): a "
                             "response without </think> has no answer; a prediction's own think_opened wins")
    parser.add_argument("--workers", type=positive_int, default=None, help="sandbox workers (default: CPU count)")
    parser.add_argument("--timeout", type=seconds, default=None,
                        help="wall-clock seconds per test run for tasks without timeout_s (default: 5; "
                             "repository tasks: 60)")
    parser.add_argument("--memory-mb", type=megabytes, default=None,
                        help="memory of a whole test run in MiB for tasks without memory_mb (default: 1024; "
                             "repository tasks: 2048)")
    parser.add_argument("--limit", type=positive_int, help="only the first N tasks of --tasks (a quick try)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over when --out holds an interrupted run (by default the same command resumes it)")
    parser.add_argument("--summary-json", type=user_path, help="also write the aggregate summary here as JSON")
    parser.add_argument("--isolation", choices=("auto", "bwrap", "rlimits"), default="auto",
                        help="sandbox isolation (default: auto = bubblewrap, else rlimits with a warning)")
    parser.add_argument("--sandbox-env", type=sandbox_env, metavar="PATH", help=SANDBOX_ENV_HELP)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def load_predictions_for(path: str, tasks: dict[str, Task], skip_unknown: bool = False) -> list[Prediction]:
    """Load predictions; a malformed record is a SchemaError naming its line, and so is an unknown
    task_id unless `skip_unknown` (candidates read from an eval run over more tasks than these)."""
    predictions = []
    for lineno, obj in read_jsonl(path):
        try:
            pred = prediction_from_json(obj)
        except ValueError as e:
            raise SchemaError(path, lineno, str(e)) from None
        if pred.task_id not in tasks:
            if skip_unknown:
                continue
            raise SchemaError(path, lineno, f"prediction for unknown task {pred.task_id!r}")
        predictions.append(pred)
    return predictions


def main(args: argparse.Namespace) -> int:
    if not 0 <= args.lam <= 1:
        print(f"error: --lambda must lie in [0, 1], got {args.lam}", file=sys.stderr)
        return 2
    inputs = {"--tasks": args.tasks, "--predictions": args.predictions}
    if input_clash(args.summary_json, {"--out": args.out}):
        print(f"error: --summary-json {input_clash(args.summary_json, {'--out': args.out})}", file=sys.stderr)
        return 2
    for flag, path in (("--out", args.out), ("--summary-json", args.summary_json)):
        problem = output_file_error(path) or input_clash(path, inputs)
        if problem:
            print(f"error: {flag} {problem}", file=sys.stderr)
            return 2
    if repo_cli.is_repo_task_file(args.tasks):
        return repo_cli.score_main(args)
    args.timeout = args.timeout or Limits().timeout_s
    args.memory_mb = args.memory_mb or Limits().memory_mb
    try:
        tasks = load_tasks(args.tasks)
        by_id = {t.task_id: t for t in tasks}
        predictions = load_predictions_for(args.predictions, by_id)
    except (SchemaError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tasks, predictions = first_tasks(tasks, predictions, args.limit)
    items = [(by_id[p.task_id], p) for p in predictions]
    limits = Limits(timeout_s=args.timeout, memory_mb=args.memory_mb)
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
    progress = False if args.no_progress else "score"
    try:
        with Fleet(workers=args.workers, isolation=args.isolation, libraries=args.sandbox_env) as fleet:
            chunk = max(16, 4 * fleet.num_workers)
            for start in range(len(scores), len(items), chunk):
                new = score_predictions(items[start:start + chunk], lambda jobs: fleet.run(jobs, progress=progress),
                                        lam=args.lam, epsilon=args.epsilon, limits=limits,
                                        max_window_runs=args.max_window_runs, window_batch=1,  # a chunk fills a round
                                        think_opened=args.think_opened)
                out.append([s.to_json() for s in new])
                scores += new
            stats = fleet.stats
    except KeyboardInterrupt:
        print(interrupted(out), file=sys.stderr)
        return 130
    failure = out.close(finished=True)
    summary = aggregate(tasks, scores, args.lam)
    summary["test_runs"], summary["cache_hits"] = stats.runs, stats.cache_hits
    predicted = {p.task_id for p in predictions}
    missing = [t.task_id for t in tasks if t.task_id not in predicted]
    if missing:
        shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        print(f"warning: {len(missing)} tasks have no prediction and count as invalid: {shown}", file=sys.stderr)
    print(format_summary(summary))
    print(f"test runs {stats.runs}, cache hits {stats.cache_hits}")
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


def score_from_json(row: dict) -> Score:
    """A `Score` back from its line in a score file (TypeError or KeyError if the line is not one)."""
    components = tuple(ComponentResult(**{**c, "refs": tuple(c["refs"]), "preds": tuple(c["preds"])})
                       for c in row.get("components", ()))
    return Score(**{**row, "components": components})
