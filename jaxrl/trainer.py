"""The RL loop of `precisecoder train`: check, set up, then sample → score → advantages → update → push.

`train(cfg)` reads in one screen: `jaxrl.preflight.check` (nothing written yet),
`jaxrl.run.open_run` (every resource on one ExitStack), then per step the data,
`jaxrl.step.step` (the paper's step), validation, the checkpoint and the metrics:

    tasks      jaxrl.tasks       Grain: shuffled, repeated, batched, rendered prompts
    step       jaxrl.step        rollout, reward, advantages, update, weight push
    every k:   jaxrl.validate, jaxrl.checkpoint, jaxrl.metrics.plot_curves

Every host runs the same code on its own slice of tasks and its own fleet; the
update and the advantages see the global batch.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from typing import Any

from jaxrl import hosts
from jaxrl import metrics as M
from jaxrl import preflight
from jaxrl.config import Config, config_from_args
from jaxrl.errors import TrainError
from jaxrl.host_digest import check_hosts_agree
from jaxrl.rollout import Engine
from jaxrl.run import Run, make_engine_for, open_run
from jaxrl.saved_run import build_model, load_policy, locate_run
from jaxrl.step import step as rl_step
from jaxrl.train_step import TrainState
from jaxrl.validate import validate
from reward.fleet import Fleet

__all__ = ["TrainError", "build_model", "config_from_args", "load_policy", "locate_run", "make_engine_for", "train"]


def train(cfg: Config, *, resume: bool = False, engine_factory: Callable[..., Engine] | None = None,
          tokenizer: Any = None, fleet: Fleet | None = None) -> dict[str, Any]:
    """Run (or resume) the RL loop of `cfg` to `cfg.run.steps`; returns the last step's metrics.

    `engine_factory(cfg, model, tokenizer, mesh, rules)` replaces `make_engine_for`. `tokenizer`
    replaces the Qwen tokenizer of `cfg.model.family` (`precisecoder demo` passes its own
    small vocabulary with the same interface). `fleet`: a sandbox fleet the caller owns and
    shares with other runs (`jaxrl.run.open_run`).
    """
    try:
        check_hosts_agree(cfg)  # a collective: before anything that could fail on one host only
    except hosts.HostsDisagree as e:
        raise TrainError(str(e)) from None
    algorithm = preflight.check(cfg, resume)
    last: dict[str, Any] = {}
    with open_run(cfg, algorithm, resume=resume, engine_factory=engine_factory, tokenizer=tokenizer,
                  fleet=fleet) as (run, state):
        for index in range(run.start, cfg.run.steps):
            timer = M.StageTimer()
            with timer("data"):
                tasks = next(run.stream)
            state, metrics = rl_step(run, state, tasks, index, timer)
            if index == run.start:
                freeze_heap()
            done = index + 1
            validating = (cfg.run.eval_every and done % cfg.run.eval_every == 0) or done == cfg.run.steps
            if validating and (run.val_tasks or run.gt_tasks):
                with timer("validate"):
                    metrics |= validate(run.engine, run.tokenizer, run.scorer, run.val_tasks + run.gt_tasks, cfg,
                                        cfg.run.seed + done)
            if (cfg.run.save_every and done % cfg.run.save_every == 0) or done == cfg.run.steps:
                with timer("save"):
                    save(run, state, metrics)
            metrics |= timer.metrics()
            record(run, done, metrics, validating)
            last = metrics
    return last


def freeze_heap() -> None:
    """Put every object alive now (after set-up and the first step, which compiles) out of the cyclic
    garbage collector's reach. They live as long as the run (the model, the compiled programs, JAX's
    and Grain's caches: hundreds of thousands of objects), and every full collection traversed them
    within some step; the collector still reclaims what later steps allocate."""
    gc.collect()
    gc.freeze()


def save(run: Run, state: TrainState, metrics: dict[str, float]) -> None:
    """Checkpoint this step; also as the best one when `run.best_metric` improved. A failed save ends the run."""
    key, mode = run.cfg.run.best_metric, run.cfg.run.best_mode
    value = metrics.get(key) if key else None
    better = (run.best_ckpt is not None and value is not None and math.isfinite(value)
              and (run.best is None or (value > run.best if mode == "max" else value < run.best)))
    if better:
        run.best = value
    data = {"data": run.stream.get_state()}
    try:
        run.ckpt.check()
        run.ckpt.save(state, run.rng, {"best": run.best}, data)
        # A kill between the two saves can leave this step in best/ already; it is the same state.
        if better and int(state.step) not in run.best_ckpt.all_steps():
            run.best_ckpt.save(state, run.rng, {"best": run.best, "metric": key}, data)
    except Exception as e:  # noqa: BLE001 - Orbax raises many kinds; one line, and the run stops here
        raise TrainError(f"step {int(state.step)}: saving the checkpoint failed ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}); continue from the last checkpoint "
                         f"with --resume") from None


def record(run: Run, done: int, metrics: dict[str, Any], validating: bool) -> None:
    """One line of metrics.jsonl (and TensorBoard), the curves after a validation, the progress bar."""
    if run.writer is not None:
        run.writer.write(done, metrics)
        if validating:
            M.plot_curves(M.read_metrics(run.writer.path), run.out / "curves.png", run.algorithm.terms)
    if run.progress is not None:
        run.progress.update(1)
        run.progress.set_postfix({k.split("/")[-1]: f"{metrics[k]:.3g}" for k in
                                  ("rollout/pass", "rollout/f1", "rollout/edited_lines", "time/step")
                                  if k in metrics and metrics[k] is not None and math.isfinite(metrics[k])})

