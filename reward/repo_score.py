"""Scores of repository tasks (docs/reward.md, "Repository tasks"): the single-file reward over a source tree.

Every path that the prediction or the reference changes is diffed on its own (C of a path outside
`buggy_files` is the tree's version, of a new file empty), with `reward.diff` and the alignment of
`reward.score`, so blocks never cross files and a component lies in one path. Blocks are numbered in
path order (paths sorted), then C order; ℓ, m, the caps and the credits are counted over all files,
and precision, recall, F1 and reward are `reward.score`'s. A component's verification program is
the tree with every reference block outside R_K applied (in whichever files it lies) and the edits of
P_K; its windows are contiguous runs of P_K's edits; the window search is `reward.score.WindowSearch`
in the spec's order, bounded by `max_window_runs`.

The scorer runs no test itself: `verify(files)` says whether the tree with `files` in place (paths
not given keep the tree's version) passes the task's tests: True, False, or None when the harness
cannot decide (then the prediction is `unverifiable`, as for single-file tasks). In production
`repo_verifier` builds it on `reward.repo_run.run_repo_task`; tests pass a pure-Python one. Every
verification program holds all of `buggy_files`' paths (the tree has the clean version there), the
unit run the buggy files with the prediction's files over them. Identical file sets are verified once
per prediction (texts compared after dropping the whitespace Python ignores at their end).

Choices the spec leaves open:
- `edited_files` counts the paths where the prediction has at least one block (a path rewritten with
  only blank-line or trailing-whitespace changes is not edited, as such a prediction is a no-op).
- An invalid prediction's score row carries its reason in `reason` (its status stays `scored`).
"""

from __future__ import annotations

import dataclasses
import os
import tarfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reward.diff import Block, Edit, apply, diff, edits_of, normalize_newlines
from reward.repo_extract import RepoPrediction, TreeText, prediction_files
from reward.repo_task import RepoTask
from reward.score import (DEFAULT_EPSILON, DEFAULT_LAMBDA, DEFAULT_MAX_WINDOW_RUNS, Analysis, Component, Score,
                          WindowSearch, build_components, score_of, unverifiable_score)

Verify = Callable[[Mapping[str, str]], "bool | None"]
UNVERIFIABLE_REASON = "the harness could not decide a test run of the tree"


@dataclasses.dataclass(frozen=True)
class RepoAnalysis:
    """A prediction's blocks and components over the tree.

    Attributes:
        analysis: the blocks of all paths (paths sorted, then C order) and the components, with block
            indices into those tuples, as `reward.score.score_of` reads them.
        bases: C of every path diffed.
        buggy: the paths of `buggy_files`, which every verification program writes.
        reference: path → all edits of its reference fix (what a verification program applies outside K).
        paths: per component, the path it lies in.
        edited_files: the paths where the prediction has a block.
    """

    analysis: Analysis
    bases: dict[str, str]
    buggy: tuple[str, ...]
    reference: dict[str, tuple[Edit, ...]]
    paths: tuple[str, ...]
    edited_files: int

    def program(self, k: int, edits: Sequence[Edit] | None = None) -> dict[str, str]:
        """The files of component k's verification program (or of a window, given its edits): every buggy
        path with the reference fix outside K, K's path with the edits of P_K (or the window) instead."""
        component: Component = self.analysis.components[k]
        files = {path: apply(self.bases[path], self.reference[path]) for path in self.buggy}
        files[self.paths[k]] = component.program(self.bases[self.paths[k]], edits)
        return files


def analyze_repo(task: RepoTask, files: Mapping[str, str], tree_text: TreeText, epsilon: int) -> RepoAnalysis:
    """Diff every changed path of a prediction (`files`: path → its new text) and of the reference."""
    paths = sorted(set(task.buggy_files) | set(files))
    bases = {p: task.buggy_files[p] if p in task.buggy_files else tree_text(p) or "" for p in paths}
    reference: list[Block] = []
    predicted: list[Block] = []
    comps: list[Component] = []
    comp_paths: list[str] = []
    ref_edits: dict[str, tuple[Edit, ...]] = {}
    edited = 0
    for path in paths:
        c = bases[path]
        ref = diff(c, task.solution_files.get(path, c))
        pred = diff(c, files.get(path, c))
        ref_edits[path] = tuple(edits_of(ref))
        edited += bool(pred)
        for comp in build_components(ref, pred, epsilon):
            comps.append(dataclasses.replace(comp, refs=tuple(i + len(reference) for i in comp.refs),
                                             preds=tuple(j + len(predicted) for j in comp.preds)))
            comp_paths.append(path)
        reference += ref
        predicted += pred
    analysis = Analysis(tuple(reference), tuple(predicted), tuple(comps))
    return RepoAnalysis(analysis, bases, tuple(sorted(task.buggy_files)), ref_edits, tuple(comp_paths), edited)


