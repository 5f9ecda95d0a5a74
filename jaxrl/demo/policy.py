"""The demo policy: a small Qwen3-architecture model over the demo vocabulary."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from jaxrl.demo.tokenizer import DemoTokenizer
from models.qwen3 import Qwen3, Qwen3Config


def policy_config(tokenizer: DemoTokenizer, hidden: int = 64, layers: int = 2, heads: int = 4) -> Qwen3Config:
    """Qwen3 with the demo vocabulary and a few narrow layers.

    Tied embeddings, as the small Qwen3 models have; head_dim = hidden / heads,
    two KV heads (grouped-query attention as in Qwen3).
    """
    return Qwen3Config(
        vocab_size=tokenizer.vocab_size, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=hidden // heads,
        rope_theta=10_000.0, tie_word_embeddings=True, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)


def new_policy(cfg: Qwen3Config, seed: int) -> Qwen3:
    """A randomly initialised float32 policy."""
    return Qwen3(cfg, dtype=jnp.float32, rngs=nnx.Rngs(seed))
