"""The paper's chat prompts (minimal-edit, refine, abstain-or-fix) as message lists.

The wording lives in the template files beside this module, verbatim from the
paper's appendix D (see README.md there); this module only fills the fields.
"""

from __future__ import annotations

import re
from importlib import resources

PROMPTS = ("minimal", "refine", "abstain", "demo", "demo_refine")
# The prompts that show a candidate fix: the paper's refiner's, and the demo refiner's (`demo --with recap`).
REFINE_PROMPTS = ("refine", "demo_refine")
# The tool loop's prompts: the paper's, and the demo policy's (`precisecoder demo --agent`).
AGENT_PROMPTS = ("agent", "demo_agent")
# The standard prompts of the out-of-distribution benchmarks (`eval --benchmark`), quoted from their sources
# (README.md): EvalPlus's instruction (HumanEval+, MBPP+, BigCodeBench), CRUXEval's direct output and input prompts.
BENCHMARK_PROMPTS = {"evalplus": ("problem",), "cruxeval_o": ("code", "input"), "cruxeval_i": ("code", "output")}


def _template(name: str, part: str) -> str:
    text = resources.files(__package__).joinpath(f"{name}.{part}.txt").read_text(encoding="utf-8")
    return text[:-1] if text.endswith("\n") else text


def messages(name: str, task_prompt: str, code: str, candidate_solution: str | None = None) -> list[dict[str, str]]:
    """The system and user messages of prompt `name` for one task (the user message alone if it has no system text).

    Args:
      name: one of `PROMPTS`.
      task_prompt: the problem description.
      code: the program shown to the model (buggy, or clean for GT Debug).
      candidate_solution: the candidate fix; required by `REFINE_PROMPTS`, refused by the others.
    """
    if name not in PROMPTS:
        raise ValueError(f"unknown prompt {name!r}; choose from {', '.join(PROMPTS)}")
    if (name in REFINE_PROMPTS) != (candidate_solution is not None):
        raise ValueError(f"the {' and '.join(REFINE_PROMPTS)} prompts need a candidate solution, "
                         "and only they take one")
    fields = {"task_prompt": task_prompt, "code": code.rstrip("\n"), "candidate_solution": (candidate_solution or "").rstrip("\n")}
    # One pass, so a field's own text (a prompt that mentions "{code}") is never filled in again.
    user = re.sub(r"\{(task_prompt|code|candidate_solution)\}", lambda m: fields[m.group(1)], _template(name, "user"))
    system = _template(name, "system")
    # A prompt without instructions (`demo`) has no system turn at all, not an empty one.
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def benchmark_messages(name: str, **fields: str) -> list[dict[str, str]]:
    """The user message of benchmark prompt `name` (`BENCHMARK_PROMPTS`) with its fields filled in one pass."""
    if name not in BENCHMARK_PROMPTS:
        raise ValueError(f"unknown benchmark prompt {name!r}; choose from {', '.join(BENCHMARK_PROMPTS)}")
    if set(fields) != set(BENCHMARK_PROMPTS[name]):
        raise ValueError(f"the {name} prompt takes the fields {', '.join(BENCHMARK_PROMPTS[name])}")
    pattern = r"\{(" + "|".join(BENCHMARK_PROMPTS[name]) + r")\}"
    user = re.sub(pattern, lambda m: fields[m.group(1)], _template(name, "user"))
    return [{"role": "user", "content": user}]


def numbered(lines: list[str], first: int = 1) -> str:
    """Lines with their line number (from `first`) and one space in front of each: the agent's view of a file."""
    return "\n".join(f"{i} {line}" for i, line in enumerate(lines, first))


def file_lines(code: str) -> list[str]:
    """A file's lines, without the empty one after a final newline."""
    return code[:-1].split("\n") if code.endswith("\n") else code.split("\n")


def agent_messages(task_prompt: str, code: str, run_tests: bool = False, name: str = "agent"
                   ) -> list[dict[str, str]]:
    """The five-turn agent's system and first user message (the file shown with line numbers).

    With `run_tests` the system message ends with `agent.run_tests.txt`, our description of the
    test tool (the paper's runs had it off, so its wording is not the paper's). `name` is one of
    `AGENT_PROMPTS`; `demo_agent` has no system turn (and no `run_tests` text).
    """
    if name not in AGENT_PROMPTS:
        raise ValueError(f"unknown agent prompt {name!r}; choose from {', '.join(AGENT_PROMPTS)}")
    system = _template(name, "system")
    if run_tests and name == "agent":
        system += "\n\n" + _template("agent", "run_tests")
    fields = {"task_prompt": task_prompt, "numbered_code": numbered(file_lines(code))}
    user = re.sub(r"\{(task_prompt|numbered_code)\}", lambda m: fields[m.group(1)], _template(name, "user"))
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def agent_retry(name: str = "agent") -> str:
    """The user message that answers an agent reply without a tool call (agent prompt `name`)."""
    return _template(name, "retry")
