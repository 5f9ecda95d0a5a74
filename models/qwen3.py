"""Qwen3 dense (HF model_type `qwen3`) in Flax NNX.

Pre-norm decoder: GQA attention with per-head q/k RMSNorm and RoPE, SwiGLU
MLP, tied or untied embeddings. The decoder layers are stacked on a leading
`layers` axis and run with `lax.scan`, so compile time does not grow with depth.

This module is also a checkpoint *family* (see `models.checkpoint`): it
exposes `Config`, `Model`, `hf_rules(cfg)` and `hf_ignore(cfg)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from models import decode
from models.checkpoint import Rule
from models.layers import (MLP, Attention, AttnMask, CausalLMHead, Embed, KVCache, LMHead, RMSNorm, jit_when_eager,
                           positions_from, rope_cos_sin, scan, stack)
from models.sharding import constrain

Array = jax.Array

# HF config.json keys that transformers fills with a default when absent.
_HF_DEFAULTS = {
    "attention_bias": False,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
    "use_sliding_window": False,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """The fields of an HF Qwen3 config.json that the model uses."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    model_type = "qwen3"

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "head_dim"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive, got {getattr(self, f)}")

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> Qwen3Config:
        """From a parsed HF config.json (transformers 4.x or 5.x layout)."""
        if d.get("model_type") != "qwen3":
            raise ValueError(f"not a qwen3 config: model_type={d.get('model_type')!r}")
        d = {**_HF_DEFAULTS, **d}
        for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if k not in d:
                raise KeyError(f"config.json lacks {k!r}")
        if d["hidden_act"] != "silu":
            raise NotImplementedError(f"hidden_act {d['hidden_act']!r} (only silu)")
        if d["use_sliding_window"]:
            raise NotImplementedError("sliding-window attention")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise NotImplementedError(f"rope_type {rope_type!r} (only default)")
        theta = rope.get("rope_theta", d.get("rope_theta"))
        if theta is None:
            raise KeyError("config.json lacks rope_theta (top level or in rope_parameters)")
        heads = d["num_attention_heads"]
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads, rope_theta=float(theta),
            rms_norm_eps=d["rms_norm_eps"], tie_word_embeddings=d["tie_word_embeddings"],
            attention_bias=d["attention_bias"], max_position_embeddings=d["max_position_embeddings"],
            bos_token_id=d["bos_token_id"], eos_token_id=d["eos_token_id"], pad_token_id=d["pad_token_id"])

    def to_hf(self) -> dict[str, Any]:
        """An HF config.json dict (transformers 5 layout, readable by 4.x too)."""
        d = dataclasses.asdict(self)
        theta = d.pop("rope_theta")
        d.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_act="silu",
                 rope_parameters={"rope_type": "default", "rope_theta": theta}, rope_theta=theta,
                 use_sliding_window=False, sliding_window=None, attention_dropout=0.0,
                 layer_types=["full_attention"] * self.num_hidden_layers)
        return d


class Qwen3Block(nnx.Module):
    """One decoder layer (HF `Qwen3DecoderLayer`)."""

    def __init__(self, cfg: Qwen3Config, *, dtype, param_dtype, rngs: nnx.Rngs, attention_impl: str = "xla"):
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, axes=("norm",), **kw)
        self.self_attn = Attention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            rope_theta=cfg.rope_theta, eps=cfg.rms_norm_eps, use_bias=cfg.attention_bias, rngs=rngs,
            impl=attention_impl, **kw)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, axes=("norm",), **kw)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, rngs=rngs, **kw)

    def __call__(self, x: Array, rope: tuple[Array, Array], mask: AttnMask, cache: KVCache | None = None,
                 cache_index: Array | None = None, layer: Array | None = None) -> tuple[Array, KVCache | None]:
        h, cache = self.self_attn(self.input_layernorm(x), rope, mask, cache, cache_index, layer)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return constrain(x, ("batch", "seq", "act_embed")), cache


