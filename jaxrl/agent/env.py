"""The five-turn debugging environment: an in-memory copy of the buggy file and its tools.

Pure Python, no model. `AgentEnv.step` takes one model reply, applies its one
tool call (`jaxrl.agent.parser`) and returns the observation, the next user
message. The tools follow the paper (§5.1, appendix D.5):

- `view`: the current file with 1-based line numbers, or only `view_range`
  `[start, end]` (inclusive; `end` -1 or past the last line means to the end).
- `str_replace_editor`: replace `old_str` by `new_str` (default: empty, a
  deletion) only when `old_str` occurs exactly once in the current file;
  "Edit applied." with the edited region and `CONTEXT` lines around it, or
  "Edit failed:" with the reason and the file unchanged.
- `submit`: the episode ends; the current file is the prediction.
- `run_tests`: off unless the env was given a test runner (`--agent-tests`);
  then the pass and fail counts of the task's tests, never their source.

A reply without a call is a retry turn: nothing is applied and the observation
is the paper's retry message. Every reply spends one turn; the episode ends at
`submit` or when the budget (default 5) is spent.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from jaxrl import prompts
from jaxrl.agent.parser import ToolCall, parse_call

TOOLS = ("view", "str_replace_editor", "submit", "run_tests")
CONTEXT = 3  # lines shown before and after an applied edit
DEFAULT_TURNS = 5

# The task's tests on a program -> (passed, failed) counts.
TestRunner = Callable[[str], tuple[int, int]]


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one reply did.

    Attributes:
        call: the parsed call, None for a reply without one (a retry turn).
        observation: the answer shown to the model next (empty once the episode is done by `submit`).
        valid: the call named a tool that ran (an edit that failed on its `old_str` still ran).
        edit_failed: a `str_replace_editor` call left the file unchanged.
        done: the episode is over (`submit`, or the last turn spent).
    """

    call: ToolCall | None
    observation: str
    valid: bool
    edit_failed: bool
    done: bool


class AgentEnv:
    """One episode's state: the current file, the turns spent, whether it is over and how it ended.

    Args:
        code: the buggy file the episode starts from.
        turns: the turn budget (replies the model may give).
        run_tests: the task's test runner; None leaves `run_tests` off.
        prompt: the agent prompt (`jaxrl.prompts.AGENT_PROMPTS`) whose retry message answers a reply
            without a call.
    """

    def __init__(self, code: str, turns: int = DEFAULT_TURNS, run_tests: TestRunner | None = None,
                 prompt: str = "agent"):
        if turns < 1:
            raise ValueError(f"the turn budget must be >= 1, got {turns}")
        self.file = code
        self.turns = turns
        self.used = 0
        self.submitted = False
        self._run_tests = run_tests
        self._retry = prompts.agent_retry(prompt)

    @property
    def done(self) -> bool:
        return self.submitted or self.used >= self.turns

    def step(self, reply: str) -> StepResult:
        """Apply the reply's first tool call (if any) and spend one turn."""
        if self.done:
            raise RuntimeError("the episode is over")
        self.used += 1
        call = parse_call(reply)
        if call is None:
            return StepResult(None, self._retry, False, False, self.done)
        if call.name == "submit":
            self.submitted = True
            return StepResult(call, "", True, False, True)
        failed = False
        if call.name == "view":
            observation, valid = self._view(call.params.get("view_range"))
        elif call.name == "str_replace_editor":
            observation, valid, failed = self._replace(call.params)
        elif call.name == "run_tests" and self._run_tests is not None:
            passed, failed_tests = self._run_tests(self.file)
            observation, valid = f"Tests: {passed} passed, {failed_tests} failed.", True
        elif call.name == "run_tests":
            observation, valid = "Error: run_tests is disabled in this session.", False
        else:
            names = ", ".join(t for t in TOOLS if t != "run_tests" or self._run_tests is not None)
            observation, valid = f"Error: unknown tool {call.name!r}; the tools are {names}.", False
        return StepResult(call, observation, valid, failed, self.done)

    def _view(self, view_range: str | None) -> tuple[str, bool]:
        lines = prompts.file_lines(self.file)
        if view_range is None or not view_range.strip():
            return prompts.numbered(lines, 1), True
        bounds = re.fullmatch(r"\s*\[?\s*(-?\d+)\s*,\s*(-?\d+)\s*\]?\s*", view_range)
        if bounds is None:
            return f"Error: view_range must be [start, end], got {view_range!r}.", False
        start, end = int(bounds.group(1)), int(bounds.group(2))
        end = len(lines) if end == -1 or end > len(lines) else end
        if not 1 <= start <= len(lines) or end < start:
            return (f"Error: view_range [{bounds.group(1)}, {bounds.group(2)}] is outside the file's "
                    f"{len(lines)} lines (1-based, inclusive).", False)
        return prompts.numbered(lines[start - 1:end], start), True

    def _replace(self, params: dict[str, str]) -> tuple[str, bool, bool]:
        old, new = params.get("old_str"), params.get("new_str", "")
        if not old:
            return "Edit failed: old_str is missing or empty.", True, True
        count = self.file.count(old)
        if count == 0:
            return "Edit failed: old_str was not found in the current file.", True, True
        if count > 1:
            return (f"Edit failed: old_str was found {count} times; it must occur exactly once "
                    "(include more surrounding lines).", True, True)
        at = self.file.index(old)
        self.file = self.file[:at] + new + self.file[at + len(old):]
        lines = prompts.file_lines(self.file)
        first = self.file[:at].count("\n")  # 0-based line where the new text starts
        last = first + new.count("\n")
        lo, hi = max(first - CONTEXT, 0), min(last + CONTEXT + 1, len(lines))
        return f"Edit applied. Lines {lo + 1}-{hi} now read:\n{prompts.numbered(lines[lo:hi], lo + 1)}", True, False
