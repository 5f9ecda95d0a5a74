"""Logical axis names → mesh axes, as data.

Every parameter of our models carries logical axis names in its `axes`
metadata (e.g. `("embed", "mlp")`); activations are constrained at block
boundaries with `constrain(x, ("batch", "seq", "act_embed"))`. Model code never
names a physical mesh axis: `RULES` (or a preset's own rules) maps each logical
name to zero or more of the mesh axes `data`, `fsdp`, `expert`, `tensor`.

The `expert` axis splits the routed experts of MoE models (`models.moe`) and,
outside the experts, shards the batch like `data`; it has size 1 unless asked for.

A mesh axis is dropped from a dimension it does not divide (e.g. 2 kv heads on
a tensor axis of 4), so one set of rules serves every model size.

Typical use (the RL train step does the same):

    mesh = make_mesh(data=1, fsdp=4, tensor=2)
    with use_mesh(mesh):
        model = init_sharded(lambda: Qwen3(cfg, rngs=nnx.Rngs(0)), mesh)
        logits = jax.jit(...)(...)
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "expert", "tensor")

# Logical name -> mesh axes (a tuple; empty means replicated). Order matters
# only within a tuple (major to minor). Parameters: embed, vocab, mlp, q_heads,
# kv_heads, head_dim, norm, layers, plus whatever a family adds. Activations:
# batch, seq, act_* (kept separate so a preset can shard them differently).
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # parameters
    ("embed", ("fsdp",)),
    ("vocab", ("tensor",)),
    ("mlp", ("tensor",)),
    ("q_heads", ("tensor",)),
    ("kv_heads", ("tensor",)),
    ("head_dim", ()),
    ("norm", ()),
    ("layers", ()),
    ("group", ()),
    ("conv_in", ()),
    ("conv_kernel", ()),
    ("expert", ("expert",)),
    ("moe_mlp", ("tensor",)),
    ("router", ()),
    # activations
    ("batch", ("data", "fsdp", "expert")),
    ("seq", ()),
    ("cache_seq", ()),
    ("act_embed", ()),
    ("act_heads", ("tensor",)),
    ("act_kv_heads", ("tensor",)),
    ("act_mlp", ("tensor",)),
    ("act_vocab", ("tensor",)),
)

_CTX: contextvars.ContextVar[tuple[Mesh, tuple] | None] = contextvars.ContextVar("models_sharding", default=None)


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[Any] | None = None, *,
              expert: int = 1) -> Mesh:
    """A `(data, fsdp, expert, tensor)` mesh over `devices` (default: all).

    One size may be -1: it takes the devices the others leave. The product
    must equal the number of devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, expert, tensor]
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh size may be -1, got {sizes}")
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices do not split into {sizes}")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, have {len(devices)}")
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=auto, devices=devices)


def logical_to_spec(
    names: Sequence[str | None],
    rules: Sequence[tuple[str, Sequence[str]]] = RULES,
    shape: Sequence[int] | None = None,
    mesh: Mesh | None = None,
) -> PartitionSpec:
    """The PartitionSpec for one array with logical axis `names`.

    With `shape` and `mesh`, a mesh axis that does not divide its dimension is
    dropped (that dimension is then replicated along it). A mesh axis is used
    at most once per array: a later dimension asking for one already taken
    does not get it. Unknown logical names are an error.
    """
    table = dict(rules)
    used: set[str] = set()
    spec: list[Any] = []
    for i, name in enumerate(names):
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise KeyError(f"no sharding rule for logical axis {name!r}; add it to the rules")
        axes = []
        size = shape[i] if shape is not None else None
        for ax in table[name]:
            if ax in used:
                continue
            if mesh is not None:
                n = dict(mesh.shape).get(ax, 1)
                if n == 1:
                    continue
                if size is not None:
                    if size % n:
                        continue
                    size //= n
            axes.append(ax)
            used.add(ax)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*spec)


def _axes_of(v: nnx.Variable) -> tuple[str | None, ...]:
    if not v.has_metadata("axes"):
        raise ValueError(f"parameter of shape {v.shape} has no `axes` metadata")
    axes = v.get_metadata("axes")
    if len(axes) != len(v.shape):
        raise ValueError(f"axes {axes} do not match shape {v.shape}")
    return tuple(axes)


