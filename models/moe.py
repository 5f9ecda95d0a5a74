"""Mixture-of-experts feed-forward shared by the MoE families (Flax NNX).

Routing is transformers' `Qwen3MoeTopKRouter`: softmax over all experts in
float32, the top k probabilities (optionally renormalized to sum to 1), cast
back to the compute dtype.

Ties go to the lower expert index (`jax.lax.top_k`'s rule). torch's `topk`
promises no order among equal values, and its CPU kernel does not pick the
lower index (`topk([.3, .3, .3, .1], 2)` gives experts 2 and 0), nor does it
agree with its CUDA kernel. So a tie at the k-th place between two
different experts with nonzero probability is resolved by each framework in
its own way; every other tie (inside the top k, or among probabilities that
underflowed to 0, so weight 0) gives the same output on both sides, and
`tests/test_qwen3_moe.py` checks that. Our sampler and trainer share this
rule, so a rollout and its update always agree.

The experts are dropless: every (token, choice) pair is sorted by expert and
the experts run as one grouped matmul (`jax.lax.ragged_dot`) over the sorted
rows, so no token is dropped unless a capacity factor is asked for.

Expert parallelism: when the active mesh (`models.sharding.use_mesh`) has an
`expert` axis of size n > 1 that divides the number of experts, the experts'
weights are split n ways and the feed-forward runs under `jax.shard_map`
over that axis alone (the other mesh axes stay automatic). Each expert shard
sees every token, computes only the pairs routed to its own experts, and a
`psum` over the axis combines them: an all-gather dispatch and a reduce-sum
combine, inside the same jitted step as the rest of the model.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from models.layers import INIT_STD, MLP, Dense, Dtype
from models.sharding import current_mesh

Array = jax.Array

EXPERT_AXIS = "expert"


def route(logits: Array, top_k: int, norm_topk_prob: bool, dtype: Dtype) -> tuple[Array, Array]:
    """Top-k softmax routing of router logits `[N, E]`.

    Returns `(weights [N, k] in dtype, experts [N, k] int32)`, highest
    probability first; equal probabilities go to the lower expert index.
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top, experts = jax.lax.top_k(probs, top_k)
    if norm_topk_prob:
        top = top / top.sum(axis=-1, keepdims=True)
    return top.astype(dtype), experts.astype(jnp.int32)


