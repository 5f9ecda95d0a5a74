"""A scored sample pool: n completions per training task, each scored with the PreciseCoder reward.

The supervised baselines learn from it (paper, C.2): rejection-sampling SFT keeps the best
passing samples, DPO pairs the best with the worst, RECAP turns samples into refiner
examples (`jaxrl.selection`). `build_pool` asks an `Engine` for completions of the rendered
training prompts, scores them with `score_predictions` on a verification fleet, and
appends one row per sample to `DIR/pool.jsonl` as each batch of tasks finishes:

    task_id, sample, text, token_ids, unit, precision, recall, f1, edited_lines, valid,
    think_opened, finish_reason

`text` is the response the scorer read (the stop token that ended it removed) and
`token_ids` the completion's tokens as the engine returned them. A rerun over the same
DIR with the same settings resumes: tasks with all n rows are kept, a torn last line
and tasks with fewer rows are dropped and sampled again; other settings are refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from jaxrl import rewards as R
from jaxrl import tasks as T
from jaxrl.eval.evaluate import EvalError, batch_seed, claim_run_dir
from jaxrl.rollout.engine import Completion, Engine, SamplingParams
from jaxrl.sampling import Sampling, sampling_kwargs
from reward.sandbox import Limits
from reward.schema import Task, write_jsonl
from reward.score import Score, score_predictions

POOL, POOL_RUN = "pool.jsonl", "pool_run.json"


class PoolError(RuntimeError):
    """A pool that cannot be built or continued; the message says why and what was kept."""


@dataclasses.dataclass(frozen=True)
class PoolSettings(Sampling):
    """Everything that changes a pool's rows (the paper: 16 samples at T = 1.0, top-p 1.0): the
    sampling settings (`jaxrl.sampling.Sampling`), plus:

    Attributes:
        n: samples per task.
        prompt: the prompt template (`jaxrl.prompts`), the one the policy is trained with.
        seed: each batch of tasks samples with a seed derived from it and its first task.
        lam, epsilon, timeout_s: the scorer's λ, ε and per-run timeout.
    """

    n: int = 16
    prompt: str = "minimal"
    seed: int = 0
    lam: float = 1 / 3
    epsilon: int = 1
    timeout_s: float = 5.0

    def __post_init__(self):
        super().__post_init__()
        self.params(self.seed)  # SamplingParams validates n.

    def params(self, seed: int) -> SamplingParams:
        return SamplingParams.of(self, n=self.n, seed=seed)


def settings_of(cfg: Any, n: int, seed: int | None = None) -> PoolSettings:
    """The pool settings of a training config: its rollout sampling, prompt and reward, with n samples."""
    return PoolSettings(**sampling_kwargs(cfg.rollout), n=n, prompt=cfg.data.prompt,
                        seed=cfg.run.seed if seed is None else seed, lam=cfg.reward.lam,
                        epsilon=cfg.reward.epsilon, timeout_s=cfg.reward.timeout_s)


def pool_rows(rendered: T.Rendered, completions: Sequence[Completion], scores: Sequence[Score]) -> list[dict[str, Any]]:
    """The rows of one task's samples, in sample order."""
    return [{"task_id": rendered.task.task_id, "sample": k, "text": c.text,
             "token_ids": list(c.token_ids), "unit": s.unit, "precision": s.precision, "recall": s.recall,
             "f1": s.f1, "edited_lines": s.edited_lines, "valid": s.valid, "think_opened": rendered.think_opened,
             "finish_reason": c.finish_reason, "status": s.status}
            for k, (c, s) in enumerate(zip(completions, scores))]