def state_shardings(state: nnx.State, mesh: Mesh, rules: Sequence = RULES) -> nnx.State:
    """NamedShardings for every variable of an (abstract or concrete) nnx State.

    Variables without `axes` metadata (RNG counters and the like) are replicated.
    """

    def one(v):
        if isinstance(v, nnx.Variable):
            names = _axes_of(v) if v.has_metadata("axes") else (None,) * len(v.shape)
            return v.replace(NamedSharding(mesh, logical_to_spec(names, rules, v.shape, mesh)))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def init_sharded(ctor: Callable[[], nnx.Module], mesh: Mesh, rules: Sequence = RULES) -> nnx.Module:
    """Build `ctor()` with every parameter created directly on its shards.

    Shapes come from `nnx.eval_shape`, shardings from the rules; the
    constructor then runs under jit with those output shardings, so no device
    ever holds a whole unsharded parameter.
    """
    abstract = nnx.eval_shape(ctor)
    graphdef, abs_state = nnx.split(abstract)
    shardings = state_shardings(abs_state, mesh, rules)

    def build():
        return nnx.state(ctor())

    with use_mesh(mesh, rules):
        state = jax.jit(build, out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def shard_model(model: nnx.Module, mesh: Mesh, rules: Sequence = RULES) -> nnx.Module:
    """Move an existing model's state onto `mesh` according to `rules` (in place)."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, state_shardings(state, mesh, rules)))
    return model


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules: Sequence = RULES) -> Iterator[Mesh]:
    """Activate `mesh` and `rules` for `constrain` (and jax's own mesh context).

    Functions traced inside this context constrain their activations; traced
    outside it, `constrain` is the identity.
    """
    token = _CTX.set((mesh, tuple((k, tuple(v)) for k, v in rules)))
    try:
        with jax.set_mesh(mesh):
            yield mesh
    finally:
        _CTX.reset(token)


def current_mesh() -> Mesh | None:
    """The mesh set by `use_mesh`, or None."""
    ctx = _CTX.get()
    return None if ctx is None else ctx[0]


def current_rules() -> tuple:
    """The rules set by `use_mesh` (`RULES` when none is active)."""
    ctx = _CTX.get()
    return RULES if ctx is None else ctx[1]


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """Constrain an activation's sharding by logical axis names (no-op without a mesh)."""
    ctx = _CTX.get()
    if ctx is None:
        return x
    mesh, rules = ctx
    spec = logical_to_spec(names, rules, x.shape, mesh)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def named_sharding(names: Sequence[str | None], shape: Sequence[int] | None = None,
                   mesh: Mesh | None = None, rules: Sequence = RULES) -> NamedSharding:
    """A NamedSharding for logical `names` on `mesh` (default: the active one)."""
    mesh = mesh or current_mesh()
    if mesh is None:
        raise ValueError("no mesh given and none active (use `use_mesh`)")
    return NamedSharding(mesh, logical_to_spec(names, rules, shape, mesh))


def rules_from_mapping(mapping: Mapping[str, Sequence[str] | str | None]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Rules from a YAML-style mapping (`{embed: fsdp, mlp: [tensor], seq: null}`), merged over `RULES`."""
    table = dict(RULES)
    for k, v in mapping.items():
        table[k] = () if v is None else (v,) if isinstance(v, str) else tuple(v)
        bad = set(table[k]) - set(MESH_AXES)
        if bad:
            raise ValueError(f"rule {k!r} names unknown mesh axes {sorted(bad)}; use {MESH_AXES}")
    return tuple(table.items())


def bytes_per_device(state: nnx.State, mesh: Mesh, rules: Sequence = RULES) -> int:
    """Bytes of `state` held by the most loaded device under `rules` (for planning)."""
    total = 0
    shardings = state_shardings(state, mesh, rules)
    for v, s in zip(jax.tree.leaves(state), jax.tree.leaves(shardings)):
        shape = np.shape(v)
        shard = s.shard_shape(shape)
        total += math.prod(shard) * np.dtype(v.dtype).itemsize
    return total


def undivided(state: nnx.State, mesh: Mesh, rules: Sequence = RULES) -> list[str]:
    """Parameters whose rules ask for a mesh axis that does not divide the dimension.

    `logical_to_spec` then replicates that dimension along the axis (more memory
    per device than the rules promise); callers warn or refuse with this list.
    """
    found = []
    for path, v in nnx.to_flat_state(state):
        if not (isinstance(v, nnx.Variable) and v.has_metadata("axes")):
            continue
        names = _axes_of(v)
        wanted = logical_to_spec(names, rules, None, mesh)
        got = logical_to_spec(names, rules, v.shape, mesh)
        for dim, (w, g) in enumerate(zip(wanted, got)):
            w_axes = () if w is None else (w,) if isinstance(w, str) else tuple(w)
            g_axes = () if g is None else (g,) if isinstance(g, str) else tuple(g)
            lost = [a for a in w_axes if a not in g_axes]
            if lost:
                found.append(f"{'.'.join(map(str, path))} {tuple(v.shape)}: dim {dim} ({names[dim]}, size "
                             f"{v.shape[dim]}) not sharded over {lost} (mesh sizes "
                             f"{[mesh.shape[a] for a in lost]})")
    return found
