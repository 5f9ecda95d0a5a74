"""A training run's resources, built from its config and owned by one `ExitStack`.

`open_run(cfg, ...)` is a context manager yielding `(run, state)`: the mesh, the
task stream, the model's jitted update, the checkpointers (restored on resume),
the engine, the sandbox fleet with its reward pipeline, the metrics writer and the
progress bar. Each resource is registered on the stack as soon as it exists, so an
error anywhere in set-up or in the loop closes everything opened so far (sandbox
processes, Orbax threads, engine servers) and nothing outlives the run.

Set-up order: `check` (nothing written yet), the run directory and its config.yaml,
the mesh, the tasks, the model, the engine and the fleet. A multi-host check that
every host runs the same program belongs right after the mesh, before any model is
built; a weight-sync barrier belongs in `jaxrl.step.push`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl import algorithms, hosts
from jaxrl.agent import train as agent_train
from jaxrl import metrics as M
from jaxrl import rewards as R
from jaxrl import tasks as T
from jaxrl import train_step as ts
from jaxrl.batching import pad_length
from jaxrl.checkpoint import Checkpointer, abstract_with_shardings
from jaxrl.config import Config, to_yaml
from jaxrl.errors import TrainError
from jaxrl.loop import Checkpoints
from jaxrl.losses import chunked_logprobs
from jaxrl.rollout import Engine, make_engine
from jaxrl.rollout.engine import engine_factory
from jaxrl.saved_run import build_model
from models import sharding as msh
from models.tokenizer import load_tokenizer
from reward.fleet import Fleet
from reward.sandbox import Limits, library_env
from reward.schema import Task


def warn(msg: str) -> None:
    """A warning in the run log (stderr of the primary host)."""
    if hosts.is_primary():
        print(f"WARNING: {msg}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Run:
    """Everything a step needs; `open_run` builds it and closes what it holds.

    Attributes:
        cfg, out: the config and the run directory.
        algorithm: terms, weights and the estimator; `advantages_fn` is its jitted call.
        mesh, rules: devices and logical-axis rules.
        tokenizer, stream, val_tasks, gt_tasks, prompt_len: the data.
        graphdef, rest, step_fn, batch_shardings, state_shardings: the jitted update.
        ref_params, ref_fn: the frozen reference policy (KL), or None.
        engine, fleet, scorer: sampling and verification.
        checkpoints, writer, progress: what the run records.
        pending: a step saved on an interruption before it was recorded (`jaxrl.loop.Loop.pending`).
        rng, start: the sampling RNG, the first step to run.
    """

    cfg: Config
    out: Path
    algorithm: algorithms.Resolved
    mesh: jax.sharding.Mesh
    rules: tuple
    tokenizer: Any
    stream: T.TaskStream
    val_tasks: list[Task]
    gt_tasks: list[Task]
    prompt_len: int
    graphdef: nnx.GraphDef
    rest: nnx.State
    step_fn: ts.ShardedStep
    batch_shardings: ts.Batch
    state_shardings: ts.TrainState
    advantages_fn: Callable[..., jax.Array]
    param_norm_fn: Callable[..., jax.Array]
    ref_params: Any
    ref_fn: Callable[..., jax.Array]
    checkpoints: Checkpoints
    rng: jax.Array
    start: int
    engine: Engine | None = None
    fleet: Fleet | None = None
    scorer: R.RewardPipeline | None = None
    writer: M.MetricsWriter | None = None
    progress: Any = None
    pending: dict[str, Any] | None = None

    def model_of(self, state: ts.TrainState) -> nnx.Module:
        """The policy with `state`'s parameters."""
        return nnx.merge(self.graphdef, state.params, self.rest)


def make_engine_for(cfg: Config, model: nnx.Module, tokenizer: Any, mesh: jax.sharding.Mesh,
                    rules: tuple) -> Engine:
    """The configured engine: `tokenizer` and `rollout.options` for all; an in-process engine
    (one whose constructor takes `model`) also gets the model, the mesh and the rules."""
    name = cfg.rollout.engine
    kwargs: dict[str, Any] = {"tokenizer": tokenizer, **cfg.rollout.options}
    if "model" in inspect.signature(engine_factory(name)).parameters:
        kwargs |= {"model": model, "mesh": mesh, "rules": rules}
    return make_engine(name, **kwargs)


