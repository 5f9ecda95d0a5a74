"""The PreciseCoder scorer: REWARD_SPEC.md from alignment to aggregates.

The math (alignment, components, credits, precision / recall / F1, rewards,
EA-GRPO, aggregates) is pure functions. `score_predictions` drives the test
runs through a `run_batch(jobs) -> results` callable (in production
`Fleet.run`) in phases, one call each: unit runs, then component
verifications, then the essential-subset windows in rounds of increasing s
(round s runs every window of size s of every component still searching).
A component's |ess| is the smallest s with a passing window, so running a
round's windows in parallel gives the same answer as the spec's sequential
order of s then position; rounds never run a window longer than the answer,
and since most components stop at s = 1 (cap = |δ*| + ε is small) one round
is the usual case. Within a call, identical jobs are sent once, and a job seen
in an earlier phase is not sent again, so no program runs twice even without
the fleet's cache; programs that differ only in whitespace at their very end
(which Python ignores) count as identical. A prediction's `runs` counts its
distinct jobs, at most 1 + |components| + Σ windows.

Choices the spec leaves open:
- `code` of a prediction is used as is; `response` goes through `extract_program`.
- Invalid predictions run nothing; `faults_fixed` is 0 and `edited_lines` null.
- On a clean task (and on an invalid prediction) the GDPO vector is [unit, 0],
  consistent with the scalar reward (1 − λ)·unit.
- EA-GRPO and the clean-row vector of "GRPO + clean rows" take ℓ of an invalid
  rollout as the number of non-blank lines of C (the spec's "length of C").
- Aggregates: a task's `lines` is the mean ℓ of its valid predictions; the set's
  `lines` is the mean over tasks with at least one (null when none); `reward`
  (mean scalar reward over all tasks) and counts are reported besides the spec's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from reward.diff import Block, Edit, apply, diff, edits_of, nonblank_lines
from reward.extract import extract_program
from reward.sandbox import Job, Limits, RunResult, limits_for
from reward.schema import Prediction, Task, Tests

DEFAULT_LAMBDA = 1 / 3
DEFAULT_EPSILON = 1
EA_ALPHA, EA_BETA = 0.8, 0.05

RunBatch = Callable[[Sequence[Job]], list[RunResult]]


# Alignment and components ---------------------------------------------------


def aligned(ref: Block, pred: Block) -> bool:
    """Spans at most one line apart, or identical edits wherever they stand."""
    (a_i, b_i), (a_j, b_j) = ref.span, pred.span
    return max(0.0, a_j - b_i, a_i - b_j) <= 1 or ref.signature == pred.signature


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

    for i, ref in enumerate(reference):
        for j, pred in enumerate(predicted):
            if aligned(ref, pred):
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
        """ℓ_K, the number of predicted edits in K."""
        return len(self.edits)

    @property
    def search_bound(self) -> int:
        """The largest window size tried: min(ℓ_K, cap_K) − 1 (no search when below 1)."""
        return min(self.size, self.cap) - 1

    def program(self, c: str, edits: Sequence[Edit] | None = None) -> str:
        """C with the reference blocks outside K and the given edits of K (default: all of P_K)."""
        return apply(c, self.others, self.edits if edits is None else edits)

    def windows(self, s: int) -> list[tuple[Edit, ...]]:
        """The contiguous windows of s edits of P_K, in position order."""
        return [self.edits[k:k + s] for k in range(self.size - s + 1)]


@dataclasses.dataclass(frozen=True)
class Analysis:
    """What a valid prediction's score needs besides test runs."""

    reference: tuple[Block, ...]
    predicted: tuple[Block, ...]
    components: tuple[Component, ...]

    @property
    def edited_lines(self) -> int:
        """ℓ = Σ |δ̂| over the predicted blocks."""
        return sum(len(b) for b in self.predicted)


