"""The PreciseCoder scorer: docs/reward.md from alignment to aggregates.

The math (alignment, components, credits, precision / recall / F1, rewards,
aggregates) is pure functions. `score_predictions` drives the test runs
through a `run_batch(jobs) -> results` callable (in production `Fleet.run`)
in phases, one call each: unit runs, then component verifications, then the
essential-subset windows (`verify=False` stops after the unit runs; a `done` dict
shared with a later call lets it make only the rest). The window search (`WindowSearch`) gives exactly
the sequential search's answer (window sizes s = 1, 2, ... in weights, then components, then
positions; the first pass settles a component) within `max_window_runs`
windows per prediction, but runs the next windows of every prediction still
searching together, at most `window_batch` of one size per prediction per
call. Window runs are bounded by the unit run, so a prediction whose windows
hang cannot buy worker time: each gets a timeout derived from the unit run's
duration (`window_timeout_s`), a timeout is a fail and is not retried, and the
prediction's windows share a wall-time budget (`window_budget_s`) past which
its search is capped like one out of `max_window_runs`. Most components stop at s = 1 (cap = |δ*| + ε is small), so one call is
the usual case. Within a call, identical jobs are sent once, and a job seen
in an earlier phase is not sent again, so no program runs twice even without
the fleet's cache; programs that differ only in whitespace at their very end
(which Python ignores) count as identical. A prediction's `runs` counts its
distinct jobs: at most 1 + |components| + max_window_runs plus, per
component, the rest of the batch behind its first passing window.

Choices the specification leaves open are listed in docs/reward.md.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from reward.diff import Block, Edit, apply, diff, edits_of, normalize_newlines, program_size
from reward.extract import extract_program
from reward.sandbox import Job, Limits, RunResult, limits_for
from reward.schema import Prediction, Task, Tests

DEFAULT_LAMBDA = 1 / 3
DEFAULT_EPSILON = 1
DEFAULT_MAX_WINDOW_RUNS = 256
WINDOW_TIMEOUT_FLOOR_S = 2.0  # a window run's timeout is never below this (load must not fail a window)
WINDOW_TIMEOUT_FACTOR = 10.0  # ... nor below this many times the unit run's duration
WINDOW_BUDGET_TIMEOUTS = 4  # a prediction's windows may spend this many window timeouts ...
WINDOW_BUDGET_FACTOR = 2.0  # ... plus, per window run allowed, this many unit-run durations

RunBatch = Callable[[Sequence[Job]], list[RunResult]]


# Alignment and components ---------------------------------------------------


def span_distance(ref: Block, pred: Block) -> float:
    """Lines between two spans: max(0, a_j − b_i, a_i − b_j) (0 when they overlap)."""
    (a_i, b_i), (a_j, b_j) = ref.span, pred.span
    return max(0.0, a_j - b_i, a_i - b_j)


def identical_pairs(reference: Sequence[Block], predicted: Sequence[Block]) -> set[tuple[int, int]]:
    """The one-to-one pairing of blocks with identical edits, nearest first.

    Candidates are the (reference, predicted) pairs whose edits are identical
    (same kinds, same old and new texts, in order), taken in order of span
    distance, then reference index, then predicted index; a pair is kept when
    neither of its blocks is in a kept pair. So one fix that matches twin
    reference blocks aligns with the nearer only.
    """
    candidates = sorted((span_distance(ref, pred), i, j)
                        for i, ref in enumerate(reference) for j, pred in enumerate(predicted)
                        if ref.signature == pred.signature)
    kept: set[tuple[int, int]] = set()
    used_refs: set[int] = set()
    used_preds: set[int] = set()
    for _, i, j in candidates:
        if i not in used_refs and j not in used_preds:
            kept.add((i, j))
            used_refs.add(i)
            used_preds.add(j)
    return kept


def alignment(reference: Sequence[Block], predicted: Sequence[Block]) -> set[tuple[int, int]]:
    """The aligned (reference index, predicted index) pairs: spans at most one line apart, or an identical pair."""
    near = {(i, j) for i, ref in enumerate(reference) for j, pred in enumerate(predicted)
            if span_distance(ref, pred) <= 1}
    return near | identical_pairs(reference, predicted)


def components(reference: Sequence[Block], predicted: Sequence[Block]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Connected components of the alignment graph holding both kinds of block.

    Returns:
        (reference block indices, predicted block indices) per component,
        ordered by their first reference block.
    """
    m = len(reference)
    parent = list(range(m + len(predicted)))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, j in alignment(reference, predicted):
        parent[root(i)] = root(m + j)
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for node in range(len(parent)):
        refs, preds = groups.setdefault(root(node), ([], []))
        (refs if node < m else preds).append(node if node < m else node - m)
    found = [(tuple(r), tuple(p)) for r, p in groups.values() if r and p]
    return sorted(found)


