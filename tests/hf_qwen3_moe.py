"""Tiny random transformers Qwen3-MoE models for parity tests (saved to a tmp dir)."""

from __future__ import annotations

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

# 8 experts, 2 active; head_dim 24 differs from hidden / heads; GQA 4 on 2.
BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=40, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=24, num_experts=8, num_experts_per_tok=2,
            rope_theta=10000.0)

VARIANTS = {
    # every layer sparse, top-k probabilities renormalized (Qwen3-30B-A3B's choice)
    "norm": dict(norm_topk_prob=True),
    # raw top-k probabilities; layer 0 dense by mlp_only_layers, layer 2 dense by decoder_sparse_step 2
    "mixed": dict(norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[0], num_hidden_layers=4,
                  tie_word_embeddings=True),
}


def make_hf(path, seed: int = 0, **overrides) -> Qwen3MoeForCausalLM:
    """A random HF Qwen3-MoE (weights scaled up so routing and logits are not flat), saved at `path`."""
    torch.manual_seed(seed)
    kw = {**BASE, **overrides}
    theta = kw.pop("rope_theta")
    cfg = Qwen3MoeConfig(**kw, rope_parameters={"rope_type": "default", "rope_theta": theta})
    model = Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.08)
    if path is not None:
        model.save_pretrained(path)
    return model