def replay_weights(logits: Array, experts: Array, norm_topk_prob: bool, dtype: Dtype) -> Array:
    """Routing weights `[N, k]` for given expert choices `[N, k]` (routing replay).

    The same arithmetic as `route` with the choices imposed, so replaying a
    forward pass's own choices gives its weights bit for bit.
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top = jnp.take_along_axis(probs, experts, axis=-1)
    if norm_topk_prob:
        top = top / top.sum(axis=-1, keepdims=True)
    return top.astype(dtype)


def expert_ffn(x: Array, experts: Array, weights: Array, gate: Array, up: Array, down: Array, *,
               first_expert: int | Array = 0, capacity: int | None = None) -> Array:
    """`sum_k weights[n, k] * FFN_{experts[n, k]}(x[n])` for the experts held here.

    Args:
      x: tokens `[N, D]`.
      experts, weights: routing `[N, k]` (global expert ids).
      gate, up: `[E_here, D, I]`; down: `[E_here, I, D]` (SwiGLU experts
        `first_expert .. first_expert + E_here - 1`).
      capacity: keep at most this many pairs per expert (in token order) and
        drop the rest; None (default) drops nothing.

    Pairs routed to experts held elsewhere contribute zero. The pairs are
    sorted by expert (stable, so token order within an expert) and each
    matmul is one `ragged_dot` over the sorted rows.
    """
    n, k = experts.shape
    here = gate.shape[0]
    local = experts.reshape(-1) - first_expert
    held = (local >= 0) & (local < here)
    key = jnp.where(held, local, here)
    order = jnp.argsort(key, stable=True)
    sorted_key = key[order]
    sizes = jnp.bincount(key, length=here + 1)[:here].astype(jnp.int32)
    keep = sorted_key < here
    if capacity is not None:
        starts = jnp.cumsum(sizes) - sizes
        rank = jnp.arange(n * k) - starts[jnp.minimum(sorted_key, here - 1)]
        keep = keep & (rank < capacity)
    token = order // k
    rows = x[token]
    h = jax.nn.silu(jax.lax.ragged_dot(rows, gate, sizes)) * jax.lax.ragged_dot(rows, up, sizes)
    y = jax.lax.ragged_dot(h.astype(x.dtype), down, sizes)
    w = weights.reshape(-1)[order].astype(x.dtype)
    # `where`, not a product: rows past the last group are left undefined by ragged_dot.
    y = jnp.where(keep[:, None], y * w[:, None], 0)
    return jnp.zeros_like(x).at[token].add(y)


def capacity_for(tokens: int, top_k: int, num_experts: int, factor: float | None) -> int | None:
    """Per-expert capacity `ceil(factor * tokens * k / E)`, or None (dropless) without a factor."""
    if factor is None:
        return None
    return max(1, math.ceil(factor * tokens * top_k / num_experts))


def dispatch(x: Array, experts: Array, weights: Array, gate: Array, up: Array, down: Array, *,
             capacity: int | None = None) -> Array:
    """`expert_ffn` over all experts, split over the mesh's `expert` axis when there is one.

    Without an active mesh, or with an `expert` axis of size 1 or one that
    does not divide the number of experts, this is `expert_ffn` on one shard.
    """
    mesh = current_mesh()
    n_shards = 1 if mesh is None else dict(mesh.shape).get(EXPERT_AXIS, 1)
    num_experts = gate.shape[0]
    if n_shards == 1 or num_experts % n_shards:
        return expert_ffn(x, experts, weights, gate, up, down, capacity=capacity)
    per_shard = num_experts // n_shards

    def shard(x, experts, weights, gate, up, down):
        # Mark the replicated inputs as varying over the axis, so their cotangents
        # (each shard's part) are summed over it in the backward pass.
        x, weights = jax.lax.pcast((x, weights), EXPERT_AXIS, to="varying")
        first = jax.lax.axis_index(EXPERT_AXIS) * per_shard
        y = expert_ffn(x, experts, weights, gate, up, down, first_expert=first, capacity=capacity)
        return jax.lax.psum(y, EXPERT_AXIS)

    split, whole = PartitionSpec(EXPERT_AXIS), PartitionSpec()
    return jax.shard_map(shard, mesh=mesh, in_specs=(whole, whole, whole, split, split, split), out_specs=whole,
                         axis_names={EXPERT_AXIS})(x, experts, weights, gate, up, down)


class Experts(nnx.Module):
    """`E` SwiGLU experts stacked on a leading `expert` axis: gate/up `[E, D, I]`, down `[E, I, D]`."""

    def __init__(self, num_experts: int, dim: int, hidden: int, *, dtype: Dtype, param_dtype: Dtype,
                 rngs: nnx.Rngs):
        self.dtype = dtype

        def param(shape, axes):
            w = INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)
            return nnx.Param(w.astype(param_dtype), axes=axes)

        self.gate_proj = param((num_experts, dim, hidden), ("expert", "embed", "moe_mlp"))
        self.up_proj = param((num_experts, dim, hidden), ("expert", "embed", "moe_mlp"))
        self.down_proj = param((num_experts, hidden, dim), ("expert", "moe_mlp", "embed"))

    def __call__(self, x: Array, experts: Array, weights: Array, capacity: int | None = None) -> Array:
        """Tokens `[N, D]` through their routed experts, weighted and summed."""
        w = [p[...].astype(self.dtype) for p in (self.gate_proj, self.up_proj, self.down_proj)]
        return dispatch(x.astype(self.dtype), experts, weights, *w, capacity=capacity)


class SparseMoE(nnx.Module):
    """HF `Qwen3MoeSparseMoeBlock`: a linear router (`gate`) and the routed `experts`.

    `__call__(x, experts=None)` returns `(y, experts, router_logits)` for
    `x [B, T, D]`: `experts [B, T, k]` are the choices made, or the ones
    passed in (routing replay: the weights then come from this call's router
    probabilities of those experts).
    """

    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int, *, norm_topk_prob: bool,
                 capacity_factor: float | None = None, dtype: Dtype, param_dtype: Dtype, rngs: nnx.Rngs):
        self.num_experts, self.top_k, self.norm_topk_prob = num_experts, top_k, norm_topk_prob
        self.capacity_factor = capacity_factor
        self.dtype = dtype
        self.gate = Dense((dim,), (num_experts,), ("embed", "router"), dtype=dtype, param_dtype=param_dtype,
                          rngs=rngs)
        self.experts = Experts(num_experts, dim, hidden, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: Array, experts: Array | None = None) -> tuple[Array, Array, Array]:
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        logits = self.gate(flat)
        if experts is None:
            weights, chosen = route(logits, self.top_k, self.norm_topk_prob, self.dtype)
        else:
            chosen = experts.reshape(b * t, self.top_k).astype(jnp.int32)
            weights = replay_weights(logits, chosen, self.norm_topk_prob, self.dtype)
        capacity = capacity_for(b * t, self.top_k, self.num_experts, self.capacity_factor)
        y = self.experts(flat, chosen, weights, capacity)
        return (y.reshape(b, t, d), chosen.reshape(b, t, self.top_k),
                logits.reshape(b, t, self.num_experts))


def load_balancing_loss(router_logits: Array, experts: Array, num_experts: int, mask: Array | None = None) -> Array:
    """Switch-style auxiliary loss `E * sum_e f_e * P_e` (1.0 when routing is uniform).

    `f_e` is the fraction of (token, choice) pairs sent to expert e and `P_e`
    the mean router probability of e, both over the tokens where `mask` is 1.
    `router_logits [..., E]`, `experts [..., k]`, `mask` broadcastable to the
    leading dims (default: all tokens).
    """
    probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1).reshape(-1, num_experts)
    chosen = jax.nn.one_hot(experts.reshape(probs.shape[0], -1), num_experts, dtype=jnp.float32).sum(axis=1)
    m = jnp.ones((probs.shape[0],), jnp.float32) if mask is None else jnp.broadcast_to(
        mask, router_logits.shape[:-1]).reshape(-1).astype(jnp.float32)
    count = jnp.maximum(m.sum(), 1.0)
    frac = (chosen * m[:, None]).sum(axis=0) / (count * experts.shape[-1])
    mean_prob = (probs * m[:, None]).sum(axis=0) / count
    return num_experts * jnp.sum(frac * mean_prob)


class SharedExpertMoE(SparseMoE):
    """HF `Qwen3_5MoeSparseMoeBlock`: routed experts plus a shared SwiGLU expert gated per token.

    `y = routed(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)`; the
    router always renormalizes its top k. Unlike `SparseMoE`, the call returns
    `y [B, T, D]` alone (the hybrid stack does not thread routing through).
    """

    def __init__(self, dim: int, hidden: int, shared_hidden: int, num_experts: int, top_k: int, *,
                 capacity_factor: float | None = None, dtype: Dtype, param_dtype: Dtype, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        super().__init__(dim, hidden, num_experts, top_k, norm_topk_prob=True, capacity_factor=capacity_factor, **kw)
        self.shared_expert = MLP(dim, shared_hidden, **kw)
        self.shared_expert_gate = Dense((dim,), (1,), ("embed", None), **kw)

    def __call__(self, x: Array) -> Array:  # type: ignore[override]
        y, _, _ = super().__call__(x)
        return y + jax.nn.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
