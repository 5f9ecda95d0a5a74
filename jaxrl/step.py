"""One RL step, stage by stage: sample → score → advantages → update → push weights.

`step(run, state, tasks, index)` is the paper's step. Its stages pass one host-local
table, `Rollouts`, one row per (task, completion) in group order (row n·G + g is
completion g of task n); each stage fills its columns:

    sample      engine.generate            tasks, prompt ids, completions
    score       jaxrl.rewards              score rows, reward terms (`jaxrl.algorithms`)
    advantages  the algorithm's estimator  advantages (over the global batch, jitted)
    update      jaxrl.train_step           the jitted, sharded, micro-batched update
    push        engine.update_weights      the new weights to the engine

With `reward.stream` (the default) the two first stages overlap: the engine reports each
task's group as soon as its G samples have stopped (`Engine.generate_each`) and
`jaxrl.rewards.StreamedScoring` scores it while the engine decodes the others; `score`
then waits only for what is left. The update is unchanged: the same samples, the same
weights, the same scores. `time/reward` is the wait after decoding, `time/reward_overlap`
the part of `time/rollout` during which groups were being scored.

An algorithm whose reward terms need only the unit runs (GRPO and the other unit-only
algorithms: `jaxrl.algorithms.Resolved.verified` is False) can take its terms from the unit
runs alone, with `reward.defer_verification` (off by default): the verification and window
runs, which only the step's metrics read, are made while the update runs
(`jaxrl.rewards.DeferredVerification`), and `time/verify` is the wait for what is left of
them after the weight push. The advantages, the update and the metrics are those of scoring
everything before the update.

A new rollout kind replaces `sample` (and, where its rows differ, `update`'s batch):
with `rollout.agent` set, rows are multi-turn episodes (`jaxrl.agent.train`: the final
file is the prediction, each episode one update row). A new algorithm is an entry of
`jaxrl.algorithms`. Nothing here imports the loop.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from jaxrl import hosts
from jaxrl import metrics as M
from jaxrl import rewards as R
from jaxrl.agent import train as agent_train
from jaxrl.agent.rollout import AgentRollout
from jaxrl.agent.tokens import episode_rows
from jaxrl.batching import make_batch, rollout_rows, to_global
from jaxrl.errors import TrainError
from jaxrl.rollout import Completion, SamplingParams
from jaxrl.tasks import Rendered
from jaxrl.train_step import TrainState
from models import sharding as msh
from reward.schema import Prediction, Task
from reward.score import Score

if TYPE_CHECKING:
    from jaxrl.run import Run


@dataclasses.dataclass(frozen=True)
class Rollouts:
    """One step's rollouts on this host, one row per completion, in group order.

    Attributes:
        tasks, prompt_ids, think_opened: of the row's task.
        completions: what the engine sampled (an episode's: `agent_train.summary_completion`).
        episodes: the agent's episodes, one per row (empty for single-turn rollouts).
        scores: score rows (after `score`).
        terms_RxK: the algorithm's reward terms (after `score`).
        advantages_R: one advantage per row (after `advantages`).
    """

    tasks: tuple[Task, ...]
    prompt_ids: tuple[tuple[int, ...], ...]
    think_opened: tuple[bool, ...]
    completions: tuple[Completion, ...]
    episodes: tuple[AgentRollout, ...] = ()
    scores: tuple[Score, ...] = ()
    terms_RxK: np.ndarray | None = None
    advantages_R: np.ndarray | None = None

    def groups(self, g: int) -> list[list[Completion]]:
        """Completions per task (G each)."""
        return [list(self.completions[i:i + g]) for i in range(0, len(self.completions), g)]


def sample(run: Run, tasks: Sequence[Rendered], index: int,
           on_group: Callable[[int, list[Completion]], None] | None = None) -> Rollouts:
    """G completions (or episodes, with `rollout.agent`) per task from the engine, with the step's seed;
    `on_group(i, completions)` as soon as task i's are final (single-turn rollouts only)."""
    r = run.cfg.rollout
    seed = int(jax.random.randint(jax.random.fold_in(run.rng, index), (), 0, 2 ** 31 - 1))
    params = SamplingParams.of(r, n=r.group_size, seed=seed)
    try:
        if r.agent is not None:
            episodes = agent_train.sample_episodes(run.engine, run.tokenizer, [t.task for t in tasks], r.group_size,
                                                   params, run.cfg)
        elif on_group is not None:
            groups = run.engine.generate_each([t.prompt_ids for t in tasks], params, on_group)
        else:
            groups = run.engine.generate([t.prompt_ids for t in tasks], params)
    except Exception as e:  # noqa: BLE001 - any engine failure ends the run resumably
        raise TrainError(f"step {index + 1}: the rollout engine failed ({type(e).__name__}: {e}); "
                         f"continue from the last checkpoint with --resume") from e
    if r.agent is not None:
        rendered = [t for t in tasks for _ in range(r.group_size)]
        return Rollouts(tuple(t.task for t in rendered), tuple(t.prompt_ids for t in rendered),
                        tuple(t.think_opened for t in rendered),
                        tuple(agent_train.summary_completion(e) for e in episodes), tuple(episodes))
    rows = [(t, c) for t, group in zip(tasks, groups, strict=True) for c in group]
    return Rollouts(tuple(t.task for t, _ in rows), tuple(t.prompt_ids for t, _ in rows),
                    tuple(t.think_opened for t, _ in rows), tuple(c for _, c in rows))


def group_pairs(tasks: Sequence[Rendered], i: int, completions: Sequence[Completion]) -> list[tuple[Task, Prediction]]:
    """The (task, prediction) pairs of task i's completions."""
    t = tasks[i]
    return [(t.task, R.prediction_of(t.task, c.text, t.think_opened)) for c in completions]


def pairs_of(rollouts: Rollouts) -> list[tuple[Task, Prediction]]:
    """The (task, prediction) pair of every row."""
    if rollouts.episodes:
        return [(t, agent_train.prediction_of(e.episode)) for t, e in zip(rollouts.tasks, rollouts.episodes)]
    return [(t, R.prediction_of(t, c.text, opened))
            for t, c, opened in zip(rollouts.tasks, rollouts.completions, rollouts.think_opened)]


def score(run: Run, rollouts: Rollouts, streamed: R.StreamedScoring | None = None, verify: bool = True,
          done: dict | None = None) -> Rollouts:
    """Score rows on the fleet (or collect those `streamed` scored during sampling) and the algorithm's
    reward terms of each; with `verify=False`, from the unit runs alone (their results added to `done`)."""
    if streamed is not None:
        scores = tuple(streamed.scores(len(rollouts.completions) // run.cfg.rollout.group_size))
    else:
        scores = tuple(run.scorer(pairs_of(rollouts), verify, done))
    terms = np.asarray([run.algorithm.term_values(s, t) for s, t in zip(scores, rollouts.tasks)], np.float32)
    return dataclasses.replace(rollouts, scores=scores, terms_RxK=terms.reshape(len(scores), -1))


def advantages(run: Run, rollouts: Rollouts) -> tuple[Rollouts, np.ndarray, np.ndarray]:
    """The estimator over the global batch; this host's rows keep their share.

    Returns:
        (rollouts with advantages, global terms `[R, K]`, global advantages `[N, G]`).
    """
    lengths = np.asarray([len(c.token_ids) for c in rollouts.completions], np.float32)
    gathered = hosts.gather_rows(np.column_stack([rollouts.terms_RxK, lengths]))
    terms, g = gathered[:, :-1], run.cfg.rollout.group_size
    adv_NxG = np.asarray(run.advantages_fn(terms.reshape(-1, g, terms.shape[1]), gathered[:, -1].reshape(-1, g)))
    n, pi = len(rollouts.completions), jax.process_index()
    local = adv_NxG.reshape(-1)[pi * n:(pi + 1) * n]
    return dataclasses.replace(rollouts, advantages_R=local), terms, adv_NxG


def update(run: Run, state: TrainState, rollouts: Rollouts) -> tuple[TrainState, dict[str, float]]:
    """One policy update on the rollouts (with reference log-probs when the loss has a KL term)."""
    g = run.cfg.rollout.group_size
    if rollouts.episodes:
        rows = episode_rows([e.segments for e in rollouts.episodes], run.tokenizer.pad_id,
                            run.cfg.rollout.agent.max_context)
    else:
        rows = rollout_rows(rollouts.prompt_ids[::g], rollouts.groups(g), run.prompt_len,
                            run.cfg.rollout.max_tokens, run.tokenizer.pad_id)
    batch = to_global(make_batch(rows, rollouts.advantages_R),
                      dataclasses.replace(run.batch_shardings, ref_logp_BxT=None))
    if run.ref_params is not None:
        with msh.use_mesh(run.mesh, run.rules):
            batch = batch.replace(ref_logp_BxT=run.ref_fn(run.ref_params, batch.tokens_BxT, batch.segment_ids_BxT))
    state, metrics = run.step_fn(state, batch)
    out = {f"update/{k}": float(v) for k, v in jax.device_get(metrics).items()}
    out["update/param_norm"] = float(run.param_norm_fn(state.params))
    return state, out


def push(run: Run, state: TrainState, index: int) -> None:
    """The updated weights to the engine."""
    try:
        run.engine.update_weights(run.model_of(state), step=index + 1)
    except Exception as e:  # noqa: BLE001
        raise TrainError(f"step {index + 1}: pushing weights to the engine failed ({type(e).__name__}: {e}); "
                         f"continue from the last checkpoint with --resume") from e


def step(run: Run, state: TrainState, tasks: Sequence[Rendered], index: int,
         timer: M.StageTimer | None = None) -> tuple[TrainState, dict[str, Any]]:
    """Step `index` (0-based) on this host's `tasks`: the new state and the step's metrics."""
    timer = timer or M.StageTimer()
    # Terms that need only the unit runs: the verification runs (metrics only) overlap the update.
    deferred = run.cfg.reward.defer_verification and not run.algorithm.verified
    done: dict = {}
    if run.cfg.reward.stream and run.cfg.rollout.agent is None:
        with R.StreamedScoring(run.scorer, functools.partial(group_pairs, tasks), verify=not deferred) as streamed:
            with timer("rollout"):
                started = time.perf_counter()
                rollouts = sample(run, tasks, index, streamed)
                decoded = time.perf_counter()
            with timer("reward"):
                rollouts = score(run, rollouts, streamed)
        timer.add("reward_overlap", streamed.busy_s(started, decoded))
        done = streamed.done()
    else:
        with timer("rollout"):
            rollouts = sample(run, tasks, index)
        with timer("reward"):
            rollouts = score(run, rollouts, verify=not deferred, done=done)
    verifying = R.DeferredVerification(run.scorer, pairs_of(rollouts), done) if deferred else None
    with timer("advantages"):
        rollouts, terms, adv_NxG = advantages(run, rollouts)
    with timer("update"):
        state, update_metrics = update(run, state, rollouts)
    with timer("push"):
        push(run, state, index)
    if verifying is not None:
        with timer("verify"):
            rollouts = dataclasses.replace(rollouts, scores=tuple(verifying.result()))
    columns = hosts.gather_rows(M.rollout_columns(rollouts.scores, rollouts.completions,
                                                  [not t.is_clean for t in rollouts.tasks],
                                                  run.tokenizer.think_end_id))
    metrics = {**M.rollout_metrics(columns, terms, run.algorithm.terms, run.cfg.rollout.group_size),
               **update_metrics, "advantage/abs_mean": float(np.abs(adv_NxG).mean())}
    if rollouts.episodes:
        metrics |= agent_train.agent_metrics(
            hosts.gather_rows(agent_train.agent_columns([e.episode for e in rollouts.episodes])))
    return state, metrics