def read_train_tasks(cfg: Config, tokenizer: Any) -> tuple[list[Task], list[Task], list[Task]]:
    """(train, val, GT Debug) tasks."""
    build = None
    if cfg.data.build is not None:
        build = T.ensure_built(cfg.data.build, cfg.reward.workers, cfg.reward.isolation, progress=cfg.run.progress,
                               libraries=library_env(cfg.reward.sandbox_env, cfg.reward.preload))
    paths = T.task_paths(cfg.data, build)
    train = T.read_tasks(paths["train"], "train")
    train = T.with_clean_rows(train, cfg.data.clean_share, cfg.data.seed)
    return (train, T.read_tasks(paths["val"], "val", cfg.validation.val_tasks),
            T.read_tasks(paths["gt_debug"], "gt_debug", cfg.validation.gt_debug_tasks))


def write_run_files(out: Path, files: dict[str, str]) -> None:
    """Create the run directory and write `files` (name -> text) in it, on the primary host only."""
    if hosts.is_primary():
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text)


def open_mesh(cfg: Config) -> tuple[jax.sharding.Mesh, tuple]:
    """The device mesh of `cfg.mesh` and its logical-axis rules."""
    try:
        mesh = msh.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, expert=cfg.mesh.expert)
    except ValueError as e:
        raise TrainError(f"mesh: {e}") from None
    return mesh, msh.rules_from_mapping(cfg.mesh.rules)


def open_state(cfg: Config, mesh: jax.sharding.Mesh, rules: tuple
               ) -> tuple[ts.TrainState, nnx.GraphDef, nnx.State, optax.GradientTransformation, ts.TrainState]:
    """The policy of `cfg.model` as a sharded train state: (state, graphdef, rest, optimizer, state shardings)."""
    model = build_model(cfg, mesh, rules)
    undivided = msh.undivided(nnx.split(model, nnx.Param, ...)[1], mesh, rules)
    if undivided:
        msg = "mesh axes that do not divide a parameter dimension (replicated instead):\n  " + "\n  ".join(undivided)
        if cfg.mesh.strict:
            raise TrainError(msg)
        warn(msg)
    tx = ts.make_optimizer(cfg.optimizer)
    state, graphdef, rest = ts.init_train_state(model, tx, mesh, rules)
    return state, graphdef, rest, tx, ts.state_shardings(jax.eval_shape(lambda s: s, state), mesh, rules)


def open_checkpoints(stack: contextlib.ExitStack, cfg: Config, out: Path, state: ts.TrainState,
                     state_shardings: ts.TrainState, resume: bool, extra: dict[str, Any] | None = None
                     ) -> tuple[Checkpoints, ts.TrainState, dict[str, Any] | None]:
    """The run's checkpoints (the last `run.keep_last`, and the best by `run.best_metric`) and, on resume,
    the state restored from the latest with its saved extra (None when nothing was restored)."""
    last = stack.enter_context(contextlib.closing(Checkpointer(out / "checkpoints", max_to_keep=cfg.run.keep_last)))
    best = stack.enter_context(contextlib.closing(Checkpointer(out / "best", max_to_keep=1))) \
        if cfg.run.best_metric else None
    checkpoints = Checkpoints(last, jax.random.key(cfg.run.seed), best, cfg.run.best_metric, cfg.run.best_mode,
                              extra=extra or {})
    saved = None
    if resume and last.latest_step() is not None:
        target = abstract_with_shardings(jax.eval_shape(lambda s: s, state), state_shardings)
        state, checkpoints.rng, saved = last.restore(target)
        checkpoints.best_value = saved.get("best")
        if hosts.is_primary():
            print(f"resuming {out} from step {int(state.step)}", file=sys.stderr, flush=True)
    return checkpoints, state, saved


