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
import json
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from models import decode, gated_delta
from models.checkpoint import Rule
from models.layers import (MLP, Attention, AttnMask, CausalLMHead, Dense, Embed, KVCache, LMHead, RMSNorm, jit_when_eager,
                           positions_from, rope_cos_sin, scan, stack)
from models.sharding import constrain

Array = jax.Array
Dtype = Any

LINEAR, FULL = "linear_attention", "full_attention"


# HF config.json keys that transformers fills with a default when absent.
_HF_DEFAULTS = {
    "attention_bias": False,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "attn_output_gate": True,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


@dataclasses.dataclass(frozen=True)
class Qwen3_5Config:
    """The fields of HF's Qwen3_5TextConfig that shape the model.

    `model_type` is `qwen3_5_text` (Qwen3_5ForCausalLM, tensors under `model.`) or
    `qwen3_5` (the multimodal wrapper, text tensors under `model.language_model.`);
    `hf_json` keeps the source config.json so that saving writes back what we do not model
    (the vision config, mrope sections, token ids).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    layer_types: tuple[str, ...]
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    model_type: str = "qwen3_5_text"
    hf_json: str = "{}"

    MODEL_TYPES = ("qwen3_5_text", "qwen3_5")  # a subclass (models.qwen3_5_moe) names its own

    def __post_init__(self):
        unknown = set(self.layer_types) - {LINEAR, FULL}
        if unknown:
            raise ValueError(f"unknown layer_types {sorted(unknown)}")
        if self.model_type not in self.MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not a Qwen3.5 type")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layer_types)

    def make_mlp(self, *, dtype: Dtype, param_dtype: Dtype, rngs: nnx.Rngs) -> nnx.Module:
        """Every layer's feed-forward: a SwiGLU MLP (the MoE subclass returns routed experts)."""
        return MLP(self.hidden_size, self.intermediate_size, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

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
        model_type = hf["model_type"]
        if model_type not in ("qwen3_5_text", "qwen3_5"):
            raise ValueError(f"not a Qwen3.5 config: model_type={model_type!r}")
        text = {**_HF_DEFAULTS, **(hf["text_config"] if model_type == "qwen3_5" else hf)}
        if text["hidden_act"] != "silu":
            raise NotImplementedError(f"hidden_act {text['hidden_act']!r} (only silu)")
        if not text["attn_output_gate"]:
            raise NotImplementedError("attention without the output gate (attn_output_gate false)")
        rope = text.get("rope_parameters") or {k: text[k] for k in ("rope_theta",) if k in text}
        if rope.get("rope_type", "default") != "default":
            raise NotImplementedError(f"rope_type {rope['rope_type']!r} (only default)")
        if "rope_theta" not in rope:
            raise KeyError("config.json lacks rope_theta (in rope_parameters or top level)")
        interval = text["full_attention_interval"]
        layer_types = text.get("layer_types") or [
            FULL if (i + 1) % interval == 0 else LINEAR for i in range(text["num_hidden_layers"])]
        if len(layer_types) != text["num_hidden_layers"]:
            raise ValueError("layer_types and num_hidden_layers disagree")
        eos = text["eos_token_id"]
        return cls(
            vocab_size=text["vocab_size"], hidden_size=text["hidden_size"],
            intermediate_size=text["intermediate_size"], num_attention_heads=text["num_attention_heads"],
            num_key_value_heads=text["num_key_value_heads"], head_dim=text["head_dim"],
            rope_theta=float(rope["rope_theta"]),
            partial_rotary_factor=rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)),
            layer_types=tuple(layer_types), linear_key_head_dim=text["linear_key_head_dim"],
            linear_value_head_dim=text["linear_value_head_dim"], linear_num_key_heads=text["linear_num_key_heads"],
            linear_num_value_heads=text["linear_num_value_heads"],
            linear_conv_kernel_dim=text["linear_conv_kernel_dim"], rms_norm_eps=text["rms_norm_eps"],
            tie_word_embeddings=hf.get("tie_word_embeddings", False) if model_type == "qwen3_5"
            else text["tie_word_embeddings"],
            attention_bias=text["attention_bias"], max_position_embeddings=text["max_position_embeddings"],
            bos_token_id=text["bos_token_id"], eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
            pad_token_id=text["pad_token_id"], model_type=model_type, hf_json=json.dumps(dict(hf), sort_keys=True))

    def to_hf(self) -> dict[str, Any]:
        """An HF config.json dict of the same model_type as the source (transformers 5 layout)."""
        source = json.loads(self.hf_json)
        wrapped = self.model_type == "qwen3_5"
        text = dict(source.get("text_config", {}) if wrapped else source)
        for k in ("full_attention_interval", "partial_rotary_factor", "rope_theta"):
            text.pop(k, None)
        eos = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
        text.update(
            model_type="qwen3_5_text", vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim, hidden_act="silu", rms_norm_eps=self.rms_norm_eps,
            rope_parameters={**text.get("rope_parameters", {}), "rope_type": "default",
                             "rope_theta": self.rope_theta, "partial_rotary_factor": self.partial_rotary_factor},
            layer_types=list(self.layer_types), linear_conv_kernel_dim=self.linear_conv_kernel_dim,
            linear_key_head_dim=self.linear_key_head_dim, linear_value_head_dim=self.linear_value_head_dim,
            linear_num_key_heads=self.linear_num_key_heads, linear_num_value_heads=self.linear_num_value_heads,
            attention_bias=self.attention_bias, max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings, bos_token_id=self.bos_token_id, eos_token_id=eos,
            pad_token_id=self.pad_token_id)
        if not wrapped:
            return {**text, "architectures": ["Qwen3_5ForCausalLM"]}
        return {**source, "text_config": text, "tie_word_embeddings": self.tie_word_embeddings,
                "architectures": ["Qwen3_5ForConditionalGeneration"]}


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
        lead = (None,) * len(layers)
        conv = jnp.zeros((*layers, batch, cfg.linear_conv_kernel_dim - 1, cfg.conv_dim), dtype)
        recurrent = jnp.zeros((*layers, batch, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                               cfg.linear_value_head_dim), jnp.float32)
        return DeltaState(constrain(conv, lead + ("batch", None, "act_mlp")),
                          constrain(recurrent, lead + ("batch", "act_heads", None, None)))