@dataclasses.dataclass(frozen=True)
class Component:
    """One component K: its blocks, its predicted edits in position order, and the rest of the reference fix."""

    refs: tuple[int, ...]
    preds: tuple[int, ...]
    cap: int
    edits: tuple[Edit, ...]
    others: tuple[Edit, ...]

    @property
    def size(self) -> int:
        """ℓ_K, the summed weight of the predicted edits in K."""
        return sum(e.weight for e in self.edits)

    @property
    def search_bound(self) -> int:
        """The largest window weight tried: min(ℓ_K, cap_K) − 1 (no search when below 1)."""
        return min(self.size, self.cap) - 1

    def program(self, c: str, edits: Sequence[Edit] | None = None) -> str:
        """C with the reference blocks outside K and the given edits of K (default: all of P_K)."""
        return apply(c, self.others, self.edits if edits is None else edits)

    def windows(self, s: int) -> list[tuple[Edit, ...]]:
        """The contiguous windows of edits of P_K that weigh s in all, in position order (at most one
        starts at each edit, since every edit weighs at least 1)."""
        before = self._weight_before()
        found = []
        for start in range(len(self.edits)):
            end = bisect.bisect_left(before, before[start] + s)  # the shortest run from start weighing >= s
            if end < len(before) and before[end] == before[start] + s:
                found.append(self.edits[start:end])
        return found

    def window_count(self) -> int:
        """How many windows the search may try: those weighing 1 … `search_bound`."""
        if self.search_bound < 1:
            return 0
        before = self._weight_before()
        # From each start, the runs within the bound end before the first prefix weight above it.
        return sum(bisect.bisect_right(before, before[start] + self.search_bound) - start - 1
                   for start in range(len(self.edits)))

    def _weight_before(self) -> list[int]:
        """The weight of edits[:k] for k = 0 … len(edits), increasing."""
        return list(itertools.accumulate((e.weight for e in self.edits), initial=0))


@dataclasses.dataclass(frozen=True)
class Analysis:
    """What a valid prediction's score needs besides test runs."""

    reference: tuple[Block, ...]
    predicted: tuple[Block, ...]
    components: tuple[Component, ...]

    @property
    def edited_lines(self) -> int:
        """ℓ = Σ |δ̂| over the predicted blocks (edits weighted by the statements they change)."""
        return sum(b.size for b in self.predicted)


def analyze(buggy: str, solution: str, program: str, epsilon: int) -> Analysis:
    """Diff a program and the reference against C and build the components."""
    reference, predicted = diff(buggy, solution), diff(buggy, program)
    return Analysis(tuple(reference), tuple(predicted), build_components(reference, predicted, epsilon))


def build_components(reference: Sequence[Block], predicted: Sequence[Block], epsilon: int) -> tuple[Component, ...]:
    """The components of one file's blocks with their caps, predicted edits and the rest of that file's
    reference fix (`others`). A repository task calls it once per path, so a component never crosses files."""
    built = []
    for refs, preds in components(reference, predicted):
        cap = sum(reference[i].size for i in refs) + epsilon * len(refs)
        edits = edits_of(predicted[j] for j in preds)
        others = edits_of(b for i, b in enumerate(reference) if i not in refs)
        built.append(Component(refs, preds, cap, tuple(edits), tuple(others)))
    return tuple(built)


