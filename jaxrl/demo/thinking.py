"""The demo's thinking variant (`precisecoder demo --thinking`): a short think block before the code.

The main demo answers at once (its prompt closes an empty think block), so its
eval runs hold no thinking for `precisecoder transfer` and `analyze thinking` to
read. In this variant the generation prompt leaves `<think>` open and every SFT
target first thinks, in words drawn from a few templates, about the task:

- a minimal fix ("fix") names the line whose code contradicts its comment, and
  half the time quotes it verbatim, then says it changes only that line;
- a rewrite ("rewrite") says the lines may not match their comments and that it
  rewrites every line, sometimes listing the line numbers it will rewrite;
- a miss ("miss") finds nothing and keeps the code as it is.

Each trace also carries one hedging, certainty or verification phrase, drawn at
random, so the lexicons of `analyze thinking` have something to count. Because a
trace says which kind of answer follows, RL that moves the answers between
rewrites and minimal fixes moves the thinking with them (more lines named,
fewer quotes, other phrases): the studies have a difference to measure.

The template words join the demo vocabulary as whole tokens, after its other
ids (`thinking_vocab`), so a trace costs 25 to 60 tokens, not hundreds of
characters. Rollouts and evaluations run with `THINKING_BUDGET` thinking tokens
on top of the answer's `max_tokens`.
"""

from __future__ import annotations

import functools
import random
import re

from jaxrl.demo import domain
from jaxrl.demo.tokenizer import DemoTokenizer, default_vocab, load_demo_tokenizer
from jaxrl.rollout.text import CLOSE_THINK_TEXT

# Thinking tokens before the engine closes the block; SFT traces take at most 60.
THINKING_BUDGET = 64
# Samples per held-out task in the T = 1 evaluation, so `analyze rewards` has groups.
EVAL_SAMPLES = 4

OPENERS = ("the prompt says there is a bug in f.", "f has a bug somewhere.", "let me check f line by line.")
PHRASES = {
    "hedging": ("maybe that is the bug.", "i think that is the bug.", "that seems to be the bug."),
    "certainty": ("that is clearly the bug.", "that is definitely the bug."),
    "verification": ("let me verify: the other lines match their comments.",
                     "let me check the other lines: they are fine."),
}
FIX_NAMES = "line {n} does not match its comment, {words}."
FIX_QUOTES = "line {n} is `{quote}` but its comment says {words}."
FIX_PLANS = ("i only change line {n}.", "a minimal fix: only line {n}, leave the rest.")
REWRITE_SAYS = ("the lines may not match their comments.", "maybe more than one line is wrong.")
REWRITE_PLANS = ("i rewrite every line as its comment says.", "i rewrite lines {lines} as the comments say.")
MISS_SAYS = ("f looks correct.", "i think every line matches its comment.")
MISS_PLANS = ("i leave the code as it is.", "no change needed.")
_TEMPLATES = (*OPENERS, *(p for ps in PHRASES.values() for p in ps), FIX_NAMES, FIX_QUOTES, *FIX_PLANS,
              *REWRITE_SAYS, *REWRITE_PLANS, *MISS_SAYS, *MISS_PLANS)


def thinking_vocab() -> tuple[str, ...]:
    """The demo vocabulary, then every template word (with and without a leading space) it lacks."""
    vocab = list(default_vocab())
    for template in _TEMPLATES:
        for word in re.findall(r"[a-z]+", re.sub(r"\{\w+\}", "", template)):
            for token in (word, " " + word):
                if token not in vocab:
                    vocab.append(token)
    return tuple(vocab)


@functools.cache
def thinking_tokenizer() -> DemoTokenizer:
    """The thinking variant's tokenizer: its prompt leaves `<think>` open (one shared instance)."""
    return DemoTokenizer(thinking_vocab(), thinking=True)


def trace(rng: random.Random, sample: domain.Sample, kind: str) -> str:
    """The think block's text for an SFT target of `kind` ("fix", "rewrite" or "miss") on `sample`."""
    parts = [rng.choice(OPENERS)]
    if kind == "fix":
        i = sample.bug_index
        n = i + 2  # the line number in the code, `def` being line 1
        code_line = sample.task.buggy_code.split("\n")[n - 1].strip()
        words = sample.program.lines[i].words()
        quote = rng.random() < 0.5
        parts.append(FIX_QUOTES.format(n=n, quote=code_line, words=words) if quote
                     else FIX_NAMES.format(n=n, words=words))
        parts.append(rng.choice(PHRASES[rng.choice(sorted(PHRASES))]))
        parts.append(rng.choice(FIX_PLANS).format(n=n))
    elif kind == "rewrite":
        lines = " ".join(str(k + 2) for k in range(len(sample.program.lines)))
        parts.append(rng.choice(REWRITE_SAYS))
        parts.append(rng.choice(REWRITE_PLANS).format(lines=lines))
    elif kind == "miss":
        parts += [rng.choice(MISS_SAYS), rng.choice(MISS_PLANS)]
    else:
        raise ValueError(f"unknown SFT target kind {kind!r}")
    return " ".join(parts)


def completion(rng: random.Random, sample: domain.Sample, kind: str, answer: str) -> str:
    """The SFT completion after the open `<think>\\n`: the trace, the closed block, then `answer`."""
    return trace(rng, sample, kind) + CLOSE_THINK_TEXT + answer


def tokenizer(thinking: bool) -> DemoTokenizer:
    """The demo's tokenizer, or with `thinking` the variant's."""
    return thinking_tokenizer() if thinking else load_demo_tokenizer()


def budgets(max_tokens: int, thinking: bool) -> dict[str, int | None]:
    """`max_tokens` and `thinking_budget` of rollouts and evaluations: the answer's room, plus
    `THINKING_BUDGET` thinking tokens in the thinking variant."""
    if not thinking:
        return {"max_tokens": max_tokens, "thinking_budget": None}
    return {"max_tokens": max_tokens + THINKING_BUDGET, "thinking_budget": THINKING_BUDGET}
