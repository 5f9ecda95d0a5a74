"""The RL loop of `precisecoder train`: sample → score → advantages → update → push weights.

`train(cfg)` reads top to bottom as the method: set-up (mesh, tasks, model,
optimizer, jitted step, checkpoints, engine, fleet), then one loop whose body is
the paper's step, each stage one call into its own module:

    tasks      jaxrl.tasks       Grain: shuffled, repeated, batched, rendered prompts
    rollout    engine.generate   G completions per prompt, with sampler log-probs
    reward     jaxrl.rewards     Grain map of the scorer over the fleet's sandboxes
    advantages jaxrl.advantages  the algorithm's estimator on rewards [N, G, K], jitted
    update     jaxrl.train_step  the jitted, sharded, micro-batched policy update
    push       engine.update_weights
    every k:   jaxrl.validate, jaxrl.checkpoint, jaxrl.metrics.plot_curves

Every host runs the same code on its own slice of tasks and its own fleet; the
update and the advantages see the global batch.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl import advantages as adv
from jaxrl import hosts
from jaxrl import metrics as M
from jaxrl import rewards as R
from jaxrl import tasks as T
from jaxrl import train_step as ts
from jaxrl.batching import make_batch, pad_length, rollout_rows, to_global
from jaxrl.checkpoint import Checkpointer, abstract_with_shardings
from jaxrl.config import Config, apply_override, from_dict, load_config, read_yaml, to_dict, to_yaml
from jaxrl.host_digest import check_hosts_agree
from jaxrl.losses import chunked_logprobs
from jaxrl.rollout import Engine, SamplingParams, make_engine
from jaxrl.rollout.engine import BUILTIN_ENGINES, ENGINES
from jaxrl.validate import validate
from models import sharding as msh
from models.tokenizer import load_tokenizer
from reward.fleet import Fleet
from reward.sandbox import Limits

# Keys that may differ between a run and its resumption.
RESUMABLE_CHANGES = ("run.steps", "run.progress")


class TrainError(RuntimeError):
    """A run that cannot start or continue; the message says why (and the run stays resumable)."""


def _warn(msg: str) -> None:
    if hosts.is_primary():
        print(f"WARNING: {msg}", file=sys.stderr, flush=True)


def build_model(cfg: Config, mesh: jax.sharding.Mesh, rules: tuple) -> nnx.Module:
    """The policy from an HF checkpoint or a random initialisation, parameters on their shards."""
    from models.checkpoint import from_pretrained, load_config as hf_config, model_class

    m = cfg.model
    dtype, param_dtype = jnp.dtype(m.dtype), jnp.dtype(m.param_dtype)
    if m.checkpoint is not None:
        if not (Path(m.checkpoint).expanduser() / "config.json").is_file():
            raise TrainError(f"model.checkpoint: no config.json in {m.checkpoint}")
        return from_pretrained(Path(m.checkpoint).expanduser(), dtype, param_dtype=param_dtype, mesh=mesh,
                               rules=rules, remat=m.remat, attention_impl=m.attention)
    try:
        hf = hf_config({"model_type": m.family, **m.architecture})
    except (KeyError, ValueError, TypeError, NotImplementedError) as e:
        raise TrainError(f"model.architecture: {e}") from None
    cls = model_class(hf)
    return msh.init_sharded(lambda: cls(hf, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(m.init_seed),
                                        remat=m.remat, attention_impl=m.attention), mesh, rules)


def locate_run(path: str | Path) -> tuple[Path, Path, int | None]:
    """(run directory, checkpoint directory, step or None for the latest) of a checkpoint path.

    Accepted: a run directory (its `checkpoints/`), a run's `checkpoints/` or `best/`,
    or one step directory inside them (`run/checkpoints/250`).
    """
    path = Path(path).expanduser()
    if (path / "config.yaml").is_file():
        return path, path / "checkpoints", None
    if (path.parent / "config.yaml").is_file():
        return path.parent, path, None
    if path.name.isdigit() and (path.parent.parent / "config.yaml").is_file():
        return path.parent.parent, path.parent, int(path.name)
    raise TrainError(f"{path}: not a `precisecoder train` run, its checkpoints/ or best/, "
                     "or a step directory in them (no config.yaml found)")


def load_policy(path: str | Path, *, dtype: str | None = None, mesh: jax.sharding.Mesh | None = None
                ) -> tuple[nnx.Module, Config, int]:
    """The policy a `train` run saved, for sampling and evaluation.

    The run's config.yaml rebuilds the model; the parameters of the checkpoint that
    `path` names (see `locate_run`) replace its weights, read alone from disk onto
    their shards (`mesh`, default: fsdp over every local device).

    Args:
        path: a run directory, its checkpoints/ or best/, or a step directory in them.
        dtype: compute dtype to run at (default: the run's `model.dtype`).
        mesh: where the parameters go.

    Returns:
        (model, the run's config, step). Raises `TrainError` with the reason.
    """
    run, ckpt_dir, step = locate_run(path)
    try:
        cfg = load_config(run / "config.yaml")
        if dtype is not None:
            cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=dtype))
        rules = msh.rules_from_mapping(cfg.mesh.rules)
        mesh = msh.make_mesh(1, -1, 1) if mesh is None else mesh
        graphdef, params, rest = nnx.split(build_model(cfg, mesh, rules), nnx.Param, ...)
        abstract = abstract_with_shardings(jax.eval_shape(lambda p: p, params),
                                           msh.state_shardings(params, mesh, rules))
        del params
        checkpointer = Checkpointer(ckpt_dir, async_save=False)
        try:
            params, step = checkpointer.restore_params(abstract, step)
        finally:
            checkpointer.close()
    except (FileNotFoundError, ValueError, KeyError, TypeError) as e:
        raise TrainError(f"{path}: {e}") from None
    return nnx.merge(graphdef, params, rest), cfg, step


def make_engine_for(cfg: Config, model: nnx.Module, tokenizer: Any, mesh: jax.sharding.Mesh,
                    rules: tuple) -> Engine:
    """The configured engine: `tokenizer` and `rollout.options` for all; an in-process engine
    (one whose constructor takes `model`) also gets the model, the mesh and the rules."""
    name = cfg.rollout.engine
    if name not in ENGINES and name in BUILTIN_ENGINES:
        importlib.import_module(BUILTIN_ENGINES[name])
    kwargs: dict[str, Any] = {"tokenizer": tokenizer, **cfg.rollout.options}
    if name in ENGINES and "model" in inspect.signature(ENGINES[name]).parameters:
        kwargs |= {"model": model, "mesh": mesh, "rules": rules}
    return make_engine(name, **kwargs)


def _check_config_matches(saved: Path, cfg: Config) -> None:
    old = to_dict(load_config(saved))
    new = to_dict(cfg)
    diffs = []

    def walk(a, b, prefix):
        for k in sorted(set(a) | set(b)):
            key = f"{prefix}{k}"
            if isinstance(a.get(k), dict) and isinstance(b.get(k), dict) and not key.endswith(("options", "rules",
                                                                                                 "architecture")):
                walk(a[k], b[k], key + ".")
            elif a.get(k) != b.get(k) and key not in RESUMABLE_CHANGES:
                diffs.append(f"{key}: {a.get(k)!r} -> {b.get(k)!r}")

    walk(old, new, "")
    if diffs:
        raise TrainError(f"--resume with a different config than {saved}: " + "; ".join(diffs))


def train(cfg: Config, *, resume: bool = False, engine_factory: Callable[..., Engine] | None = None,
          tokenizer: Any = None) -> dict[str, Any]:
    """Run (or resume) the RL loop of `cfg` to `cfg.run.steps`; returns the last step's metrics.

    `engine_factory(cfg, model, tokenizer, mesh, rules)` replaces `make_engine_for`. `tokenizer`
    replaces the Qwen tokenizer of `cfg.model.family` (`precisecoder demo` passes its own
    small vocabulary with the same interface).
    """
    try:
        check_hosts_agree(cfg)
    except hosts.HostsDisagree as e:
        raise TrainError(str(e)) from None
    out = Path(cfg.run.out).expanduser()
    saved_config = out / "config.yaml"
    if resume and saved_config.is_file():
        _check_config_matches(saved_config, cfg)
    elif not resume and (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir()):
        raise TrainError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    if hosts.is_primary():
        out.mkdir(parents=True, exist_ok=True)
        saved_config.write_text(to_yaml(cfg))

    # ---- mesh
    rules = msh.rules_from_mapping(cfg.mesh.rules)
    try:
        mesh = msh.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    except ValueError as e:
        raise TrainError(f"mesh: {e}") from None
    pi, pc = jax.process_index(), jax.process_count()

    # ---- tasks
    tokenizer = load_tokenizer(cfg.model.family) if tokenizer is None else tokenizer
    build = None
    if cfg.data.build is not None:
        build = T.ensure_built(cfg.data.build, cfg.reward.workers, cfg.reward.isolation, progress=cfg.run.progress)
    paths = T.task_paths(cfg.data, build)
    train_tasks = T.with_clean_rows(T.read_tasks(paths["train"], "train"), cfg.data.clean_share, cfg.data.seed)
    val_tasks = T.read_tasks(paths["val"], "val", cfg.validation.val_tasks)
    gt_tasks = T.read_tasks(paths["gt_debug"], "gt_debug", cfg.validation.gt_debug_tasks)
    stream = T.TaskStream(train_tasks, cfg.data.tasks_per_step, cfg.data.seed, tokenizer, cfg.data.prompt, pi, pc)
    prompt_len = pad_length(max(len(T.render(t, tokenizer, cfg.data.prompt).prompt_ids) for t in train_tasks),
                            cfg.data.prompt_multiple)

    stops = R.stop_texts(tokenizer)

    # ---- model, optimizer, train state
    model = build_model(cfg, mesh, rules)
    undivided = msh.undivided(nnx.split(model, nnx.Param, ...)[1], mesh, rules)
    if undivided:
        msg = "mesh axes that do not divide a parameter dimension (replicated instead):\n  " + "\n  ".join(undivided)
        if cfg.mesh.strict:
            raise TrainError(msg)
        _warn(msg)
    tx = ts.make_optimizer(cfg.optimizer)
    state, graphdef, rest = ts.init_train_state(model, tx, mesh, rules)
    ref_params = jax.tree.map(jnp.copy, state.params) if cfg.loss.kl_coef > 0 else None

    rows = cfg.data.tasks_per_step * cfg.rollout.group_size
    seq = prompt_len + cfg.rollout.max_tokens
    batch_devices = math.prod(mesh.shape[a] for a in dict(rules)["batch"])
    if rows % cfg.run.micro_batches:
        raise TrainError(f"run.micro_batches={cfg.run.micro_batches} does not divide the {rows} rollouts of a step")
    if (rows // cfg.run.micro_batches) % batch_devices:
        _warn(f"a micro-batch of {rows // cfg.run.micro_batches} rows does not split over the {batch_devices} "
              f"devices of the batch axes: it is replicated")
    spec = jax.ShapeDtypeStruct
    abstract_batch = ts.Batch(
        tokens_BxT=spec((rows, seq), jnp.int32), loss_mask_BxT=spec((rows, seq), jnp.int32),
        old_logp_BxT=spec((rows, seq), jnp.float32), advantages_BxS=spec((rows, 1), jnp.float32),
        ref_logp_BxT=spec((rows, seq), jnp.float32) if ref_params is not None else None,
        segment_ids_BxT=spec((rows, seq), jnp.int32))
    abstract_state = jax.eval_shape(lambda s: s, state)
    state_shardings = ts.state_shardings(abstract_state, mesh, rules)
    batch_shardings = ts.batch_shardings(abstract_batch, mesh, rules)
    step_fn = ts.jit_train_step(graphdef, rest, tx, ts.TrainStepConfig(cfg.loss, cfg.optimizer, cfg.run.micro_batches, prompt_len),
                                mesh, abstract_state, abstract_batch, rules)

    estimator = R.ESTIMATOR[cfg.algorithm.name]
    term_names = R.TERM_NAMES[cfg.algorithm.name]
    adv_cfg = adv.AdvantageConfig(estimator, R.term_weights(cfg.algorithm.name, cfg.reward.lam),
                                  dict(cfg.algorithm.options))
    param_norm_fn = jax.jit(optax.tree.norm)
    advantages_fn = jax.jit(lambda r, lengths: adv.compute_advantages(adv_cfg, r, lengths))

    def ref_logprobs(params, tokens, seg):
        m = nnx.merge(graphdef, params, rest)
        hidden = m(tokens, segment_ids=seg, return_hidden=True)[:, prompt_len - 1:]
        logp = chunked_logprobs(hidden, m.lm_head_weight(), tokens[:, prompt_len - 1:], cfg.loss.logp_chunk,
                                cfg.loss.temperature)[0]
        return jnp.pad(logp, ((0, 0), (prompt_len - 1, 0)))

    ref_fn = jax.jit(ref_logprobs, out_shardings=batch_shardings.old_logp_BxT)

    # ---- checkpoints (resume)
    ckpt = Checkpointer(out / "checkpoints", max_to_keep=cfg.run.keep_last)
    best_ckpt = Checkpointer(out / "best", max_to_keep=1) if cfg.run.best_metric else None
    rng = jax.random.key(cfg.run.seed)
    best: float | None = None
    start = 0
    if resume and ckpt.latest_step() is not None:
        target = abstract_with_shardings(abstract_state, state_shardings)
        state, rng, extra = ckpt.restore(target)
        stream.set_state(extra["host"]["data"])
        best = extra.get("best")
        start = int(state.step)
    if start >= cfg.run.steps:
        raise TrainError(f"the run is already at step {start} >= run.steps={cfg.run.steps}; raise --steps to extend it")
    writer = M.MetricsWriter(out, cfg.run.tensorboard and hosts.is_primary(), start if resume else None) \
        if hosts.is_primary() else None

    def save(step_metrics: dict[str, float]) -> None:
        """Checkpoint this step; also as the best one when `run.best_metric` improved."""
        nonlocal best
        key = cfg.run.best_metric
        value = step_metrics.get(key) if key else None
        better = (best_ckpt is not None and value is not None and math.isfinite(value)
                  and (best is None or (value > best if cfg.run.best_mode == "max" else value < best)))
        if better:
            best = value
        ckpt.save(state, rng, {"best": best}, {"data": stream.get_state()})
        # A kill between the two saves can leave this step in best/ already; it is the same state.
        if better and int(state.step) not in best_ckpt.all_steps():
            best_ckpt.save(state, rng, {"best": best, "metric": key}, {"data": stream.get_state()})

    # ---- engine and fleet
    def current_model() -> nnx.Module:
        return nnx.merge(graphdef, state.params, rest)

    try:
        engine = (engine_factory or make_engine_for)(cfg, current_model(), tokenizer, mesh, rules)
    except (ValueError, TypeError) as e:
        raise TrainError(f"rollout.engine {cfg.rollout.engine!r}: {e}") from None
    fleet = Fleet(workers=cfg.reward.workers, isolation=cfg.reward.isolation)
    scorer = R.RewardPipeline(fleet, cfg.reward.lam, cfg.reward.epsilon, Limits(timeout_s=cfg.reward.timeout_s),
                              cfg.reward.threads)
    progress = None
    if cfg.run.progress and hosts.is_primary():
        from tqdm import tqdm
        progress = tqdm(total=cfg.run.steps, initial=start, desc=cfg.name, unit="step", dynamic_ncols=True)

    # ---- loop
    last: dict[str, Any] = {}
    try:
        for step in range(start, cfg.run.steps):
            timer = M.StageTimer()
            with timer("data"):
                batch_tasks = next(stream)
            with timer("rollout"):
                seed = int(jax.random.randint(jax.random.fold_in(rng, step), (), 0, 2 ** 31 - 1))
                params = SamplingParams(n=cfg.rollout.group_size, temperature=cfg.rollout.temperature,
                                        top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                                        max_tokens=cfg.rollout.max_tokens,
                                        thinking_budget=cfg.rollout.thinking_budget, seed=seed)
                try:
                    groups = engine.generate([r.prompt_ids for r in batch_tasks], params)
                except Exception as e:  # noqa: BLE001 - any engine failure ends the run resumably
                    raise TrainError(f"step {step + 1}: the rollout engine failed ({type(e).__name__}: {e}); "
                                     f"continue from the last checkpoint with --resume") from e
            with timer("reward"):
                flat = [(r.task, c) for r, group in zip(batch_tasks, groups) for c in group]
                pairs = [(r.task, R.prediction_of(r.task, R.response_text(c, stops), r.think_opened))
                         for r, group in zip(batch_tasks, groups) for c in group]
                scores = scorer(pairs)
                local_terms = np.asarray([R.terms(cfg.algorithm.name, s, t) for s, (t, _) in zip(scores, flat)],
                                         np.float32)
                columns = hosts.gather_rows(M.rollout_columns(scores, [c for _, c in flat],
                                                              [not t.is_clean for t, _ in flat], tokenizer.think_end_id))
                all_terms = hosts.gather_rows(local_terms)
            with timer("advantages"):
                g = cfg.rollout.group_size
                lengths = columns[:, M.COLUMNS.index("response_tokens")].reshape(-1, g)
                adv_NxG = np.asarray(advantages_fn(all_terms.reshape(-1, g, len(term_names)), lengths))
                local_rows = len(flat)
                local_adv = adv_NxG.reshape(-1)[pi * local_rows:(pi + 1) * local_rows]
            with timer("update"):
                rows_np = rollout_rows([r.prompt_ids for r in batch_tasks], groups, prompt_len,
                                       cfg.rollout.max_tokens, tokenizer.pad_id)
                batch = to_global(make_batch(rows_np, local_adv), dataclasses.replace(batch_shardings,
                                                                                      ref_logp_BxT=None))
                if ref_params is not None:
                    with msh.use_mesh(mesh, rules):
                        batch = batch.replace(ref_logp_BxT=ref_fn(ref_params, batch.tokens_BxT,
                                                                  batch.segment_ids_BxT))
                state, update_metrics = step_fn(state, batch)
                update_metrics = {f"update/{k}": float(v) for k, v in jax.device_get(update_metrics).items()}
                update_metrics["update/param_norm"] = float(param_norm_fn(state.params))
            with timer("push"):
                try:
                    engine.update_weights(current_model(), step=step + 1)
                except Exception as e:  # noqa: BLE001
                    raise TrainError(f"step {step + 1}: pushing weights to the engine failed ({type(e).__name__}: "
                                     f"{e}); continue from the last checkpoint with --resume") from e

            done = step + 1
            metrics: dict[str, Any] = {**M.rollout_metrics(columns, all_terms, term_names), **update_metrics,
                                       "advantage/abs_mean": float(np.abs(adv_NxG).mean())}
            validating = (cfg.run.eval_every and done % cfg.run.eval_every == 0) or done == cfg.run.steps
            if validating and (val_tasks or gt_tasks):
                with timer("validate"):
                    metrics |= validate(engine, tokenizer, scorer, val_tasks + gt_tasks, cfg, cfg.run.seed + done)
            if (cfg.run.save_every and done % cfg.run.save_every == 0) or done == cfg.run.steps:
                with timer("save"):
                    save(metrics)
            metrics |= timer.metrics()
            if writer is not None:
                writer.write(done, metrics)
                if validating:
                    M.plot_curves(M.read_metrics(writer.path), out / "curves.png", term_names)
            if progress is not None:
                progress.update(1)
                progress.set_postfix({k.split("/")[-1]: f"{metrics[k]:.3g}" for k in
                                      ("rollout/pass", "rollout/f1", "rollout/edited_lines", "time/step")
                                      if k in metrics and metrics[k] is not None and math.isfinite(metrics[k])})
            last = metrics
    finally:
        ckpt.close()
        if best_ckpt is not None:
            best_ckpt.close()
        engine.close()
        scorer.close()
        fleet.close()
        if writer is not None:
            writer.close()
        if progress is not None:
            progress.close()
    return last


def config_from_args(name_or_path: str, overrides: list[str], steps: int | None, out: str | None) -> Config:
    """The run's config: the file, then `--set` overrides, then `--steps` and `--out`."""
    raw = read_yaml(name_or_path)
    for o in overrides:
        raw = apply_override(raw, o)
    run = dict(raw.get("run") or {})
    if steps is not None:
        run["steps"] = steps
    if out is not None:
        run["out"] = out
    return from_dict(Config, {**raw, "run": run})
