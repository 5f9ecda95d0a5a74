"""Shared pieces of the eval tests: a small task set of every kind and engines answering from a table."""

from __future__ import annotations

import threading

from jaxrl.rollout.engine import Completion, Engine
from reward.schema import AssertTests, Task


def task(task_id: str, prompt: str, buggy: str, solution: str, tests: str, **meta) -> Task:
    return Task(task_id, task_id.split("#")[0], prompt, buggy, solution, AssertTests(tests), meta=meta)


TASKS = [
    task("add#b0", "Return the sum of a and b.", "def add(a, b):\n    return a - b\n",
         "def add(a, b):\n    return a + b\n", "assert add(2, 3) == 5\n", kind="single"),
    task("f#b0", "Compute ((x + 1) * 2 + 3) - 4.",
         "def f(x):\n    a = x - 1\n    b = a * 2\n    c = b + 3\n    return c + 4\n",
         "def f(x):\n    a = x + 1\n    b = a * 2\n    c = b + 3\n    return c - 4\n",
         "assert f(1) == 3\nassert f(5) == 11\n"),
    task("g#b0", "Return the sum of the list.",
         "def g(xs):\n    total = 0\n    for x in xs[1:]:\n        total -= x\n    return total\n",
         "def g(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n",
         "assert g([1, 2, 3]) == 6\n"),
    task("clamp#clean", "Clamp x into [lo, hi].", "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
         "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n", "assert clamp(5, 0, 3) == 3\n", kind="clean"),
    task("ident#clean", "Return x unchanged.", "def ident(x):\n    return x\n", "def ident(x):\n    return x\n",
         "assert ident(4) == 4\n"),
]

FENCE = "```"

# Completion texts after the prompt's opened `<think>\n` (Qwen3.5, thinking on), keyed by task prompt.
ANSWERS = {
    "Return the sum of a and b.": f"Minus should be plus.\n</think>\n\n{FENCE}python\ndef add(a, b):\n    return a + b\n{FENCE}",
    "Compute ((x + 1) * 2 + 3) - 4.":
        f"One bug.\n</think>\n\n{FENCE}python\ndef f(x):\n    a = x + 1\n    b = a * 2\n    c = b + 3\n    return c + 4\n{FENCE}",
    "Return the sum of the list.": "Let me think about the loop bounds and the sign, and",
    "Clamp x into [lo, hi].": f"It is correct.\n</think>\n\n{FENCE}python\ndef clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n{FENCE}",
    "Return x unchanged.": "",
}


def completion(text: str, tokenizer) -> Completion:
    ids = tuple(tokenizer.encode(text))
    thinking, answer = (text.split("</think>", 1)[0], text.split("</think>", 1)[1]) if "</think>" in text \
        else (text, "")
    return Completion(ids, (0.0,) * len(ids), "stop" if "</think>" in text else "length", text, thinking, answer)


class TableEngine(Engine):
    """Answers each prompt with the table entry whose key its decoded text contains; records every call."""

    def __init__(self, tokenizer, answers=None, fail_after: int | None = None):
        self.tokenizer = tokenizer
        self.answers = ANSWERS if answers is None else answers
        self.fail_after = fail_after
        self.calls: list[tuple[list[str], object]] = []
        self._lock = threading.Lock()

    def generate(self, prompts, params):
        with self._lock:
            if self.fail_after is not None and len(self.calls) >= self.fail_after:
                raise ConnectionError("the server went away")
            texts = [self.tokenizer.decode(p) for p in prompts]
            self.calls.append((texts, params))
        out = []
        for text in texts:
            key = next(k for k in self.answers if k in text)
            out.append([completion(self.answers[key], self.tokenizer) for _ in range(params.n)])
        return out

    def update_weights(self, model, *, step):
        raise NotImplementedError
