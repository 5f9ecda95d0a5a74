"""What the tests' objects cost the program in `proxy` mode (docs/sandbox.md, "Objects of the tests").

Times one run of a program that calls a callback of the tests N times, one that consumes a generator of the
tests of N items, and one with no reference at all, each --repeat times, one worker, and prints one JSON line
per kind with the durations (seconds) and the cost per round trip.

    PYTHONPATH=$PWD python scripts/bench_values.py [--n 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics

from reward.fleet import Fleet
from reward.sandbox import Job, Limits
from reward.schema import AssertTests

PROGRAM = "def count(cb, n):\n    for i in range(n):\n        cb(i)\n    return n\n" \
          "def consume(items):\n    return sum(1 for _ in items)\n"
TESTS = {  # `for` keeps them out of the host's plan of plain asserts: each runs in the judge's test process
    "none": "for _ in [0]:\n    assert count(len, 0) == 0\n",
    "callbacks": "for _ in [0]:\n    assert count(lambda i: i, {n}) == {n}\n",
    "generator": "for _ in [0]:\n    assert consume(x for x in range({n})) == {n}\n",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20000, help="callbacks or items per run")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    limits = Limits(timeout_s=60.0, memory_mb=512)
    with Fleet(workers=1, cache=False, isolation="bwrap") as fleet:
        for kind, tests in TESTS.items():
            job = Job(PROGRAM, AssertTests(tests.format(n=args.n)), limits)
            durations = []
            for _ in range(args.repeat):
                result = fleet.run([job])[0]
                if not result.passed:
                    raise SystemExit(f"{kind}: {result.status} {result.stderr[-400:]}")
                durations.append(round(result.duration_s, 3))
            trips = args.n if kind != "none" else 0
            per_trip = statistics.median(durations) / trips * 1e6 if trips else None
            print(json.dumps({"kind": kind, "round_trips": trips, "duration_s": durations,
                              "median_us_per_round_trip": None if per_trip is None else round(per_trip, 1)}))


if __name__ == "__main__":
    main()
