"""Qwen3-MoE (HF model_type `qwen3_moe`, e.g. Qwen3-30B-A3B) in Flax NNX.

Qwen3's decoder (`models.qwen3`) with the SwiGLU MLP of most layers replaced
by a sparse mixture of experts (`models.moe.SparseMoE`). Layer i is sparse
unless it is listed in `mlp_only_layers` or `(i + 1) % decoder_sparse_step`
is nonzero; the others keep a dense MLP of `intermediate_size`.

Layers are stacked and scanned in *runs* of consecutive layers of one kind
(`runs[r]` covers layers `run_bounds[r]`): one run when every layer is
sparse (Qwen3-30B-A3B), one per layer at worst. The KV cache stays one stack
over all layers.

Calls may return and replay the routing: `return_routing=True` adds the
experts chosen by every sparse layer (`[B, T, L_sparse, k]` int32, in layer
order) and the router logits (`[B, T, L_sparse, E]`) to the output, and
`routing=` imposes such choices (routing replay, see `models.moe`).
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
from models.moe import SparseMoE
from models.qwen3 import Qwen3Config
from models.sharding import constrain

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Qwen3MoeConfig(Qwen3Config):
    """Qwen3's fields plus the mixture of experts'.

    `capacity_factor` is ours (not in HF's config): None keeps every token.
    """

    num_experts: int = 128
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.001
    capacity_factor: float | None = None

    model_type = "qwen3_moe"

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} not in 1..{self.num_experts}")
        if self.decoder_sparse_step < 1:
            raise ValueError(f"decoder_sparse_step must be >= 1, got {self.decoder_sparse_step}")

    def is_sparse(self, layer: int) -> bool:
        """Whether HF layer `layer` has routed experts (transformers' rule)."""
        return (layer not in self.mlp_only_layers and self.num_experts > 0
                and (layer + 1) % self.decoder_sparse_step == 0)

    @property
    def run_bounds(self) -> tuple[tuple[int, int, bool], ...]:
        """`(start, stop, sparse)` for each run of consecutive layers of one kind."""
        runs: list[list] = []
        for i in range(self.num_hidden_layers):
            sparse = self.is_sparse(i)
            if runs and runs[-1][2] == sparse:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1, sparse])
        return tuple(tuple(r) for r in runs)

    @property
    def num_sparse_layers(self) -> int:
        return sum(self.is_sparse(i) for i in range(self.num_hidden_layers))

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> Qwen3MoeConfig:
        """From a parsed HF config.json."""
        if d.get("model_type") != cls.model_type:
            raise ValueError(f"not a {cls.model_type} config: model_type={d.get('model_type')!r}")
        base = Qwen3Config.from_hf({"intermediate_size": 6144, **d, "model_type": "qwen3"})
        num_experts = d.get("num_experts", d.get("num_local_experts", 128))
        return cls(**dataclasses.asdict(base), num_experts=num_experts,
                   num_experts_per_tok=d.get("num_experts_per_tok", 8),
                   moe_intermediate_size=d.get("moe_intermediate_size", 768),
                   norm_topk_prob=bool(d.get("norm_topk_prob", False)),
                   decoder_sparse_step=d.get("decoder_sparse_step", 1),
                   mlp_only_layers=tuple(d.get("mlp_only_layers") or ()),
                   router_aux_loss_coef=d.get("router_aux_loss_coef", 0.001))

    def to_hf(self) -> dict[str, Any]:
        """An HF config.json dict (transformers 5 layout)."""
        d = super().to_hf()
        d.pop("capacity_factor")
        d.update(model_type=self.model_type, architectures=["Qwen3MoeForCausalLM"],
                 mlp_only_layers=list(self.mlp_only_layers), output_router_logits=False)
        return d


class Qwen3MoeBlock(nnx.Module):
    """One decoder layer (HF `Qwen3MoeDecoderLayer`), sparse or dense."""

    def __init__(self, cfg: Qwen3MoeConfig, sparse: bool, *, dtype, param_dtype, rngs: nnx.Rngs,
                 attention_impl: str = "xla"):
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.sparse = sparse
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, axes=("norm",), **kw)
        self.self_attn = Attention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            rope_theta=cfg.rope_theta, eps=cfg.rms_norm_eps, use_bias=cfg.attention_bias, rngs=rngs,
            impl=attention_impl, **kw)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, axes=("norm",), **kw)
        if sparse:
            self.mlp = SparseMoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                                 norm_topk_prob=cfg.norm_topk_prob, capacity_factor=cfg.capacity_factor, rngs=rngs,
                                 **kw)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, rngs=rngs, **kw)

    def __call__(self, x: Array, rope: tuple[Array, Array], mask: AttnMask, cache: KVCache | None,
                 cache_index: Array | None, layer: Array | None, experts: Array | None
                 ) -> tuple[Array, KVCache | None, tuple[Array, Array] | None]:
        """Returns the new residual stream, the cache, and (experts, router logits) when sparse."""
        h, cache = self.self_attn(self.input_layernorm(x), rope, mask, cache, cache_index, layer)
        x = x + h
        normed = self.post_attention_layernorm(x)
        routing = None
        if self.sparse:
            h, chosen, logits = self.mlp(normed, experts)
            routing = (chosen, logits)
        else:
            h = self.mlp(normed)
        return constrain(x + h, ("batch", "seq", "act_embed")), cache, routing


