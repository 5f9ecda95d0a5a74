"""Flax NNX ports of the Qwen families, HF checkpoint I/O, sharding rules, decoding.

The public names below load lazily, so `import models` stays cheap (no JAX
until one of them is used):

- `from_pretrained(path, dtype=jnp.float32, mesh=None)`: an HF safetensors
  directory → our model, each parameter read straight onto its shards.
- `save_pretrained(model, path)`: our model → a directory transformers loads.
- `load_config(path_or_dict)`: HF config.json → the family's config dataclass.
- `model_class(config)`: the family's model class for a config.
- `Qwen3`, `Qwen3Config`: the dense family.
- `Qwen3Moe`, `Qwen3MoeConfig`, `Qwen3_5MoeConfig`: the mixtures of experts
  (a `Qwen3_5MoeConfig` builds a `Qwen3_5` with routed experts).
- `make_mesh(data, fsdp, tensor, expert=1)`: the `(data, fsdp, expert, tensor)` device mesh.
- `Decoder`, `SamplingParams`: jitted prefill / step / generate.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "from_pretrained": "models.checkpoint",
    "save_pretrained": "models.checkpoint",
    "load_config": "models.checkpoint",
    "model_class": "models.checkpoint",
    "FAMILIES": "models.checkpoint",
    "Qwen3": "models.qwen3",
    "Qwen3Config": "models.qwen3",
    "Qwen3_5": "models.qwen3_5", "Qwen3_5Config": "models.qwen3_5",
    "Qwen3Moe": "models.qwen3_moe", "Qwen3MoeConfig": "models.qwen3_moe",
    "Qwen3_5MoeConfig": "models.qwen3_5_moe",
    "make_mesh": "models.sharding",
    "Decoder": "models.decode",
    "SamplingParams": "models.decode",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")