def faults_of(task: Any) -> int:
    """m, the reference blocks of a task: of `buggy_code` → `solution`, or summed over the paths of a
    repository task's `buggy_files` → `solution_files` (`reward.repo_task.RepoTask`)."""
    if isinstance(task, Task):
        return len(diff(task.buggy_code, task.solution))
    return sum(len(diff(text, task.solution_files[path])) for path, text in task.buggy_files.items())


# Score math -----------------------------------------------------------------


def credit(verified: bool, essential: int, cap: int) -> int:
    """credit_K = min(|ess_K|, cap_K) for a verified component, else 0."""
    return min(essential, cap) if verified else 0


def precision_recall_f1(unit: int, edited_lines: int, credits: int, faults: int, fixed: int) -> tuple[float, float, float]:
    """Precision Σcredit/ℓ, recall Σfix/m, and F1 of precision and gated recall (1 when unit = 1)."""
    precision = credits / edited_lines if edited_lines else 0.0
    recall = fixed / faults
    gated = 1.0 if unit else recall
    f1 = 2 * precision * gated / (precision + gated) if precision + gated else 0.0
    return precision, recall, f1


def scalar_reward(unit: int, f1: float | None, lam: float = DEFAULT_LAMBDA) -> float:
    """r_λ = (1 − λ)·unit + λ·f1; f1 = None (a clean task) gives (1 − λ)·unit."""
    return (1 - lam) * unit + lam * (f1 or 0.0)


@dataclasses.dataclass(frozen=True)
class ComponentResult:
    """Diagnostics of one component: its blocks, verdict, |ess|, cap and credit."""

    refs: tuple[int, ...]
    preds: tuple[int, ...]
    verified: bool
    essential: int | None
    cap: int
    credit: int


@dataclasses.dataclass(frozen=True)
class Score:
    """The scores and diagnostics of one prediction (one line of `precisecoder score`)."""

    task_id: str
    valid: bool
    unit: int
    precision: float | None
    recall: float | None
    f1: float | None
    edited_lines: int | None
    faults: int
    faults_fixed: int
    noop: bool
    damage: int | None
    reward: float
    blocks: int | None = None
    components: tuple[ComponentResult, ...] = ()
    runs: int = 0
    window_search_capped: bool = False
    status: str = "scored"
    reason: str | None = None
    edited_files: int | None = None

    @property
    def vector(self) -> tuple[float, float]:
        """The GDPO reward vector [unit, f1], weighted [1 − λ, λ]; f1 counts 0 on clean tasks."""
        return float(self.unit), self.f1 or 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def score_of(task: Task, valid: bool, unit: int, analysis: Analysis | None, verdicts: Sequence[bool],
             essentials: Sequence[int | None], runs: int, lam: float = DEFAULT_LAMBDA,
             capped: bool = False) -> Score:
    """Assemble the score of one prediction from its analysis and test verdicts.

    Args:
        verdicts: per component of `analysis`, whether it was verified.
        essentials: per component, |ess_K| for a verified one, else None.
        capped: whether the window search ran out of `max_window_runs` (reported as is).
    """
    faults = faults_of(task) if analysis is None else len(analysis.reference)
    ell = analysis.edited_lines if analysis is not None else None
    results = tuple(
        ComponentResult(k.refs, k.preds, ok, ess, k.cap, credit(ok, ess or 0, k.cap))
        for k, ok, ess in zip(analysis.components if analysis else (), verdicts, essentials))
    fixed = sum(len(r.refs) for r in results if r.verified)
    noop = valid and ell == 0
    common = dict(task_id=task.task_id, valid=valid, unit=unit, edited_lines=ell, faults=faults,
                  faults_fixed=fixed, noop=noop, blocks=len(analysis.predicted) if analysis else None,
                  components=results, runs=runs, window_search_capped=capped)
    if faults == 0:
        return Score(precision=None, recall=None, f1=None, damage=1 - unit,
                     reward=scalar_reward(unit, None, lam), **common)
    precision, recall, f1 = precision_recall_f1(unit, ell or 0, sum(r.credit for r in results), faults, fixed)
    return Score(precision=precision, recall=recall, f1=f1, damage=None,
                 reward=scalar_reward(unit, f1, lam), **common)


