"""The lexical analysis of thinking (the paper's §5.2–5.3, B.5–B.6) over `precisecoder eval` run directories.

`measure_runs` reads each run's predictions.jsonl (the `thinking` of every sample)
and scores.jsonl, and the task set (for `meta.bug_lines`), and gives one row per
sample with a think block: its length, the lexicon rates, MATTR, repetition, whether
it quotes a buggy line and every buggy line, and its outcomes. `analyze` turns the
rows into the tables (per-run means, Spearman correlations with the outcomes, the
OLS of F1 on standardized measures with model fixed effects and task-clustered
standard errors, and between the first run and each other one: Jensen–Shannon
divergence, TF-IDF cosine and the most distinctive bigrams by weighted log-odds).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl.studies import lexical, stats
from reward.diff import diff
from reward.schema import Task

OUTCOMES = ("unit", "precision", "recall", "f1", "edited_lines")
SHAPE = ("tokens", "words", "mattr", "repetition", "quotes_bug", "quotes_all_bugs")


class AnalysisError(ValueError):
    """A run directory or task set that cannot be analyzed (one error line, exit code 2)."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One eval run: its name (from summary.json, else the directory's) and its per-sample records."""

    name: str
    path: Path
    samples: list[dict[str, Any]]
    scores: list[dict[str, Any]]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        raise AnalysisError(f"{path}: {e}") from None


