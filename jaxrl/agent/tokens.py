"""The multi-turn token layout: an episode as one concatenated token row for the train step.

An episode with token ids (the `jax` and `sglang` engines, `openai --api
completions`) is a list of segments, in the order the sampler saw them:

    [prompt | reply 1 | observation 1 | reply 2 | observation 2 | … | reply n]
     context  policy    context         policy    context             policy

The prompt of turn t is exactly the concatenation of every segment before reply
t, so the row the trainer recomputes is the context the sampler had at each of
its tokens. Thinking stays in the context of later turns (the chat template's
re-rendering would drop it, and the row would no longer be what was sampled).
An observation segment closes the reply's turn (`<|im_end|>` when the reply did
not end with it), then opens a user turn with the tool's answer or the retry
message and the next assistant turn, through the chat template.

The loss mask is 1 exactly on the policy's sampled tokens: the prompt, the
observations, the retry messages and tokens the engine appended (a thinking
budget's `</think>`) are 0. `old_logp[t]` is the sampler's log-prob of token t.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Segment:
    """A run of tokens of an episode row.

    Attributes:
        token_ids: the tokens.
        logprobs: the sampler's log-prob of each token (policy segments; empty for context).
        policy: sampled by the policy (a reply) rather than given to it (prompt, observation, retry).
        forced: per token of a policy segment, True where the engine appended it (not trained).
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()
    policy: bool = False
    forced: tuple[bool, ...] = ()

    def __post_init__(self):
        if self.policy and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"a policy segment needs one log-prob per token: "
                             f"{len(self.logprobs)} for {len(self.token_ids)}")
        if self.forced and len(self.forced) != len(self.token_ids):
            raise ValueError(f"forced has {len(self.forced)} flags for {len(self.token_ids)} tokens")
        if not self.policy and (self.logprobs or self.forced):
            raise ValueError("a context segment carries no log-probs and nothing forced")


def context_ids(segments: Sequence[Segment]) -> list[int]:
    """Every token of `segments` in order: the prompt of the next turn."""
    return [t for s in segments for t in s.token_ids]


def observation_text(observation: str, reply_closed: bool, tokenizer: Any, enable_thinking: bool) -> str:
    """The text between two replies: close the reply's turn, the observation as a user turn, the next
    assistant turn opened as the chat template opens it (`<think>\\n` for Qwen3.5/3.6 with thinking on)."""
    user = tokenizer.render_chat([{"role": "user", "content": observation}], enable_thinking=enable_thinking)
    return ("" if reply_closed else "<|im_end|>") + "\n" + user


def episode_row(segments: Sequence[Segment]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens [T] int32, loss mask [T] int32, old log-probs [T] float32) of one episode."""
    tokens = np.asarray(context_ids(segments), np.int32)
    mask = np.zeros(len(tokens), np.int32)
    logp = np.zeros(len(tokens), np.float32)
    at = 0
    for s in segments:
        n = len(s.token_ids)
        if s.policy:
            forced = np.asarray(s.forced, bool) if s.forced else np.zeros(n, bool)
            mask[at:at + n] = ~forced
            logp[at:at + n] = np.where(forced, 0.0, np.asarray(s.logprobs, np.float32))
        at += n
    return tokens, mask, logp


def episode_rows(episodes: Sequence[Sequence[Segment]], pad_id: int, length: int | None = None
                 ) -> dict[str, np.ndarray]:
    """Right-padded rows of several episodes: `tokens`, `segment_ids` (1 on real tokens, so positions
    start at 0 on the prompt's first token), `loss_mask`, `old_logp`, each [B, T].

    `length` is T (default: the longest episode); a longer episode is an error.
    """
    rows = [episode_row(e) for e in episodes]
    t = max((len(r[0]) for r in rows), default=0) if length is None else length
    out = {"tokens": np.full((len(rows), t), pad_id, np.int32), "segment_ids": np.zeros((len(rows), t), np.int32),
           "loss_mask": np.zeros((len(rows), t), np.int32), "old_logp": np.zeros((len(rows), t), np.float32)}
    for b, (tokens, mask, logp) in enumerate(rows):
        if len(tokens) > t:
            raise ValueError(f"an episode of {len(tokens)} tokens exceeds the row length {t}")
        n = len(tokens)
        out["tokens"][b, :n], out["segment_ids"][b, :n] = tokens, 1
        out["loss_mask"][b, :n], out["old_logp"][b, :n] = mask, logp
    return out
