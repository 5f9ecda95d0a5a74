"""Runs grouped by name (a method's seeds): mean ± std per column, best and second marked, as Table 2.

`eval compare --group NAME=DIR,DIR...` gives each group the summaries of its run
directories. A group's value in a column is the mean over its runs of each run's point
value (`summary.json`), with the sample standard deviation (n − 1) over runs; a group
of one run has no std. Per column the best group is **bold** and the second
<u>underlined</u>, the paper's marks: higher is better except for `lines` and `damage`.
Marks compare the values as shown (one decimal for shares in %, two for lines), so
groups that print the same value share a mark; the second is the next value shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

# (summary section, column, header, higher is better)
COLUMNS = (("buggy", "pass", "pass %", True), ("buggy", "precision", "precision %", True),
           ("buggy", "recall", "recall %", True), ("buggy", "f1", "F1 %", True),
           ("buggy", "lines", "lines", False), ("clean", "noop", "no-op %", True),
           ("clean", "damage", "damage %", False))


def parse_group(text: str) -> tuple[str, list[str]]:
    """`NAME=DIR,DIR...` -> (NAME, [DIR, ...]); ValueError with the reason."""
    name, sep, dirs = text.rpartition("=")
    paths = [d for d in dirs.split(",") if d]
    if not sep or not name or not paths:
        raise ValueError(f"--group {text!r}: expected NAME=DIR[,DIR...]")
    return name, paths


def parse_sweep(text: str) -> tuple[str, float]:
    """`NAME=X` (X a number or a fraction such as 1/6) -> (NAME, X); ValueError with the reason."""
    name, sep, value = text.rpartition("=")
    try:
        x = float(Fraction(value.strip()))
    except (ValueError, ZeroDivisionError):
        x = None
    if not sep or not name or x is None:
        raise ValueError(f"--sweep {text!r}: expected NAME=X with X a number or a fraction like 1/6")
    return name, x


def run_value(summary: Mapping[str, Any], section: str, column: str) -> float | None:
    """One run's point value of a column (None when the run has no such tasks or value)."""
    part = summary[section]
    if not part["tasks"] or part.get(column) is None:
        return None
    return part[column]["value"]


def mean_std(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """(mean, sample std or None for one value, n) of the values present."""
    present = np.asarray([v for v in values if v is not None], np.float64)
    if present.size == 0:
        return None, None, 0
    std = float(present.std(ddof=1)) if present.size > 1 else None
    return float(present.mean()), std, int(present.size)


def shown(value: float, column: str) -> str:
    """A value as the table prints it: lines with two decimals, shares in % with one."""
    return f"{value:.2f}" if column == "lines" else f"{100 * value:.1f}"


def group_stats(groups: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> list[dict[str, Any]]:
    """Per group: its name, runs and {column: (mean, std, n)}."""
    return [{"name": name, "runs": len(runs),
             "columns": {col: mean_std([run_value(s, sec, col) for s in runs]) for sec, col, _, _ in COLUMNS}}
            for name, runs in groups]


def marks(stats: Sequence[Mapping[str, Any]]) -> dict[tuple[int, str], str]:
    """(group index, column) -> "best" or "second", comparing the values as shown (two groups at least)."""
    out = {}
    for _, col, _, higher in COLUMNS:
        values = {i: float(shown(g["columns"][col][0], col)) for i, g in enumerate(stats)
                  if g["columns"][col][0] is not None}
        if len(values) < 2:
            continue
        ranked = sorted(set(values.values()), reverse=higher)
        for i, v in values.items():
            if v == ranked[0]:
                out[i, col] = "best"
            elif len(ranked) > 1 and v == ranked[1]:
                out[i, col] = "second"
    return out


def _cell(mean: float | None, std: float | None, column: str, mark: str | None) -> str:
    if mean is None:
        return "–"
    text = shown(mean, column)
    if std is not None:
        text += " ± " + shown(std, column)
    return {"best": f"**{text}**", "second": f"<u>{text}</u>"}.get(mark, text)


def grouped_markdown(stats: Sequence[Mapping[str, Any]]) -> str:
    """compare.md of grouped runs: a row per group, mean ± std over its runs, the marks."""
    marked = marks(stats)
    header = ["method", "runs", *(h for _, _, h, _ in COLUMNS)]
    rows = [[g["name"], str(g["runs"]), *(_cell(*g["columns"][col][:2], col, marked.get((i, col)))
                                         for _, col, _, _ in COLUMNS)] for i, g in enumerate(stats)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(["# Comparison by method", "",
                      "Mean ± sample std over each method's runs (seeds); **best** and <u>second</u> per column "
                      "(fewer lines and less damage are better).", "", *lines, ""])


def sweep_points(stats: Sequence[Mapping[str, Any]], sweep: Mapping[str, float]
                 ) -> list[tuple[float, Mapping[str, Any]]]:
    """(x, group stats) of the swept groups, by x."""
    by_name = {g["name"]: g for g in stats}
    return sorted(((x, by_name[name]) for name, x in sweep.items()), key=lambda p: p[0])
