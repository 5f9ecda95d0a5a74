"""Verified debugging task sets, built the way PDB builds its single- and multi-fault tasks.

Phases, each one batch of sandbox runs:

0. trusted helpers (no run): tests that call a function of the program other
   than the one under test to check its answer (HumanEval/32's `poly`) get the
   reference's definition of it first (`reward.trusted_helpers`), so a program
   cannot pass by replacing the helper; `manifest["problems_trusted_helpers"]`
   lists them.
1. solutions: every reference program runs with its tests in the mode
   `reward.modes.choose_mode` gives them: `proxy` for `assert` tests on plain
   data (docs/sandbox.md: the tests run apart from the program, which they see
   only through plain-data proxies), `inprocess` for tests that need the
   program's process (mock, files, seeds, ...; every `unittest` test). One that
   fails in `proxy` mode but passes with `inprocess` tests keeps those (its tests
   need more than plain data). `meta["tests_mode"]` and `meta["tests_mode_reason"]`
   say which mode and why; `inprocess` tasks go to `train` like `proxy` ones
   (their verdict is the harness's, docs/sandbox.md "The inprocess harness")
   unless `BuildConfig.train_inprocess` is unset. A problem that fails both ways is dropped, with the
   reason (`manifest["problems_dropped_reasons"]`).
2. single faults: every one-line mutant (`reward.data.mutations`, at most
   `max_per_operator` per operator and problem, drawn with the seed) is kept
   iff it fails its tests within 2 s without timing out, and
   diff(buggy, solution) is exactly one block of one line.
3. composites, built from the kept single faults of one program:
   - multi-fault: 2 to 4 faults with at least 2 unchanged non-blank lines
     between any two; kept iff it fails, diff(buggy, solution) has exactly k
     one-line blocks, and every proper subset of its faults applied alone fails;
   - multi-line: 2 to 4 faults on contiguous lines, or a run of statements
     moved across a loop boundary; kept iff diff(buggy, solution) is one block
     of that many lines and it is atomic (every partial revert fails).
   A run that times out, runs out of memory or is killed never counts as a failure.
4. splits by base problem, within each source shuffled with the seed: 10% val,
   10% test, 10% GT Debug and the rest train. GT Debug's problems are in none of
   train, val and test (the paper, §4.1) and get no mutants: `gt_debug` holds them
   as clean tasks. `BuildConfig.gt_debug_from_val_test` restores the old layout
   (80/10/10, GT Debug made from the val and test problems, so it overlaps test).

No buggy program appears twice. Everything but the sandbox verdicts is a pure
function of the problems and the seed, so the same seed and verdicts give
byte-identical files; the fleet's on-disk cache makes a rerun replay the verdicts.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.metadata
import itertools
import json
import os
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tqdm import tqdm

from reward.check_cli import failure_reason
from reward.data.mutations import Mutant, apply_edits, block_shift_mutants, single_line_mutants
from reward.data.sources import Problem
from reward.diff import diff
from reward.modes import choose_mode, mode_of
from reward.sandbox import Job, Limits, RunResult
from reward.schema import AssertTests, IOTests, Task, Tests, write_tasks
from reward.trusted_helpers import bind_helpers

Runner = Callable[[Sequence[Job], str], list[RunResult]]
"""Runs a batch of jobs (the string labels the phase's progress bar) and returns results in order."""

SCREEN_LIMITS = Limits(timeout_s=2.0)
SOLUTION_LIMITS = Limits()
FAILING = ("fail", "error")
SPLITS = ("train", "val", "test")
GT_DEBUG = "gt_debug"
SINGLE, MULTI, MULTI_LINE = "single", "multi", "multi_line"
MIN_GAP = 3  # faults of a multi-fault task lie >= 3 non-blank lines apart (2 unchanged between)
LAYOUT = 2  # what the same arguments build; 2: GT Debug held out. Caches of built sets key on it.


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """How many candidates to draw; the seed fixes every draw and the splits.

    Attributes:
        seed: seeds mutant sampling, composition and splits.
        max_per_operator: single-fault candidates per operator and problem.
        multi_per_k: multi-fault candidates per problem and fault count k in 2..4.
        multi_line_per_problem: multi-line candidates per problem.
        val_fraction: share of each source's base problems in val (test gets the same).
        gt_debug_fraction: share of each source's base problems held out for GT Debug alone.
        gt_debug_from_val_test: the old layout: no problems held out for GT Debug, which is
            made from the val and test problems instead (`gt_debug_fraction` is then unused).
        train_inprocess: put tasks whose tests run `inprocess` in train (False keeps them out).
    """

    seed: int = 0
    max_per_operator: int = 4
    multi_per_k: int = 2
    multi_line_per_problem: int = 2
    val_fraction: float = 0.1
    gt_debug_fraction: float = 0.1
    gt_debug_from_val_test: bool = False
    train_inprocess: bool = True

    def __post_init__(self):
        for name in ("max_per_operator", "multi_per_k", "multi_line_per_problem"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.val_fraction < 0.5:
            raise ValueError(f"val_fraction must be in [0, 0.5), got {self.val_fraction}")
        if not 0 <= self.gt_debug_fraction < 1 - 2 * self.val_fraction:
            raise ValueError(f"gt_debug_fraction must be in [0, 1 - 2 * val_fraction), got {self.gt_debug_fraction}")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A candidate buggy program: faults (parts) planted in one problem's solution."""

    problem: Problem
    kind: str
    parts: tuple[Mutant, ...]

    @property
    def program(self) -> str:
        return _program(self.problem, self.parts)


def _program(problem: Problem, parts: Iterable[Mutant]) -> str:
    return apply_edits(problem.solution, [e for m in parts for e in m.edits])


def _rng(seed: int, *names: str) -> random.Random:
    return random.Random(":".join([str(seed), *names]))


def sample_singles(problem: Problem, cfg: BuildConfig) -> list[Candidate]:
    """Single-fault candidates: at most `max_per_operator` per operator, drawn with the seed."""
    by_operator: dict[str, list[Mutant]] = collections.defaultdict(list)
    for mutant in single_line_mutants(problem.solution, problem.frozen_lines, f"{cfg.seed}:{problem.base_id}"):
        by_operator[mutant.operator].append(mutant)
    chosen = []
    for operator, mutants in by_operator.items():
        if len(mutants) > cfg.max_per_operator:
            picked = set(_rng(cfg.seed, problem.base_id, operator).sample(range(len(mutants)), cfg.max_per_operator))
            mutants = [m for i, m in enumerate(mutants) if i in picked]
        chosen += [Candidate(problem, SINGLE, (m,)) for m in mutants]
    return chosen


def _ranks(program: str) -> dict[int, int]:
    """0-based line index -> its index among the non-blank lines."""
    nonblank = [i for i, line in enumerate(program.split("\n")) if line.strip()]
    return {line: rank for rank, line in enumerate(nonblank)}


def _by_line(singles: Sequence[Mutant]) -> dict[int, list[Mutant]]:
    lines: dict[int, list[Mutant]] = collections.defaultdict(list)
    for m in singles:
        lines[m.edits[0].line].append(m)
    return dict(sorted(lines.items()))


def sample_multi(problem: Problem, singles: Sequence[Mutant], cfg: BuildConfig) -> list[Candidate]:
    """Multi-fault candidates: 2..4 kept single faults on lines >= `MIN_GAP` non-blank lines apart."""
    ranks, by_line = _ranks(problem.solution), _by_line(singles)
    out = []
    for k in (2, 3, 4):
        rng, seen = _rng(cfg.seed, problem.base_id, f"multi{k}"), set()
        if len(by_line) < k:
            continue
        for _ in range(20 * cfg.multi_per_k):
            lines = sorted(rng.sample(list(by_line), k))
            if any(ranks[b] - ranks[a] < MIN_GAP for a, b in zip(lines, lines[1:])):
                continue
            parts = tuple(rng.choice(by_line[line]) for line in lines)
            if parts not in seen:
                seen.add(parts)
                out.append(Candidate(problem, MULTI, parts))
                if len(seen) == cfg.multi_per_k:
                    break
    return out


def sample_multi_line(problem: Problem, singles: Sequence[Mutant], cfg: BuildConfig) -> list[Candidate]:
    """Multi-line candidates: kept faults on 2..4 contiguous non-blank lines, and loop block shifts."""
    ranks, by_line = _ranks(problem.solution), _by_line(singles)
    rng = _rng(cfg.seed, problem.base_id, "multi_line")
    windows, faulty = [], list(by_line)
    for n in (2, 3, 4):
        for start in range(len(faulty)):
            lines = faulty[start:start + n]
            if len(lines) == n and ranks[lines[-1]] - ranks[lines[0]] == n - 1:
                windows.append(lines)
    picked = sorted(rng.sample(range(len(windows)), min(cfg.multi_line_per_problem, len(windows))))
    out = [Candidate(problem, MULTI_LINE, tuple(rng.choice(by_line[line]) for line in windows[i])) for i in picked]
    for shift in block_shift_mutants(problem.solution, problem.frozen_lines):
        parts = tuple(dataclasses.replace(shift, edits=(edit,)) for edit in shift.edits)
        out.append(Candidate(problem, MULTI_LINE, parts))
    return out


def _shape_ok(candidate: Candidate, buggy: str) -> bool:
    """The diff rule of its kind: k one-line blocks (one per fault), or one block of all its lines."""
    blocks = diff(buggy, candidate.problem.solution)
    if candidate.kind == MULTI_LINE:
        return len(blocks) == 1 and len(blocks[0]) == len(candidate.parts)
    return len(blocks) == len(candidate.parts) and all(len(b) == 1 for b in blocks)


@dataclasses.dataclass(frozen=True)
class Kept:
    """A candidate that passed screening: its buggy program and the status its tests ended with."""

    candidate: Candidate
    program: str
    status: str


def _subsets(parts: tuple[Mutant, ...]) -> list[tuple[Mutant, ...]]:
    """Every non-empty proper subset of the parts."""
    return [c for r in range(1, len(parts)) for c in itertools.combinations(parts, r)]


def screen(candidates: Sequence[Candidate], run: Runner, seen: set[str], phase: str,
           stats: dict[str, int]) -> list[Kept]:
    """The candidates that pass screening, in order; `seen` (buggy programs) grows as they are kept.

    One batch runs every candidate and every proper subset of its parts;
    `stats` counts the candidates and why each rejected one was: `still_passes`, its own
    timeout (oom, killed), `duplicate`, `diff_shape`, `fault_not_needed` (a proper subset of
    its faults passes), or `subset_timeout` (`subset_oom`, `subset_killed`: a subset's run
    did not end cleanly).
    """
    unique: dict[tuple[str, str], Job] = {}
    for c in candidates:
        for parts in [c.parts, *_subsets(c.parts)]:
            program = _program(c.problem, parts)
            unique.setdefault((c.problem.base_id, program), Job(program, c.problem.tests, SCREEN_LIMITS))
    verdict = dict(zip(unique, run(list(unique.values()), phase)))
    kept = []
    for c in candidates:
        stats["candidates"] += 1
        buggy = c.program
        result = verdict[c.problem.base_id, buggy]
        partial = [verdict[c.problem.base_id, _program(c.problem, s)] for s in _subsets(c.parts)]
        if result.passed:
            reason = "still_passes"
        elif result.status not in FAILING:
            reason = result.status
        elif buggy in seen:
            reason = "duplicate"
        elif not _shape_ok(c, buggy):
            reason = "diff_shape"
        elif any(r.passed for r in partial):
            reason = "fault_not_needed"
        elif any(r.status not in FAILING for r in partial):
            reason = "subset_" + next(r.status for r in partial if r.status not in FAILING)
        else:
            seen.add(buggy)
            kept.append(Kept(c, buggy, result.status))
            stats["kept"] += 1
            continue
        stats[reason] += 1
    return kept


def split_of(problems: Sequence[Problem], cfg: BuildConfig) -> dict[str, str]:
    """base_id -> split: within each source, base problems shuffled with the seed; val, test and gt_debug
    (none in the old layout) from the front, in that order, the rest train."""
    by_source: dict[str, list[str]] = collections.defaultdict(list)
    for p in problems:
        if p.base_id not in by_source[p.source]:
            by_source[p.source].append(p.base_id)
    splits = {}
    for source, ids in by_source.items():
        ids = sorted(ids)
        _rng(cfg.seed, "split", source).shuffle(ids)
        n_held = round(cfg.val_fraction * len(ids))
        n_gt = 0 if cfg.gt_debug_from_val_test else round(cfg.gt_debug_fraction * len(ids))
        for i, base_id in enumerate(ids):
            splits[base_id] = ("val" if i < n_held else "test" if i < 2 * n_held
                               else GT_DEBUG if i < 2 * n_held + n_gt else "train")
    return splits


def _spans(buggy: str, solution: str) -> list[list[float]]:
    """Spans of the reference blocks in the buggy program (positions of docs/reward.md, 1-based)."""
    return [[int(x) if x == int(x) else x for x in b.span] for b in diff(buggy, solution)]


def to_task(kept: Kept, number: int) -> Task:
    """The task of a kept candidate; `meta` records how it was made and how its tests fail."""
    c, p = kept.candidate, kept.candidate.problem
    spans = _spans(kept.program, p.solution)
    meta = {"source": p.source, "kind": c.kind, "faults": len(spans),
            "operators": [m.operator for m in c.parts], "categories": [m.category for m in c.parts],
            "bug_lines": spans, "status": kept.status, **_mode_meta(p)}
    return Task(f"{p.base_id}#b{number}", p.base_id, p.prompt, kept.program, p.solution, p.tests, meta=meta)


def tests_mode(problem: Problem) -> str:
    """How the problem's tests run: proxy or inprocess (assert and unittest tests), or io."""
    return mode_of(problem.tests)


def mode_reason(problem: Problem) -> str:
    """Why the problem's tests run in their mode (the builder's own finding, else `choose_mode`'s)."""
    return problem.mode_reason or choose_mode(problem.tests)[1]


def _mode_meta(problem: Problem) -> dict[str, str]:
    return {"tests_mode": tests_mode(problem), "tests_mode_reason": mode_reason(problem)}


def bind_trusted_helpers(problems: Sequence[Problem]) -> tuple[list[Problem], dict[str, list[str]]]:
    """Problems whose tests call helpers of the program get the reference's (`reward.trusted_helpers`),
    and base_id -> the helpers' names of those problems."""
    out, found = [], {}
    for p in problems:
        if isinstance(p.tests, AssertTests):
            code, names = bind_helpers(p.tests.code, p.solution)
            if names:
                p = dataclasses.replace(p, tests=AssertTests(code, p.tests.mode))
                found[p.base_id] = names
        out.append(p)
    return out, found


def run_reason(result: RunResult, tests: Tests) -> str | None:
    """Why a run of these tests did not pass (`check`'s `reason`), None for a pass."""
    return failure_reason(result, isinstance(tests, IOTests), mode_of(tests) == "inprocess")


def solution_phase(problems: Sequence[Problem], run: Runner) -> tuple[list[Problem], dict[str, str]]:
    """Problems whose solution passes, and the dropped ones: base_id -> why their solution fails.

    A solution that fails in `proxy` mode runs again `inprocess`; passing there, its
    problem keeps `inprocess` tests and says why in `mode_reason`.
    """
    results = run([Job(p.solution, p.tests, SOLUTION_LIMITS) for p in problems], "solutions")
    retry = [i for i, (p, r) in enumerate(zip(problems, results))
             if not r.passed and isinstance(p.tests, AssertTests) and mode_of(p.tests) == "proxy"]
    marked = {i: dataclasses.replace(problems[i], tests=AssertTests(problems[i].tests.code, "inprocess"),
                                     mode_reason="its solution fails in proxy mode ("
                                                 f"{run_reason(results[i], problems[i].tests)}) and passes inprocess")
              for i in retry}
    second = dict(zip(retry, run([Job(marked[i].solution, marked[i].tests, SOLUTION_LIMITS) for i in retry],
                                 "solutions (inprocess)"))) if retry else {}
    good, dropped = [], {}
    for i, (p, r) in enumerate(zip(problems, results)):
        if r.passed:
            good.append(p)
        elif i in second and second[i].passed:
            good.append(marked[i])
        else:
            last = second.get(i, r)
            dropped[p.base_id] = f"{last.status}: {run_reason(last, marked[i].tests if i in second else p.tests)}"
    return good, dropped


def clean_task(problem: Problem, split: str) -> Task:
    """A correct program shown as is (buggy_code == solution), for GT Debug."""
    meta = {"source": problem.source, "kind": "clean", "faults": 0, "split": split, **_mode_meta(problem)}
    return Task(f"{problem.base_id}#clean", problem.base_id, problem.prompt, problem.solution,
                problem.solution, problem.tests, meta=meta)


@dataclasses.dataclass
class BuildResult:
    """Tasks per output file and the manifest."""

    files: dict[str, list[Task]]
    manifest: dict[str, Any]


def _counts(tasks: Sequence[Task]) -> dict[str, dict[str, int]]:
    counts: dict[str, collections.Counter] = {k: collections.Counter() for k in
                                              ("source", "kind", "faults", "status", "tests_mode",
                                                                     "operator", "category")}
    for t in tasks:
        for key in ("source", "kind", "faults", "status", "tests_mode"):
            counts[key][str(t.meta[key])] += 1
        counts["operator"].update(t.meta["operators"])
        counts["category"].update(t.meta["categories"])
    return {k: dict(sorted(c.items())) for k, c in counts.items()}


def build(problems: Sequence[Problem], run: Runner, cfg: BuildConfig = BuildConfig(),
          progress: bool = False) -> BuildResult:
    """Build train/val/test/gt_debug task lists from correct programs with tests.

    Args:
        problems: the sources' problems (ids unique).
        run: the sandbox runner (production: the fleet).
        cfg: sampling sizes and the seed.
        progress: show progress bars for mutant generation.
    """
    problems, helpers = bind_trusted_helpers(problems)
    good, dropped = solution_phase(problems, run)
    splits = split_of(good, cfg)
    gt_debug = [p for p in good if splits[p.base_id] == GT_DEBUG]
    mutable = [p for p in good if splits[p.base_id] != GT_DEBUG]

    # single faults
    stats: dict[str, collections.Counter] = {k: collections.Counter() for k in (SINGLE, MULTI, MULTI_LINE)}
    seen = {p.solution for p in good}
    singles = [c for p in tqdm(mutable, desc="mutants", disable=not progress, leave=False)
               for c in sample_singles(p, cfg)]
    kept = screen(singles, run, seen, "single faults", stats[SINGLE])

    # composites
    kept_by_problem: dict[str, list[Mutant]] = collections.defaultdict(list)
    for k in kept:
        kept_by_problem[k.candidate.problem.base_id].append(k.candidate.parts[0])
    multi, multi_line = [], []
    for p in tqdm(mutable, desc="composites", disable=not progress, leave=False):
        multi += sample_multi(p, kept_by_problem[p.base_id], cfg)
        multi_line += sample_multi_line(p, kept_by_problem[p.base_id], cfg)
    kept += screen(multi, run, seen, "multi-fault", stats[MULTI])
    kept += screen(multi_line, run, seen, "multi-line", stats[MULTI_LINE])

    # tasks and splits
    order = {p.base_id: i for i, p in enumerate(good)}
    kept.sort(key=lambda k: order[k.candidate.problem.base_id])  # stable: singles, multi, multi-line
    files: dict[str, list[Task]] = {name: [] for name in (*SPLITS, GT_DEBUG)}
    number: collections.Counter = collections.Counter()
    held_out: list[str] = []
    for k in kept:
        base_id = k.candidate.problem.base_id
        task = to_task(k, number[base_id])
        number[base_id] += 1
        if splits[base_id] == "train" and task.meta["tests_mode"] == "inprocess" and not cfg.train_inprocess:
            held_out.append(task.task_id)
            continue
        files[splits[base_id]].append(task)
    files[GT_DEBUG] = ([clean_task(p, splits[p.base_id]) for p in good if splits[p.base_id] in ("val", "test")]
                       if cfg.gt_debug_from_val_test else [clean_task(p, GT_DEBUG) for p in gt_debug])

    manifest = {
        "tool": "precisecoder-jax",
        "version": importlib.metadata.version("precisecoder-jax"),
        "seed": cfg.seed,
        "config": dataclasses.asdict(cfg),
        "screen_timeout_s": SCREEN_LIMITS.timeout_s,
        "problems": dict(sorted(collections.Counter(p.source for p in problems).items())),
        "problems_dropped": list(dropped),
        "problems_dropped_reasons": dropped,
        "problems_inprocess": [p.base_id for p in good if tests_mode(p) == "inprocess"],
        "problems_per_mode": dict(sorted(collections.Counter(tests_mode(p) for p in good).items())),
        "problems_mode_reasons": {p.base_id: mode_reason(p) for p in good if tests_mode(p) != "proxy"},
        "problems_trusted_helpers": helpers,
        "train_inprocess_excluded": held_out,
        "base_problems": {s: sum(1 for p in good if splits[p.base_id] == s) for s in (*SPLITS, GT_DEBUG)},
        "files": {name: len(tasks) for name, tasks in files.items()},
        "counts": _counts([t for s in SPLITS for t in files[s]]),
        "by_split": {s: _counts(files[s]) for s in SPLITS},
        "screening": {kind: dict(sorted(c.items())) for kind, c in stats.items()},
    }
    return BuildResult(files, manifest)


def write(result: BuildResult, out: str | os.PathLike) -> None:
    """Write DIR/{train,val,test,gt_debug}.jsonl and DIR/manifest.json."""
    os.makedirs(out, exist_ok=True)
    for name, tasks in result.files.items():
        write_tasks(os.path.join(out, f"{name}.jsonl"), tasks)
    with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(result.manifest, f, indent=1, sort_keys=True)
        f.write("\n")
