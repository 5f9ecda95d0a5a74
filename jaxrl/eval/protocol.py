"""The paper's evaluation protocol: settings, prompts per task, and the response the scorer reads.

Defaults follow the paper (appendix C, Table 11): one sample per task, the
minimal-edit prompt with thinking on, temperature 1.0 and top-p 1.0, a thinking
budget of 4,096 tokens and 6,144 in total; clean (GT Debug) tasks get 16,384
thinking tokens so the model has room to decide that no edit is needed.

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
from reward.diff import diff
from reward.extract import answer_text, fenced_blocks, extract_program
from reward.schema import Task
from reward.score import program_of

THINK_OPEN = "<think>\n"
KINDS = ("single", "multi", "multi_line")
KIND_NAMES = {"single": "single-fault", "multi": "multi-fault", "multi_line": "multi-line", "clean": "clean"}


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """Everything that changes an evaluation's numbers (execution knobs live elsewhere).

    Attributes:
        prompt: `minimal`, `abstain` or `refine` (the latter needs candidates).
        samples: completions per task (K); a task's scores are averaged over them.
        temperature, top_p, top_k: sampling (0 temperature is greedy).
        thinking_budget: thinking tokens on buggy tasks; None for no budget.
        max_tokens: completion tokens in total on buggy tasks.
        clean_thinking_budget: thinking tokens on clean (GT Debug) tasks.
        enable_thinking: render the chat prompt with thinking on (the paper's setting).
        seed: sampling seed; each batch of prompts derives its own from it.
        lam: λ of the scalar reward (1 − λ)·unit + λ·f1.
        epsilon: ε of the credit cap for tasks without their own.
        timeout_s: wall-clock seconds of one test run for tasks without their own.
    """

    prompt: str = "minimal"
    samples: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    thinking_budget: int | None = 4096
    max_tokens: int = 6144
    clean_thinking_budget: int | None = 16384
    enable_thinking: bool = True
    seed: int = 0
    lam: float = 1 / 3
    epsilon: int = 1
    timeout_s: float = 5.0

    def __post_init__(self):
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
        self.params(clean=False), self.params(clean=True)  # SamplingParams validates the rest.

    def params(self, clean: bool, seed: int | None = None) -> SamplingParams:
        """Sampling parameters of a buggy or a clean task."""
        budget, total = self.thinking_budget, self.max_tokens
        if clean and budget is not None and self.clean_thinking_budget is not None:
            budget, total = self.clean_thinking_budget, self.clean_thinking_budget + (total - budget)
        return SamplingParams(n=self.samples, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_tokens=total, thinking_budget=budget,
                              seed=self.seed if seed is None else seed)

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
    return prompts.messages(prompt, task.prompt, task.buggy_code, candidate if prompt == "refine" else None)


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