def analyze(buggy: str, solution: str, program: str, epsilon: int) -> Analysis:
    """Diff a program and the reference against C and build the components."""
    reference, predicted = diff(buggy, solution), diff(buggy, program)
    built = []
    for refs, preds in components(reference, predicted):
        cap = sum(len(reference[i]) for i in refs) + epsilon * len(refs)
        edits = edits_of(predicted[j] for j in preds)
        others = edits_of(b for i, b in enumerate(reference) if i not in refs)
        built.append(Component(refs, preds, cap, tuple(edits), tuple(others)))
    return Analysis(tuple(reference), tuple(predicted), tuple(built))


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

    @property
    def vector(self) -> tuple[float, float]:
        """The GDPO reward vector [unit, f1], weighted [1 − λ, λ]; f1 counts 0 on clean tasks."""
        return float(self.unit), self.f1 or 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def score_of(task: Task, valid: bool, unit: int, analysis: Analysis | None, verdicts: Sequence[bool],
             essentials: Sequence[int | None], runs: int, lam: float = DEFAULT_LAMBDA) -> Score:
    """Assemble the score of one prediction from its analysis and test verdicts.

    Args:
        verdicts: per component of `analysis`, whether it was verified.
        essentials: per component, |ess_K| for a verified one, else None.
    """
    faults = len(diff(task.buggy_code, task.solution)) if analysis is None else len(analysis.reference)
    ell = analysis.edited_lines if analysis is not None else None
    results = tuple(
        ComponentResult(k.refs, k.preds, ok, ess, k.cap, credit(ok, ess or 0, k.cap))
        for k, ok, ess in zip(analysis.components if analysis else (), verdicts, essentials))
    fixed = sum(len(r.refs) for r in results if r.verified)
    noop = valid and ell == 0
    common = dict(task_id=task.task_id, valid=valid, unit=unit, edited_lines=ell, faults=faults,
                  faults_fixed=fixed, noop=noop, blocks=len(analysis.predicted) if analysis else None,
                  components=results, runs=runs)
    if faults == 0:
        return Score(precision=None, recall=None, f1=None, damage=1 - unit,
                     reward=scalar_reward(unit, None, lam), **common)
    precision, recall, f1 = precision_recall_f1(unit, ell or 0, sum(r.credit for r in results), faults, fixed)
    return Score(precision=precision, recall=recall, f1=f1, damage=None,
                 reward=scalar_reward(unit, f1, lam), **common)


# Test runs --------------------------------------------------------------------


def canonical_job(program: str, tests: Tests, limits: Limits) -> Job:
    """The job that runs a program: spaces, tabs and line ends at its very end are dropped.

    Python ignores them, and an extracted program lacks C's final newline, so
    without this the usual exact fix would run twice (as the answer and as its
    verification program). Other Unicode whitespace is kept: Python rejects
    some of it (U+00A0) as source, and that must still fail.
    """
    return Job(program.rstrip(" \t\r\n"), tests, limits)


class _Runner:
    """`run_batch` behind a memo: each distinct job is sent once per scoring call."""

    def __init__(self, run_batch: RunBatch):
        self._run_batch = run_batch
        self._done: dict[Job, RunResult] = {}

    def __call__(self, jobs: Sequence[Job]) -> list[bool]:
        todo = list(dict.fromkeys(job for job in jobs if job not in self._done))
        if todo:
            results = self._run_batch(todo)
            if len(results) != len(todo):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(todo)} jobs")
            self._done.update(zip(todo, results))
        return [self._done[job].passed for job in jobs]


def program_of(prediction: Prediction) -> str | None:
    """The prediction's program: `code` if given, else the program extracted from `response`."""
    if prediction.code is not None:
        return prediction.code
    return extract_program(prediction.response or "")


def score_predictions(items: Sequence[tuple[Task, Prediction]], run_batch: RunBatch, *,
                      lam: float = DEFAULT_LAMBDA, epsilon: int = DEFAULT_EPSILON,
                      limits: Limits = Limits()) -> list[Score]:
    """Score (task, prediction) pairs, one `run_batch` call per phase.

    Args:
        items: the pairs to score; a task's own `epsilon` and `timeout_s` override the defaults.
        run_batch: runs jobs and returns their results in order (e.g. `Fleet.run`).
        lam: λ of the scalar reward.
        epsilon: default ε of the cap.
        limits: default limits of one test run.
    """
    run = _Runner(run_batch)
    programs = [program_of(pred) for _, pred in items]
    jobs_of: list[set[Job]] = [set() for _ in items]

    def job(n: int, program: str) -> Job:
        task = items[n][0]
        made = canonical_job(program, task.tests, limits_for(task, limits))
        jobs_of[n].add(made)
        return made

    valid = [n for n, program in enumerate(programs) if program is not None]
    analyses: dict[int, Analysis] = {
        n: analyze(items[n][0].buggy_code, items[n][0].solution, programs[n],
                   epsilon if items[n][0].epsilon is None else items[n][0].epsilon)
        for n in valid}

    units = dict(zip(valid, run([job(n, programs[n]) for n in valid])))

    keys = [(n, k) for n in valid for k in range(len(analyses[n].components))]
    comps = {(n, k): analyses[n].components[k] for n, k in keys}
    verified = dict(zip(keys, run([job(n, comps[n, k].program(items[n][0].buggy_code)) for n, k in keys])))

    essential: dict[tuple[int, int], int] = {
        key: comps[key].size for key in keys if verified[key] and comps[key].search_bound < 1}
    searching = [key for key in keys if verified[key] and key not in essential]
    s = 1
    while searching:
        windows = [(key, edits) for key in searching for edits in comps[key].windows(s)]
        passed = run([job(key[0], comps[key].program(items[key[0]][0].buggy_code, edits)) for key, edits in windows])
        hits = {key for (key, _), ok in zip(windows, passed) if ok}
        for key in searching:
            if key in hits:
                essential[key] = s
            elif s == comps[key].search_bound:
                essential[key] = comps[key].size
        searching = [key for key in searching if key not in essential]
        s += 1

    scores = []
    for n, (task, _) in enumerate(items):
        analysis = analyses.get(n)
        ks = range(len(analysis.components)) if analysis else ()
        scores.append(score_of(task, n in analyses, int(units.get(n, False)), analysis,
                               [verified[n, k] for k in ks], [essential.get((n, k)) for k in ks],
                               len(jobs_of[n]), lam))
    return scores


