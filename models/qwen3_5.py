"""Qwen3.5 / Qwen3.6 hybrid text model (HF `qwen3_5_text`, and the text half of `qwen3_5`) in Flax NNX.

Layers alternate, as the config's `layer_types` say, between Gated DeltaNet
(`linear_attention`) and gated softmax attention (`full_attention`: an output
gate from a doubled q_proj, partial rotary, zero-centered q/k norms). Every norm
outside the DeltaNet is zero-centered, `x̂ (1 + w)`; the DeltaNet's own output
norm is a plain weight times x̂, gated by silu(z).

The layer list is cut into its shortest repeating group (three DeltaNet layers and
one attention layer for the released models); groups are stacked and scanned, and
within a group each run of same-kind layers is stacked and scanned again, so
compile time does not grow with depth. Parameters are `[groups, run, ...]`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from models import gated_delta
from models.layers import MLP, Attention, AttnMask, Dense, Embed, KVCache, LMHead, RMSNorm, rope_cos_sin, scan, stack
from models.layers import positions_from
from models.sharding import constrain

Array = jax.Array
Dtype = Any

LINEAR, FULL = "linear_attention", "full_attention"


@dataclasses.dataclass(frozen=True)
class Qwen3_5Config:
    """The fields of HF's Qwen3_5TextConfig that shape the model."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    layer_types: tuple[str, ...]
    linear_conv_kernel_dim: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    tie_word_embeddings: bool
    attention_bias: bool = False

    def __post_init__(self):
        unknown = set(self.layer_types) - {LINEAR, FULL}
        if unknown:
            raise ValueError(f"unknown layer_types {sorted(unknown)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layer_types)

    @property
    def conv_dim(self) -> int:
        """Channels of the DeltaNet's fused q|k|v projection and its conv."""
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        return 2 * key_dim + self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def groups(self) -> tuple[int, tuple[tuple[str, int], ...]]:
        """(number of groups, the group's runs as (layer type, length)) for the shortest period."""
        types, n = self.layer_types, len(self.layer_types)
        period = next(p for p in range(1, n + 1) if n % p == 0 and types == types[:p] * (n // p))
        runs = tuple((kind, len(list(same))) for kind, same in itertools.groupby(types[:period]))
        return n // period, runs

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> Qwen3_5Config:
        """From an HF config.json dict: `qwen3_5_text`, or `qwen3_5` (its `text_config`; vision ignored)."""
        text = hf["text_config"] if hf["model_type"] == "qwen3_5" else hf
        if text["hidden_act"] != "silu":
            raise ValueError(f"hidden_act {text['hidden_act']!r} is not supported (silu only)")
        rope = text["rope_parameters"]
        if rope["rope_type"] != "default":
            raise ValueError(f"rope_type {rope['rope_type']!r} is not supported")
        if len(text["layer_types"]) != text["num_hidden_layers"]:
            raise ValueError("layer_types and num_hidden_layers disagree")
        return cls(
            vocab_size=text["vocab_size"],
            hidden_size=text["hidden_size"],
            intermediate_size=text["intermediate_size"],
            num_attention_heads=text["num_attention_heads"],
            num_key_value_heads=text["num_key_value_heads"],
            head_dim=text["head_dim"],
            rms_norm_eps=text["rms_norm_eps"],
            rope_theta=rope["rope_theta"],
            partial_rotary_factor=rope["partial_rotary_factor"],
            layer_types=tuple(text["layer_types"]),
            linear_conv_kernel_dim=text["linear_conv_kernel_dim"],
            linear_key_head_dim=text["linear_key_head_dim"],
            linear_value_head_dim=text["linear_value_head_dim"],
            linear_num_key_heads=text["linear_num_key_heads"],
            linear_num_value_heads=text["linear_num_value_heads"],
            tie_word_embeddings=hf["tie_word_embeddings"],
            attention_bias=text["attention_bias"],
        )


# ---------------------------------------------------------------------------
# decoding state


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DeltaState:
    """One DeltaNet layer's decoding state: the conv's last K−1 inputs and the recurrent matrix."""

    conv: Array  # [B, K-1, conv_dim], compute dtype
    recurrent: Array  # [B, Hv, Dk, Dv], float32

    @staticmethod
    def zeros(cfg: Qwen3_5Config, batch: int, dtype: Dtype, layers: tuple[int, ...] = ()) -> DeltaState:
        return DeltaState(
            jnp.zeros((*layers, batch, cfg.linear_conv_kernel_dim - 1, cfg.conv_dim), dtype),
            jnp.zeros((*layers, batch, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                       cfg.linear_value_head_dim), jnp.float32),
        )


def init_layer_caches(cfg: Qwen3_5Config, batch: int, max_len: int, dtype: Dtype) -> tuple[Any, ...]:
    """Zero caches for every run of the scanned groups, stacked `[groups, run, ...]` like the parameters."""
    n_groups, runs = cfg.groups
    caches = []
    for kind, length in runs:
        if kind == LINEAR:
            caches.append(DeltaState.zeros(cfg, batch, dtype, (n_groups, length)))
        else:
            caches.append(KVCache.zeros(batch, max_len, cfg.num_key_value_heads, cfg.head_dim, dtype,
                                        (n_groups, length)))
    return tuple(caches)


# ---------------------------------------------------------------------------
# layers


class GatedRMSNorm(nnx.Module):
    """`cast(w · cast(x̂)) · silu(z)` per value head (flash-linear-attention's FusedRMSNormGated order)."""

    def __init__(self, dim: int, eps: float, *, dtype: Dtype, param_dtype: Dtype):
        self.eps, self.dtype = eps, dtype
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype), axes=("head_dim",))

    def __call__(self, x: Array, z: Array) -> Array:
        xf = x.astype(jnp.float32)
        normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        h = self.weight[...].astype(self.dtype) * normed.astype(self.dtype)
        return (h * jax.nn.silu(z.astype(jnp.float32))).astype(self.dtype)


class DepthwiseConv(nnx.Module):
    """Causal depthwise conv taps `[K, C]` (HF's conv1d.weight `[C, 1, K]`, transposed)."""

    def __init__(self, taps: int, channels: int, *, param_dtype: Dtype, rngs: nnx.Rngs):
        bound = taps**-0.5
        w = jax.random.uniform(rngs.params(), (taps, channels), jnp.float32, -bound, bound)
        self.weight = nnx.Param(w.astype(param_dtype), axes=(None, "mlp"))


class GatedDeltaNet(nnx.Module):
    """The linear-attention mixer: fused q|k|v projection, causal conv + silu, L2-normed q and k,

    g = −exp(A_log) · softplus(a + dt_bias), β = sigmoid(b), the gated delta rule, a
    silu(z)-gated RMSNorm per value head, then out_proj.
    """

    def __init__(self, cfg: Qwen3_5Config, *, dtype: Dtype, param_dtype: Dtype, rngs: nnx.Rngs):
        self.cfg, self.dtype = cfg, dtype
        d, hv, dv = cfg.hidden_size, cfg.linear_num_value_heads, cfg.linear_value_head_dim
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.in_proj_qkv = Dense((d,), (cfg.conv_dim,), ("embed", "mlp"), **kw)
        self.in_proj_z = Dense((d,), (hv, dv), ("embed", "q_heads", "head_dim"), **kw)
        self.in_proj_b = Dense((d,), (hv,), ("embed", "q_heads"), **kw)
        self.in_proj_a = Dense((d,), (hv,), ("embed", "q_heads"), **kw)
        self.conv1d = DepthwiseConv(cfg.linear_conv_kernel_dim, cfg.conv_dim, param_dtype=param_dtype, rngs=rngs)
        a = jax.random.uniform(rngs.params(), (hv,), jnp.float32, 0.01, 16.0)
        self.A_log = nnx.Param(jnp.log(a).astype(param_dtype), axes=("q_heads",))
        self.dt_bias = nnx.Param(jnp.ones((hv,), param_dtype), axes=("q_heads",))
        self.norm = GatedRMSNorm(dv, cfg.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)
        self.out_proj = Dense((hv, dv), (d,), ("q_heads", "head_dim", "embed"), **kw)

    def __call__(self, x: Array, segment_ids: Array, state: DeltaState | None = None,
                 chunk_size: int = 64) -> tuple[Array, DeltaState | None]:
        """Mix `x [B, T, D]`; tokens with segment id 0 are padding and tokens never see another segment.

        With `state`, continue from it and return the new one; one-token calls use the recurrent form.
        """
        cfg = self.cfg
        b, t, _ = x.shape
        x = x * (segment_ids != 0)[..., None].astype(x.dtype)
        qkv, conv_state = gated_delta.causal_conv1d(
            self.in_proj_qkv(x), self.conv1d.weight[...].astype(self.dtype),
            None if state is None else state.conv, segment_ids)
        qkv = jax.nn.silu(qkv)
        key_dim = cfg.linear_num_key_heads * cfg.linear_key_head_dim
        q, k, v = jnp.split(qkv, [key_dim, 2 * key_dim], axis=-1)
        q = gated_delta.l2_normalize(q.reshape(b, t, cfg.linear_num_key_heads, -1)).astype(self.dtype)
        k = gated_delta.l2_normalize(k.reshape(b, t, cfg.linear_num_key_heads, -1)).astype(self.dtype)
        v = v.reshape(b, t, cfg.linear_num_value_heads, -1)
        beta = jax.nn.sigmoid(self.in_proj_b(x))
        a = self.in_proj_a(x).astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a)
        initial = None if state is None else state.recurrent
        if t == 1 and state is not None:
            o, recurrent = gated_delta.recurrent_gated_delta_rule(q, k, v, g, beta, initial, segment_ids)
        else:
            o, recurrent = gated_delta.chunked_gated_delta_rule(q, k, v, g, beta, initial, segment_ids, chunk_size)
        o = self.norm(o, self.in_proj_z(x))
        new_state = None if state is None else DeltaState(conv_state.astype(state.conv.dtype), recurrent)
        return self.out_proj(o), new_state