def _key(files: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A file set as the tests see it: whitespace Python ignores at a text's very end dropped."""
    return tuple(sorted((path, normalize_newlines(text).rstrip(" \t\n")) for path, text in files.items()))


class _Memo:
    """`verify` behind a memo for one prediction: `runs` counts the distinct file sets it was asked about."""

    def __init__(self, verify: Verify):
        self._verify = verify
        self._done: dict[tuple, bool | None] = {}

    def __call__(self, files: Mapping[str, str]) -> bool | None:
        key = _key(files)
        if key not in self._done:
            self._done[key] = self._verify({path: text + "\n" for path, text in key})
        return self._done[key]

    @property
    def runs(self) -> int:
        return len(self._done)


def score_repo_prediction(task: RepoTask, prediction: RepoPrediction, verify: Verify, tree_text: TreeText, *,
                          lam: float = DEFAULT_LAMBDA, epsilon: int = DEFAULT_EPSILON,
                          max_window_runs: int = DEFAULT_MAX_WINDOW_RUNS, think_opened: bool = False) -> Score:
    """Score one prediction of a repository task; its row carries `edited_files`.

    Args:
        verify: whether the tree with the given files in place passes the task's tests (None: undecided).
        tree_text: the clean tree's text of a path, None when it has none.
        epsilon: the default ε, for a task without its own.
        think_opened: the default for predictions whose `think_opened` is unset.
    """
    if max_window_runs < 0:
        raise ValueError(f"max_window_runs must be >= 0, got {max_window_runs}")
    files, reason = prediction_files(prediction, task, tree_text, think_opened)
    if files is None:
        return dataclasses.replace(score_of(task, False, 0, None, (), (), 0, lam), reason=reason)
    eps = epsilon if task.epsilon is None else task.epsilon
    repo = analyze_repo(task, files, tree_text, eps)
    comps = repo.analysis.components
    run = _Memo(verify)

    def unverifiable() -> Score:
        return dataclasses.replace(unverifiable_score(task, True, repo.analysis, run.runs, UNVERIFIABLE_REASON),
                                   edited_files=repo.edited_files)

    unit = run({**task.buggy_files, **files})
    verdicts = [run(repo.program(k)) for k in range(len(comps))]
    if unit is None or None in verdicts:
        return unverifiable()
    search = WindowSearch([(k, comps[k]) for k in range(len(comps)) if verdicts[k]], max_window_runs)
    while not search.done:
        passed = [run(repo.program(k, edits)) for k, _, edits in search.take(1)]
        if None in passed:
            return unverifiable()
        search.record(passed)
    essentials = [search.essential.get(k) for k in range(len(comps))]
    score = score_of(task, True, int(unit), repo.analysis, verdicts, essentials, run.runs, lam, capped=search.capped)
    return dataclasses.replace(score, edited_files=repo.edited_files)


# Wiring to the sandbox (reward.repo_run) -------------------------------------


def repo_verifier(task: RepoTask, task_dir: str | os.PathLike, **limits: Any) -> Verify:
    """`verify` for one task on the sandbox's pytest runner: `reward.repo_run.run_repo_task` with the
    task's node ids; status `pass` is True, `fail` and `timeout` False, `error` (the harness could not
    decide) None. `limits` go to `run_repo_task` (timeout_s, memory_mb, sandbox_env, loopback)."""
    from reward.repo_run import run_repo_task  # the runner's module; imported only when tests run

    verdicts = {"pass": True, "fail": False, "timeout": False}

    def verify(files: Mapping[str, str]) -> bool | None:
        return verdicts.get(run_repo_task(task, dict(files), task_dir, **limits).status)

    return verify


def tree_reader(task: RepoTask, task_dir: str | os.PathLike) -> TreeText:
    """`tree_text` for a task: a path's text in the clean tree at `task.repo.archive` (relative to the
    task file's folder), a directory or a `.tar.gz`; a tar whose members all lie under one top folder
    (a source distribution's `name-version/`) is read from inside it."""
    archive = os.path.join(task_dir, task.repo.archive)
    if os.path.isdir(archive):
        def read_dir(path: str) -> str | None:
            full = os.path.join(archive, path)
            if not os.path.isfile(full):
                return None
            with open(full, encoding="utf-8", errors="surrogateescape") as f:
                return f.read()
        return read_dir
    with tarfile.open(archive) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}
        tops = {name.split("/", 1)[0] for name in members}
        prefix = f"{tops.pop()}/" if len(tops) == 1 and all("/" in n for n in members) else ""
        texts = {name[len(prefix):]: tar.extractfile(m).read().decode("utf-8", "surrogateescape")
                 for name, m in members.items() if name.endswith(".py")}
    return texts.get