def open_verifier(stack: contextlib.ExitStack, cfg: Config, fleet: Fleet | None = None
                  ) -> tuple[Fleet, R.RewardPipeline]:
    """The sandbox fleet of `cfg.reward` (or the caller's `fleet`, left open) and the reward pipeline on it."""
    if fleet is None:
        fleet = stack.enter_context(contextlib.closing(Fleet(
            workers=cfg.reward.workers, isolation=cfg.reward.isolation,
            libraries=library_env(cfg.reward.sandbox_env, cfg.reward.preload))))
    scorer = stack.enter_context(contextlib.closing(R.RewardPipeline(
        fleet, cfg.reward.lam, cfg.reward.epsilon, Limits(timeout_s=cfg.reward.timeout_s), cfg.reward.threads,
        cfg.reward.window_batch)))
    return fleet, scorer


def open_engine(stack: contextlib.ExitStack, cfg: Config, model: nnx.Module, tokenizer: Any,
                mesh: jax.sharding.Mesh, rules: tuple, factory: Callable[..., Engine] | None = None) -> Engine:
    """The configured rollout engine (or `factory`'s), closed with the stack."""
    try:
        engine = (factory or make_engine_for)(cfg, model, tokenizer, mesh, rules)
    except (ValueError, TypeError) as e:
        raise TrainError(f"rollout.engine {cfg.rollout.engine!r}: {e}") from None
    stack.callback(engine.close)
    return engine


def open_recorder(stack: contextlib.ExitStack, cfg: Config, out: Path, start: int, total: int, desc: str
                  ) -> tuple[M.MetricsWriter | None, Any]:
    """metrics.jsonl (cut after `start` on resume) and the progress bar, on the primary host only."""
    if not hosts.is_primary():
        return None, None
    writer = stack.enter_context(contextlib.closing(M.MetricsWriter(out, cfg.run.tensorboard, start or None)))
    progress = None
    if cfg.run.progress:
        from tqdm import tqdm  # noqa: PLC0415
        progress = stack.enter_context(contextlib.closing(
            tqdm(total=total, initial=start, desc=desc, unit="step", dynamic_ncols=True)))
    return writer, progress


@contextlib.contextmanager
def open_run(cfg: Config, algorithm: algorithms.Resolved, *, resume: bool,
             engine_factory: Callable[..., Engine] | None = None, tokenizer: Any = None,
             fleet: Fleet | None = None) -> Iterator[tuple[Run, ts.TrainState]]:
    """The RL run's resources and its train state (restored on resume); all closed on exit.

    `fleet` is a sandbox fleet the caller owns and keeps open (shared with other runs,
    its verdict cache with them); by default the run starts its own from `cfg.reward`.

    Call `jaxrl.preflight.check` first: this writes config.yaml at once.
    """
    out = Path(cfg.run.out).expanduser()
    write_run_files(out, {"config.yaml": to_yaml(cfg)})
    with contextlib.ExitStack() as stack:
        mesh, rules = open_mesh(cfg)
        tokenizer = load_tokenizer(cfg.model.family) if tokenizer is None else tokenizer
        train_tasks, val_tasks, gt_tasks = read_train_tasks(cfg, tokenizer)
        pi, pc = jax.process_index(), jax.process_count()
        stream = stack.enter_context(contextlib.closing(
            T.TaskStream(train_tasks, cfg.data.tasks_per_step, cfg.data.seed, tokenizer, cfg.data.prompt, pi, pc)))
        prompt_len = pad_length(max(len(T.render(t, tokenizer, cfg.data.prompt).prompt_ids) for t in train_tasks),
                                cfg.data.prompt_multiple)
        if cfg.rollout.agent is None:
            seq, logp_from = prompt_len + cfg.rollout.max_tokens, prompt_len
        else:
            seq, logp_from = agent_train.row_shape(cfg, train_tasks, tokenizer)

        state, graphdef, rest, tx, _ = open_state(cfg, mesh, rules)
        ref_params = jax.tree.map(jnp.copy, state.params) if cfg.loss.kl_coef > 0 else None
        step_fn, batch_shardings, state_shardings = _jit_update(cfg, graphdef, rest, tx, mesh, rules, state,
                                                                seq, logp_from, ref_params is not None)
        checkpoints, state, saved = open_checkpoints(stack, cfg, out, state, state_shardings, resume)
        pending = None
        if saved is not None:
            stream.set_state(saved["host"]["data"])
            pending = saved.get("pending")
        start = int(state.step)
        if start >= cfg.run.steps:
            raise TrainError(f"the run is already at step {start} >= run.steps={cfg.run.steps}; "
                             "raise --steps to extend it")

        run = Run(cfg, out, algorithm, mesh, rules, tokenizer, stream, val_tasks, gt_tasks, prompt_len, graphdef,
                  rest, step_fn, batch_shardings, state_shardings,
                  jax.jit(algorithm.advantages), jax.jit(optax.tree.norm), ref_params,
                  _reference_logprobs(cfg, graphdef, rest, logp_from, batch_shardings), checkpoints,
                  checkpoints.rng, start)
        run.engine = open_engine(stack, cfg, run.model_of(state), tokenizer, mesh, rules, engine_factory)
        run.fleet, run.scorer = open_verifier(stack, cfg, fleet)
        run.writer, run.progress = open_recorder(stack, cfg, out, start, cfg.run.steps, cfg.name)
        run.pending = pending
        yield run, state