# Test runs --------------------------------------------------------------------


def window_timeout_s(timeout_s: float, unit_s: float) -> float:
    """A window run's timeout: WINDOW_TIMEOUT_FACTOR × the unit run's duration, at least the floor,
    at most the task's own timeout (a window is the buggy program with part of the fix: about as fast)."""
    return min(timeout_s, max(WINDOW_TIMEOUT_FLOOR_S, WINDOW_TIMEOUT_FACTOR * unit_s))


def window_budget_s(window_timeout: float, unit_s: float, max_window_runs: int) -> float:
    """The wall time a prediction's window runs may use in all: a few timeouts, and for every window
    run allowed a few unit-run durations (what honest windows take)."""
    return WINDOW_BUDGET_TIMEOUTS * window_timeout + WINDOW_BUDGET_FACTOR * max_window_runs * unit_s


def canonical_job(program: str, tests: Tests, limits: Limits) -> Job:
    """The job that runs a program: spaces, tabs and line ends at its very end are dropped.

    Python ignores them, and an extracted program lacks C's final newline, so
    without this the usual exact fix would run twice (as the answer and as its
    verification program). Other Unicode whitespace is kept: Python rejects
    some of it (U+00A0) as source, and that must still fail.
    """
    return Job(program.rstrip(" \t\r\n"), tests, limits)


UNVERIFIABLE = "unverifiable"


def unverifiable_reason(result: RunResult) -> str:
    """Why the judge could not verify a run: its last `[tests]` line (the proxy error it recorded)."""
    _, _, detail = result.stderr.rpartition("[tests] ")
    return detail.strip().splitlines()[-1][:300] if detail.strip() else "the judge could not verify the run"


def unverifiable_score(task: Task, valid: bool, analysis: Analysis | None, runs: int, reason: str) -> Score:
    """A prediction some of whose runs the judge could not verify: no verdict, reward 0, left out of aggregates."""
    ell = analysis.edited_lines if analysis is not None else None
    faults = faults_of(task) if analysis is None else len(analysis.reference)
    return Score(task.task_id, valid, 0, None, None, None, ell, faults, 0, valid and ell == 0, None, 0.0,
                 blocks=len(analysis.predicted) if analysis else None, runs=runs, status=UNVERIFIABLE,
                 reason=reason)


UNIT_ONLY = "unit_only"


def unit_only_score(task: Task, valid: bool, unit: int, analysis: Analysis | None, runs: int) -> Score:
    """What a prediction's unit run alone settles (`score_predictions(verify=False)`): unit, edited lines,
    no-op and damage; precision, recall and F1 are None and the reward NaN until the verification runs."""
    ell = analysis.edited_lines if analysis is not None else None
    faults = faults_of(task) if analysis is None else len(analysis.reference)
    return Score(task.task_id, valid, unit, None, None, None, ell, faults, 0, valid and ell == 0,
                 1 - unit if faults == 0 else None, math.nan,
                 blocks=len(analysis.predicted) if analysis else None, runs=runs, status=UNIT_ONLY)