class _Block(nnx.Module):
    """Pre-norm residual block shared by both layer kinds: mixer, then SwiGLU MLP."""

    def _norms_and_mlp(self, cfg: Qwen3_5Config, dtype: Dtype, param_dtype: Dtype, rngs: nnx.Rngs):
        nkw = dict(zero_centered=True, dtype=dtype, param_dtype=param_dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **nkw)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **nkw)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def _finish(self, residual: Array, mixed: Array) -> Array:
        h = residual + mixed
        h = h + self.mlp(self.post_attention_layernorm(h))
        return constrain(h, ("batch", "seq", "act_embed"))


class DeltaLayer(_Block):
    """A `linear_attention` decoder layer."""

    def __init__(self, cfg: Qwen3_5Config, *, dtype: Dtype, param_dtype: Dtype, rngs: nnx.Rngs):
        self.linear_attn = GatedDeltaNet(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self._norms_and_mlp(cfg, dtype, param_dtype, rngs)

    def __call__(self, h: Array, ctx: Context, state: DeltaState | None) -> tuple[Array, DeltaState | None]:
        mixed, state = self.linear_attn(self.input_layernorm(h), ctx.segment_ids, state, ctx.chunk_size)
        return self._finish(h, mixed), state


class AttentionLayer(_Block):
    """A `full_attention` decoder layer (gated attention)."""

    def __init__(self, cfg: Qwen3_5Config, *, dtype: Dtype, param_dtype: Dtype, rngs: nnx.Rngs):
        self.self_attn = Attention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            rope_theta=cfg.rope_theta, partial_rotary_factor=cfg.partial_rotary_factor, eps=cfg.rms_norm_eps,
            zero_centered_norm=True, output_gate=True, use_bias=cfg.attention_bias,
            dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self._norms_and_mlp(cfg, dtype, param_dtype, rngs)

    def __call__(self, h: Array, ctx: Context, cache: KVCache | None) -> tuple[Array, KVCache | None]:
        mixed, cache = self.self_attn(self.input_layernorm(h), ctx.rope, ctx.mask, cache, ctx.cache_index)
        return self._finish(h, mixed), cache


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Context:
    """What every layer of one forward pass shares."""

    segment_ids: Array  # [B, T], 0 = padding
    rope: tuple[Array, Array]
    mask: AttnMask
    cache_index: Array | None
    chunk_size: int = dataclasses.field(metadata=dict(static=True), default=64)


class Group(nnx.Module):
    """One period of `layer_types`: each run of same-kind layers stacked on a `group` axis."""

    def __init__(self, cfg: Qwen3_5Config, *, dtype: Dtype, param_dtype: Dtype, rngs: nnx.Rngs):
        kinds = {LINEAR: DeltaLayer, FULL: AttentionLayer}
        self.runs = nnx.List([
            stack(lambda r, k=kind: kinds[k](cfg, dtype=dtype, param_dtype=param_dtype, rngs=r), n, rngs, "group")
            for kind, n in cfg.groups[1]
        ])

    def __call__(self, h: Array, ctx: Context, caches: tuple | None) -> tuple[Array, tuple | None]:
        new_caches = []
        for i, run in enumerate(self.runs):
            h, c = scan(run, lambda layer, carry, c: layer(carry, ctx, c), h,
                        None if caches is None else caches[i])
            new_caches.append(c)
        return h, None if caches is None else tuple(new_caches)


class Qwen3_5(nnx.Module):
    """Qwen3.5/3.6 causal LM: `model(input_ids)` → logits `[B, T, V]`."""

    def __init__(self, cfg: Qwen3_5Config, *, dtype: Dtype = jnp.float32, param_dtype: Dtype = jnp.float32,
                 rngs: nnx.Rngs, remat: bool = False):
        self.cfg, self.dtype, self.remat = cfg, dtype, remat
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.embed_tokens = Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs, **kw)
        self.layers = stack(lambda r: Group(cfg, rngs=r, **kw), cfg.groups[0], rngs, "layers")
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=True, **kw)
        self.lm_head = None if cfg.tie_word_embeddings else LMHead(cfg.vocab_size, cfg.hidden_size, rngs=rngs, **kw)

    def __call__(self, input_ids: Array, *, positions: Array | None = None, segment_ids: Array | None = None,
                 attention_mask: Array | None = None, caches: tuple | None = None, cache_index: Array | None = None,
                 kv_segment_ids: Array | None = None, chunk_size: int = 64) -> Array | tuple[Array, tuple]:
        """Logits `[B, T, V]` for `input_ids [B, T]`.

        Args:
          positions: `[B, T]` rotary positions (default: from segments or the mask).
          segment_ids: `[B, T]` packed-sequence ids, 0 = padding; no token sees another segment,
            in attention nor in the DeltaNet's conv and state.
          attention_mask: `[B, T]` 1 for tokens, 0 for (left) padding; used when `segment_ids` is None.
          caches: from `init_layer_caches`; then this block is written at `cache_index` and
            `kv_segment_ids [B, S]` says which cache slots hold tokens (0 = empty or padding).
          chunk_size: the DeltaNet's chunk length.

        Returns:
          logits, or (logits, new caches) when `caches` is given.
        """
        cfg = self.cfg
        b, t = input_ids.shape
        if segment_ids is None:
            segment_ids = (jnp.ones((b, t), jnp.int32) if attention_mask is None
                           else attention_mask.astype(jnp.int32))
        if positions is None:
            positions = positions_from(attention_mask, segment_ids, (b, t))
        if caches is None:
            mask = AttnMask.full(segment_ids)
        else:
            q_idx = cache_index + jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
            kv_idx = jnp.broadcast_to(jnp.arange(kv_segment_ids.shape[1], dtype=jnp.int32), kv_segment_ids.shape)
            mask = AttnMask(q_idx, kv_idx, segment_ids.astype(jnp.int32), kv_segment_ids.astype(jnp.int32))
        rope = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, cfg.partial_rotary_factor)
        ctx = Context(segment_ids, rope, mask, cache_index, chunk_size)

        h = constrain(self.embed_tokens(input_ids), ("batch", "seq", "act_embed"))
        h, caches = scan(self.layers, lambda group, carry, c: group(carry, ctx, c), h, caches, remat=self.remat)
        h = self.norm(h)
        logits = self.embed_tokens.attend(h) if self.lm_head is None else self.lm_head(h)
        logits = constrain(logits, ("batch", "seq", "act_vocab"))
        return logits if caches is None else (logits, caches)

