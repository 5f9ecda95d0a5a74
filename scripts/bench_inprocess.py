"""What the `inprocess` harness costs: one worker, one small task, in each test mode.

Runs the same program (`def add`) with one assertion 20 times (after one warm-up
run) as an `assert` task in `proxy` mode, as an `assert` task in `inprocess` mode
and as a `unittest` task, and prints each mode's median wall time per run in
milliseconds (docs/sandbox.md, "The inprocess harness"). Usage, from the
repository root: `python scripts/bench_inprocess.py [--runs N]`.
"""

from __future__ import annotations

import argparse
import statistics
import time

from reward.sandbox import Job, Limits, SandboxWorker, resolve_isolation
from reward.schema import AssertTests, UnittestTests

PROGRAM = "def add(a, b):\n    return a + b\n"
UNITTEST = ("import unittest\n\nclass T(unittest.TestCase):\n    def test_add(self):\n"
            "        self.assertEqual(add(1, 2), 3)\n")


def median_ms(worker: SandboxWorker, job: Job, runs: int) -> float:
    """Median wall time of `runs` runs of `job` (after one warm-up run), in milliseconds."""
    worker.run(job)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = worker.run(job)
        times.append(time.perf_counter() - start)
        if not result.passed:
            raise SystemExit(f"the benchmark's own task did not pass: {result.status} {result.stderr[-300:]}")
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    limits = Limits(timeout_s=10)
    jobs = {"assert proxy": Job(PROGRAM, AssertTests("assert add(1, 2) == 3\n"), limits),
            "assert inprocess": Job(PROGRAM, AssertTests("assert add(1, 2) == 3\n", "inprocess"), limits),
            "unittest": Job(PROGRAM, UnittestTests(UNITTEST), limits)}
    worker = SandboxWorker(resolve_isolation("auto"))
    try:
        for name, job in jobs.items():
            print(f"{name}: {median_ms(worker, job, args.runs):.1f} ms per run (median of {args.runs})")
    finally:
        worker.close()


if __name__ == "__main__":
    main()
