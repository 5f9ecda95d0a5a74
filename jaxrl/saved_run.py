"""A trained run, read back: its model rebuilt from config.yaml, its parameters from a checkpoint.

`load_policy` is what evaluation, `generate --checkpoint` and the demo use; it lives
apart from the training loop so that reading a run never imports the trainer.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl.checkpoint import Checkpointer, abstract_with_shardings
from jaxrl.config import Config, load_config
from jaxrl.errors import TrainError
from models import sharding as msh


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
