"""The demo's prompt (`jaxrl.prompts` name `demo`): the line-by-line description, then the code.

The paper's minimal-edit prompt adds about 90 words of instructions, which a
policy trained from scratch cannot read anyway: they would only double the
prompt length (and the cost of every step) with a constant prefix. What
matters to the method is unchanged: the model sees the problem description
and the code, never the tests, and answers with a ```python block that the
project's extractor reads. Training, SFT and evaluation all render it through
`jaxrl.prompts.messages("demo", ...)`.
"""

from __future__ import annotations

from jaxrl import prompts
from reward.schema import Task

PROMPT = "demo"


def task_messages(task: Task) -> list[dict[str, str]]:
    """The chat turns of a task (its buggy code, or the clean code of a GT Debug task)."""
    return prompts.messages(PROMPT, task.prompt, task.buggy_code)


def answer(program: str) -> str:
    """The completion text that answers with `program` (what SFT targets look like)."""
    return f"```python\n{program.rstrip()}\n```"
