"""The paper's comparison figures as PNG, drawn from runs' summaries.

- Figure 12: edit precision against pass rate, one point per run with its 95%
  intervals as error bars (upper right is better: passing and precise).
- Figure 14: damage against no-op rate on clean (GT Debug) tasks, one point per
  run, the runs of one model under different prompts joined by an arrow
  (minimal → abstain), so the effect of allowing abstention shows as a move.
- Figure 9: the λ sweep, pass rate, edit precision and F1 of grouped runs against λ,
  each a mean over seeds with ± one std as error bars.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxrl.eval.report import run_label  # noqa: E402

MARKERS = {"minimal": "o", "abstain": "s", "refine": "^"}


def _point(column: Mapping[str, Any], name: str) -> tuple[float, list[float]]:
    """(value %, [below, above] error-bar lengths %) of one column."""
    value, ci = 100 * column[name]["value"], column[name]["ci"]
    if ci is None:
        return value, [0.0, 0.0]
    return value, [max(0.0, value - 100 * ci[0]), max(0.0, 100 * ci[1] - value)]


def precision_vs_pass(summaries: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> bool:
    """Figure 12 for the runs with buggy tasks; False (nothing drawn) when none has any."""
    runs = [s for s in summaries if s["buggy"]["tasks"] and s["buggy"]["pass"]["value"] is not None]
    if not runs:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    for s in runs:
        x, xerr = _point(s["buggy"], "pass")
        y, yerr = _point(s["buggy"], "precision")
        ax.errorbar([x], [y], xerr=[[xerr[0]], [xerr[1]]], yerr=[[yerr[0]], [yerr[1]]],
                    fmt=MARKERS.get(s["settings"]["prompt"], "o"), capsize=3, label=run_label(s))
        ax.annotate(run_label(s), (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    _finish(fig, ax, path, "pass rate (%)", "edit precision (%)", "Precision vs. pass rate (buggy tasks, 95% CI)")
    return True


def noop_vs_damage(summaries: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> bool:
    """Figure 14 for the runs with clean tasks; False (nothing drawn) when none has any."""
    runs = [s for s in summaries if s["clean"]["tasks"] and s["clean"]["noop"]["value"] is not None]
    if not runs:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    by_model: dict[str, list[Mapping[str, Any]]] = {}
    for s in runs:
        by_model.setdefault(s["model"].get("name") or "model", []).append(s)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, group) in enumerate(by_model.items()):
        color = colors[i % len(colors)]
        points = {}
        for s in group:
            x, xerr = _point(s["clean"], "noop")
            y, yerr = _point(s["clean"], "damage")
            prompt = s["settings"]["prompt"]
            points.setdefault(prompt, (x, y))
            ax.errorbar([x], [y], xerr=[[xerr[0]], [xerr[1]]], yerr=[[yerr[0]], [yerr[1]]], color=color,
                        fmt=MARKERS.get(prompt, "o"), capsize=3, label=f"{name} ({prompt})")
        if "minimal" in points and "abstain" in points:
            ax.annotate("", xy=points["abstain"], xytext=points["minimal"],
                        arrowprops={"arrowstyle": "->", "color": color, "alpha": 0.7})
    _finish(fig, ax, path, "no-op rate (%)", "damage (%)",
            "Clean tasks: no-op vs. damage, minimal → abstain prompt (95% CI)")
    return True


def lambda_sweep(points: Sequence[tuple[float, Mapping[str, Any]]], path: str | os.PathLike) -> bool:
    """Figure 9 from (λ, group stats of `jaxrl.eval.groups`) points; False when fewer than two have a pass rate."""
    points = [(x, g) for x, g in points if g["columns"]["pass"][0] is not None]
    if len(points) < 2:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    xs = [x for x, _ in points]
    for column, label in (("pass", "pass rate"), ("precision", "edit precision"), ("f1", "F1")):
        means = [100 * (g["columns"][column][0] if g["columns"][column][0] is not None else float("nan"))
                 for _, g in points]
        stds = [100 * (g["columns"][column][1] or 0.0) for _, g in points]
        ax.errorbar(xs, means, yerr=stds, fmt="-o", capsize=3, label=label)
    _finish(fig, ax, path, "λ (weight of the F1 term)", "%", "λ sweep (mean ± std over seeds)")
    return True


def _finish(fig, ax, path: str | os.PathLike, xlabel: str, ylabel: str, title: str) -> None:
    """Label, grid and legend a figure, write it as PNG and release it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
