"""Every check a training run can make before it writes anything, builds data or initialises a model.

`check(cfg, resume)` raises `TrainError` (exit 2, one line naming the key) for: the
algorithm (its estimator importable, its options accepted), the engine (registered,
and able to return the policy's log-probs), paths, the agent's episode length
against the model's context, the mesh against the devices, the batch against the
micro-batches, and `--out` against `--resume`.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxrl import algorithms
from jaxrl.config import Config, load_config, to_dict
from jaxrl.errors import TrainError
from jaxrl.rollout.engine import engine_factory
from models import sharding as msh

# Keys that may differ between a run and its resumption (a run directory may move).
RESUMABLE_CHANGES = ("run.steps", "run.progress", "run.out")


def check(cfg: Config, resume: bool) -> algorithms.Resolved:
    """Raise `TrainError` for the first thing that would stop the run; else its resolved algorithm."""
    a = cfg.algorithm
    try:
        algorithm = algorithms.resolve(a.name, a.estimator, a.terms, a.weights, a.options, cfg.reward.lam)
    except algorithms.AlgorithmError as e:
        raise TrainError(str(e)) from None
    _check_estimator_shapes(algorithm, cfg.data.tasks_per_step * jax.process_count(), cfg.rollout.group_size,
                            cfg.algorithm.estimator)
    _check_engine(cfg.rollout.engine)
    _check_paths(cfg)
    _check_agent_context(cfg)
    try:
        msh.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, expert=cfg.mesh.expert)
    except ValueError as e:
        raise TrainError(f"mesh: {e}") from None
    rows = cfg.data.tasks_per_step * cfg.rollout.group_size
    if rows % cfg.run.micro_batches:
        raise TrainError(f"run.micro_batches={cfg.run.micro_batches} does not divide the {rows} rollouts of a step")
    if rows % jax.process_count():
        raise TrainError(f"the {rows} rollouts of a step do not split over {jax.process_count()} hosts")
    _check_out(cfg, resume)
    return algorithm


def _check_estimator_shapes(algorithm: algorithms.Resolved, n: int, g: int, spec: str | None) -> None:
    """Trace the estimator on the run's shapes (no data): it must map [N, G, K] rewards to [N, G]."""
    k = len(algorithm.terms)
    where = f"algorithm.estimator {spec}" if spec else "algorithm"
    try:
        out = jax.eval_shape(algorithm.advantages, jax.ShapeDtypeStruct((n, g, k), jnp.float32),
                             jax.ShapeDtypeStruct((n, g), jnp.int32))
    except Exception as e:  # noqa: BLE001 - any failure of the user's function: one line
        raise TrainError(f"{where}: tracing it on rewards [{n}, {g}, {k}] failed ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if getattr(out, "shape", None) != (n, g):
        raise TrainError(f"{where}: returns {getattr(out, 'shape', type(out).__name__)} for rewards [{n}, {g}, {k}], "
                         f"not one advantage per rollout [{n}, {g}]")


def _check_engine(name: str) -> None:
    try:
        engine_factory(name)
    except ValueError as e:
        raise TrainError(f"rollout.engine: {e}") from None


def _check_paths(cfg: Config) -> None:
    for key in ("train", "val", "gt_debug"):
        path = getattr(cfg.data, key)
        if path is not None and not Path(path).expanduser().is_file():
            raise TrainError(f"data.{key}: no such file {path}")
    if cfg.model.checkpoint is not None and not (Path(cfg.model.checkpoint).expanduser() / "config.json").is_file():
        raise TrainError(f"model.checkpoint: no config.json in {cfg.model.checkpoint}")
    out = Path(cfg.run.out).expanduser()
    if out.exists() and not out.is_dir():
        raise TrainError(f"run.out: {out} is a file, not a directory")


def model_context(cfg: Config) -> int:
    """The model's context in tokens (`max_position_embeddings` of its HF config; 32768 when unset)."""
    if cfg.model.architecture is not None:
        hf = dict(cfg.model.architecture)
    else:
        hf = json.loads((Path(cfg.model.checkpoint).expanduser() / "config.json").read_text())
    hf = hf.get("text_config", hf)  # Qwen3.5 checkpoints nest the language model's config
    return int(hf.get("max_position_embeddings", 32768))


def _check_agent_context(cfg: Config) -> None:
    agent = cfg.rollout.agent
    if agent is not None and agent.max_context > model_context(cfg):
        raise TrainError(f"rollout.agent.max_context={agent.max_context} exceeds the model's context of "
                         f"{model_context(cfg)} tokens (max_position_embeddings)")


def has_checkpoint(out: Path) -> bool:
    """Whether `out/checkpoints` holds a finalized step (Orbax's temporary directories do not count)."""
    d = out / "checkpoints"
    return d.is_dir() and any(p.is_dir() and p.name.isdigit() for p in d.iterdir())


def _check_out(cfg: Config, resume: bool) -> None:
    out = Path(cfg.run.out).expanduser()
    if resume:
        if not has_checkpoint(out):
            raise TrainError(f"no checkpoint in {out}; drop --resume to start a new run")
        if (out / "config.yaml").is_file():
            _check_config_matches(out / "config.yaml", cfg)
    elif has_checkpoint(out):
        raise TrainError(f"{out} already holds a run; pass --resume to continue it or choose another --out")


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
