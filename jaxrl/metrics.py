"""What a run records: per-stage times, rollout and reward statistics, JSONL + TensorBoard, plots.

Metrics of a step are gathered in one dict and written once (`MetricsWriter.write`):
one line of `metrics.jsonl` and one TensorBoard scalar per key. `plot_curves`
draws the training curves of the paper's Figure 1b from `metrics.jsonl`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Per-rollout columns gathered over hosts (`rollout_columns`), one float each.
COLUMNS = ("unit", "f1", "precision", "recall", "edited_lines", "valid", "noop", "buggy", "reward",
           "response_tokens", "thinking_tokens", "budget_hit", "truncated", "unverifiable")


class StageTimer:
    """Wall-clock seconds per named stage of one step."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        """Seconds measured elsewhere, reported like a stage's (e.g. work that overlapped a stage)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def metrics(self) -> dict[str, float]:
        """`time/<stage>` seconds, `share/<stage>` of the step, and `time/step`."""
        total = time.perf_counter() - self._start
        out = {f"time/{k}": v for k, v in self.seconds.items()}
        out |= {f"share/{k}": v / total for k, v in self.seconds.items()}
        out["time/step"] = total
        return out


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


def rollout_columns(scores: Sequence[Any], completions: Sequence[Any], is_buggy: Sequence[bool],
                    think_end_id: int) -> np.ndarray:
    """`[R, len(COLUMNS)]` float rows, one per rollout (NaN where a value does not apply)."""
    rows = []
    for s, c, buggy in zip(scores, completions, is_buggy):
        ids = list(c.token_ids)
        thinking = ids.index(think_end_id) + 1 if think_end_id in ids else len(ids)
        rows.append([s.unit, s.f1 or 0.0, _nan(s.precision), _nan(s.recall), _nan(s.edited_lines),
                     float(s.valid), float(s.noop), float(buggy), s.reward, len(ids), thinking,
                     float(c.budget_hit), float(c.finish_reason == "length"), float(s.status == "unverifiable")])
    return np.asarray(rows, np.float64).reshape(len(rows), len(COLUMNS))


def _mean(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


def group_composition(unit_NxG: np.ndarray) -> dict[str, float]:
    """Shares of groups whose rollouts all pass, all fail, or both (only mixed groups carry a unit signal)."""
    passing = unit_NxG > 0
    all_pass, all_fail = passing.all(axis=1), ~passing.any(axis=1)
    return {"groups/all_pass": float(all_pass.mean()), "groups/all_fail": float(all_fail.mean()),
            "groups/mixed": float((~all_pass & ~all_fail).mean())}


def rollout_metrics(columns: np.ndarray, rewards_RxK: np.ndarray, term_names: Sequence[str],
                    group_size: int) -> dict[str, float]:
    """Step statistics over all rollouts of all hosts (rows in group order, `group_size` per group).

    `rollout/*` leave out the unverifiable rollouts (`reward/unverifiable` counts them); the group
    composition and `reward/<term>` are over every rollout, as the advantages saw them.
    """
    unverifiable = columns[:, COLUMNS.index("unverifiable")]
    groups = group_composition(columns[:, COLUMNS.index("unit")].reshape(-1, group_size))
    c = {name: columns[unverifiable == 0, i] for i, name in enumerate(COLUMNS)}
    buggy = c["buggy"] > 0
    out = {
        "rollout/pass": _mean(c["unit"][buggy]) if buggy.any() else _mean(c["unit"]),
        "rollout/precision": _mean(c["precision"]),
        "rollout/recall": _mean(c["recall"]),
        "rollout/f1": _mean(c["f1"][buggy]) if buggy.any() else math.nan,
        "rollout/edited_lines": _mean(c["edited_lines"]),
        "rollout/edited_lines_pass": _mean(c["edited_lines"][c["unit"] > 0]),
        "rollout/noop": _mean(c["noop"]),
        "rollout/valid": _mean(c["valid"]),
        "rollout/reward": _mean(c["reward"]),
        "rollout/response_tokens": _mean(c["response_tokens"]),
        "rollout/thinking_tokens": _mean(c["thinking_tokens"]),
        "rollout/budget_hit": _mean(c["budget_hit"]),
        "rollout/truncated": _mean(c["truncated"]),
        "reward/unverifiable": float(unverifiable.sum()),
        **groups,
    }
    for k, name in enumerate(term_names):
        out[f"reward/{name}"] = float(rewards_RxK[:, k].mean())
    return out


class MetricsWriter:
    """`metrics.jsonl` (one JSON object per step) and TensorBoard scalars in the run directory.

    On resume, lines past the checkpoint's step are dropped first (they are recomputed).
    """

    def __init__(self, out: str | os.PathLike, tensorboard: bool, resume_step: int | None = None):
        self.path = Path(out) / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            keep = [line for line in self.path.read_text().splitlines()
                    if line.strip() and _parse(line).get("step", math.inf) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in keep))
        elif resume_step is None:
            self.path.write_text("")
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter
            self._tb = SummaryWriter(str(Path(out) / "tensorboard"))

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """One record for `step` (NaN is written as null)."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, **clean}, sort_keys=True) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, (int, float)) and v is not None:
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def _parse(line: str) -> dict[str, Any]:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return {"step": math.inf}  # a line torn by a kill is dropped


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a `metrics.jsonl` (a torn last line skipped)."""
    return [r for r in (_parse(line) for line in Path(path).read_text().splitlines() if line.strip())
            if r.get("step") != math.inf]


PANELS = (("rollout/pass", "val/pass", "pass rate"), ("rollout/edited_lines", "val/lines", "edited lines"),
          ("rollout/noop", "gt_debug/noop", "no-op rate"))


def plot_curves(records: Sequence[Mapping[str, Any]], path: str | os.PathLike, term_names: Sequence[str]) -> None:
    """Training curves (pass rate, edited lines, no-op rate, each reward term) as a PNG.

    Training values are per step; validation values are drawn as points where they exist.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(PANELS) + [(f"reward/{n}", None, f"reward term: {n}") for n in term_names]
    cols = 3
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, (train_key, val_key, title) in zip(axes.flat, panels):
        for key, style, label in ((train_key, "-", "train"), (val_key, "o-", "validation")):
            if key is None:
                continue
            pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), style, label=label, markersize=3)
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    tmp = Path(f"{path}.tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)
