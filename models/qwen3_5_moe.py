"""Qwen3.5-MoE text model (HF model_type `qwen3_5_moe_text`, e.g. Qwen3.5-35B-A3B) in Flax NNX.

The hybrid Gated DeltaNet / gated-attention stack of `models.qwen3_5` with
every layer's MLP replaced by routed experts plus a sigmoid-gated shared
expert (`models.moe.SharedExpertMoE`). The model class is `Qwen3_5` itself;
this config's `make_mlp` supplies the feed-forward, and the checkpoint rules
swap the dense MLP's tensors for the router's, the experts' and the shared
expert's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from flax import nnx

from models.checkpoint import Rule
from models.moe import SharedExpertMoE
from models.qwen3_5 import Dtype, Qwen3_5, Qwen3_5Config
from models.qwen3_5 import hf_ignore as _dense_ignore
from models.qwen3_5 import hf_rules as _dense_rules


@dataclasses.dataclass(frozen=True)
class Qwen3_5MoeConfig(Qwen3_5Config):
    """Qwen3.5's fields plus the experts'. `capacity_factor` is ours: None keeps every token."""

    num_experts: int = 256
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    router_aux_loss_coef: float = 0.001
    capacity_factor: float | None = None
    model_type: str = "qwen3_5_moe_text"

    MODEL_TYPES = ("qwen3_5_moe_text",)

    def make_mlp(self, *, dtype: Dtype, param_dtype: Dtype, rngs: nnx.Rngs) -> nnx.Module:
        return SharedExpertMoE(self.hidden_size, self.moe_intermediate_size, self.shared_expert_intermediate_size,
                               self.num_experts, self.num_experts_per_tok, capacity_factor=self.capacity_factor,
                               dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> Qwen3_5MoeConfig:
        """From a `qwen3_5_moe_text` config.json dict."""
        if hf.get("model_type") != "qwen3_5_moe_text":
            raise ValueError(f"not a Qwen3.5-MoE text config: model_type={hf.get('model_type')!r}")
        shared = hf.get("shared_expert_intermediate_size", 512)
        dense = Qwen3_5Config.from_hf({**hf, "model_type": "qwen3_5_text", "intermediate_size": shared})
        fields = {f.name: getattr(dense, f.name) for f in dataclasses.fields(Qwen3_5Config)}
        return cls(**{**fields, "model_type": "qwen3_5_moe_text"},
                   num_experts=hf.get("num_experts", hf.get("num_local_experts", 256)),
                   num_experts_per_tok=hf.get("num_experts_per_tok", 8),
                   moe_intermediate_size=hf.get("moe_intermediate_size", 512),
                   shared_expert_intermediate_size=shared,
                   router_aux_loss_coef=hf.get("router_aux_loss_coef", 0.001))

    def to_hf(self) -> dict[str, Any]:
        """An HF `qwen3_5_moe_text` config.json dict (transformers 5 layout)."""
        d = super().to_hf()
        d.pop("intermediate_size", None)
        d.pop("num_local_experts", None)
        d.update(model_type="qwen3_5_moe_text", architectures=["Qwen3_5MoeForCausalLM"],
                 num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                 moe_intermediate_size=self.moe_intermediate_size,
                 shared_expert_intermediate_size=self.shared_expert_intermediate_size,
                 router_aux_loss_coef=self.router_aux_loss_coef, output_router_logits=False)
        return d


# ---------------------------------------------------------------------------
# checkpoint family interface

Config = Qwen3_5MoeConfig
Model = Qwen3_5

_MOE_TENSORS = (  # (HF name under the layer's mlp, ours under the layer's mlp, transpose, one per expert)
    ("gate.weight", "gate.kernel", True, False),
    ("experts.{j}.gate_proj.weight", "experts.gate_proj", True, True),
    ("experts.{j}.up_proj.weight", "experts.up_proj", True, True),
    ("experts.{j}.down_proj.weight", "experts.down_proj", True, True),
    ("shared_expert.gate_proj.weight", "shared_expert.gate_proj.kernel", True, False),
    ("shared_expert.up_proj.weight", "shared_expert.up_proj.kernel", True, False),
    ("shared_expert.down_proj.weight", "shared_expert.down_proj.kernel", True, False),
    ("shared_expert_gate.weight", "shared_expert_gate.kernel", True, False),
)


def hf_rules(cfg: Qwen3_5MoeConfig) -> list[Rule]:
    """Qwen3.5's rules with each run's dense-MLP tensors replaced by the mixture's (same layers, same index)."""
    rules = []
    for rule in _dense_rules(cfg):
        if ".mlp." not in rule.ours:
            rules.append(rule)
        elif rule.ours.endswith(".mlp.gate_proj.kernel"):
            hf_layer, ours_layer = rule.hf.split("mlp.")[0], rule.ours.split("mlp.")[0]
            rules += [Rule(f"{hf_layer}mlp.{hf}", f"{ours_layer}mlp.{ours}", layers=rule.layers, index=rule.index,
                           transpose=t, experts=cfg.num_experts if per_expert else None)
                      for hf, ours, t, per_expert in _MOE_TENSORS]
    return rules


def hf_ignore(cfg: Qwen3_5MoeConfig) -> tuple[str, ...]:
    """As Qwen3.5: multi-token-prediction heads, rotary buffers, a tied lm_head."""
    return _dense_ignore(cfg)
