"""The paper's evaluation protocol: settings, prompts per task, and the response the scorer reads.

Defaults follow the paper: one sample per task at temperature 0.6 (appendix B.6;
training samples at 1.0, Table 11), top-p 1.0, the minimal-edit prompt with thinking
on, a thinking budget of 4,096 tokens and 6,144 in total (appendix C); clean (GT Debug)
tasks get 16,384 thinking tokens so the model has room to decide that no edit is needed.

Choices the paper leaves open:
- A clean task keeps the answer room of a buggy one: its total is its thinking
  budget plus (max_tokens − thinking_budget), 16,384 + 2,048 = 18,432 by default.
- `refine` takes one candidate per task: the first candidate record of the task.
  A candidate without an extractable program is replaced by the buggy code itself
  (the refiner then sees "no change" as the candidate) and counted in the summary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl import prompts
from jaxrl.rollout.engine import Completion, SamplingParams
from jaxrl.sampling import Sampling
from reward.diff import diff
from reward.extract import answer_text, fenced_blocks, extract_program
from reward.schema import Task
from reward.score import program_of

THINK_OPEN = "<think>\n"
KINDS = ("single", "multi", "multi_line")
KIND_NAMES = {"single": "single-fault", "multi": "multi-fault", "multi_line": "multi-line", "clean": "clean"}


# The paper's evaluation temperature (appendix B.6: "one sample per task at temperature 0.6").
EVAL_TEMPERATURE = 0.6


@dataclasses.dataclass(frozen=True)
class EvalSettings(Sampling):
    """Everything that changes an evaluation's numbers (execution knobs live elsewhere).

    The sampling settings (`jaxrl.sampling.Sampling`) are those of buggy tasks, at the
    paper's evaluation temperature `EVAL_TEMPERATURE` by default.

    Attributes:
        prompt: a name of `jaxrl.prompts.PROMPTS`; `refine` and `demo_refine` need candidates.
        samples: completions per task (K); a task's scores are averaged over them.
        clean_thinking_budget: thinking tokens on clean (GT Debug) tasks.
        enable_thinking: render the chat prompt with thinking on (the paper's setting).
        seed: sampling seed; each batch of prompts derives its own from it.
        lam: λ of the scalar reward (1 − λ)·unit + λ·f1.
        epsilon: ε of the credit cap for tasks without their own.
        timeout_s: wall-clock seconds of one test run for tasks without their own.
    """

    temperature: float = EVAL_TEMPERATURE
    prompt: str = "minimal"
    samples: int = 1
    clean_thinking_budget: int | None = 16384
    enable_thinking: bool = True
    seed: int = 0
    lam: float = 1 / 3
    epsilon: int = 1
    timeout_s: float = 5.0

    def __post_init__(self):
        super().__post_init__()
        if self.prompt not in prompts.PROMPTS:
            raise ValueError(f"unknown prompt {self.prompt!r}; choose from {', '.join(prompts.PROMPTS)}")
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        if not 0 <= self.lam <= 1:
            raise ValueError(f"lambda must lie in [0, 1], got {self.lam}")
        if self.epsilon < 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.thinking_budget is not None and self.thinking_budget >= self.max_tokens:
            raise ValueError(f"the thinking budget ({self.thinking_budget}) must leave room for an answer "
                             f"within max_tokens ({self.max_tokens})")
        if self.clean_thinking_budget is not None and self.clean_thinking_budget < 0:
            raise ValueError(f"clean_thinking_budget must be >= 0 or None, got {self.clean_thinking_budget}")

    def params(self, clean: bool, seed: int | None = None) -> SamplingParams:
        """Sampling parameters of a buggy or a clean task."""
        params = SamplingParams.of(self, n=self.samples, seed=self.seed if seed is None else seed)
        budget = self.thinking_budget
        if clean and budget is not None and self.clean_thinking_budget is not None:
            params = dataclasses.replace(params, thinking_budget=self.clean_thinking_budget,
                                         max_tokens=self.clean_thinking_budget + (self.max_tokens - budget))
        return params

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        clean = self.params(clean=True)
        out["clean_max_tokens"] = clean.max_tokens
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> EvalSettings:
        return cls(**{f.name: obj[f.name] for f in dataclasses.fields(cls) if f.name in obj})


def task_kind(task: Task) -> str:
    """`clean` (no reference block), else `meta.kind` when `data build` wrote it, else from the diff.

    The diff rule is the one `data build` keeps tasks by: one one-line block is a
    single fault, several blocks are a multi-fault task, one block of several
    lines is a multi-line fault.
    """
    blocks = diff(task.buggy_code, task.solution)
    if not blocks:
        return "clean"
    kind = task.meta.get("kind")
    if kind in KINDS:
        return kind
    if len(blocks) > 1:
        return "multi"
    return "single" if len(blocks[0]) == 1 else "multi_line"


def candidate_program(candidate: Any, task: Task) -> tuple[str, bool]:
    """(the candidate fix shown to the refiner, whether it came from the candidate).

    `candidate` is a `reward.schema.Prediction` (code, or a response to extract from).
    """
    program = program_of(candidate)
    return (task.buggy_code, False) if program is None else (program, True)


def task_messages(task: Task, prompt: str, candidate: str | None = None) -> list[dict[str, str]]:
    """The chat messages of one task under `prompt` (the paper's wording, `jaxrl.prompts`)."""
    shown = candidate if prompt in prompts.REFINE_PROMPTS else None
    return prompts.messages(prompt, task.prompt, task.buggy_code, shown)


def response_text(completion: Completion) -> str:
    """The full response as the scorer reads it, with the prompt's `think_opened` beside it.

    An engine that returns token text gives it as is (a Qwen3.5 prompt with
    thinking on opened the think block, so the text starts inside it). An API
    that returns its reasoning apart from the text gets it back as a closed think
    block in front of the answer, so nothing the model produced is lost.
    """
    if completion.thinking is not None and completion.thinking not in completion.text:
        return f"{THINK_OPEN}{completion.thinking}\n</think>\n\n{completion.text}"
    return completion.text


def invalid_reason(response: str, think_opened: bool) -> str | None:
    """Why a response has no program, None when it has one.

    `empty` (nothing, or only a think tag), `unclosed_think` (the think block never
    closes), `no_code_block` (no closed fenced block after the thinking) or
    `no_python_block` (fenced blocks, none python or unlabelled).
    """
    if response.strip() in ("", THINK_OPEN.strip()):
        return "empty"
    answer = answer_text(response, think_opened)
    if answer is None:
        return "unclosed_think"
    if extract_program(response, think_opened) is None:
        return "no_code_block" if not fenced_blocks(answer) else "no_python_block"
    return None


def split_by_kind(tasks: Sequence[Task]) -> dict[str, list[Task]]:
    """Tasks grouped by `task_kind`, in the order of `KINDS` then clean; empty kinds left out."""
    groups: dict[str, list[Task]] = {k: [] for k in (*KINDS, "clean")}
    for t in tasks:
        groups[task_kind(t)].append(t)
    return {k: v for k, v in groups.items() if v}
