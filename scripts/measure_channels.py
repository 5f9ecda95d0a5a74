"""Measure the channels between runs that the sandbox cannot remove: inode numbers from kernel-wide counters.

A run cannot be kept from creating a pipe or a socket and reading its inode number with
`fstat`, and those numbers come from one counter the whole kernel shares (`get_next_ino`,
per CPU in batches of 1,024; memfds and pidfds, with counters of their own, are refused
by the seccomp filter). A writer run moves a counter to a chosen residue modulo M; the next run
of the same worker reads the residue back after subtracting the offset measured on a
calibration pair. This prints, for each counter and M, how often the reader decoded the
writer's value (chance is 1/M), and what moving the counter costs the writer.

    python scripts/measure_channels.py --trials 40 --json

Both runs pin themselves to CPU 0 (as an attacker would: the per-CPU batches otherwise
make the residue depend on where each run is scheduled).

    python scripts/measure_channels.py --page-cache --json

times, in two runs one after the other, the first and the second read of one byte of 40
files over 256 KiB under /usr/lib (from the `--skip`-th: choose files no one has read
since boot). A page no run has read yet is slow to read once and fast after, so a run
that reads chosen pages leaves a mark that a later run can time (each page once).

    python scripts/measure_channels.py --cpu --trials 20 --json

runs a writer and a reader side by side on two workers: the writer keeps busy (bit 1, eight
processes, held to one CPU by its cgroup) or sleeps (bit 0) for a second; the reader counts
loop turns in that second. It prints the reader's counts for each bit.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import textwrap
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from reward.fleet import Fleet  # noqa: E402
from reward.sandbox import Job, Limits  # noqa: E402
from reward.schema import AssertTests  # noqa: E402

NEW = {"pipe": "os.pipe()", "socket": "[s.detach() for s in socket.socketpair()]"}
COMMON = """
    import os, socket, time
    os.sched_setaffinity(0, {{0}})
    def ino():
        fds = {new}
        number = os.fstat(fds[0]).st_ino
        for fd in fds:
            os.close(fd)
        return number
"""
WRITER = COMMON + """
    start = time.perf_counter()
    moved = 0
    while ino() % {m} != {value}:
        moved += 1
    cost = time.perf_counter() - start
    print("moved", moved, cost)
"""
READER = COMMON + """
    print("read", ino())
"""


def run_one(fleet: Fleet, program: str) -> str:
    result = fleet.run([Job(textwrap.dedent(program), AssertTests(""), Limits(timeout_s=30.0, memory_mb=256))])[0]
    if not result.passed:
        raise RuntimeError(result.stderr)
    return result.stdout


def measure(fleet: Fleet, kind: str, m: int, trials: int, rng: random.Random) -> dict:
    """Decoding rate of a residue modulo `m` sent through counter `kind` from one run to the next."""
    def pair(value: int) -> tuple[int, float, int]:
        out = run_one(fleet, WRITER.format(new=NEW[kind], m=m, value=value))
        _, moved, cost = out.split()
        read = int(run_one(fleet, READER.format(new=NEW[kind])).split()[1])
        return read, float(cost), int(moved)

    offset = pair(0)[0] % m  # what the runs' own set-up allocates between the writer's number and the reader's
    hits, costs, moves = 0, [], []
    for _ in range(trials):
        value = rng.randrange(m)
        read, cost, moved = pair(value)
        hits += (read - offset) % m == value
        costs.append(cost)
        moves.append(moved)
    per_step = sum(costs) / max(1, sum(moves))
    return {"counter": kind, "m": m, "trials": trials, "decoded": hits, "rate": round(hits / trials, 3),
            "chance": round(1 / m, 4), "writer_s_mean": round(sum(costs) / trials, 5),
            "us_per_step": round(per_step * 1e6, 2)}


PAGE_CACHE = """
    import os, time
    files = sorted(os.path.join(d, n) for d, _, names in os.walk("/usr/lib") for n in names
                   if os.path.isfile(os.path.join(d, n)) and os.path.getsize(os.path.join(d, n)) > 1 << 18)
    first, second = [], []
    for name in files[{skip}:{skip} + 40]:
        fd = os.open(name, os.O_RDONLY)
        for times in (first, second):
            start = time.perf_counter_ns()
            os.pread(fd, 1, 1 << 17)
            times.append((time.perf_counter_ns() - start) / 1000)
        os.close(fd)
    print(sorted(first)[len(first) // 2], sorted(second)[len(second) // 2], len(first))
"""


def page_cache_timing(fleet: Fleet, skip: int) -> dict:
    """Median microseconds of a first and a second read of a page, over 40 files from the `skip`-th."""
    first, second, files = run_one(fleet, PAGE_CACHE.format(skip=skip)).split()
    return {"files": int(files), "first_read_us": float(first), "second_read_us": float(second)}


CPU_WRITER = """
    import os, time
    if {bit}:
        kids = 0
        while kids < 7 and os.fork() != 0:
            kids += 1
        end = time.monotonic() + 1.2
        while time.monotonic() < end:
            pass
        if kids < 7:
            os._exit(0)  # a child
        for _ in range(kids):
            os.wait()
    else:
        time.sleep(1.2)
"""
CPU_READER = """
    import time
    time.sleep(0.1)
    turns, end = 0, time.monotonic() + 1.0
    while time.monotonic() < end:
        turns += 1
    print(turns)
"""


def cpu_contention(fleet: Fleet, trials: int, rng: random.Random) -> dict:
    """The reader's loop turns in a second beside a busy writer (bit 1) and an idle one (bit 0)."""
    limits = Limits(timeout_s=30.0, memory_mb=256)
    turns: dict[int, list[int]] = {0: [], 1: []}
    for _ in range(trials):
        bit = rng.randrange(2)
        jobs = [Job(textwrap.dedent(CPU_WRITER.format(bit=bit)), AssertTests(""), limits),
                Job(textwrap.dedent(CPU_READER), AssertTests(""), limits)]
        turns[bit].append(int(fleet.run(jobs)[1].stdout))
    return {f"bit{bit}": sorted(counts) for bit, counts in turns.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--moduli", default="2,16,256,4096")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--page-cache", action="store_true", help="time first and second reads instead")
    parser.add_argument("--skip", type=int, default=300, help="--page-cache: start at this file")
    parser.add_argument("--cpu", action="store_true", help="time a reader beside a busy or idle writer instead")
    args = parser.parse_args()
    rng = random.Random(0)
    started = time.time()
    if args.cpu:
        with Fleet(workers=2, cache=False, isolation="bwrap") as fleet:
            row = {**cpu_contention(fleet, args.trials, rng), "load": round(os.getloadavg()[0], 2)}
            print(json.dumps(row) if args.json else row)
        return
    with Fleet(workers=1, cache=False, isolation="bwrap") as fleet:
        if args.page_cache:
            for run in range(2):  # the second run finds the first run's pages cached
                row = {"run": run, **page_cache_timing(fleet, args.skip), "load": round(os.getloadavg()[0], 2)}
                print(json.dumps(row) if args.json else row, flush=True)
            return
        for kind in NEW:
            for m in (int(x) for x in args.moduli.split(",")):
                row = measure(fleet, kind, m, args.trials, rng)
                row["load"] = round(os.getloadavg()[0], 2)
                print(json.dumps(row) if args.json else row, flush=True)
    print(json.dumps({"seconds": round(time.time() - started, 1)}))


if __name__ == "__main__":
    main()