class PoolLog:
    """pool.jsonl as a resumable log: complete tasks are kept, rows appended (and synced) as batches finish.

    `DIR/pool_run.json` records the settings, the model and the task ids; resuming with
    other ones is refused rather than mixing two pools in one file.
    """

    def __init__(self, out_dir: str | os.PathLike, run: Mapping[str, Any], n: int):
        self.dir = Path(out_dir).expanduser()
        try:
            claim_run_dir(self.dir, dict(run), POOL_RUN, "pool")
        except EvalError as e:
            raise PoolError(str(e)) from None
        self.done: dict[str, list[dict[str, Any]]] = {}
        path = self.dir / POOL
        if path.exists():
            found: dict[str, dict[int, dict[str, Any]]] = {}
            for line in path.read_text(encoding="utf-8").split("\n"):
                try:
                    row = json.loads(line)
                    found.setdefault(row["task_id"], {})[row["sample"]] = row
                except (ValueError, KeyError, TypeError):
                    continue
            self.done = {tid: [rows[k] for k in range(n)] for tid, rows in found.items()
                         if all(k in rows for k in range(n))}
        write_jsonl(path, (row for rows in self.done.values() for row in rows))
        self._file = open(path, "a", encoding="utf-8")

    def append(self, rows: Sequence[dict[str, Any]]) -> None:
        """Write rows and flush them to disk before returning."""
        self._file.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def build_pool(engine: Engine, tokenizer: Any, tasks: Sequence[Task], settings: PoolSettings, fleet: Any,
               out_dir: str | os.PathLike, *, model: Mapping[str, Any] | None = None, batch_size: int = 8,
               progress: bool = False) -> dict[str, Any]:
    """Sample `settings.n` completions of every task, score them, and keep them in `out_dir/pool.jsonl`.

    Args:
        engine: where completions come from (`jaxrl.rollout.make_engine`).
        tokenizer: renders the prompts (`models.tokenizer.QwenTokenizer`, or the demo's).
        tasks: the training tasks, in the order their rows are written.
        settings: sampling and scoring.
        fleet: the verification fleet (`reward.fleet.Fleet`) that runs the tests.
        model: what is sampled (name, source), recorded in pool_run.json.
        batch_size: tasks per engine call (each gives n completions).
        progress: a progress bar over tasks, with its ETA.

    Returns:
        Counts: tasks, samples, passing samples, tasks with a passing sample, valid samples.
        Raises `PoolError` when the engine fails (the tasks done are kept) or the
        directory holds another pool.
    """
    if batch_size < 1:
        raise PoolError(f"batch size must be >= 1, got {batch_size}")
    run = {"settings": dataclasses.asdict(settings), "model": dict(model or {}), "tasks": [t.task_id for t in tasks]}
    log = PoolLog(out_dir, run, settings.n)
    limits = Limits(timeout_s=settings.timeout_s)
    bar = tqdm(total=len(tasks), initial=len(log.done), desc="pool", unit="task", disable=not progress,
               smoothing=0.1)
    try:
        for start in range(0, len(tasks), batch_size):
            chunk = tasks[start:start + batch_size]
            todo = [T.render(t, tokenizer, settings.prompt) for t in chunk if t.task_id not in log.done]
            if not todo:
                continue
            try:
                groups = engine.generate([r.prompt_ids for r in todo],
                                         settings.params(batch_seed(settings.seed, chunk[0].task_id)))
            except Exception as e:  # noqa: BLE001 - any engine failure ends the run resumably
                raise PoolError(f"the engine failed ({type(e).__name__}: {e}); the {len(log.done)} tasks done "
                                f"are kept in {log.dir / POOL}, rerun the same command to continue") from e
            items = [(r.task, R.prediction_of(r.task, c.text, r.think_opened))
                     for r, group in zip(todo, groups) for c in group]
            scores = score_predictions(items, fleet.run, lam=settings.lam, epsilon=settings.epsilon,
                                       limits=limits, window_batch=1)  # many predictions a round
            rows = [row for i, (r, group) in enumerate(zip(todo, groups))
                    for row in pool_rows(r, group, scores[i * settings.n:(i + 1) * settings.n])]
            log.append(rows)
            for r in todo:
                log.done[r.task.task_id] = [row for row in rows if row["task_id"] == r.task.task_id]
            bar.update(len(todo))
    finally:
        bar.close()
        log.close()
    ordered = [row for t in tasks for row in log.done[t.task_id]]
    write_jsonl(log.dir / POOL, ordered)
    passing = [row for row in ordered if row["valid"] and row["unit"] == 1]
    return {"tasks": len(tasks), "samples": len(ordered), "passing": len(passing),
            "tasks_with_a_pass": len({row["task_id"] for row in passing}),
            "valid": sum(row["valid"] for row in ordered)}