class Qwen3Moe(CausalLMHead, nnx.Module):
    """Qwen3MoeForCausalLM, with the options of `models.qwen3.Qwen3` plus routing.

    `return_routing=True` makes the call return `(out, routing)` (or
    `((out, routing), cache)` with a cache), `routing = (experts, router_logits)`
    stacked over the sparse layers on axis 2; `routing=experts` replays choices.
    """

    def __init__(self, cfg: Qwen3MoeConfig, *, dtype=jnp.float32, param_dtype=None, rngs: nnx.Rngs,
                 remat: bool = True, attention_impl: str = "xla"):
        param_dtype = param_dtype or dtype
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.config = cfg
        self.dtype = dtype
        self.remat = remat
        self.embed_tokens = Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs, **kw)
        self.runs = nnx.List([
            stack(lambda r, s=sparse: Qwen3MoeBlock(cfg, s, rngs=r, attention_impl=attention_impl, **kw),
                  stop - start, rngs)
            for start, stop, sparse in cfg.run_bounds])
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
                 return_hidden: bool = False, return_routing: bool = False, routing: Array | None = None):
        cfg = self.config
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
        rope = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)

        def body(block, carry, xs):
            h, kv = carry
            i, experts = xs
            h, kv, routed = block(h, rope, mask, kv, index, None if kv is None else i, experts)
            return (h, kv), routed

        chosen, logits, done = [], [], 0
        for run, (start, stop, sparse) in zip(self.runs, cfg.run_bounds):
            replay = None
            if sparse and routing is not None:
                replay = jnp.moveaxis(routing[:, :, done:done + stop - start], 2, 0)
            (x, kv), routed = scan(run, body, (x, kv), (jnp.arange(start, stop), replay), remat=self.remat)
            if sparse:
                chosen.append(routed[0])
                logits.append(routed[1])
                done += stop - start
        h = self.norm(x)
        out = h if return_hidden else self.logits(h)
        if return_routing:
            out = (out, (jnp.moveaxis(jnp.concatenate(chosen), 0, 2), jnp.moveaxis(jnp.concatenate(logits), 0, 2)))
        if cache is None:
            return out
        return out, dataclasses.replace(cache, layers=kv)


# ---------------------------------------------------------------------------
# checkpoint family interface

Config = Qwen3MoeConfig
Model = Qwen3Moe


def block_rules(cfg: Qwen3MoeConfig, prefix: str) -> list[Rule]:
    """Rules for the MLP side of every run: dense MLPs, routers and routed experts.

    HF stores each expert's SwiGLU separately (`mlp.experts.{j}.gate_proj.weight`),
    which transformers 5 fuses on load and splits again on save.
    """
    rules = []
    for r, (start, stop, sparse) in enumerate(cfg.run_bounds):
        def rule(hf: str, ours: str, start=start, **kw) -> Rule:
            return Rule(f"{prefix}.layers.{{i}}.{hf}", f"runs.{r}.{ours}", layers=range(start, stop),
                        index=lambda i, start=start: (i - start,), transpose=True, **kw)

        if sparse:
            rules.append(rule("mlp.gate.weight", "mlp.gate.kernel"))
            rules += [rule(f"mlp.experts.{{j}}.{p}.weight", f"mlp.experts.{p}", experts=cfg.num_experts)
                      for p in ("gate_proj", "up_proj", "down_proj")]
        else:
            rules += [rule(f"mlp.{p}.weight", f"mlp.{p}.kernel") for p in ("gate_proj", "up_proj", "down_proj")]
    return rules


def hf_rules(cfg: Qwen3MoeConfig) -> list[Rule]:
    """HF tensor names ↔ our parameters (HF Linear weights are `[out, in]`; ours `[in, out]`)."""
    rules = [Rule("model.embed_tokens.weight", "embed_tokens.embedding"), Rule("model.norm.weight", "norm.weight")]
    for r, (start, stop, _) in enumerate(cfg.run_bounds):
        def rule(hf: str, ours: str, start=start, stop=stop, r=r, **kw) -> Rule:
            return Rule(f"model.layers.{{i}}.{hf}", f"runs.{r}.{ours}", layers=range(start, stop),
                        index=lambda i, start=start: (i - start,), **kw)

        rules += [
            rule("input_layernorm.weight", "input_layernorm.weight"),
            rule("post_attention_layernorm.weight", "post_attention_layernorm.weight"),
            rule("self_attn.q_proj.weight", "self_attn.q_proj.kernel", transpose=True, split=(1, 2)),
            rule("self_attn.k_proj.weight", "self_attn.k_proj.kernel", transpose=True, split=(1, 2)),
            rule("self_attn.v_proj.weight", "self_attn.v_proj.kernel", transpose=True, split=(1, 2)),
            rule("self_attn.o_proj.weight", "self_attn.o_proj.kernel", transpose=True, split=(2, 1)),
            rule("self_attn.q_norm.weight", "self_attn.q_norm.weight"),
            rule("self_attn.k_norm.weight", "self_attn.k_norm.weight"),
        ]
        if cfg.attention_bias:
            rules += [rule(f"self_attn.{p}_proj.bias", f"self_attn.{p}_proj.bias", split=(2,)) for p in "qkv"]
            rules.append(rule("self_attn.o_proj.bias", "self_attn.o_proj.bias"))
    rules += block_rules(cfg, "model")
    if not cfg.tie_word_embeddings:
        rules.append(Rule("lm_head.weight", "lm_head.weight"))
    return rules


def hf_ignore(cfg: Qwen3MoeConfig) -> tuple[str, ...]:
    """Regexes of HF tensors we read past: rotary buffers, and a redundant lm_head when tied."""
    return (r".*rotary_emb\.inv_freq",) + ((r"lm_head\.weight",) if cfg.tie_word_embeddings else ())
