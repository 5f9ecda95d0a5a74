"""The RL loop of `precisecoder train`: check, set up, then sample → score → advantages → update → push.

`train(cfg)` reads in one screen: `jaxrl.preflight.check` (nothing written yet),
`jaxrl.run.open_run` (every resource on one ExitStack), then per step the data,
`jaxrl.step.step` (the paper's step), validation, the checkpoint and the metrics:

    tasks      jaxrl.tasks       Grain: shuffled, repeated, batched, rendered prompts
    step       jaxrl.step        rollout, reward, advantages, update, weight push
    every k:   jaxrl.validate, jaxrl.checkpoint, jaxrl.metrics.plot_curves

The loop itself (cadences, checkpoints, the best one, metrics, interruptions) is
`jaxrl.loop.run_loop`, the one every trainer uses; RL gives it its step.

Every host runs the same code on its own slice of tasks and its own fleet; the
update and the advantages see the global batch.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from jaxrl import hosts
from jaxrl import metrics as M
from jaxrl import preflight
from jaxrl.config import Config, config_from_args
from jaxrl.errors import TrainError
from jaxrl.host_digest import check_hosts_agree
from jaxrl.loop import Loop, interruptible, run_loop
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
    shares with other runs (`jaxrl.run.open_run`). SIGINT and SIGTERM save the last completed
    step and raise `jaxrl.loop.Interrupted` (`jaxrl.loop.interruptible`).
    """
    try:
        check_hosts_agree(cfg)  # a collective: before anything that could fail on one host only
    except hosts.HostsDisagree as e:
        raise TrainError(str(e)) from None
    algorithm = preflight.check(cfg, resume)
    with interruptible(cfg.run.exit_grace_s), \
            open_run(cfg, algorithm, resume=resume, engine_factory=engine_factory, tokenizer=tokenizer,
                     fleet=fleet) as (run, state):

        def one_step(state: TrainState, index: int, timer: M.StageTimer) -> tuple[TrainState, dict[str, Any]]:
            with timer("data"):
                tasks = next(run.stream)
            state, metrics = rl_step(run, state, tasks, index, timer)
            if index == run.start:
                freeze_heap()
            return state, metrics

        loop = Loop(cfg.run.steps, run.start, cfg.run.eval_every, cfg.run.save_every,
                    validate=(lambda state, done: validate(run.engine, run.tokenizer, run.scorer,
                                                           run.val_tasks + run.gt_tasks, cfg, cfg.run.seed + done))
                    if run.val_tasks or run.gt_tasks else None,
                    checkpoints=run.checkpoints, host_data=lambda: {"data": run.stream.get_state()},
                    writer=run.writer, on_record=lambda done, metrics, validated: validated and curves(run),
                    progress=run.progress,
                    progress_keys=("rollout/pass", "rollout/f1", "rollout/edited_lines", "time/step"), timed=True,
                    pending=run.pending)
        _, last = run_loop(loop, state, one_step)
    return last


def freeze_heap() -> None:
    """Put every object alive now (after set-up and the first step, which compiles) out of the cyclic
    garbage collector's reach. They live as long as the run (the model, the compiled programs, JAX's
    and Grain's caches: hundreds of thousands of objects), and every full collection traversed them
    within some step; the collector still reclaims what later steps allocate."""
    gc.collect()
    gc.freeze()


def curves(run: Run) -> None:
    """curves.png from metrics.jsonl (primary host), after each validation."""
    if run.writer is not None:
        M.plot_curves(M.read_metrics(run.writer.path), run.out / "curves.png", run.algorithm.terms)