def load_run(directory: str | Path) -> Run:
    """A run directory written by `precisecoder eval` (or `precisecoder transfer`)."""
    path = Path(directory)
    samples, scores = _jsonl(path / "predictions.jsonl"), _jsonl(path / "scores.jsonl")
    if len(samples) != len(scores):
        raise AnalysisError(f"{path}: {len(samples)} predictions but {len(scores)} scores (an unfinished run?)")
    try:
        name = json.loads((path / "summary.json").read_text(encoding="utf-8"))["model"]["name"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        name = path.resolve().name
    return Run(str(name), path, samples, scores)


def bug_lines(task: Task) -> list[int]:
    """The buggy program's lines the reference fix modifies or deletes (`meta.bug_lines` spans, else the diff)."""
    spans = task.meta.get("bug_lines")
    if spans is None:
        spans = [b.span for b in diff(task.buggy_code, task.solution)]
    return [n for a, b in spans for n in range(math.ceil(a), math.floor(b) + 1)]


def measure(thinking: str, task: Task, lexicons: Mapping[str, frozenset], count_tokens: Callable[[str], int] | None
            ) -> dict[str, float]:
    """The measures of one trace on its task."""
    tokens = lexical.words(thinking)
    quoted = lexical.quotes(thinking, task.buggy_code, bug_lines(task))
    row = {"tokens": float(count_tokens(thinking)) if count_tokens else math.nan, "words": float(len(tokens)),
           "mattr": lexical.mattr(tokens), "repetition": lexical.repetition(tokens),
           "quotes_bug": float(any(quoted.values())) if quoted else math.nan,
           "quotes_all_bugs": float(all(quoted.values())) if quoted else math.nan}
    row.update({name: lexical.lexicon_rate(tokens, lex) for name, lex in lexicons.items()})
    return row


def measure_runs(runs: Sequence[Run], tasks: Mapping[str, Task], lexicons: Mapping[str, frozenset],
                 count_tokens: Callable[[str], int] | None = None) -> list[dict[str, Any]]:
    """One row per sample with a non-empty think block: run, model, task, sample, measures, outcomes."""
    rows = []
    for run in runs:
        for sample, score in zip(run.samples, run.scores):
            thinking = sample.get("thinking")
            if not thinking or not thinking.strip():
                continue
            task = tasks.get(sample["task_id"])
            if task is None:
                raise AnalysisError(f"{run.path}: task {sample['task_id']!r} is not in the task set")
            row = {"run": run.name, "task_id": task.task_id, "sample": sample.get("sample", 0),
                   "clean": task.is_clean, "budget_hit": float(bool(sample.get("budget_hit")))}
            row.update(measure(thinking, task, lexicons, count_tokens))
            row.update({k: math.nan if score.get(k) is None else float(score[k]) for k in OUTCOMES})
            rows.append(row)
    return rows


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def run_means(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> dict[str, dict[str, float]]:
    """run -> column -> mean over its rows (NaNs left out)."""
    out: dict[str, dict[str, float]] = {}
    for run in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == run]
        out[run] = {c: (float(np.mean(v)) if (v := _finite([r[c] for r in mine])) else math.nan) for c in columns}
        out[run]["traces"] = float(len(mine))
    return out


def correlations(rows: Sequence[Mapping[str, Any]], measures: Sequence[str], outcomes: Sequence[str]
                 ) -> dict[str, dict[str, tuple[float, float, int]]]:
    """measure -> outcome -> (Spearman ρ, p, n) over the rows where both are defined."""
    out: dict[str, dict[str, tuple[float, float, int]]] = {}
    for m in measures:
        out[m] = {}
        for o in outcomes:
            pairs = [(r[m], r[o]) for r in rows if not (math.isnan(r[m]) or math.isnan(r[o]))]
            rho, p = stats.spearman([a for a, _ in pairs], [b for _, b in pairs]) if pairs else (math.nan, math.nan)
            out[m][o] = (rho, p, len(pairs))
    return out


def regression(rows: Sequence[Mapping[str, Any]], measures: Sequence[str], outcome: str = "f1"
               ) -> tuple[stats.OLSResult, list[str]]:
    """OLS of `outcome` on the standardized measures with run fixed effects, standard errors clustered by
    task; measures constant over the rows are dropped (returned second)."""
    rows = [r for r in rows if not any(math.isnan(r[c]) for c in (*measures, outcome))]
    if not rows:
        raise AnalysisError(f"no trace has every measure and {outcome} (buggy tasks only)")
    if np.ptp([r[outcome] for r in rows]) == 0:
        raise AnalysisError(f"{outcome} is {rows[0][outcome]:g} on every trace: nothing to explain")
    kept = [m for m in measures if np.ptp([r[m] for r in rows]) > 0]
    x, names = stats.design({m: stats.standardize([r[m] for r in rows]) for m in kept},
                            [r["run"] for r in rows] if len({r["run"] for r in rows}) > 1 else None)
    fit = stats.ols_clustered([r[outcome] for r in rows], x, [r["task_id"] for r in rows], names)
    return fit, [m for m in measures if m not in kept]


@dataclasses.dataclass(frozen=True)
class Contrast:
    """How the thinking of run `b` differs from run `a` in words."""

    a: str
    b: str
    js_bits: float
    tfidf_cosine: float
    paired_tasks: int
    top_a: list[tuple[str, float]]
    top_b: list[tuple[str, float]]


def contrast(a: Run, b: Run, top: int = 15) -> Contrast:
    """JS divergence of the word distributions, mean TF-IDF cosine of the two runs' traces of the same task
    (first sample each; idf over all those traces), and the bigrams with the largest log-odds z each way
    (only those with z > 0 for a and z < 0 for b, so a side may list fewer than `top`)."""
    def traces(run: Run) -> dict[str, list[str]]:
        out = {}
        for s in run.samples:
            if s.get("thinking") and s["task_id"] not in out:
                out[s["task_id"]] = lexical.words(s["thinking"])
        return out

    ta, tb = traces(a), traces(b)
    words_a = collections.Counter(w for doc in ta.values() for w in doc)
    words_b = collections.Counter(w for doc in tb.values() for w in doc)
    shared = [t for t in ta if t in tb]
    vectors = lexical.tfidf_vectors([ta[t] for t in shared] + [tb[t] for t in shared])
    cosines = _finite([lexical.cosine(vectors[i], vectors[len(shared) + i]) for i in range(len(shared))])
    bigrams_a = collections.Counter(" ".join(g) for doc in ta.values() for g in lexical.ngrams(doc, 2))
    bigrams_b = collections.Counter(" ".join(g) for doc in tb.values() for g in lexical.ngrams(doc, 2))
    z = lexical.log_odds(bigrams_a, bigrams_b) if bigrams_a and bigrams_b else {}
    typical_a = sorted(((w, v) for w, v in z.items() if v > 0), key=lambda kv: (-kv[1], kv[0]))
    typical_b = sorted(((w, -v) for w, v in z.items() if v < 0), key=lambda kv: (-kv[1], kv[0]))
    return Contrast(a.name, b.name, lexical.jensen_shannon(words_a, words_b),
                    float(np.mean(cosines)) if cosines else math.nan, len(shared), typical_a[:top], typical_b[:top])