class Qwen3(CausalLMHead, nnx.Module):
    """Qwen3ForCausalLM.

    Call `model(input_ids)` for logits `[B, T, V]`. Options: `positions`
    (`[B, T]`), `segment_ids` (`[B, T]`, packed sequences; 0 = padding),
    `attention_mask` (`[B, T]`, 1 = token, 0 = left padding), `cache` (a
    `decode.Cache`; the call then returns `(out, new_cache)`), and
    `return_hidden` (final-normed hidden states `[B, T, D]` instead of logits;
    pair with `lm_head_weight()` for chunked log-probs).

    `remat` (default on) recomputes each layer's activations in the backward
    pass, keeping only the residual stream between layers; it changes no
    value and costs nothing without a gradient. On the CPU it is also faster
    than saving a scan's per-layer residuals.

    `attention_impl` ("xla", "splash" on TPU, "cudnn" on GPU) picks the attention
    kernel of cache-free calls (`models.fused_attention`).
    """

    def __init__(self, cfg: Qwen3Config, *, dtype=jnp.float32, param_dtype=None, rngs: nnx.Rngs,
                 remat: bool = True, attention_impl: str = "xla"):
        param_dtype = param_dtype or dtype
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.config = cfg
        self.dtype = dtype
        self.remat = remat
        self.embed_tokens = Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs, **kw)
        self.layers = stack(lambda r: Qwen3Block(cfg, rngs=r, attention_impl=attention_impl, **kw),
                            cfg.num_hidden_layers, rngs)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, axes=("norm",), **kw)
        self.lm_head = None if cfg.tie_word_embeddings else LMHead(cfg.vocab_size, cfg.hidden_size, rngs=rngs, **kw)

    def init_cache(self, batch: int, max_len: int, dtype=None) -> decode.Cache:
        """An empty decoding cache for `batch` rows of up to `max_len` tokens."""
        cfg = self.config
        kv = KVCache.zeros(batch, max_len, cfg.num_key_value_heads, cfg.head_dim, dtype or self.dtype,
                           layers=(cfg.num_hidden_layers,))
        return decode.Cache.empty(kv, batch, max_len)

    @jit_when_eager
    def __call__(self, input_ids: Array, *, positions: Array | None = None, segment_ids: Array | None = None,
                 attention_mask: Array | None = None, cache: decode.Cache | None = None,
                 return_hidden: bool = False):
        x = constrain(self.embed_tokens(input_ids), ("batch", "seq", "act_embed"))
        if cache is None:
            seg = segment_ids if segment_ids is not None else attention_mask
            if seg is None:
                seg = jnp.ones(input_ids.shape, jnp.int32)
            mask = AttnMask.full(seg)
            if positions is None:
                positions = positions_from(attention_mask, segment_ids, input_ids.shape)
            kv, index = None, None
        else:
            if segment_ids is not None:
                raise ValueError("segment_ids are not supported with a cache")
            index = cache.index
            auto_positions, mask, cache = cache.advance(attention_mask, input_ids.shape)
            positions = auto_positions if positions is None else positions
            kv = cache.layers
        rope = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)

        # The stacked KV cache rides in the scan carry, so each layer writes its new
        # keys and values in place.
        def body(block, carry, i):
            h, kv = carry
            h, kv = block(h, rope, mask, kv, index, None if kv is None else i)
            return (h, kv), None

        (x, kv), _ = scan(self.layers, body, (x, kv), jnp.arange(self.config.num_hidden_layers), remat=self.remat)
        h = self.norm(x)
        out = h if return_hidden else self.logits(h)
        if cache is None:
            return out
        return out, dataclasses.replace(cache, layers=kv)


# ---------------------------------------------------------------------------
# checkpoint family interface

Config = Qwen3Config
Model = Qwen3


def hf_rules(cfg: Qwen3Config) -> list[Rule]:
    """HF tensor names ↔ our parameters (HF Linear weights are `[out, in]`; ours `[in, out]`)."""
    layers = range(cfg.num_hidden_layers)

    def per_layer(hf: str, ours: str, **kw) -> Rule:
        return Rule(f"model.layers.{{i}}.{hf}", f"layers.{ours}", layers=layers, **kw)

    rules = [
        Rule("model.embed_tokens.weight", "embed_tokens.embedding"),
        Rule("model.norm.weight", "norm.weight"),
        per_layer("input_layernorm.weight", "input_layernorm.weight"),
        per_layer("post_attention_layernorm.weight", "post_attention_layernorm.weight"),
        per_layer("self_attn.q_proj.weight", "self_attn.q_proj.kernel", transpose=True, split=(1, 2)),
        per_layer("self_attn.k_proj.weight", "self_attn.k_proj.kernel", transpose=True, split=(1, 2)),
        per_layer("self_attn.v_proj.weight", "self_attn.v_proj.kernel", transpose=True, split=(1, 2)),
        per_layer("self_attn.o_proj.weight", "self_attn.o_proj.kernel", transpose=True, split=(2, 1)),
        per_layer("self_attn.q_norm.weight", "self_attn.q_norm.weight"),
        per_layer("self_attn.k_norm.weight", "self_attn.k_norm.weight"),
        per_layer("mlp.gate_proj.weight", "mlp.gate_proj.kernel", transpose=True),
        per_layer("mlp.up_proj.weight", "mlp.up_proj.kernel", transpose=True),
        per_layer("mlp.down_proj.weight", "mlp.down_proj.kernel", transpose=True),
    ]
    if cfg.attention_bias:
        rules += [per_layer(f"self_attn.{p}_proj.bias", f"self_attn.{p}_proj.bias", split=(2,)) for p in "qkv"]
        rules.append(per_layer("self_attn.o_proj.bias", "self_attn.o_proj.bias"))
    if not cfg.tie_word_embeddings:
        rules.append(Rule("lm_head.weight", "lm_head.weight"))
    return rules


def hf_ignore(cfg: Qwen3Config) -> tuple[str, ...]:
    """Regexes of HF tensors we read past: rotary buffers, and a redundant lm_head when tied."""
    return (r".*rotary_emb\.inv_freq",) + ((r"lm_head\.weight",) if cfg.tie_word_embeddings else ())