def layer_caches(cfg: Qwen3_5Config, batch: int, max_len: int, dtype: Dtype) -> tuple[Any, ...]:
    """Zero states for every run of a layer group, in run order.

    DeltaNet runs: `DeltaState` stacked `[groups, run, ...]` like the parameters (scanned
    over, as each step rewrites all of it). Attention runs: one `KVCache` stacked
    `[groups · run, ...]` that rides in the scan carry, so a step writes its token in place.
    """
    n_groups, runs = cfg.groups
    return tuple(
        DeltaState.zeros(cfg, batch, dtype, (n_groups, n)) if kind == LINEAR
        else KVCache.zeros(batch, max_len, cfg.num_key_value_heads, cfg.head_dim, dtype, (n_groups * n,))
        for kind, n in runs)


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
    """Causal depthwise conv weights, stored `[C, 1, K]` as HF's torch Conv1d stores them."""

    def __init__(self, taps: int, channels: int, *, param_dtype: Dtype, rngs: nnx.Rngs):
        bound = taps**-0.5
        w = jax.random.uniform(rngs.params(), (channels, 1, taps), jnp.float32, -bound, bound)
        self.weight = nnx.Param(w.astype(param_dtype), axes=("mlp", "conv_in", "conv_kernel"))

    def taps(self, dtype: Dtype) -> Array:
        """The taps `[K, C]`, oldest first."""
        return self.weight[...][:, 0, :].T.astype(dtype)


