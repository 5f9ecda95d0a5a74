"""The rollout interface: what every engine takes and returns.

The trainer, the evaluation and the demo ask an engine for completions and never
learn whether the tokens came from the embedded JAX sampler, SGLang servers or an
OpenAI-compatible endpoint. An engine is chosen by name (`make_engine("jax", ...)`);
`register_engine` adds one.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import Any, Literal

from jaxrl.sampling import Sampling, sampling_kwargs

FinishReason = Literal["stop", "length"]


@dataclasses.dataclass(frozen=True)
class SamplingParams(Sampling):
    """One engine call's request: the sampling settings (`jaxrl.sampling.Sampling`), n and a seed.

    Attributes:
        n: samples per prompt (G, the group size).
        stop_token_ids: token ids that end a completion besides the tokenizer's own.
        seed: the sampling seed; the same seed gives the same samples.
    """

    n: int = 1
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")

    @classmethod
    def of(cls, sampling: Sampling, *, n: int, seed: int) -> SamplingParams:
        """The request for `n` samples per prompt under `sampling`'s settings (any `Sampling` subclass)."""
        return cls(**sampling_kwargs(sampling), n=n, seed=seed)


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled completion of one prompt.

    Attributes:
        token_ids: the completion's tokens (the prompt excluded), including any the
            engine appended to close a think block and the stop token, if one ended it.
        logprobs: one per token id: the log-prob of that token under the
            temperature-scaled, untruncated distribution (the quantity the train step
            recomputes); engine-appended tokens carry 0.0 and `forced` marks them.
        finish_reason: "stop" (a stop token) or "length" (max_tokens reached).
        text: the decoded completion, special tokens kept, except the stop token that ended it
            (the response as servers return it; `token_ids` still holds the stop token).
        thinking: the think block's text, or None when there was none.
        answer: the text after the think block (all of `text` when there was none).
        forced: per token, True where the engine appended it (thinking budget).
        budget_hit: the thinking budget closed the think block.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    text: str
    thinking: str | None
    answer: str
    forced: tuple[bool, ...] = ()
    budget_hit: bool = False


class Engine(abc.ABC):
    """A source of completions. Engines are also context managers (`close` on exit)."""

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        """`params.n` completions for each prompt (token ids), in prompt order."""

    def generate_each(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                      on_prompt: Callable[[int, list[Completion]], None]) -> list[list[Completion]]:
        """`generate`, also calling `on_prompt(i, completions)` once per prompt as soon as its completions
        are final, so a caller can start on them while the others are sampled. This default calls it for
        every prompt at the end, in order; an engine that knows sooner overrides it."""
        groups = self.generate(prompts, params)
        for i, group in enumerate(groups):
            on_prompt(i, group)
        return groups

    @abc.abstractmethod
    def update_weights(self, model: Any, *, step: int) -> None:
        """Serve `model`'s current weights from now on (after an RL update at `step`)."""

    def close(self) -> None:
        """Release servers, threads and devices; the default holds none."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


ENGINES: dict[str, Callable[..., Engine]] = {}

# Built-in engines, imported on first use so that choosing `openai` never imports JAX.
BUILTIN_ENGINES: dict[str, str] = {
    "jax": "jaxrl.rollout.jax_engine",
    "sglang": "jaxrl.rollout.sglang_engine",
    "openai": "jaxrl.rollout.openai_engine",
}


def register_engine(name: str) -> Callable[[Callable[..., Engine]], Callable[..., Engine]]:
    """Decorator: make an engine constructor available to `make_engine(name, ...)`."""

    def decorate(factory: Callable[..., Engine]) -> Callable[..., Engine]:
        if name in ENGINES:
            raise ValueError(f"engine {name!r} is already registered")
        ENGINES[name] = factory
        return factory

    return decorate


def engine_factory(name: str) -> Callable[..., Engine]:
    """The constructor registered as `name`, importing a built-in engine's module on first use.

    The one lookup of the registry: reading `ENGINES[name]` directly fails in a fresh process,
    before the built-in engine's module has registered it.
    """
    if name not in ENGINES and name in BUILTIN_ENGINES:
        importlib.import_module(BUILTIN_ENGINES[name])
    if name not in ENGINES:
        known = ", ".join(sorted(set(ENGINES) | set(BUILTIN_ENGINES)))
        raise ValueError(f"unknown engine {name!r}; choose from {known}")
    return ENGINES[name]


def make_engine(name: str, **kwargs: Any) -> Engine:
    """The engine registered as `name` (a built-in one is imported first), built with `kwargs`."""
    return engine_factory(name)(**kwargs)
