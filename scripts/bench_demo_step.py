"""Benchmark a demo RL step stage by stage: settings of the reward stage side by side, in one process.

On one saved demo base (a `precisecoder demo` output directory, or `base{b}` in it:
`base/` and `data/`), each round runs GRPO then PreciseCoder (or PreciseCoder first, with
--first precisecoder) for --steps steps under each chosen setting (--settings), the order
of the settings reversed every other round, so that machine load hits all alike:

- `old`: 12 tasks × G = 8, each trainer run with its own sandbox fleet (a cold verdict
  cache), scored after decoding: the demo before the paper's protocol;
- `new`: 16 tasks × G = 6, both runs on one fleet whose verdict cache is seeded with the
  domain's known verdicts (`jaxrl.demo.run.seed_fleet`) and shared, scored after decoding,
  up to twice the workers' count of one prediction's windows in a scorer round;
- `streamed`: `new` with each group scored as soon as its samples finish, while the engine
  decodes the others (`reward.stream`);
- `streamed_wb1`: `streamed` with one window of a prediction a round (`reward.window_batch`
  1), so no window runs after a component's first pass: the trainer's default;
- `deferred`: `streamed_wb1` with `reward.defer_verification`: GRPO's reward stage makes
  only the unit runs, and the verification runs its metrics read are made while the update
  runs (PreciseCoder's F1 term needs them first: unchanged).

The settings from `new` on must write the same metrics; the bench checks it.

From the trainer's `time/` metrics (the first step, which compiles, left out) it
prints per setting the median seconds of each stage and its share of the time of all
measured steps (`reward` is what is left after decoding; `reward_overlap`, part of `rollout`, the
scoring done during it), the step's median and each setting's ratio to the first; the CPU
seconds of this process per step (JAX and the scorer's Python; the sandbox runs are not in
it: their processes are reaped inside the sandbox's own pid namespaces), which load
inflates far less than wall time; the fleet's runs and cache hits (and the runs each method
made), the fleet's work whatever the load; and whether the settings from `new` on wrote the
same metrics (every key but the times). With --json one object.

    scripts/bench_demo_step.py --base runs/demo [--steps 10] [--repeats 1] [--settings streamed_wb1,deferred]
        [--segment N] [--workers N] [--threads N] [--first grpo|precisecoder] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

STAGES = ("data", "rollout", "reward_overlap", "reward", "advantages", "update", "push", "verify", "save")
_NEW = {"tasks_per_step": 16, "group_size": 6, "shared": True, "stream": False, "window_batch": None, "defer": False}
SETTINGS = {"old": {**_NEW, "tasks_per_step": 12, "group_size": 8, "shared": False},
            "new": _NEW,
            "streamed": {**_NEW, "stream": True},
            "streamed_wb1": {**_NEW, "stream": True, "window_batch": 1},
            "deferred": {**_NEW, "stream": True, "window_batch": 1, "defer": True}}


def cpu_seconds() -> float:
    """User + system CPU seconds of this process."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def run_setting(name: str, home: Path, steps: int, scratch: Path, segment: int | None = None,
                workers: int | None = None, threads: int | None = None, first: str = "grpo") -> dict:
    """GRPO and PreciseCoder, `first` first, for `steps` steps under setting `name` (the `jax` engine's
    `segment`, if given; `workers` sandbox workers, default the demo's; `threads` scorer threads,
    default the trainer's); the per-step records and costs, and the test runs each method made."""
    import dataclasses

    from jaxrl.config import RewardConfig
    from jaxrl.demo.run import DemoConfig, fleet_workers, rl_config, seed_fleet
    from jaxrl.demo.tokenizer import load_demo_tokenizer
    from jaxrl.metrics import read_metrics
    from jaxrl.tasks import read_tasks
    from jaxrl.trainer import train
    from reward.fleet import Fleet

    s = SETTINGS[name]
    cfg = dataclasses.replace(DemoConfig(), tasks_per_step=s["tasks_per_step"], group_size=s["group_size"],
                              rl_steps=steps)
    cpu0 = cpu_seconds()
    start = time.perf_counter()
    records, by_method, fleets, runs_by_method = [], {}, [], {}
    workers = workers or fleet_workers()  # the demo's fleet
    shared = Fleet(workers=workers) if s["shared"] else None
    if shared is not None:
        tasks = [*read_tasks(home / "data" / "train.jsonl", "train"), *read_tasks(home / "data" / "test.jsonl", "test"),
                 *read_tasks(home / "data" / "clean.jsonl", "clean")]
        seed_fleet(shared, tasks, RewardConfig().timeout_s)
    try:
        for method in sorted(("grpo", "precisecoder"), key=lambda m: m != first):
            out = scratch / f"{name}-{method}-{time.monotonic_ns()}"
            fleet = shared or Fleet(workers=workers)
            config = rl_config(cfg, 0, method, home / "base", home / "data", out, False)
            config = dataclasses.replace(config, reward=dataclasses.replace(
                config.reward, stream=s["stream"], window_batch=s["window_batch"], defer_verification=s["defer"],
                threads=threads or config.reward.threads))
            if segment is not None:
                config = dataclasses.replace(config, rollout=dataclasses.replace(
                    config.rollout, options={**config.rollout.options, "segment": segment}))
            runs_before = fleet.stats.runs
            try:
                train(config, tokenizer=load_demo_tokenizer(), fleet=fleet)
            finally:
                fleets.append(dataclasses.asdict(fleet.stats))
                runs_by_method[method] = fleet.stats.runs - runs_before
                if fleet is not shared:
                    fleet.close()
            by_method[method] = read_metrics(out / "metrics.jsonl")[1:]  # the first step compiles
            records += by_method[method]
    finally:
        if shared is not None:
            shared.close()
    rollouts = s["tasks_per_step"] * s["group_size"]
    return {"records": records, "by_method": by_method, "wall_s": time.perf_counter() - start,
            "cpu_s": cpu_seconds() - cpu0, "rollouts_per_step": rollouts, "runs_by_method": runs_by_method,
            "fleet": fleets[-1] if s["shared"] else {k: sum(f[k] for f in fleets) for k in fleets[0]}}