class GatedDeltaNet(nnx.Module):
    """Gated DeltaNet, the `linear_attention` mixer.

    Fused q|k|v projection, causal depthwise conv + silu, L2-normed q and k,
    g = −exp(A_log) · softplus(a + dt_bias), β = sigmoid(b), the gated delta rule
    (chunked; recurrent for one-token steps), a silu(z)-gated RMSNorm per value head,
    then out_proj.
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
            self.in_proj_qkv(x), self.conv1d.taps(self.dtype),
            None if state is None else state.conv, segment_ids)
        qkv = jax.nn.silu(qkv)
        key_dim = cfg.linear_num_key_heads * cfg.linear_key_head_dim
        q, k, v = jnp.split(qkv, [key_dim, 2 * key_dim], axis=-1)
        heads = lambda y, n, axis: constrain(y.reshape(b, t, n, -1), ("batch", "seq", axis, None))
        q = gated_delta.l2_normalize(heads(q, cfg.linear_num_key_heads, "act_kv_heads")).astype(self.dtype)
        k = gated_delta.l2_normalize(heads(k, cfg.linear_num_key_heads, "act_kv_heads")).astype(self.dtype)
        v = heads(v, cfg.linear_num_value_heads, "act_heads")
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
        self.mlp = cfg.make_mlp(dtype=dtype, param_dtype=param_dtype, rngs=rngs)

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

    def __init__(self, cfg: Qwen3_5Config, *, dtype: Dtype, param_dtype: Dtype, rngs: nnx.Rngs,
                 attention_impl: str = "xla"):
        self.self_attn = Attention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            rope_theta=cfg.rope_theta, partial_rotary_factor=cfg.partial_rotary_factor, eps=cfg.rms_norm_eps,
            zero_centered_norm=True, output_gate=True, use_bias=cfg.attention_bias,
            dtype=dtype, param_dtype=param_dtype, rngs=rngs, impl=attention_impl)
        self._norms_and_mlp(cfg, dtype, param_dtype, rngs)

    def __call__(self, h: Array, ctx: Context, cache: KVCache | None, layer: Array | None
                 ) -> tuple[Array, KVCache | None]:
        """With `cache` (a stack), this layer's keys and values are entry `layer` of it."""
        mixed, cache = self.self_attn(self.input_layernorm(h), ctx.rope, ctx.mask, cache, ctx.cache_index, layer)
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

    def __init__(self, cfg: Qwen3_5Config, *, dtype: Dtype, param_dtype: Dtype, rngs: nnx.Rngs,
                 attention_impl: str = "xla"):
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        make = {LINEAR: lambda r: DeltaLayer(cfg, rngs=r, **kw),
                FULL: lambda r: AttentionLayer(cfg, rngs=r, attention_impl=attention_impl, **kw)}
        self.runs_spec = cfg.groups[1]
        self.runs = nnx.List([stack(make[kind], n, rngs, "group") for kind, n in self.runs_spec])

    def __call__(self, h: Array, ctx: Context, kv: tuple | None, delta: tuple | None, group: Array,
                 remat: bool = False) -> tuple[Array, tuple | None, tuple | None]:
        """Run the group's layers.

        `kv` and `delta` (None without a cache) hold one entry per run, None for runs of
        the other kind: the whole stacked `KVCache` of an attention run (written in place
        at entry group · run + j), and a DeltaNet run's states for this group. With
        `remat`, each layer is recomputed in the backward pass too, so a group's backward
        holds one layer's float32 DeltaNet intermediates at a time, not all of them.
        """
        kv, delta = (None, None) if kv is None else (list(kv), list(delta))
        for i, (run, (kind, n)) in enumerate(zip(self.runs, self.runs_spec)):
            if kind == LINEAR:
                h, state = scan(run, lambda layer, carry, st: layer(carry, ctx, st), h,
                                None if delta is None else delta[i], remat=remat)
                if delta is not None:
                    delta[i] = state
            else:
                def attend(layer, carry, j, n=n):
                    x, cache = carry
                    return layer(x, ctx, cache, None if cache is None else group * n + j), None

                (h, cache), _ = scan(run, attend, (h, None if kv is None else kv[i]), jnp.arange(n), remat=remat)
                if kv is not None:
                    kv[i] = cache
        return h, None if kv is None else tuple(kv), None if delta is None else tuple(delta)