class _Runner:
    """`run_batch` behind a memo: each distinct job is sent once per scoring call (or per `done` dict
    shared between calls)."""

    def __init__(self, run_batch: RunBatch, done: dict[Job, RunResult] | None = None):
        self._run_batch = run_batch
        self._done: dict[Job, RunResult] = {} if done is None else done

    def __call__(self, jobs: Sequence[Job]) -> list[bool]:
        return [result.passed for result in self.results(jobs)]

    def results(self, jobs: Sequence[Job]) -> list[RunResult]:
        todo = list(dict.fromkeys(job for job in jobs if job not in self._done))
        if todo:
            results = self._run_batch(todo)
            if len(results) != len(todo):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(todo)} jobs")
            self._done.update(zip(todo, results))
        return [self._done[job] for job in jobs]

    def unverifiable(self, jobs: Iterable[Job]) -> str | None:
        """The reason of the first of `jobs` the judge could not verify, or None."""
        found = [self._done[job] for job in jobs if self._done[job].status == UNVERIFIABLE]
        return unverifiable_reason(found[0]) if found else None


class WindowSearch:
    """The essential-subset search of one prediction, run a batch of windows at a time.

    The result is the spec's sequential search: windows in order of size s (their summed weight),
    then component, then position; a component settles at the size of its
    first passing window, or at ℓ_K once its last window fails; every window
    tried for an unsettled component uses one of `max_window_runs`, and its
    duration comes out of `budget_s`. When either is used up, the components
    still unsettled get |ess_K| = ℓ_K and the search is `capped`. A batch holds
    no more windows than the time left pays for at `window_s` (the most one
    window run takes), so the windows never use more than `budget_s` + `window_s`. `take` hands out the next windows (one size at a
    time, at most `n`, never past the budget) so they can run in parallel;
    `record` reads their verdicts in order, so windows after a component's
    first pass in the same batch are run but change nothing (at most one
    batch per component is spent after its first pass).
    """

    def __init__(self, components: Sequence[tuple[int, Component]], max_window_runs: int,
                 budget_s: float = math.inf, window_s: float = math.inf):
        self.essential: dict[int, int] = {}
        self.capped = False
        self._budget = max_window_runs
        self._budget_s, self._window_s = budget_s, window_s
        self._size = {k: comp.size for k, comp in components}
        self._left = {k: comp.window_count() for k, comp in components}
        for k, left in self._left.items():
            if not left:
                self.essential[k] = self._size[k]
        self._taken: list[tuple[int, int, tuple[Edit, ...]]] = []
        self._order = self._windows(components)
        self._next = next(self._order, None)
        self._cap()

    def _windows(self, components: Sequence[tuple[int, Component]]) -> Iterator[tuple[int, int, tuple[Edit, ...]]]:
        """(component, s, window) in search order, skipping components settled by the time they are reached."""
        for s in itertools.count(1):
            live = [(k, comp) for k, comp in components if k not in self.essential and s <= comp.search_bound]
            if not live:
                return
            for k, comp in live:
                for window in comp.windows(s):
                    if k in self.essential:
                        break
                    yield k, s, window

    @property
    def done(self) -> bool:
        return len(self.essential) == len(self._size)

    def take(self, n: int) -> list[tuple[int, int, tuple[Edit, ...]]]:
        """The next windows to run: at most n, all of one size, within the budget left."""
        batch: list[tuple[int, int, tuple[Edit, ...]]] = []
        if math.isfinite(self._budget_s) and math.isfinite(self._window_s):
            n = min(n, max(1, math.ceil(self._budget_s / self._window_s)))
        while self._next is not None and len(batch) < min(n, self._budget):
            if self._next[0] not in self.essential:
                if batch and self._next[1] != batch[0][1]:
                    break
                batch.append(self._next)
            self._next = next(self._order, None)
        self._taken = batch
        return batch

    def record(self, passed: Sequence[bool], durations_s: Sequence[float] | None = None) -> None:
        """The verdicts (and run durations) of the windows of the last `take`, in order."""
        self._budget_s -= sum(durations_s or ())
        for (k, s, _), ok in zip(self._taken, passed, strict=True):
            if k in self.essential:
                continue
            self._budget -= 1
            self._left[k] -= 1
            if ok:
                self.essential[k] = s
            elif not self._left[k]:
                self.essential[k] = self._size[k]
        self._cap()

    def _cap(self) -> None:
        if self._budget <= 0 or self._budget_s <= 0:
            for k in self._size:
                if k not in self.essential:
                    self.essential[k] = self._size[k]
                    self.capped = True


