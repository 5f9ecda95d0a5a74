"""The paper's columns over a task set, each with a bootstrap 95% interval.

Per task the scores of its samples are averaged first and a task without a
prediction counts as one invalid prediction (docs/reward.md, "Aggregates over a task set"), so the
point values equal `reward.score.aggregate`. Buggy tasks give pass, precision,
recall and F1 (invalid = 0) and lines (the mean ℓ over valid predictions, over
the tasks that have one); clean tasks give no-op and damage.

The interval is the percentile bootstrap over tasks: B resamples of the n tasks
with replacement, the column's mean in each, and the (1 − level)/2 and
(1 + level)/2 quantiles of those means (NumPy's linear interpolation). `lines`
averages over the resampled tasks that have a value; a resample with none is
dropped. The resampling seed is fixed, so a report is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from reward.schema import Task
from reward.score import Score, verifiable_by_task

BUGGY_COLUMNS = ("pass", "precision", "recall", "f1", "lines")
CLEAN_COLUMNS = ("noop", "damage")
RESAMPLES = 1000
LEVEL = 0.95


def bootstrap_ci(values: np.ndarray, resamples: int = RESAMPLES, level: float = LEVEL,
                 seed: int = 0) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of the mean of `values` (NaN = no value, skipped); None when empty.

    Args:
        values: one value per task, shape [n].
        resamples: B, the number of bootstrap resamples.
        level: the interval's coverage (0.95 for a 95% interval).
        seed: the resampling seed.
    """
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[0]
    if n == 0 or np.all(np.isnan(values)):
        return None
    idx_BxN = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    drawn_BxN = values[idx_BxN]
    present_BxN = ~np.isnan(drawn_BxN)
    counts_B = present_BxN.sum(axis=1)
    keep_B = counts_B > 0
    means_B = np.where(present_BxN, drawn_BxN, 0.0).sum(axis=1)[keep_B] / counts_B[keep_B]
    lo, hi = np.quantile(means_B, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def per_task_values(tasks: Sequence[Task], scores: Sequence[Score], lam: float) -> dict[str, dict[str, float]]:
    """task_id -> column -> the task's value (samples averaged; NaN where a column has none).

    A task without a score counts as one invalid prediction; `lines` is the mean ℓ
    of its valid predictions (NaN when none is valid). Unverifiable predictions are
    left out; a task with nothing else has NaN in every column (left out of the means).
    """
    by_task = verifiable_by_task(tasks, scores, lam)
    out = {}
    for t in tasks:
        group = by_task[t.task_id]
        mean = lambda field: float(np.mean([getattr(s, field) or 0.0 for s in group])) if group else float("nan")  # noqa: E731
        valid = [s.edited_lines for s in group if s.valid]
        out[t.task_id] = {
            "pass": mean("unit"), "precision": mean("precision"), "recall": mean("recall"), "f1": mean("f1"),
            "lines": float(np.mean(valid)) if valid else float("nan"),
            "noop": mean("noop"), "damage": mean("damage"),
        }
    return out


def columns(tasks: Sequence[Task], values: dict[str, dict[str, float]], *, clean: bool,
            resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> dict[str, Any]:
    """{"tasks": n, column: {"value", "ci": [lo, hi]}} of buggy or clean columns over `tasks`."""
    out: dict[str, Any] = {"tasks": len(tasks)}
    for name in CLEAN_COLUMNS if clean else BUGGY_COLUMNS:
        v = np.array([values[t.task_id][name] for t in tasks], dtype=np.float64)
        present = v[~np.isnan(v)]
        ci = bootstrap_ci(v, resamples, level, seed)
        out[name] = {"value": float(present.mean()) if present.size else None,
                     "ci": None if ci is None else list(ci)}
    return out
