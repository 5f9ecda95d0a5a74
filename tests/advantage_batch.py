"""A fixed batch of score rows for the golden advantages (tests/fixtures/advantages_golden.json).

Five groups of four rollouts: three buggy tasks and two clean ones, valid and invalid
answers, one group where every rollout passes and one where none does. The golden
file holds every algorithm's advantages on it, computed before the trainer's
algorithms moved into `jaxrl.algorithms`; the refactor must reproduce them.
"""

from __future__ import annotations

import numpy as np

from reward.schema import AssertTests, Task
from reward.score import Score

G = 4
LAM = 1 / 3
# (algorithm, options, token-weighted lengths?) of every golden case
CASES = (
    ("precisecoder", {}, False),
    ("precisecoder", {"token_weighted": True}, True),
    ("grpo", {}, False),
    ("grpo", {"ddof": 1}, False),
    ("drgrpo", {}, False),
    ("rloo", {}, False),
    ("ea_grpo", {}, False),
    ("ea_grpo", {"alpha": 0.5, "beta": 0.2}, False),
    ("grpo_f1sum", {}, False),
    ("grpo_clean_rows", {}, False),
)


def batch_tasks() -> list[Task]:
    """One task per group: three buggy, two clean (C of 3 to 5 non-blank lines)."""
    tasks = []
    for i in range(5):
        code = "".join(f"x{j} = {j}\n" for j in range(3 + i % 3))
        solution = code.replace("x0 = 0", "x0 = 1") if i < 3 else code
        tasks.append(Task(f"t{i}", f"b{i}", "p", code, solution, AssertTests("assert True\n")))
    return tasks


def batch_scores() -> list[Score]:
    """G score rows per task of `batch_tasks()`, in group order."""
    rng = np.random.default_rng(20261201)
    rows = []
    for i, task in enumerate(batch_tasks()):
        for g in range(G):
            valid = bool(rng.random() < 0.8) or i == 1
            unit = 1 if i == 1 else 0 if i == 2 else int(valid and rng.random() < 0.5)
            clean = task.is_clean
            f1 = None if clean or not valid else float(rng.choice([0.0, 0.25, 0.5, 1.0]))
            lines = int(rng.integers(0, 7)) if valid else None
            rows.append(Score(task_id=task.task_id, valid=valid, unit=unit, precision=None, recall=None, f1=f1,
                              edited_lines=lines, faults=0 if clean else 1, faults_fixed=unit, noop=lines == 0,
                              damage=None, reward=0.0))
    return rows


def batch_lengths() -> np.ndarray:
    """Completion tokens per rollout, `[N, G]`."""
    return np.random.default_rng(7).integers(5, 60, (5, G))