def program_of(prediction: Prediction, think_opened: bool = False) -> str | None:
    """The prediction's program: `code` if given, else the program extracted from `response`.

    The prediction's own `think_opened` wins; `think_opened` here is the default for those without it.
    Line ends are normalized (`\\r\\n` and `\\r` as `\\n`, as Python reads them and as extraction
    already does), so the program that runs is the one the diff numbers.
    """
    if prediction.code is not None:
        return normalize_newlines(prediction.code)
    opened = think_opened if prediction.think_opened is None else prediction.think_opened
    return extract_program(prediction.response or "", think_opened=opened)


def score_predictions(items: Sequence[tuple[Task, Prediction]], run_batch: RunBatch, *,
                      lam: float = DEFAULT_LAMBDA, epsilon: int = DEFAULT_EPSILON,
                      limits: Limits = Limits(), max_window_runs: int = DEFAULT_MAX_WINDOW_RUNS,
                      window_batch: int | None = None, think_opened: bool = False, verify: bool = True,
                      done: dict[Job, RunResult] | None = None) -> list[Score]:
    """Score (task, prediction) pairs: one `run_batch` call for the unit runs and verifications, then one
    per round of window batches.

    With `verify=False` only the unit runs are made: each score is `unit_only_score` (unit, edited
    lines, no-op, damage; no precision, recall, F1 or reward), all that unit-only reward terms
    read. `done` holds the results of jobs already run, and this call adds its own: a later call
    with `verify=True` and the same dict makes only the verification and window runs, and scores
    exactly as one call with `verify=True` would have (the unit runs' verdicts are reused, not re-run).

    Args:
        items: the pairs to score; a task's own `epsilon` and `timeout_s` override the defaults.
        run_batch: runs jobs and returns their results in order (e.g. `Fleet.run`).
        lam: λ of the scalar reward.
        epsilon: default ε of the cap.
        limits: default limits of one test run.
        max_window_runs: the most windows tried per prediction in the essential-subset search.
        window_batch: the most windows of one prediction run in parallel (default: twice the CPU
            count, a default fleet's worker count; pass 2 × `Fleet.num_workers`). It changes the
            runs made, never a score.
        think_opened: for predictions whose `think_opened` is unset, whether their prompt opened
            the think block (see `extract_program`).
    """
    if max_window_runs < 0:
        raise ValueError(f"max_window_runs must be >= 0, got {max_window_runs}")
    batch = 2 * (os.cpu_count() or 1) if window_batch is None else window_batch
    if batch < 1:
        raise ValueError(f"window_batch must be >= 1, got {window_batch}")
    run = _Runner(run_batch, done)
    programs = [program_of(pred, think_opened) for _, pred in items]
    jobs_of: list[dict[Job, None]] = [{} for _ in items]  # in the order first made: the unit run first

    def job(n: int, program: str, window: bool = False) -> Job:
        task = items[n][0]
        made = canonical_job(program, task.tests, limits_for(task, limits))
        if window:
            made = dataclasses.replace(made, limits=window_limits[n], retry_timeout=False)
        jobs_of[n][made] = None
        return made

    valid = [n for n, program in enumerate(programs) if program is not None]
    analyses: dict[int, Analysis] = {
        n: analyze(items[n][0].buggy_code, items[n][0].solution, programs[n],
                   epsilon if items[n][0].epsilon is None else items[n][0].epsilon)
        for n in valid}

    if not verify:
        units = dict(zip(valid, run([job(n, programs[n]) for n in valid])))
        return [unverifiable_score(task, n in analyses, analyses.get(n), len(jobs_of[n]), reason)
                if (reason := run.unverifiable(jobs_of[n])) is not None
                else unit_only_score(task, n in analyses, int(units.get(n, False)), analyses.get(n), len(jobs_of[n]))
                for n, (task, _) in enumerate(items)]

    # The unit runs and the verifications do not depend on each other: one batch for both.
    keys = [(n, k) for n in valid for k in range(len(analyses[n].components))]
    comps = {(n, k): analyses[n].components[k] for n, k in keys}
    unit_jobs = [job(n, programs[n]) for n in valid]
    results = run.results(unit_jobs + [job(n, comps[n, k].program(items[n][0].buggy_code)) for n, k in keys])
    unit_results = dict(zip(valid, results[:len(valid)]))
    verified = {key: result.passed for key, result in zip(keys, results[len(valid):])}
    units = {n: result.passed for n, result in unit_results.items()}
    window_limits = {n: dataclasses.replace(
        limits_for(items[n][0], limits),
        timeout_s=window_timeout_s(limits_for(items[n][0], limits).timeout_s, unit_results[n].duration_s))
        for n in valid}

    searches = {n: WindowSearch([(k, analyses[n].components[k]) for k in range(len(analyses[n].components))
                                 if verified[n, k]], max_window_runs,
                                window_budget_s(window_limits[n].timeout_s, unit_results[n].duration_s,
                                                max_window_runs),
                                window_limits[n].timeout_s) for n in valid}
    active = [n for n in valid if not searches[n].done]
    while active:
        batches = {n: searches[n].take(batch) for n in active}
        code = {n: items[n][0].buggy_code for n in active}
        results = run.results([job(n, comps[n, k].program(code[n], edits), window=True)
                               for n in active for k, _, edits in batches[n]])
        start = 0
        for n in active:
            done = results[start:start + len(batches[n])]
            searches[n].record([r.passed for r in done], [r.duration_s for r in done])
            start += len(batches[n])
        active = [n for n in active if not searches[n].done]
    scores = []
    for n, (task, _) in enumerate(items):
        analysis = analyses.get(n)
        reason = run.unverifiable(jobs_of[n])
        if reason is not None:
            scores.append(unverifiable_score(task, n in analyses, analysis, len(jobs_of[n]), reason))
            continue
        ks = range(len(analysis.components)) if analysis else ()
        search = searches.get(n)
        scores.append(score_of(task, n in analyses, int(units.get(n, False)), analysis,
                               [verified[n, k] for k in ks], [search.essential.get(k) for k in ks] if search else [],
                               len(jobs_of[n]), lam, capped=bool(search and search.capped)))
    return scores


