"""The sampling settings: one frozen dataclass that every settings class and engine request extends.

Training rollouts (`RolloutConfig`), validation (`ValidationConfig`), evaluation
(`EvalSettings`), the supervised baselines' pool (`PoolSettings`) and the engines'
request (`SamplingParams`) all sample with the same five settings, declared and
checked here once. A subclass adds what only it has (the group size, GT Debug's
budget, n and the seed of one engine call) and its own bounds on top.

This module does not import JAX, so that loading a config stays JAX-free.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How to sample completions (the paper's defaults, appendix C).

    Attributes:
        temperature: 0 is greedy; logits are divided by it otherwise.
        top_p: keep the smallest set of most likely tokens whose mass reaches p (1 keeps all).
        top_k: keep the k most likely tokens (0 keeps all).
        max_tokens: completion tokens in total, thinking and answer together.
        thinking_budget: tokens a think block may take before the engine closes it
            with `\\n</think>\\n\\n`; None for no budget.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 6144
    thinking_budget: int | None = 4096

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.thinking_budget is not None and self.thinking_budget < 0:
            raise ValueError(f"thinking_budget must be >= 0 or None, got {self.thinking_budget}")



def sampling_kwargs(settings: Sampling) -> dict[str, Any]:
    """The five sampling settings of `settings` (any `Sampling` subclass) as keyword arguments."""
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(Sampling)}
