"""The demo's agent variant (`precisecoder demo --agent`): the micro domain inside the five-turn tool loop.

The demo policy is trained from scratch, so it can only use the tools once taught. Its
SFT data gets, beside every (prompt, answer) pair, the same target as an agent
transcript in the paper's plain-text call format (`jaxrl.agent.parser`):

- a fix or a rewrite is one `str_replace_editor` whose `old_str` is the buggy file's
  lines from the first to the last one the target changes (one line for the minimal
  fix; the span of rewritten lines for the rewrite), then `submit`;
- a miss (the target is the buggy code) is a `view` of the file, then `submit`.

A transcript is played through the real environment (`jaxrl.agent.rollout.run_episodes`
with a scripted sampler), so its observations are the tools' own answers, and laid out
as an agentic RL row (`jaxrl.agent.tokens`): the replies are the SFT targets, the
prompt and the observations are masked out of the loss.

The prompt is `jaxrl.prompts`' `demo_agent` (no system turn: the task's sentence and the
file with line numbers), the tool call tags and the environment's fixed phrases join
the vocabulary as whole tokens (`agent_vocab`), and an episode is at most `MAX_CONTEXT`
tokens, the policy's positions.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl.demo import domain
from jaxrl.demo.tokenizer import DemoTokenizer, default_vocab

PROMPT = "demo_agent"
TURNS = 5  # the paper's turn budget
TURN_TOKENS = 128  # a reply's budget: a rewrite's edit (old and new span) takes up to 115 tokens
MAX_CONTEXT = 512  # tokens of an episode, the demo policy's positions

_TOOL_TOKENS = ("<function=view>", "<function=str_replace_editor>", "<function=submit>", "</function>",
                "<parameter=old_str>", "<parameter=new_str>", "<parameter=view_range>", "</parameter>")
# Fixed phrases of the environment's answers (jaxrl.agent.env) and of the retry message, one token each.
_PHRASES = ("Edit applied. Lines ", " now read:", "Edit failed: old_str was not found in the current file.",
            "Edit failed: old_str was found ", " times; it must occur exactly once (include more surrounding lines).",
            "Edit failed: old_str is missing or empty.", "Error: ",
            "no tool call: call str_replace_editor, view or submit.")


def agent_vocab() -> tuple[str, ...]:
    """The demo vocabulary, then the tool tags and the environment's phrases (new ids after the old)."""
    vocab = list(default_vocab())
    vocab += [t for t in _TOOL_TOKENS + _PHRASES if t not in vocab]
    return tuple(vocab)


@functools.cache
def agent_tokenizer() -> DemoTokenizer:
    """The agent variant's tokenizer (one shared instance)."""
    return DemoTokenizer(agent_vocab())


def edit_call(old: str, new: str) -> str:
    """A `str_replace_editor` reply in the plain-text format."""
    return (f"<function=str_replace_editor>\n<parameter=old_str>{old}</parameter>\n"
            f"<parameter=new_str>{new}</parameter>\n</function>")


VIEW = "<function=view>\n</function>"
SUBMIT = "<function=submit>\n</function>"


def transcript(code: str, target: str) -> list[str]:
    """The replies that turn `code` into `target`: one edit of the changed lines' span (grown upwards
    until `old_str` is unique in the file), then `submit`; a `view` then `submit` when nothing changes."""
    if target == code:
        return [VIEW, SUBMIT]
    old_lines, new_lines = code.split("\n"), target.split("\n")
    if len(old_lines) != len(new_lines):
        raise ValueError("a demo target has the buggy program's lines")
    changed = [i for i, (a, b) in enumerate(zip(old_lines, new_lines)) if a != b]
    first, last = changed[0], changed[-1]
    while first > 0 and code.count("\n".join(old_lines[first:last + 1])) > 1:
        first -= 1
    return [edit_call("\n".join(old_lines[first:last + 1]), "\n".join(new_lines[first:last + 1])), SUBMIT]


def _scripted(tokenizer: DemoTokenizer, replies: dict[str, list[str]]):
    """A `jaxrl.agent.rollout.Sampler` that answers each task's turns with its scripted replies."""
    from jaxrl.rollout.engine import Completion

    given = {task_id: 0 for task_id in replies}

    def sample(requests, params):
        out = []
        for r in requests:
            text = replies[r.task.task_id][given[r.task.task_id]]
            given[r.task.task_id] += 1
            ids = tuple(tokenizer.encode(text) + [tokenizer.eos_id])
            out.append([Completion(ids, (0.0,) * len(ids), "stop", text, None, text)])
        return out

    return sample


