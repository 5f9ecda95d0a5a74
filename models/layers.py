"""Building blocks shared by every model family (Flax NNX).

Each `nnx.Param` carries logical axis names in its `axes` metadata (see
`models.sharding`); nothing here names a mesh axis. Modules keep HF's names
(`q_proj`, `gate_proj`, ...) so checkpoint conversion stays a table.

Conventions: activations are `[B, T, ...]`; attention heads are a separate
axis (`q [B, T, N, H]`, `k, v [B, T, K, H]`; the KV cache and `attend` take
keys and values as `[B, K, S, H]`); parameters are stored in
`param_dtype` and cast to the compute `dtype` at use.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import fused_attention
from models.sharding import constrain

Array = jax.Array
Dtype = Any

INIT_STD = 0.02


def _normal(rngs: nnx.Rngs, shape: Sequence[int], std: float, dtype: Dtype) -> Array:
    return (std * jax.random.normal(rngs.params(), tuple(shape), jnp.float32)).astype(dtype)


class Dense(nnx.Module):
    """`y = x · W (+ b)` contracting the last `len(in_shape)` dims of x.

    The kernel has shape `in_shape + out_shape` (e.g. q_proj: `(embed,) +
    (heads, head_dim)`), so head axes stay separate and shardable.
    """

    def __init__(self, in_shape: Sequence[int], out_shape: Sequence[int], axes: Sequence[str], *,
                 use_bias: bool = False, dtype: Dtype = jnp.float32, param_dtype: Dtype = jnp.float32,
                 rngs: nnx.Rngs, std: float = INIT_STD):
        self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)
        if len(axes) != len(self.in_shape) + len(self.out_shape):
            raise ValueError(f"axes {axes} do not match {self.in_shape} + {self.out_shape}")
        self.dtype = dtype
        self.kernel = nnx.Param(_normal(rngs, self.in_shape + self.out_shape, std, param_dtype), axes=tuple(axes))
        self.bias = (nnx.Param(jnp.zeros(self.out_shape, param_dtype), axes=tuple(axes[len(self.in_shape):]))
                     if use_bias else None)

    def __call__(self, x: Array) -> Array:
        # As one 2-D matmul: XLA's CPU backward is much slower when the weight
        # gradient contracts over several batch dims (or several input dims).
        lead = x.shape[:x.ndim - len(self.in_shape)]
        k = self.kernel[...].astype(self.dtype).reshape(math.prod(self.in_shape), math.prod(self.out_shape))
        y = (x.astype(self.dtype).reshape(-1, k.shape[0]) @ k).reshape(*lead, *self.out_shape)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis, statistics in fp32.

    `zero_centered=False` (Qwen3): `w * cast(x / rms(x))`, weight starts at 1.
    `zero_centered=True` (Qwen3.5/3.6): `cast(x / rms(x) * (1 + w))`, weight
    starts at 0. Both follow transformers' rounding order exactly.
    """

    def __init__(self, dim: int, eps: float = 1e-6, *, zero_centered: bool = False,
                 axes: Sequence[str] = ("norm",), dtype: Dtype = jnp.float32, param_dtype: Dtype = jnp.float32):
        self.eps, self.zero_centered, self.dtype = eps, zero_centered, dtype
        init = jnp.zeros if zero_centered else jnp.ones
        self.weight = nnx.Param(init((dim,), param_dtype), axes=tuple(axes))

    def __call__(self, x: Array) -> Array:
        xf = x.astype(jnp.float32)
        normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        w = self.weight[...]
        if self.zero_centered:
            return (normed * (1.0 + w.astype(jnp.float32))).astype(self.dtype)
        return w.astype(self.dtype) * normed.astype(self.dtype)


class Embed(nnx.Module):
    """Token embedding `[vocab, embed]`; `attend` reuses it as a tied LM head."""

    def __init__(self, vocab: int, dim: int, *, dtype: Dtype = jnp.float32, param_dtype: Dtype = jnp.float32,
                 rngs: nnx.Rngs, std: float = INIT_STD):
        self.dtype = dtype
        self.embedding = nnx.Param(_normal(rngs, (vocab, dim), std, param_dtype), axes=("vocab", "embed"))

    def __call__(self, ids: Array) -> Array:
        return jnp.take(self.embedding[...], ids, axis=0).astype(self.dtype)

    def attend(self, x: Array) -> Array:
        return _project_out(x.astype(self.dtype), self.embedding[...].astype(self.dtype))


class LMHead(nnx.Module):
    """Untied output projection, stored `[vocab, embed]` like HF's lm_head.weight."""

    def __init__(self, vocab: int, dim: int, *, dtype: Dtype = jnp.float32, param_dtype: Dtype = jnp.float32,
                 rngs: nnx.Rngs, std: float = INIT_STD):
        self.dtype = dtype
        self.weight = nnx.Param(_normal(rngs, (vocab, dim), std, param_dtype), axes=("vocab", "embed"))

    def __call__(self, x: Array) -> Array:
        return _project_out(x.astype(self.dtype), self.weight[...].astype(self.dtype))


