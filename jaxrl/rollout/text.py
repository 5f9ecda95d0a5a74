"""Token-level facts every engine needs: stop ids, the think block, and turning tokens into a `Completion`.

A Qwen completion may hold a think block. Whether it is already open when sampling
starts depends on the prompt: Qwen3.5/3.6's chat template ends a thinking-on prompt
with `<think>\\n`, Qwen3's does not (its model writes `<think>` itself), and a
prefilled chain of thought leaves the block open too. `prompt_opens_think` reads that
from the prompt's tokens: the block is open when a `<think>` token follows the last
`<|im_start|>` and no `</think>` follows it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from jaxrl.rollout.engine import Completion, FinishReason

CLOSE_THINK_TEXT = "\n</think>\n\n"


@dataclasses.dataclass(frozen=True)
class TokenSpec:
    """The special token ids an engine acts on.

    Attributes:
        stop_ids: tokens that end a completion (Qwen: `<|im_end|>`, `<|endoftext|>`).
        think_open: `<think>`, or None when the vocabulary has no think block.
        think_close: `</think>`, or None.
        close_think: the tokens of `\\n</think>\\n\\n`, appended when a thinking budget runs out.
        turn_start: `<|im_start|>`, which starts a chat turn (None: the whole prompt is one turn).
    """

    stop_ids: tuple[int, ...] = ()
    think_open: int | None = None
    think_close: int | None = None
    close_think: tuple[int, ...] = ()
    turn_start: int | None = None

    def __post_init__(self):
        if (self.think_open is None) != (self.think_close is None):
            raise ValueError("think_open and think_close must be given together")
        if self.think_close is not None and self.think_close not in self.close_think:
            raise ValueError(f"close_think {self.close_think} does not contain think_close {self.think_close}")
        if set(self.close_think) & set(self.stop_ids):
            raise ValueError("close_think must not contain a stop token")

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenSpec:
        """From a `models.tokenizer.QwenTokenizer`."""
        return cls(stop_ids=tuple(tokenizer.stop_ids), think_open=tokenizer.think_id,
                   think_close=tokenizer.think_end_id, close_think=tuple(tokenizer.encode(CLOSE_THINK_TEXT)),
                   turn_start=tokenizer.im_start_id)


def prompt_opens_think(prompt: Sequence[int], spec: TokenSpec) -> bool:
    """Whether sampling starts inside a think block: `<think>` after the last turn start, no `</think>` after it."""
    if spec.think_open is None:
        return False
    start = 0
    if spec.turn_start is not None:
        starts = [i for i, t in enumerate(prompt) if t == spec.turn_start]
        start = starts[-1] if starts else 0
    state = False
    for t in prompt[start:]:
        if t == spec.think_open:
            state = True
        elif t == spec.think_close:
            state = False
    return state


def split_think(token_ids: Sequence[int], opened: bool, spec: TokenSpec) -> tuple[list[int] | None, list[int]]:
    """(thinking tokens or None, answer tokens) of a response (no stop token); the markers dropped.

    The think block runs from the prompt's open `<think>` (when `opened`) or from a
    sampled `<think>`, to the first `</think>`; an unclosed block is all thinking.
    """
    ids = list(token_ids)
    if spec.think_open is None:
        return None, ids
    if opened:
        begin = 0
    elif spec.think_open in ids:
        begin = ids.index(spec.think_open) + 1
    else:
        return None, ids
    rest = ids[begin:]
    if spec.think_close in rest:
        end = rest.index(spec.think_close)
        return rest[:end], rest[end + 1:]
    return rest, []


def make_completion(token_ids: Sequence[int], logprobs: Sequence[float], forced: Sequence[bool],
                    finish_reason: FinishReason, opened: bool, spec: TokenSpec,
                    decode: Callable[[Sequence[int]], str] | None) -> Completion:
    """A `Completion` with text, thinking and answer decoded (empty texts without `decode`).

    Thinking drops the newlines around it and the answer its leading newlines, as the
    Qwen chat templates do when they split an assistant turn.
    """
    decode = decode or (lambda ids: "")
    # The one place the stop token leaves the response: it ends the turn and is not part of it (SGLang
    # and OpenAI servers leave it out of their text too). Kept, `<|im_end|>` right after a closing fence
    # would unclose the code block.
    stopped = finish_reason == "stop" and len(token_ids) > 0 and token_ids[-1] in spec.stop_ids
    response = list(token_ids[:-1] if stopped else token_ids)
    thinking_ids, answer_ids = split_think(response, opened, spec)
    return Completion(
        token_ids=tuple(int(t) for t in token_ids), logprobs=tuple(float(x) for x in logprobs),
        finish_reason=finish_reason, text=decode(response),
        thinking=None if thinking_ids is None else decode(thinking_ids).strip("\n"),
        answer=decode(answer_ids).lstrip("\n"), forced=tuple(bool(f) for f in forced), budget_hit=any(forced))


@dataclasses.dataclass(frozen=True)
class ThinkState:
    """Where a partial completion stands in its think block (for engines that enforce the budget host-side).

    Attributes:
        inside: the completion is inside an unclosed think block.
        spent: tokens sampled inside the current block (its `<think>` excluded).
        seen: a think block was open at some point (in the prompt or the completion).
    """

    inside: bool
    spent: int
    seen: bool


def think_state(token_ids: Sequence[int], opened: bool, spec: TokenSpec) -> ThinkState:
    """The think-block state after `token_ids`, counted as the `jax` engine counts it."""
    inside, spent, seen = opened, 0, opened
    for t in token_ids:
        if spec.think_open is not None and t == spec.think_open and not inside:
            inside, spent, seen = True, 0, True
        elif inside and t == spec.think_close:
            inside = False
        elif inside:
            spent += 1
    return ThinkState(inside, spent, seen)
