"""What `precisecoder analyze thinking` writes: tables.md, measures.csv and the PNG figures."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxrl.studies import figures, stats
from jaxrl.studies.thinking import Contrast


def _num(x: float, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def write_measures_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """One line per trace, every measure and outcome (NaN as an empty cell)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()})


def tables_markdown(means: Mapping[str, Mapping[str, float]], columns: Sequence[str],
                    correlations: Mapping[str, Mapping[str, tuple[float, float, int]]],
                    fit: stats.OLSResult | None, dropped: Sequence[str], fit_error: str | None,
                    contrasts: Sequence[Contrast]) -> str:
    """The per-run means, the Spearman table, the OLS and the pairwise contrasts as Markdown."""
    runs = list(means)
    out = ["# Thinking traces", "", "## Per run (means over traces)", "",
           "| measure | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    for c in ("traces", *columns):
        out.append(f"| {c} | " + " | ".join(_num(means[r][c], 0 if c == "traces" else 3) for r in runs) + " |")
    outcomes = list(next(iter(correlations.values()))) if correlations else []
    out += ["", "Lexicon rates are matches per 1,000 prose words; quotes_* are shares of traces.", "",
            "## Spearman correlations with the outcomes (all runs pooled, buggy tasks)", "",
            "| measure | " + " | ".join(f"ρ {o}" for o in outcomes) + " | n |", "|---|" + "---|" * (len(outcomes) + 1)]
    for m, by in correlations.items():
        n = max((x[2] for x in by.values()), default=0)
        cells = [f"{_num(rho)}{'*' if not math.isnan(p) and p < 0.05 else ''}" for rho, p, _ in by.values()]
        out.append(f"| {m} | " + " | ".join(cells) + f" | {n} |")
    out += ["", "`*`: p < 0.05 (two-sided).", "", "## OLS of F1 on the standardized measures", ""]
    if fit is None:
        out.append(f"Not fitted: {fit_error}")
    else:
        out += ["Model (run) fixed effects; standard errors clustered by task (CR1).", "",
                "| regressor | coef | SE | z | p |", "|---|---|---|---|---|"]
        out += [f"| {n} | {_num(c, 4)} | {_num(s, 4)} | {_num(z)} | {_num(p, 3)} |"
                for n, c, s, z, p in zip(fit.names, fit.coef, fit.se, fit.z, fit.p)]
        out += ["", f"n = {fit.n} traces, {fit.clusters} task clusters, R² = {_num(fit.r2, 3)}."]
        if dropped:
            out.append(f"Dropped (constant over the traces): {', '.join(dropped)}.")
    for c in contrasts:
        out += ["", f"## {c.b} against {c.a}", "",
                f"Jensen–Shannon divergence of the word distributions: {_num(c.js_bits, 4)} bits; "
                f"mean TF-IDF cosine of the two runs' traces of the same task: {_num(c.tfidf_cosine, 3)} "
                f"({c.paired_tasks} tasks).", "",
                f"| bigrams typical of {c.a} | z | bigrams typical of {c.b} | z |", "|---|---|---|---|"]
        for i in range(max(len(c.top_a), len(c.top_b))):
            left = c.top_a[i] if i < len(c.top_a) else ("", math.nan)
            right = c.top_b[i] if i < len(c.top_b) else ("", math.nan)
            out.append(f"| {left[0]} | {_num(left[1])} | {right[0]} | {_num(right[1])} |")
    return "\n".join(out) + "\n"


def plot_rates(means: Mapping[str, Mapping[str, float]], lexicons: Sequence[str], path: Path) -> None:
    """Grouped bars: each lexicon's rate per 1,000 prose words, one bar per run."""
    runs = list(means)
    width = 0.8 / max(len(runs), 1)
    fig, ax = figures.new_figure(max(6, 0.7 * len(lexicons)), 4)
    for i, run in enumerate(runs):
        xs = [j + i * width for j in range(len(lexicons))]
        ax.bar(xs, [0 if math.isnan(means[run][lex]) else means[run][lex] for lex in lexicons], width, label=run)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(lexicons))], lexicons, rotation=45, ha="right")
    figures.save(fig, ax, path, None, "matches per 1,000 prose words")


def plot_length_vs_f1(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Scatter of trace length (prose words) against F1, one colour per run."""
    fig, ax = figures.new_figure(5, 4)
    for run in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == run and not math.isnan(r["f1"])]
        ax.scatter([r["words"] for r in mine], [r["f1"] for r in mine], s=12, alpha=0.6, label=run)
    figures.save(fig, ax, path, "prose words in the think block", "F1")
