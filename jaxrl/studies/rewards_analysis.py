"""The reward analyses of the paper (Fig 2, appendix A.2, Fig 3) over a score table.

A score table is `precisecoder score`'s or `precisecoder eval`'s scores.jsonl with
several samples per task. Samples of one task, in file order, form groups of
`group_size` (default: all samples of the task are one group); a task's last,
incomplete group is left out of the group statistics (and counted).

- Fig 2: Pearson correlations between −lines, unit, precision, recall and F1 over
  the samples of buggy tasks, pooled and within tasks (each term minus its task's
  mean, so only the variation between samples of one task is left); −lines is
  undefined for an invalid sample, whose pairs with it are left out.
- A.2: per term, the share of groups in which it is constant (so its group-
  standardized advantage is 0); the share of all-pass, all-fail and mixed groups;
  and per advantage estimator, the share of the advantage mass Σ|A| that falls in
  collapsed groups (all-pass or all-fail: unit constant), computed with
  `jaxrl.advantages`' pure estimators on the groups' `[N, G, K]` reward tensor.
- Fig 3: edit precision on buggy tasks against the no-op rate on clean tasks,
  one point per eval run (summary.json), with Pearson's r.

`passing_edited_lines` and `group_composition` are the per-step quantities the
trainer logs (the paper's Fig 1b, and the group composition).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import advantages as adv
from jaxrl.studies import stats

TERMS = ("neg_lines", "unit", "precision", "recall", "f1")
CONSTANT_TERMS = ("unit", "f1", "precision", "recall", "neg_lines", "reward")


def passing_edited_lines(unit_NxG: np.ndarray, lines_NxG: np.ndarray) -> float:
    """Mean edited lines over passing rollouts only (the paper's Fig 1b); NaN when none passes."""
    unit, lines = np.asarray(unit_NxG, float), np.asarray(lines_NxG, float)
    passing = unit > 0
    return float(lines[passing].mean()) if passing.any() else math.nan


def group_composition(unit_per_group: Sequence[Sequence[float]]) -> dict[str, float]:
    """Shares of groups whose rollouts all pass, all fail, or are mixed (rows of a `unit_NxG` array, or
    groups of different sizes); NaNs for no group."""
    passes = [{float(u) > 0 for u in group} for group in unit_per_group]
    n = len(passes)
    if not n:
        return {"all_pass": math.nan, "all_fail": math.nan, "mixed": math.nan}
    return {"all_pass": sum(p == {True} for p in passes) / n, "all_fail": sum(p == {False} for p in passes) / n,
            "mixed": sum(len(p) == 2 for p in passes) / n}


def term_value(score: Mapping[str, Any], term: str) -> float:
    """One term of a score record; NaN where it is undefined (−lines of an invalid sample)."""
    if term == "neg_lines":
        return math.nan if score.get("edited_lines") is None else -float(score["edited_lines"])
    value = score.get(term)
    return math.nan if value is None else float(value)


def groups_of(scores: Sequence[Mapping[str, Any]], group_size: int | None) -> tuple[list[list[Mapping]], int]:
    """(complete groups, samples left out): each task's samples in file order, cut into groups of `group_size`."""
    by_task: dict[str, list[Mapping]] = collections.defaultdict(list)
    for s in scores:
        by_task[s["task_id"]].append(s)
    groups, left = [], 0
    for samples in by_task.values():
        size = group_size or len(samples)
        full = len(samples) // size * size
        groups += [samples[i:i + size] for i in range(0, full, size)]
        left += len(samples) - full
    return groups, left


def correlation_table(scores: Sequence[Mapping[str, Any]], within: bool) -> dict[str, float]:
    """`a~b` -> Pearson's r between two terms over buggy-task samples (pooled, or within tasks)."""
    buggy = [s for s in scores if s.get("f1") is not None]
    values = {t: np.array([term_value(s, t) for s in buggy]) for t in TERMS}
    if within:
        tasks = np.array([s["task_id"] for s in buggy])
        for t, v in values.items():
            for task in set(tasks):
                mine = tasks == task
                v[mine] = v[mine] - np.nanmean(v[mine]) if np.isfinite(v[mine]).any() else v[mine]
    out = {}
    for i, a in enumerate(TERMS):
        for b in TERMS[i + 1:]:
            ok = np.isfinite(values[a]) & np.isfinite(values[b])
            out[f"{a}~{b}"] = stats.pearson(values[a][ok], values[b][ok])
    return out


def constant_shares(groups: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, float]:
    """term -> share of groups in which the term takes one value (an undefined −lines counts as a value)."""
    out = {}
    for term in CONSTANT_TERMS:
        constant = 0
        for g in groups:
            values = {("nan" if math.isnan(v) else v) for v in (term_value(s, term) for s in g)}
            constant += len(values) == 1
        out[term] = constant / len(groups) if groups else math.nan
    return out


def reward_tensor(groups: Sequence[Sequence[Mapping[str, Any]]]) -> np.ndarray:
    """`[N, G, 3]` of (unit, f1, edited lines) per rollout; f1 of a clean task is 0, lines of an invalid
    sample NaN (EA-GRPO ignores lines of failing rollouts)."""
    return np.array([[[float(s["unit"]), float(s.get("f1") or 0.0),
                       math.nan if s.get("edited_lines") is None else float(s["edited_lines"])] for s in g]
                     for g in groups], np.float32)


@jax.jit
def _estimates(rewards_NxGx3: jax.Array, weights_2: jax.Array) -> dict[str, jax.Array]:
    unit_NxG, lines_NxG, scalar_NxG = rewards_NxGx3[..., 0], rewards_NxGx3[..., 2], rewards_NxGx3[..., :2] @ weights_2
    return {"grpo_unit": adv.grpo(unit_NxG), "grpo": adv.grpo(scalar_NxG), "drgrpo": adv.drgrpo(scalar_NxG),
            "rloo": adv.rloo(scalar_NxG), "gdpo": adv.gdpo(rewards_NxGx3[..., :2], weights_2),
            "ea_grpo": adv.grpo(adv.ea_grpo_rewards(unit_NxG, lines_NxG))}


def advantage_mass(rewards_NxGx3: np.ndarray, lam: float = 1 / 3) -> dict[str, float]:
    """estimator -> share of Σ|A| in collapsed groups (unit constant), with `jaxrl.advantages`' pure estimators."""
    collapsed_N = rewards_NxGx3[..., 0].min(axis=1) == rewards_NxGx3[..., 0].max(axis=1)
    out = {}
    for name, a in _estimates(jnp.asarray(rewards_NxGx3), jnp.array([1 - lam, lam], jnp.float32)).items():
        mass_NxG = np.abs(np.asarray(a, np.float64))
        total = mass_NxG.sum()
        out[name] = float(mass_NxG[collapsed_N].sum() / total) if total > 0 else math.nan
    return out


def noop_vs_precision(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Fig 3: per run its name, buggy precision and clean no-op rate, and Pearson's r across runs."""
    points = []
    for s in summaries:
        precision, noop = s["buggy"].get("precision", {}).get("value"), s["clean"].get("noop", {}).get("value")
        if precision is not None and noop is not None:
            points.append({"run": s["model"]["name"], "precision": precision, "noop": noop})
    r = stats.pearson([p["noop"] for p in points], [p["precision"] for p in points])
    return {"runs": points, "r": r}


def analyze_scores(scores: Sequence[Mapping[str, Any]], group_size: int | None = None, lam: float = 1 / 3
                   ) -> dict[str, Any]:
    """Every figure of a score table, as one JSON-able dict (`precisecoder analyze rewards --json`)."""
    groups, left = groups_of(scores, group_size)
    sizes = {len(g) for g in groups}
    out: dict[str, Any] = {
        "samples": len(scores),
        "groups_count": len(groups),
        "left_out": left,
        "constant_share": constant_shares(groups),
        "groups": group_composition([[s["unit"] for s in g] for g in groups]),
        "correlations": correlation_table(scores, within=False),
        "within_task_correlations": correlation_table(scores, within=True),
    }
    if len(sizes) == 1 and next(iter(sizes)) > 1:
        out["advantage_mass_collapsed"] = advantage_mass(reward_tensor(groups), lam)
    else:
        out["advantage_mass_collapsed"] = None
    lines_passing = [s["edited_lines"] for s in scores if s["unit"] and s.get("edited_lines") is not None]
    out["passing_edited_lines"] = float(np.mean(lines_passing)) if lines_passing else math.nan
    return out