class Qwen3_5(CausalLMHead, nnx.Module):
    """Qwen3_5ForCausalLM (and the text half of Qwen3_5ForConditionalGeneration).

    Call `model(input_ids)` for logits `[B, T, V]`. Options: `positions` (`[B, T]`),
    `segment_ids` (`[B, T]`, packed sequences, 0 = padding: no token sees another
    segment, in attention nor through the DeltaNet's conv and state), `attention_mask`
    (`[B, T]`, 1 = token, 0 = left padding), `cache` (a `decode.Cache`; the call then
    returns `(out, new_cache)`) and `return_hidden` (final-normed hidden states
    `[B, T, D]` instead of logits). `chunk_size` is the DeltaNet's chunk length; `remat`
    recomputes each layer group in the backward pass. `attention_impl` ("xla", "splash"
    on TPU, "cudnn" on GPU) picks the attention kernel of cache-free calls
    (`models.fused_attention`).
    """

    def __init__(self, cfg: Qwen3_5Config, *, dtype: Dtype = jnp.float32, param_dtype: Dtype | None = None,
                 rngs: nnx.Rngs, remat: bool = False, chunk_size: int = 64, attention_impl: str = "xla"):
        param_dtype = param_dtype or dtype
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.config, self.dtype, self.remat, self.chunk_size = cfg, dtype, remat, chunk_size
        self.embed_tokens = Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs, **kw)
        self.layers = stack(lambda r: Group(cfg, rngs=r, attention_impl=attention_impl, **kw), cfg.groups[0], rngs,
                            "layers")
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=True, **kw)
        self.lm_head = None if cfg.tie_word_embeddings else LMHead(cfg.vocab_size, cfg.hidden_size, rngs=rngs, **kw)

    def init_cache(self, batch: int, max_len: int, dtype: Dtype | None = None) -> decode.Cache:
        """An empty decoding cache: KV for attention layers, conv and recurrent state for DeltaNet layers."""
        return decode.Cache.empty(layer_caches(self.config, batch, max_len, dtype or self.dtype), batch, max_len)

    @jit_when_eager
    def __call__(self, input_ids: Array, *, positions: Array | None = None, segment_ids: Array | None = None,
                 attention_mask: Array | None = None, cache: decode.Cache | None = None,
                 return_hidden: bool = False):
        cfg = self.config
        shape = input_ids.shape
        if cache is None:
            seg = segment_ids if segment_ids is not None else attention_mask
            seg = jnp.ones(shape, jnp.int32) if seg is None else seg.astype(jnp.int32)
            mask = AttnMask.full(seg)
            if positions is None:
                positions = positions_from(attention_mask, segment_ids, shape)
            states, index = None, None
        else:
            if segment_ids is not None:
                raise ValueError("segment_ids are not supported with a cache")
            seg = jnp.ones(shape, jnp.int32) if attention_mask is None else attention_mask.astype(jnp.int32)
            index = cache.index
            auto_positions, mask, cache = cache.advance(attention_mask, shape)
            positions = auto_positions if positions is None else positions
            states = cache.layers
        rope = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, cfg.partial_rotary_factor)
        ctx = Context(seg, rope, mask, index, self.chunk_size)

        # Attention KV caches ride in the scan carry, so each step writes its token in
        # place; DeltaNet states are scanned over, as each step rewrites them whole.
        kinds = tuple(kind for kind, _ in cfg.groups[1])
        kv = None if states is None else tuple(c if k == FULL else None for k, c in zip(kinds, states))
        delta = None if states is None else tuple(c if k == LINEAR else None for k, c in zip(kinds, states))

        def body(group, carry, xs):
            (x, kv), (delta, g) = carry, xs
            x, kv, delta = group(x, ctx, kv, delta, g, self.remat)
            return (x, kv), delta

        h = constrain(self.embed_tokens(input_ids), ("batch", "seq", "act_embed"))
        (h, kv), delta = scan(self.layers, body, (h, kv), (delta, jnp.arange(cfg.groups[0])), remat=self.remat)
        states = None if states is None else tuple(c if k == FULL else d for k, c, d in zip(kinds, kv, delta))
        h = self.norm(h)
        out = h if return_hidden else self.logits(h)
        return out if cache is None else (out, dataclasses.replace(cache, layers=states))


# ---------------------------------------------------------------------------
# checkpoint family interface

Config = Qwen3_5Config
Model = Qwen3_5