def _jit_update(cfg: Config, graphdef: nnx.GraphDef, rest: nnx.State, tx: optax.GradientTransformation,
                mesh: jax.sharding.Mesh, rules: tuple, state: ts.TrainState, seq: int, logp_from: int,
                with_ref: bool) -> tuple[ts.ShardedStep, ts.Batch, ts.TrainState]:
    """The jitted update for rows of `seq` tokens whose loss mask is 0 before `logp_from`, with the batch
    and state shardings."""
    rows = cfg.data.tasks_per_step * cfg.rollout.group_size
    batch_devices = math.prod(mesh.shape[a] for a in dict(rules)["batch"])
    if (rows // cfg.run.micro_batches) % batch_devices:
        warn(f"a micro-batch of {rows // cfg.run.micro_batches} rows does not split over the {batch_devices} "
             f"devices of the batch axes: it is replicated")
    spec = jax.ShapeDtypeStruct
    abstract_batch = ts.Batch(
        tokens_BxT=spec((rows, seq), jnp.int32), loss_mask_BxT=spec((rows, seq), jnp.int32),
        old_logp_BxT=spec((rows, seq), jnp.float32), advantages_BxS=spec((rows, 1), jnp.float32),
        ref_logp_BxT=spec((rows, seq), jnp.float32) if with_ref else None,
        segment_ids_BxT=spec((rows, seq), jnp.int32))
    abstract_state = jax.eval_shape(lambda s: s, state)
    step_cfg = ts.TrainStepConfig(cfg.loss, cfg.optimizer, cfg.run.micro_batches, logp_from)
    step_fn = ts.jit_train_step(graphdef, rest, tx, step_cfg, mesh, abstract_state, abstract_batch, rules)
    return (step_fn, ts.batch_shardings(abstract_batch, mesh, rules),
            ts.state_shardings(abstract_state, mesh, rules))


def _reference_logprobs(cfg: Config, graphdef: nnx.GraphDef, rest: nnx.State, logp_from: int,
                        batch_shardings: ts.Batch) -> Callable[..., jax.Array]:
    """Jitted log-probs of the batch's tokens under given (reference) parameters, from `logp_from` on."""

    def ref_logprobs(params, tokens, seg):
        m = nnx.merge(graphdef, params, rest)
        hidden = m(tokens, segment_ids=seg, return_hidden=True)[:, logp_from - 1:]
        logp = chunked_logprobs(hidden, m.lm_head_weight(), tokens[:, logp_from - 1:], cfg.loss.logp_chunk,
                                cfg.loss.temperature)[0]
        return jnp.pad(logp, ((0, 0), (logp_from - 1, 0)))

    return jax.jit(ref_logprobs, out_shardings=batch_shardings.old_logp_BxT)
