"""Throughput of the trainer's reward stage against calling the scorer on the fleet directly.

Both score the same (task, prediction) pairs on one fleet of persistent sandboxes with
its result cache off (every run is real): `direct` is one `score_predictions(pairs,
fleet.run)` call, `pipeline` is `jaxrl.rewards.RewardPipeline` (a Grain map over the
pairs, a thread pool, one dispatcher into `Fleet.run`). Rounds alternate; the best
round of each is compared. Prints one JSON line; the scores must be identical.

  python scripts/bench_reward_pipeline.py [--workers 2] [--tasks 24] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from jaxrl.config import BuildSpec
from jaxrl.rewards import RewardPipeline
from jaxrl.tasks import ensure_built
from reward.fleet import Fleet
from reward.sandbox import Limits
from reward.schema import Prediction, load_tasks
from reward.score import score_predictions


def pairs_of(tasks):
    """Three answers per task: the reference fix, the unchanged buggy code, the fix plus an extra edit."""
    out = []
    for t in tasks:
        for code in (t.solution, t.buggy_code, t.solution.rstrip("\n") + "\npass\n"):
            out.append((t, Prediction(t.task_id, response=f"<think>\nok\n</think>\n\n```python\n{code}```\n")))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--tasks", type=int, default=24)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="pipeline threads (default: the trainer's)")
    args = p.parse_args()
    build = ensure_built(BuildSpec(problems=20, max_per_operator=1), workers=args.workers)
    pairs = pairs_of(load_tasks(build / "train.jsonl")[: args.tasks])
    limits = Limits()
    with Fleet(workers=args.workers, cache=False) as fleet:
        pipeline = RewardPipeline(fleet, 1 / 3, 1, limits, threads=args.threads)
        score_predictions(pairs[:3], fleet.run, limits=limits)  # start the sandboxes
        times = {"direct": [], "pipeline": []}
        results = {}
        for _ in range(args.rounds):
            for name in ("direct", "pipeline"):
                start = time.perf_counter()
                if name == "direct":
                    results[name] = score_predictions(pairs, fleet.run, limits=limits,
                                                      window_batch=2 * fleet.num_workers)
                else:
                    results[name] = pipeline(pairs)
                times[name].append(time.perf_counter() - start)
        pipeline.close()
    best = {k: min(v) for k, v in times.items()}
    same = [s.to_json() for s in results["direct"]] == [s.to_json() for s in results["pipeline"]]
    print(json.dumps({
        "pairs": len(pairs), "workers": args.workers, "threads": pipeline.threads, "rounds": args.rounds,
        "direct_s": round(best["direct"], 3), "pipeline_s": round(best["pipeline"], 3),
        "direct_pairs_per_s": round(len(pairs) / best["direct"], 2),
        "pipeline_pairs_per_s": round(len(pairs) / best["pipeline"], 2),
        "pipeline_vs_direct_throughput": round(best["direct"] / best["pipeline"], 3),
        "scores_identical": same, "load_avg_1min": os.getloadavg()[0],
    }))


if __name__ == "__main__":
    main()