_DELTA_TENSORS = (  # (HF name under the layer, ours under the layer, transpose, split)
    ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_qkv.kernel", True, None),
    ("linear_attn.in_proj_z.weight", "linear_attn.in_proj_z.kernel", True, (1, 2)),
    ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_b.kernel", True, None),
    ("linear_attn.in_proj_a.weight", "linear_attn.in_proj_a.kernel", True, None),
    ("linear_attn.conv1d.weight", "linear_attn.conv1d.weight", False, None),
    ("linear_attn.A_log", "linear_attn.A_log", False, None),
    ("linear_attn.dt_bias", "linear_attn.dt_bias", False, None),
    ("linear_attn.norm.weight", "linear_attn.norm.weight", False, None),
    ("linear_attn.out_proj.weight", "linear_attn.out_proj.kernel", True, (2, 1)),
)
_ATTENTION_TENSORS = (
    ("self_attn.q_proj.weight", "self_attn.q_proj.kernel", True, (1, 2)),
    ("self_attn.k_proj.weight", "self_attn.k_proj.kernel", True, (1, 2)),
    ("self_attn.v_proj.weight", "self_attn.v_proj.kernel", True, (1, 2)),
    ("self_attn.o_proj.weight", "self_attn.o_proj.kernel", True, (2, 1)),
    ("self_attn.q_norm.weight", "self_attn.q_norm.weight", False, None),
    ("self_attn.k_norm.weight", "self_attn.k_norm.weight", False, None),
)
_ATTENTION_BIASES = tuple((f"self_attn.{p}_proj.bias", f"self_attn.{p}_proj.bias", False, s)
                          for p, s in (("q", (2,)), ("k", (2,)), ("v", (2,)), ("o", None)))
_BLOCK_TENSORS = (
    ("input_layernorm.weight", "input_layernorm.weight", False, None),
    ("post_attention_layernorm.weight", "post_attention_layernorm.weight", False, None),
    ("mlp.gate_proj.weight", "mlp.gate_proj.kernel", True, None),
    ("mlp.up_proj.weight", "mlp.up_proj.kernel", True, None),
    ("mlp.down_proj.weight", "mlp.down_proj.kernel", True, None),
)


def _hf_prefix(cfg: Qwen3_5Config) -> str:
    return "model.language_model." if cfg.model_type == "qwen3_5" else "model."


def hf_rules(cfg: Qwen3_5Config) -> list[Rule]:
    """HF tensor names ↔ our parameters.

    HF layer i is group i // P, run r, slot i % P − start_r of that run, for the period P.
    HF Linear weights are `[out, in]`, ours `[in, out]`; conv1d.weight keeps HF's `[C, 1, K]`.
    """
    prefix = _hf_prefix(cfg)
    n_groups, runs = cfg.groups
    period = sum(n for _, n in runs)
    rules = [Rule(f"{prefix}embed_tokens.weight", "embed_tokens.embedding"),
             Rule(f"{prefix}norm.weight", "norm.weight")]
    start = 0
    for r, (kind, n) in enumerate(runs):
        layers = [g * period + start + j for g in range(n_groups) for j in range(n)]
        tensors = _BLOCK_TENSORS + (_DELTA_TENSORS if kind == LINEAR else _ATTENTION_TENSORS)
        if kind == FULL and cfg.attention_bias:
            tensors += _ATTENTION_BIASES
        rules += [Rule(f"{prefix}layers.{{i}}.{hf}", f"layers.runs.{r}.{ours}", layers=layers,
                       index=lambda i, s=start: (i // period, i % period - s), transpose=t, split=split)
                  for hf, ours, t, split in tensors]
        start += n
    if not cfg.tie_word_embeddings:
        rules.append(Rule("lm_head.weight", "lm_head.weight"))
    return rules


def hf_ignore(cfg: Qwen3_5Config) -> tuple[str, ...]:
    """HF tensors we read past: the vision tower, multi-token-prediction heads, rotary buffers, a tied lm_head."""
    tied = (r"lm_head\.weight",) if cfg.tie_word_embeddings else ()
    return (r"model\.visual\..*", r"mtp\..*", r".*rotary_emb\.inv_freq") + tied