class CausalLMHead:
    """Output projection shared by the decoder families: the LM head, or the embedding when tied.

    A model using it sets `self.embed_tokens` (an `Embed`) and `self.lm_head`
    (an `LMHead`, or None for tied embeddings).
    """

    def lm_head_weight(self) -> Array:
        """The output projection `[V, D]` (the embedding when tied): `logits = h @ W.T`."""
        return (self.embed_tokens.embedding if self.lm_head is None else self.lm_head.weight)[...]

    def logits(self, hidden: Array) -> Array:
        """LM head on final hidden states `[B, T, D]` → `[B, T, V]`."""
        out = self.embed_tokens.attend(hidden) if self.lm_head is None else self.lm_head(hidden)
        return constrain(out, ("batch", "seq", "act_vocab"))


def _project_out(x: Array, w: Array) -> Array:
    """`x [..., D] · w[V, D]ᵀ` as one 2-D matmul (see `Dense`)."""
    return (x.reshape(-1, x.shape[-1]) @ w.T).reshape(*x.shape[:-1], w.shape[0])


class MLP(nnx.Module):
    """SwiGLU: `down_proj(silu(gate_proj(x)) * up_proj(x))`."""

    def __init__(self, dim: int, hidden: int, *, dtype: Dtype = jnp.float32, param_dtype: Dtype = jnp.float32,
                 rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = Dense((dim,), (hidden,), ("embed", "mlp"), **kw)
        self.up_proj = Dense((dim,), (hidden,), ("embed", "mlp"), **kw)
        self.down_proj = Dense((hidden,), (dim,), ("mlp", "embed"), **kw)

    def __call__(self, x: Array) -> Array:
        h = jax.nn.silu(self.gate_proj(x)) * self.up_proj(x)
        h = constrain(h, ("batch", "seq", "act_mlp"))
        return self.down_proj(h)


# ---------------------------------------------------------------------------
# rotary embeddings


def rope_cos_sin(positions: Array, head_dim: int, theta: float, partial_rotary_factor: float = 1.0
                 ) -> tuple[Array, Array]:
    """cos and sin `[B, T, rotary_dim // 2]` in fp32 for integer `positions [B, T]`.

    Only the first `int(head_dim * partial_rotary_factor)` channels of each head
    rotate (transformers' rule); the rest pass through.
    """
    rot = int(head_dim * partial_rotary_factor)
    inv_freq = 1.0 / (theta ** (np.arange(0, rot, 2, dtype=np.float32) / rot))
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    return jnp.cos(freqs), jnp.sin(freqs)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """Rotate-half RoPE on `x [B, T, N, H]` with `cos, sin [B, T, R/2]` (R <= H)."""
    half = cos.shape[-1]
    rot = 2 * half
    cos = cos.astype(x.dtype)[:, :, None, :]
    sin = sin.astype(x.dtype)[:, :, None, :]
    x1, x2, rest = x[..., :half], x[..., half:rot], x[..., rot:]
    out = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
    if rest.shape[-1]:
        out.append(rest)
    return jnp.concatenate(out, axis=-1)


# ---------------------------------------------------------------------------
# attention


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class AttnMask:
    """Which keys each query may see, without materializing `[B, T, S]` up front.

    Query i may attend key j when `kv_idx[j] <= q_idx[i]` (causal in slot
    order), `q_seg[i] == kv_seg[j]` (same packed sequence) and `kv_seg[j] != 0`
    (0 marks padding or an empty cache slot).
    """

    q_idx: Array  # [B, T] int32
    kv_idx: Array  # [B, S] int32
    q_seg: Array  # [B, T] int32
    kv_seg: Array  # [B, S] int32

    def allowed(self) -> Array:
        """Boolean `[B, T, S]`."""
        causal = self.kv_idx[:, None, :] <= self.q_idx[:, :, None]
        same = self.q_seg[:, :, None] == self.kv_seg[:, None, :]
        return causal & same & (self.kv_seg[:, None, :] != 0)

    @staticmethod
    def full(segment_ids: Array) -> AttnMask:
        """Self-attention over one `[B, T]` block whose segment ids are given (0 = padding)."""
        b, t = segment_ids.shape
        idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        seg = segment_ids.astype(jnp.int32)
        return AttnMask(idx, idx, seg, seg)


def attend(q: Array, k: Array, v: Array, mask: AttnMask, scale: float) -> Array:
    """Grouped-query softmax attention.

    Args:
      q: `[B, T, N, H]`; k, v: `[B, K, S, H]` (kv heads before slots, the
        cache's layout, so the batched matmuls need no transpose of the
        cache), N a multiple of K: query head n uses kv head n // (N/K), as
        transformers' repeat_kv does.
      mask: which keys each query sees.
      scale: multiplies the scores (usually H ** -0.5).

    Returns:
      `[B, T, N, H]` in q's dtype. Scores and softmax run in fp32; a query that
      sees no key gets a uniform average instead of NaN.
    """
    b, t, n, h = q.shape
    kh = k.shape[1]
    # Queries as [B, K, G, T, H] so both matmuls produce their natural layout:
    # only q and the output are transposed, never the [.., T, S] scores.
    qg = q.reshape(b, t, kh, n // kh, h).transpose(0, 2, 3, 1, 4)
    s = jnp.einsum("bkgth,bksh->bkgts", qg, k, preferred_element_type=jnp.float32)
    # An additive bias rather than a select: its backward is the identity.
    s = s * scale + jnp.where(mask.allowed(), 0.0, jnp.finfo(jnp.float32).min)[:, None, None]
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    o = jnp.einsum("bkgts,bksh->bkgth", p, v)
    return o.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Keys and values of one attention layer, `[B, K, S, H]` each, or of a stack, `[L, B, K, S, H]`.

    A scanned model should carry the stacked cache through the scan and pass
    the layer index (`write(..., layer=l)`, `read(layer=l)`): the new token is
    then written in place, where passing per-layer slices in and out of the
    scan copies the whole cache every step (7x slower at 2k slots on the CPU).
    """

    k: Array
    v: Array

    @staticmethod
    def zeros(batch: int, length: int, kv_heads: int, head_dim: int, dtype: Dtype, layers: tuple[int, ...] = ()
              ) -> KVCache:
        shape = (*layers, batch, kv_heads, length, head_dim)
        names = (None,) * len(layers) + ("batch", "act_kv_heads", "cache_seq", None)
        return KVCache(constrain(jnp.zeros(shape, dtype), names), constrain(jnp.zeros(shape, dtype), names))

    def write(self, k: Array, v: Array, index: Array, layer: Array | None = None) -> KVCache:
        """Store `k, v [B, T, K, H]` at slots `index .. index+T-1` (of stack entry `layer`)."""
        k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
        if layer is None:
            start = (0, 0, index, 0)
        else:
            start = (layer, 0, 0, index, 0)
            k, v = k[None], v[None]
        return KVCache(jax.lax.dynamic_update_slice(self.k, k.astype(self.k.dtype), start),
                       jax.lax.dynamic_update_slice(self.v, v.astype(self.v.dtype), start))

    def read(self, layer: Array | None = None) -> tuple[Array, Array]:
        """Keys and values `[B, K, S, H]` (of stack entry `layer`)."""
        if layer is None:
            return self.k, self.v
        return self.k[layer], self.v[layer]


class Attention(nnx.Module):
    """Causal GQA with per-head q/k RMSNorm, (partial) RoPE and an optional output gate.

    `output_gate=True` is Qwen3.5's gated attention: q_proj emits a gate of the
    same size as the queries, interleaved per head (`[..., N, 2H]`: first H
    channels query, last H gate), and the output is `o_proj(attn * sigmoid(gate))`.

    `impl` picks the kernel for calls without a cache (training, scoring): "xla"
    (`attend`, float32 scores in memory), "splash" (Pallas, TPU) or "cudnn" (GPU),
    see `models.fused_attention`. Calls with a KV cache always use `attend`.
    """

    def __init__(self, dim: int, num_heads: int, num_kv_heads: int, head_dim: int, *,
                 rope_theta: float, partial_rotary_factor: float = 1.0, eps: float = 1e-6,
                 zero_centered_norm: bool = False, output_gate: bool = False, use_bias: bool = False,
                 dtype: Dtype = jnp.float32, param_dtype: Dtype = jnp.float32, rngs: nnx.Rngs,
                 impl: str = "xla"):
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope_theta, self.partial_rotary_factor = rope_theta, partial_rotary_factor
        self.output_gate = output_gate
        self.impl = fused_attention.check_impl(impl)
        kw = dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        q_width = head_dim * (2 if output_gate else 1)
        self.q_proj = Dense((dim,), (num_heads, q_width), ("embed", "q_heads", "head_dim"), **kw)
        self.k_proj = Dense((dim,), (num_kv_heads, head_dim), ("embed", "kv_heads", "head_dim"), **kw)
        self.v_proj = Dense((dim,), (num_kv_heads, head_dim), ("embed", "kv_heads", "head_dim"), **kw)
        self.o_proj = Dense((num_heads, head_dim), (dim,), ("q_heads", "head_dim", "embed"), **kw)
        nkw = dict(zero_centered=zero_centered_norm, axes=("head_dim",), dtype=dtype, param_dtype=param_dtype)
        self.q_norm = RMSNorm(head_dim, eps, **nkw)
        self.k_norm = RMSNorm(head_dim, eps, **nkw)

    def __call__(self, x: Array, rope: tuple[Array, Array], mask: AttnMask,
                 cache: KVCache | None = None, cache_index: Array | None = None, layer: Array | None = None
                 ) -> tuple[Array, KVCache | None]:
        """Attend `x [B, T, D]`; with `cache`, first write this block's k, v at `cache_index`.

        `layer` selects this layer's entry when `cache` is a stack (see `KVCache`).
        Returns the output `[B, T, D]` and the updated cache (None without one).
        """
        q = self.q_proj(x)
        gate = None
        if self.output_gate:
            q, gate = jnp.split(q, 2, axis=-1)
        q = apply_rope(self.q_norm(q), *rope)
        k = apply_rope(self.k_norm(self.k_proj(x)), *rope)
        v = self.v_proj(x)
        q = constrain(q, ("batch", "seq", "act_heads", None))
        if cache is not None:
            cache = cache.write(k, v, cache_index, layer)
            k, v = (a.astype(q.dtype) for a in cache.read(layer))
        else:
            k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
        if cache is None and self.impl != "xla":
            o = fused_attention.fused_attention(self.impl, q, k, v, mask.q_seg, self.head_dim ** -0.5)
        else:
            o = attend(q, k, v, mask, self.head_dim ** -0.5)
        if gate is not None:
            o = o * jax.nn.sigmoid(gate)
        return self.o_proj(o), cache


# ---------------------------------------------------------------------------
# stacked (scanned) layers


def stack(make: Callable[[nnx.Rngs], nnx.Module], n: int, rngs: nnx.Rngs, axis_name: str = "layers") -> nnx.Module:
    """`n` independent copies of `make(rngs)` with every parameter stacked on a new leading axis.

    The new axis is named `axis_name` in each parameter's `axes`. Nest calls to
    stack groups (e.g. `[groups, 3, ...]` with axis names ("layers", "group")).
    """
    keys = jax.random.split(rngs.params(), n)

    @nnx.vmap(in_axes=0, out_axes=0)
    def build(key):
        return make(nnx.Rngs(params=key))

    module = build(keys)
    for _, v in nnx.iter_graph(module):
        if isinstance(v, nnx.Variable) and v.has_metadata("axes"):
            v.set_metadata("axes", (axis_name, *v.get_metadata("axes")))
    return module


def scan(stacked: nnx.Module, fn: Callable[[nnx.Module, Any, Any], tuple[Any, Any]], carry: Any,
         xs: Any = None, *, remat: bool = False) -> tuple[Any, Any]:
    """`lax.scan` of `fn(layer, carry, x) -> (carry, y)` over the leading axis of `stacked`.

    Compile time stays constant in depth. With `remat`, each step's
    activations are recomputed in the backward pass (only the carry is saved).
    """
    graphdef, state = nnx.split(stacked)

    def body(c, inp):
        layer_state, x = inp
        return fn(nnx.merge(graphdef, layer_state), c, x)

    if remat:
        body = jax.checkpoint(body, prevent_cse=False)
    return jax.lax.scan(body, carry, (state, xs))


def positions_from(attention_mask: Array | None, segment_ids: Array | None, shape: tuple[int, int]) -> Array:
    """Default position ids `[B, T]`.

    With `segment_ids`: the index within each packed segment. With a left-
    padding `attention_mask`: `cumsum(mask) - 1` clipped at 0 (what
    transformers' `generate` uses). Otherwise `0..T-1`.
    """
    b, t = shape
    idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if segment_ids is not None:
        seg = segment_ids.astype(jnp.int32)
        starts = jnp.concatenate([jnp.ones((b, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
        start_idx = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
        return idx - start_idx
    if attention_mask is not None:
        return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1, 0)
    return idx



def jit_when_eager(method: Callable) -> Callable:
    """Decorate a model's `__call__` so an eager call runs compiled.

    Outside any trace (plain arrays in), the call goes through `nnx.jit`, so a
    script's or test's `model(ids)` compiles once per shape instead of running
    op by op (a `lax.scan` would recompile on every eager call). Inside a trace
    the method runs as written. Keywords `return_hidden` and (MoE families)
    `return_routing` are static.
    """
    params = inspect.signature(method).parameters
    jitted = nnx.jit(method, static_argnames=tuple(n for n in ("return_hidden", "return_routing") if n in params))

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs))) or _params_traced(self):
            return method(self, *args, **kwargs)
        return jitted(self, *args, **kwargs)

    return call


def _params_traced(module: nnx.Module) -> bool:
    for _, v in nnx.iter_graph(module):
        if isinstance(v, nnx.Variable):
            return isinstance(v.get_raw_value(), jax.core.Tracer)
    return False
