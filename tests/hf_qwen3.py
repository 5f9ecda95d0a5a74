"""Tiny random transformers Qwen3 models for parity tests (saved to a tmp dir)."""

from __future__ import annotations

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

# head_dim 24 differs from hidden / heads = 16; GQA 4 query heads on 2 kv heads.
BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=24, rope_theta=10000.0)

VARIANTS = {
    "tied": dict(tie_word_embeddings=True),
    "untied": dict(tie_word_embeddings=False),
    "bias": dict(tie_word_embeddings=False, attention_bias=True, num_hidden_layers=3),
}


def make_hf(path, seed: int = 0, **overrides) -> Qwen3ForCausalLM:
    """A random HF Qwen3 (weights scaled up so logits are not all near zero), saved at `path`."""
    torch.manual_seed(seed)
    kw = {**BASE, **overrides}
    theta = kw.pop("rope_theta")
    cfg = Qwen3Config(**kw, rope_parameters={"rope_type": "default", "rope_theta": theta})
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)
    model.save_pretrained(path)
    return model


def hf_logits(model, ids, attention_mask=None, position_ids=None) -> np.ndarray:
    """transformers' logits as a float32 numpy array."""
    kw = {}
    if attention_mask is not None:
        kw["attention_mask"] = torch.tensor(np.asarray(attention_mask))
    if position_ids is not None:
        kw["position_ids"] = torch.tensor(np.asarray(position_ids))
    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids)), **kw).logits.float().numpy()
