"""The agent's tool calls in the SWE-agent plain-text format, read from one model reply.

    <function=NAME>
    <parameter=KEY>VALUE</parameter>
    </function>

Rules (docs/agent.md):
- A think block is dropped first: the text up to the last `</think>` (and a
  `<think>` that never closes, with everything after it) is not read, so a call
  the model only muses about in its thinking is never applied.
- Exactly one call is taken per reply: the first complete `<function=NAME>` …
  `</function>` block. Later blocks and all text around the block are ignored.
- Inside the block, each `<parameter=KEY>VALUE</parameter>` sets KEY (the first
  of a repeated KEY wins). One newline right after `>` and one right before
  `</parameter>` are dropped, so a value may sit on lines of its own; all other
  whitespace is kept, as `old_str` must match the file exactly.
- A reply without a complete block has no call (a retry turn).
"""

from __future__ import annotations

import dataclasses
import re

_FUNCTION = re.compile(r"<function=([^>\s]*)\s*>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\s]*)\s*>(.*?)</parameter>", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its parameters (KEY -> VALUE, in order of appearance)."""

    name: str
    params: dict[str, str]

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "params": dict(self.params)}


def strip_think(reply: str) -> str:
    """The reply without its think block: what follows the last `</think>`; nothing if a `<think>` never closes."""
    if "</think>" in reply:
        return reply.rsplit("</think>", 1)[1]
    if "<think>" in reply:
        return reply.split("<think>", 1)[0]
    return reply


def _value(text: str) -> str:
    text = text[1:] if text.startswith("\n") else text
    return text[:-1] if text.endswith("\n") else text


def parse_call(reply: str) -> ToolCall | None:
    """The first complete tool call of `reply` (after its think block), or None when it has none."""
    match = _FUNCTION.search(strip_think(reply))
    if match is None:
        return None
    params: dict[str, str] = {}
    for key, value in _PARAMETER.findall(match.group(2)):
        params.setdefault(key, _value(value))
    return ToolCall(match.group(1), params)