def untimed(records: list[dict]) -> list[dict]:
    """The records without their wall-clock keys."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "share/"))} for r in records]


def shares(records: list[dict]) -> dict[str, float]:
    """Each stage's share of the summed step time of `records`."""
    total = sum(r["time/step"] for r in records)
    return {k: sum(r.get(f"time/{k}", 0.0) for r in records) / total for k in STAGES}


def summarize(runs: list[dict]) -> dict:
    """Median seconds of each stage and of the step, and each stage's share of the summed step time, over all
    records of the setting's runs, and per method; the reward's share counts the wait for deferred
    verification runs (`verify`) as reward."""
    records = [r for run in runs for r in run["records"]]
    out: dict = {"steps_measured": len(records), "rollouts_per_step": runs[0]["rollouts_per_step"],
                 "step_s": statistics.median(r["time/step"] for r in records)}
    out["stage_s"] = {k: statistics.median(r.get(f"time/{k}", 0.0) for r in records) for k in STAGES}
    out["share"] = shares(records)
    out["by_method"] = {}
    for method in runs[0]["by_method"]:
        mine = [r for run in runs for r in run["by_method"][method]]
        share = shares(mine)
        out["by_method"][method] = {"step_s": statistics.median(r["time/step"] for r in mine),
                                    "reward_s": statistics.median(r.get("time/reward", 0.0) + r.get("time/verify", 0.0)
                                                                  for r in mine),
                                    "reward_share": share["reward"] + share["verify"], "share": share,
                                    "test_runs": sum(run["runs_by_method"][method] for run in runs)}
    out["cpu_s"] = sum(run["cpu_s"] for run in runs)
    out["wall_s"] = sum(run["wall_s"] for run in runs)
    total_steps = sum(len(run["records"]) + 2 for run in runs)  # + the two compiling steps per run
    out["cpu_s_per_step"] = out["cpu_s"] / total_steps
    out["fleet"] = {k: sum(run["fleet"][k] for run in runs) for k in runs[0]["fleet"]}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="a demo output directory (its base/ and data/), or base{b} in it")
    parser.add_argument("--steps", type=int, default=10, help="RL steps per run, the first left out (default 10)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of the settings (default 1)")
    parser.add_argument("--settings", default="streamed_wb1,deferred",
                        help=f"comma-separated, from {', '.join(SETTINGS)} (default streamed_wb1,deferred)")
    parser.add_argument("--segment", type=int, help="decoding steps per segment of the jax engine (default: "
                        "the engine's, 64); a prompt's group is reported finished between segments")
    parser.add_argument("--workers", type=int, help="sandbox workers (default: the demo's, min(4, 2 × cores))")
    parser.add_argument("--threads", type=int, help="scorer threads, reward.threads (default: the trainer's)")
    parser.add_argument("--first", choices=("grpo", "precisecoder"), default="grpo",
                        help="the method that runs first in each setting (default grpo, as in the demo); on a "
                        "shared fleet the second finds many of the first's verdicts in the cache")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    home = Path(args.base).expanduser()
    names = [n for n in args.settings.split(",") if n]
    if not (home / "base" / "sft.json").is_file() or not (home / "data" / "train.jsonl").is_file():
        print(f"bench_demo_step: {home} has no demo base (base/sft.json) and data (data/train.jsonl)", file=sys.stderr)
        return 2
    if args.steps < 3 or args.repeats < 1 or (args.segment is not None and args.segment < 1):
        print("bench_demo_step: --steps must be >= 3, --repeats and --segment >= 1", file=sys.stderr)
        return 2
    if not names or any(n not in SETTINGS for n in names) or len(set(names)) < len(names):
        print(f"bench_demo_step: --settings takes distinct names from {', '.join(SETTINGS)}", file=sys.stderr)
        return 2
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from absl import flags

    flags.FLAGS(sys.argv[:1])
    load = os.getloadavg()
    runs: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="bench_demo_step_") as scratch:
        for repeat in range(args.repeats):
            for name in names if repeat % 2 == 0 else names[::-1]:
                runs[name].append(run_setting(name, home, args.steps, Path(scratch), args.segment, args.workers,
                                                args.threads, args.first))
    result: dict = {name: summarize(r) for name, r in runs.items()}
    first = names[0]
    result["ratio_step_to_first"] = {n: result[n]["step_s"] / result[first]["step_s"] for n in names}
    result["ratio_cpu_per_step_to_first"] = {n: result[n]["cpu_s_per_step"] / result[first]["cpu_s_per_step"]
                                            for n in names}
    same = [n for n in names if n != "old"]
    if len(same) > 1:
        result["metrics_equal"] = {n: all(untimed(a["records"]) == untimed(b["records"])
                                          for a, b in zip(runs[same[0]], runs[n])) for n in same[1:]}
    result |= {"load_average_at_start": load, "load_average_at_end": os.getloadavg(), "base": str(home),
               "steps": args.steps, "repeats": args.repeats, "settings": names, "segment": args.segment,
               "workers": args.workers, "threads": args.threads, "first": args.first}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"load average {load[0]:.1f} at start, {result['load_average_at_end'][0]:.1f} at end")
    print("| setting | rollouts | step s | " + " | ".join(STAGES) + " | CPU s a step | test runs | cache hits |")
    print("|---" * (len(STAGES) + 6) + "|")
    for name in names:
        r = result[name]
        print(f"| {name} | {r['rollouts_per_step']} | {r['step_s']:.2f} | "
              + " | ".join(f"{r['stage_s'][k]:.2f} ({100 * r['share'][k]:.0f} %)" for k in STAGES)
              + f" | {r['cpu_s_per_step']:.2f} | {r['fleet']['runs']} | {r['fleet']['cache_hits']} |")
    for name in names:
        print(f"{name}: " + ", ".join(f"{m} step {v['step_s']:.2f} s, reward (with verify) {v['reward_s']:.2f} s = "
                                      f"{100 * v['reward_share']:.1f} % of its steps, {v['test_runs']} test runs"
                                      for m, v in result[name]["by_method"].items()))
    print(", ".join(f"{n}/{first}: step {result['ratio_step_to_first'][n]:.2f}x, CPU a step "
                    f"{result['ratio_cpu_per_step_to_first'][n]:.2f}x" for n in names[1:]))
    for n, equal in result.get("metrics_equal", {}).items():
        print(f"{n}'s metrics equal {same[0]}'s (every key but the times): {equal}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the fleet and the scratch directory are already cleaned up
        print("bench_demo_step: interrupted, nothing printed", file=sys.stderr)
        sys.exit(130)