# Baseline rewards -------------------------------------------------------------


def baseline_terms(score: Score, buggy_code: str) -> tuple[float, float]:
    """The terms [unit, ℓ] that the EA-GRPO and "GRPO + clean rows" estimators of `jaxrl.advantages` take.

    ℓ is a count, not a reward: the estimators own the sign of its penalty
    (clean rows standardize −ℓ). An invalid rollout's ℓ is C's size (`program_size`: the summed
    weight of its non-blank lines, their number when each holds one statement).
    """
    ell = score.edited_lines if score.valid else program_size(buggy_code)
    return float(score.unit), float(ell)


# Aggregates -------------------------------------------------------------------


def invalid_score(task: Task, lam: float = DEFAULT_LAMBDA) -> Score:
    """The score a task without a prediction counts as."""
    return score_of(task, False, 0, None, (), (), 0, lam)


def verifiable_by_task(tasks: Sequence[Task], scores: Sequence[Score], lam: float = DEFAULT_LAMBDA) -> dict[str, list[Score]]:
    """task_id -> its verifiable scores; a task without any score gets one invalid score, one with only
    unverifiable scores gets none. Scores for unknown tasks are an error."""
    by_task: dict[str, list[Score]] = {t.task_id: [] for t in tasks}
    seen: set[str] = set()
    for s in scores:
        if s.task_id not in by_task:
            raise KeyError(f"score for unknown task {s.task_id!r}")
        seen.add(s.task_id)
        if s.status != UNVERIFIABLE:
            by_task[s.task_id].append(s)
    for t in tasks:
        if t.task_id not in seen:
            by_task[t.task_id].append(invalid_score(t, lam))
    return by_task


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def aggregate(tasks: Sequence[Task], scores: Sequence[Score], lam: float = DEFAULT_LAMBDA) -> dict[str, Any]:
    """The set's summary: buggy pass / precision / recall / f1 / lines (and files, when some score reports
    `edited_files`: repository tasks), clean noop / damage.

    Several predictions of a task are averaged per task first; a task without
    one counts as one invalid prediction. Unverifiable predictions are left
    out and counted (a task with only such predictions is left out of the
    means too). Scores for unknown tasks are an error.
    """
    by_task = verifiable_by_task(tasks, scores, lam)
    scored = {s.task_id for s in scores}
    missing = [t.task_id for t in tasks if t.task_id not in scored]
    unverifiable = [s for s in scores if s.status == UNVERIFIABLE]

    def per_task(group: Sequence[Task], field: str) -> float | None:
        return _mean(_mean(getattr(s, field) or 0.0 for s in by_task[t.task_id]) for t in group
                     if by_task[t.task_id])

    is_buggy = {t.task_id: faults_of(t) > 0 for t in tasks}
    buggy = [t for t in tasks if is_buggy[t.task_id]]
    clean = [t for t in tasks if not is_buggy[t.task_id]]

    def valid_mean(field: str) -> float | None:
        """The mean over buggy tasks of each task's mean `field` over its valid predictions that report it."""
        per = [_mean(getattr(s, field) for s in by_task[t.task_id] if s.valid and getattr(s, field) is not None)
               for t in buggy if by_task[t.task_id]]
        return _mean(v for v in per if v is not None)

    summary = {
        "tasks": len(tasks), "predictions": len(scores), "missing": len(missing),
        "invalid": sum(not s.valid for s in scores),
        "unverifiable": len(unverifiable),
        "unverifiable_tasks": sum(not by_task[t.task_id] for t in tasks),
        "unverifiable_reasons": dict(sorted(Counter(s.reason for s in unverifiable).items())),
        "reward": per_task(tasks, "reward"),
        "buggy": {"tasks": len(buggy), "pass": per_task(buggy, "unit"), "precision": per_task(buggy, "precision"),
                  "recall": per_task(buggy, "recall"), "f1": per_task(buggy, "f1"),
                  "lines": valid_mean("edited_lines")},
        "clean": {"tasks": len(clean), "noop": per_task(clean, "noop"), "damage": per_task(clean, "damage")},
    }
    if any(s.edited_files is not None for s in scores):  # repository tasks: the mean number of files edited
        summary["buggy"]["files"] = valid_mean("edited_files")
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """The aggregate table: percentages with one decimal, lines (and files, for repository tasks) with two."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}"

    def two(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    b, c = summary["buggy"], summary["clean"]
    files = (f" {'files':>6}", f" {two(b['files']):>6}") if "files" in b else ("", "")
    return "\n".join([
        f"{'buggy tasks':>11} {'pass %':>7} {'precision %':>12} {'recall %':>9} {'f1 %':>6} {'lines':>6}{files[0]}",
        f"{b['tasks']:>11} {pct(b['pass']):>7} {pct(b['precision']):>12} {pct(b['recall']):>9} {pct(b['f1']):>6} "
        f"{two(b['lines']):>6}{files[1]}",
        f"{'clean tasks':>11} {'noop %':>7} {'damage %':>12}",
        f"{c['tasks']:>11} {pct(c['noop']):>7} {pct(c['damage']):>12}",
        f"predictions {summary['predictions']}, invalid {summary['invalid']}, "
        f"tasks without a prediction {summary['missing']} (counted invalid), mean reward {pct(summary['reward'])} %",
        f"unverifiable {summary['unverifiable']} (left out; tasks with no verifiable prediction "
        f"{summary['unverifiable_tasks']})",
    ])