def sft_transcripts(samples: Sequence[domain.Sample], rewrite_share: float, seed: int, miss_share: float,
                    tokenizer: DemoTokenizer) -> tuple[list[Any], dict[str, float]]:
    """Each sample's SFT target (`domain.sft_target`, its own random stream) as an agent episode's
    token segments, played through the environment; and the shares of targets by kind.

    Raises:
        RuntimeError: an episode that does not end by `submit` with its target as the file.
    """
    from jaxrl.agent.rollout import run_episodes
    from jaxrl.rollout.engine import SamplingParams

    rng = random.Random(f"sft-agent-targets:{seed}")
    targets, counts = {}, {"rewrite": 0, "fix": 0, "miss": 0}
    for s in samples:
        target, kind = domain.sft_target(rng, s, rewrite_share, miss_share)
        targets[s.task.task_id] = target
        counts[kind] += 1
    replies = {s.task.task_id: transcript(s.task.buggy_code, targets[s.task.task_id]) for s in samples}
    rollouts = run_episodes(_scripted(tokenizer, replies), tokenizer, [(s.task, 0) for s in samples],
                            SamplingParams(max_tokens=TURN_TOKENS), turns=TURNS, enable_thinking=False,
                            prompt=PROMPT)
    for r in rollouts:
        e = r.episode
        if e.ended_by != "submit" or e.file != targets[e.task_id] or e.failed_edits:
            raise RuntimeError(f"demo agent transcript of {e.task_id} did not reach its target "
                               f"(ended by {e.ended_by}, {e.failed_edits} failed edits)")
        if sum(len(s.token_ids) for s in r.segments) > MAX_CONTEXT:
            raise RuntimeError(f"demo agent transcript of {e.task_id} passes {MAX_CONTEXT} tokens")
    return [r.segments for r in rollouts], {k: v / max(len(samples), 1) for k, v in counts.items()}


def encode_transcripts(segments: Sequence[Any], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded token ids `[N, T]` of the transcripts and their loss mask (the replies' tokens)."""
    from jaxrl.agent.tokens import episode_rows

    rows = episode_rows(segments, pad_id)
    return rows["tokens"], rows["loss_mask"].astype(np.float32)


def stack_rows(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], pad_id: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Two (tokens, mask) sets of right-padded rows as one, padded to the longer rows."""
    t = max(a[0].shape[1], b[0].shape[1])

    def pad(tokens, mask):
        extra = t - tokens.shape[1]
        return (np.pad(tokens, ((0, 0), (0, extra)), constant_values=pad_id),
                np.pad(mask, ((0, 0), (0, extra))))

    (ta, ma), (tb, mb) = pad(*a), pad(*b)
    return np.concatenate([ta, tb]), np.concatenate([ma, mb])


def rollout_agent(turns: int = TURNS) -> dict[str, Any]:
    """The `rollout.agent` section of an agentic demo RL run."""
    return {"turns": turns, "max_context": MAX_CONTEXT, "prompt": PROMPT}


def evaluate_in_agent(model: Any, seed: int, tasks: Sequence[Any], fleet: Any, out: Path, progress: bool,
                      temperature: float) -> Any:
    """`eval --agent`'s code path (`jaxrl.agent.evaluate.evaluate_agent`) for one policy on held-out
    tasks: the same environment, turn budget and row limit as agentic RL, one episode per task."""
    from jaxrl.agent.evaluate import AgentSettings, evaluate_agent
    from jaxrl.demo import prompt
    from jaxrl.eval.protocol import EvalSettings
    from jaxrl.rollout import make_engine

    tok = agent_tokenizer()
    settings = EvalSettings(prompt=prompt.PROMPT, samples=1, temperature=temperature, max_tokens=TURN_TOKENS,
                            thinking_budget=None, clean_thinking_budget=None, enable_thinking=False, seed=seed)
    with make_engine("jax", model=model, tokenizer=tok) as engine:
        return evaluate_agent(engine, tok, tasks, settings, fleet, AgentSettings(turns=TURNS, prompt=PROMPT),
                              model={"name": out.parent.name}, task_set="demo held-out", out_dir=out,
                              batch_size=len(tasks), progress=progress, max_context=MAX_CONTEXT)


AGENT_METHOD = "precisecoder_agent"  # PreciseCoder trained with `rollout.agent` (the run's directory name)
TABLE_COLUMNS = ("pass", "precision", "recall", "lines", "noop", "damage", "turns_used", "submitted",
                 "failed_edits", "no_valid_call")


def agent_row(result: Any, seed: int) -> dict[str, Any]:
    """One policy's results inside the agent: the demo's score columns (%, `jaxrl.demo.report.row_of`)
    and the agent columns (turns used, ended by submit %, failed edits, no valid call %)."""
    from jaxrl.demo import report as rep

    a = result.summary["agent"]

    def pct(x):
        return None if x is None else 100.0 * x

    return {**rep.row_of(result.summary, seed, result.scores), "turns_used": a["turns_used"],
            "submitted": pct(a["submitted"]), "failed_edits": a["failed_edits"],
            "no_valid_call": pct(a["no_valid_call"])}


def agent_markdown(table: dict[str, Sequence[dict[str, Any]]], label: str) -> str:
    """report.md's section of the agent variant: every policy evaluated inside the tool loop."""
    from jaxrl.demo import report as rep

    return "\n".join([
        f"## Inside the agent ({label}; {TURNS}-turn tool loop, rows of {MAX_CONTEXT} tokens)", "",
        "Every policy runs each held-out task as an episode of the tool loop (view / str_replace_editor / "
        "submit; `eval --agent`'s code path); the final file is scored as a single-turn answer. The SFT base "
        "also learned agent transcripts; GRPO and PreciseCoder were trained single-turn, "
        "PreciseCoder (agentic RL) with `rollout.agent`. Mean ± std over RL seeds.", "",
        rep.summary_table(table, TABLE_COLUMNS), ""])
