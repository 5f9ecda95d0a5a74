"""Does over-editing help a demo policy to pass, answer against answer on the same task?

Samples K answers (T = 1) per held-out buggy task from one policy of a finished
`precisecoder demo` run, scores them with the fleet and prints, as JSON, the
pass rate of answers that edit ≥ 2 lines against those that edit ≤ 1 line:
pooled over all answers (report.md's coupling table) and within tasks
(`jaxrl.demo.report.within_task_coupling`: only tasks with both kinds of answer,
each task weighted once, and how many of them favour each kind). Answers and
scores go to RUN/seedS/coupling/POLICY.

    scripts/demo_coupling.py --run runs/demo [--seed 0] [--policy base] [--samples 8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="the --out directory of a finished demo run")
    parser.add_argument("--seed", type=int, default=0, help="which seed's policy and tasks (default 0)")
    parser.add_argument("--policy", default="base", help="base, or a method the run trained (default base)")
    parser.add_argument("--samples", type=int, default=8, help="answers per task (default 8)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    seed_dir = Path(args.run) / f"seed{args.seed}"
    if not (seed_dir / "base" / "sft.json").is_file():
        print(f"demo_coupling: no finished demo seed in {seed_dir}", file=sys.stderr)
        return 2
    if args.samples < 2:
        print("demo_coupling: --samples must be >= 2", file=sys.stderr)
        return 2

    import models
    from jaxrl.demo import report
    from jaxrl.demo.run import DemoConfig, evaluate_policy, fleet_workers
    from jaxrl.saved_run import load_policy
    from reward.fleet import Fleet
    from reward.schema import load_tasks

    if args.policy == "base":
        policy = models.from_pretrained(seed_dir / "base")
    else:
        run_dir = seed_dir / "rl" / args.policy
        if not (run_dir / "config.yaml").is_file():
            print(f"demo_coupling: no RL run {run_dir}", file=sys.stderr)
            return 2
        policy, _, _ = load_policy(run_dir)
    tasks = load_tasks(seed_dir / "data" / "test.jsonl")
    with Fleet(workers=fleet_workers()) as fleet:
        result = evaluate_policy(policy, DemoConfig(), args.seed, tasks, fleet, seed_dir / "coupling" / args.policy,
                                 not args.no_progress, samples=args.samples, decodings={"sampled": 1.0})
    scores = result["sampled"].scores
    print(json.dumps({"run": args.run, "seed": args.seed, "policy": args.policy, "samples": args.samples,
                      "tasks": len(tasks), "pooled": report.coupling(scores),
                      "within_task": report.within_task_coupling(scores)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
