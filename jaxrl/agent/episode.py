"""One agent episode as data: its turns (model text, parsed call, observation, file after it) and how it ended.

A line of `episodes.jsonl` is `Episode.to_json()`; `Episode.from_json` reads it back
(a resumed `eval --agent` keeps the episodes already written).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

# "context": the next turn might not have fit the row (`run_episodes(max_context=...)`, training).
EndedBy = Literal["submit", "turns", "context"]


@dataclasses.dataclass(frozen=True)
class Turn:
    """One reply and what it did.

    Attributes:
        text: the model's full text this turn, thinking included (the scorer's `response` form).
        thinking: the think block's text, None when there was none.
        answer: the text after the think block: what the parser reads.
        call: the parsed call `{"name", "params"}`, None for a retry turn (no call).
        observation: the user message that answered it (empty after `submit`).
        file: the file after the turn.
        valid: the call named a tool that ran.
        edit_failed: a `str_replace_editor` call left the file unchanged.
        finish_reason: "stop" or "length" (the turn's token budget).
        completion_tokens: tokens the engine returned this turn.
        budget_hit: the thinking budget closed this turn's think block.
    """

    text: str
    thinking: str | None
    answer: str
    call: dict[str, Any] | None
    observation: str
    file: str
    valid: bool
    edit_failed: bool
    finish_reason: str
    completion_tokens: int
    budget_hit: bool


@dataclasses.dataclass(frozen=True)
class Episode:
    """A task's episode: its turns in order, the final file (the prediction) and how it ended."""

    task_id: str
    sample: int
    turns: tuple[Turn, ...]
    ended_by: EndedBy
    file: str

    @property
    def failed_edits(self) -> int:
        return sum(t.edit_failed for t in self.turns)

    @property
    def no_valid_call(self) -> bool:
        return not any(t.valid for t in self.turns)

    def to_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "sample": self.sample, "ended_by": self.ended_by,
                "turns_used": len(self.turns), "failed_edits": self.failed_edits,
                "no_valid_call": self.no_valid_call, "file": self.file,
                "turns": [dataclasses.asdict(t) for t in self.turns]}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Episode:
        names = [f.name for f in dataclasses.fields(Turn)]
        turns = tuple(Turn(**{n: t[n] for n in names}) for t in obj["turns"])
        if obj["ended_by"] not in ("submit", "turns", "context") or not turns:
            raise ValueError(f"not an episode: ended_by {obj['ended_by']!r}, {len(turns)} turns")
        return cls(obj["task_id"], int(obj["sample"]), turns, obj["ended_by"], obj["file"])


def agent_columns(episodes: Sequence[Episode]) -> dict[str, float | int | None]:
    """The agent columns of a run: episodes, mean turns used, share ended by `submit`, mean failed
    edits per episode, share with no valid call (None for no episodes)."""
    n = len(episodes)

    def mean(values) -> float | None:
        return sum(values) / n if n else None

    return {"episodes": n, "turns_used": mean(len(e.turns) for e in episodes),
            "submitted": mean(e.ended_by == "submit" for e in episodes),
            "failed_edits": mean(e.failed_edits for e in episodes),
            "no_valid_call": mean(e.no_valid_call for e in episodes)}
