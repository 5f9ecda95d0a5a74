"""The reward stage: a Grain pipeline of scorer calls on the fleet, and the per-algorithm terms.

`RewardPipeline.score(pairs)` is a Grain `MapDataset` over (task, prediction)
pairs whose map is `reward.score.score_predictions` on one pair, run by a pool
of threads that share one `Fleet`: the sandbox workers are started once and
persist across steps (no process start-up per step), and the fleet's content
cache serves repeated programs. Results come back in pair order.

`terms(algorithm, score, task)` turns one rollout's score into its reward terms
(the K of `rewards_NxGxK`) and `term_weights(algorithm, lam)` gives the weights
the estimator `ESTIMATOR[algorithm]` combines them with.
"""

from __future__ import annotations

from collections.abc import Sequence

import grain

from reward.fleet import Fleet
from reward.sandbox import Limits
from reward.schema import Prediction, Task
from reward.score import Score, baseline_terms, score_predictions

# algorithm -> registered advantage estimator (`jaxrl.advantages`)
ESTIMATOR = {
    "precisecoder": "gdpo",
    "grpo": "grpo",
    "drgrpo": "drgrpo",
    "rloo": "rloo",
    "ea_grpo": "ea_grpo",
    "grpo_f1sum": "grpo",
    "grpo_clean_rows": "grpo_clean_rows",
}

TERM_NAMES = {
    "precisecoder": ("unit", "f1"),
    "grpo": ("unit",),
    "drgrpo": ("unit",),
    "rloo": ("unit",),
    "ea_grpo": ("unit", "edited_lines"),
    "grpo_f1sum": ("unit", "f1"),
    "grpo_clean_rows": ("unit", "edited_lines", "is_clean"),
}


def terms(algorithm: str, score: Score, task: Task) -> tuple[float, ...]:
    """One rollout's reward terms for `algorithm` (names in `TERM_NAMES`).

    unit and f1 are `Score.vector` (f1 counts 0 on clean tasks and invalid answers);
    edited_lines comes from `reward.score.baseline_terms` (an invalid answer's is the number
    of non-blank lines of C; EA-GRPO ignores it, as an invalid answer never passes).
    """
    unit, f1 = score.vector
    if algorithm in ("precisecoder", "grpo_f1sum"):
        return unit, f1
    if algorithm in ("grpo", "drgrpo", "rloo"):
        return (unit,)
    lines = baseline_terms(score, task.buggy_code)[1]
    if algorithm == "ea_grpo":
        return unit, lines
    if algorithm == "grpo_clean_rows":
        return unit, lines, float(task.is_clean)
    raise ValueError(f"unknown algorithm {algorithm!r}")


def term_weights(algorithm: str, lam: float) -> tuple[float, ...]:
    """The estimator's term weights: [1 − λ, λ] for the F1 algorithms; unit alone otherwise."""
    if algorithm in ("precisecoder", "grpo_f1sum"):
        return 1.0 - lam, lam
    return (1.0,) + (0.0,) * (len(TERM_NAMES[algorithm]) - 1)


def prediction_of(task: Task, response: str, think_opened: bool) -> Prediction:
    """The prediction a completion makes (its program is extracted from `response`; `think_opened`:
    the prompt itself opened the think block, so the response must close it)."""
    return Prediction(task.task_id, response=response, think_opened=think_opened)


class _ScoreOne:
    def __init__(self, fleet: Fleet, lam: float, epsilon: int, limits: Limits):
        self.fleet, self.lam, self.epsilon, self.limits = fleet, lam, epsilon, limits

    def __call__(self, pair: tuple[Task, Prediction]) -> Score:
        return score_predictions([pair], self.fleet.run, lam=self.lam, epsilon=self.epsilon, limits=self.limits,
                                 window_batch=2 * self.fleet.num_workers)[0]


class RewardPipeline:
    """Scores (task, prediction) pairs through Grain on one persistent fleet.

    Args:
        fleet: this host's sandbox fleet (its `run` must be thread-safe).
        lam, epsilon, limits: the scorer's settings.
        threads: concurrent scorer calls (default: the fleet's worker count).
    """

    def __init__(self, fleet: Fleet, lam: float, epsilon: int, limits: Limits, threads: int | None = None):
        self.fleet = fleet
        self.threads = threads or fleet.num_workers
        self._map = _ScoreOne(fleet, lam, epsilon, limits)

    def __call__(self, pairs: Sequence[tuple[Task, Prediction]]) -> list[Score]:
        """Scores in pair order."""
        if not pairs:
            return []
        ds = grain.MapDataset.source(list(pairs)).map(self._map)
        options = grain.ReadOptions(num_threads=self.threads, prefetch_buffer_size=2 * self.threads)
        return list(ds.to_iter_dataset(options))