# Baseline rewards -------------------------------------------------------------


def ea_grpo_rewards(units: Sequence[int], edited_lines: Sequence[int | None],
                    alpha: float = EA_ALPHA, beta: float = EA_BETA) -> list[float]:
    """EA-GRPO rewards of one group of rollouts.

    T = 1[mean(u) ≥ α]; μ_c, σ_c = mean and population std of D over passing
    rollouts; P_i = sigmoid((D_i − μ_c)/σ_c), or 1/2 when σ_c = 0;
    R_i = u_i·(1 − T·β·P_i), 0 for failing or invalid rollouts.
    """
    gate = 1.0 if sum(units) / len(units) >= alpha else 0.0
    passing = [d for u, d in zip(units, edited_lines) if u]
    if not passing:
        return [0.0] * len(units)
    mu = sum(passing) / len(passing)
    sigma = math.sqrt(sum((d - mu) ** 2 for d in passing) / len(passing))
    rewards = []
    for u, d in zip(units, edited_lines):
        if not u:
            rewards.append(0.0)
            continue
        penalty = 1 / (1 + math.exp(-(d - mu) / sigma)) if sigma > 0 else 0.5
        rewards.append(1 - gate * beta * penalty)
    return rewards


def clean_row_terms(score: Score, buggy_code: str) -> tuple[float, float]:
    """The unstandardized "GRPO + clean rows" vector [unit, −ℓ]; an invalid rollout's ℓ is C's non-blank line count."""
    ell = score.edited_lines if score.valid else len(nonblank_lines(buggy_code))
    return float(score.unit), -float(ell)


# Aggregates -------------------------------------------------------------------


def invalid_score(task: Task, lam: float = DEFAULT_LAMBDA) -> Score:
    """The score a task without a prediction counts as."""
    return score_of(task, False, 0, None, (), (), 0, lam)


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def aggregate(tasks: Sequence[Task], scores: Sequence[Score], lam: float = DEFAULT_LAMBDA) -> dict[str, Any]:
    """The set's summary: buggy pass / precision / recall / f1 / lines, clean noop / damage.

    Several predictions of a task are averaged per task first; a task without
    one counts as one invalid prediction. Scores for unknown tasks are an error.
    """
    by_task: dict[str, list[Score]] = {t.task_id: [] for t in tasks}
    for s in scores:
        if s.task_id not in by_task:
            raise KeyError(f"score for unknown task {s.task_id!r}")
        by_task[s.task_id].append(s)
    missing = [t.task_id for t in tasks if not by_task[t.task_id]]
    for t in tasks:
        if not by_task[t.task_id]:
            by_task[t.task_id].append(invalid_score(t, lam))

    def per_task(group: Sequence[Task], field: str) -> float | None:
        return _mean(_mean(getattr(s, field) or 0.0 for s in by_task[t.task_id]) for t in group)

    is_buggy = {t.task_id: bool(diff(t.buggy_code, t.solution)) for t in tasks}
    buggy = [t for t in tasks if is_buggy[t.task_id]]
    clean = [t for t in tasks if not is_buggy[t.task_id]]
    lines = [_mean(s.edited_lines for s in by_task[t.task_id] if s.valid) for t in buggy]
    return {
        "tasks": len(tasks), "predictions": len(scores), "missing": len(missing),
        "invalid": sum(not s.valid for s in scores),
        "reward": per_task(tasks, "reward"),
        "buggy": {"tasks": len(buggy), "pass": per_task(buggy, "unit"), "precision": per_task(buggy, "precision"),
                  "recall": per_task(buggy, "recall"), "f1": per_task(buggy, "f1"),
                  "lines": _mean(v for v in lines if v is not None)},
        "clean": {"tasks": len(clean), "noop": per_task(clean, "noop"), "damage": per_task(clean, "damage")},
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The aggregate table: percentages with one decimal, lines with two."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}"

    b, c = summary["buggy"], summary["clean"]
    lines = "-" if b["lines"] is None else f"{b['lines']:.2f}"
    return "\n".join([
        f"{'buggy tasks':>11} {'pass %':>7} {'precision %':>12} {'recall %':>9} {'f1 %':>6} {'lines':>6}",
        f"{b['tasks']:>11} {pct(b['pass']):>7} {pct(b['precision']):>12} {pct(b['recall']):>9} {pct(b['f1']):>6} {lines:>6}",
        f"{'clean tasks':>11} {'noop %':>7} {'damage %':>12}",
        f"{c['tasks']:>11} {pct(c['noop']):>7} {pct(c['damage']):>12}",
        f"predictions {summary['predictions']}, invalid {summary['invalid']}, "
        f"tasks without a prediction {summary['missing']} (counted invalid), mean reward {pct(summary['reward'])} %",
    ])
