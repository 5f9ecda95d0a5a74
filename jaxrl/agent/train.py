"""Agentic RL (`rollout.agent` in a config): the step's sample stage as episodes, and their rows.

Each of a task's G rollouts is an episode of the tool loop, run with the training
engine turn by turn (`jaxrl.agent.rollout.run_episodes`, token ids, thinking on).
What changes against a single-turn step:

    sample   G episodes per task; each row's summary `Completion` holds every policy token
    score    the episode's final file is the prediction (same fleet, scorer and GDPO terms)
    update   one row per episode, `jaxrl.agent.tokens.episode_rows`: replies trained,
             prompt, observations and retry messages masked, the sampler's log-probs as old

A row is the whole episode right-padded to `rollout.agent.max_context` tokens; the
update computes log-probs from the shortest first prompt on (no policy token lies
before it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl import prompts
from jaxrl.agent.episode import Episode
from jaxrl.agent.rollout import AgentRollout, engine_sampler, run_episodes
from jaxrl.config import Config
from jaxrl.errors import TrainError
from jaxrl.rollout.engine import Completion, Engine, SamplingParams
from reward.schema import Prediction, Task

# Per-episode columns of the step's agent metrics (`agent/<name>`, means over all hosts' episodes).
AGENT_COLUMNS = ("turns_used", "submitted", "failed_edits", "no_valid_call", "out_of_context")


def first_prompt_length(task: Task, tokenizer: Any, prompt: str = "agent") -> int:
    """Tokens of an episode's first prompt: the agent's system and user messages, thinking on."""
    messages = prompts.agent_messages(task.prompt, task.buggy_code, name=prompt)
    text = tokenizer.render_chat(messages, enable_thinking=True)
    return len(tokenizer.encode(text))


def row_shape(cfg: Config, tasks: Sequence[Task], tokenizer: Any) -> tuple[int, int]:
    """(row length, first position a policy token can hold) of the update's agent batch.

    Raises:
        TrainError: a task's first turn cannot fit `rollout.agent.max_context`.
    """
    agent, max_tokens = cfg.rollout.agent, cfg.rollout.max_tokens
    lengths = [first_prompt_length(t, tokenizer, agent.prompt) for t in tasks]
    longest = max(lengths)
    if longest + max_tokens > agent.max_context:
        raise TrainError(f"rollout.agent.max_context={agent.max_context}: the longest first prompt "
                         f"({longest} tokens) and one turn (rollout.max_tokens={max_tokens}) do not fit; "
                         f"raise it to at least {longest + max_tokens}")
    return agent.max_context, min(lengths)


def sample_episodes(engine: Engine, tokenizer: Any, tasks: Sequence[Task], group_size: int,
                    params: SamplingParams, cfg: Config) -> list[AgentRollout]:
    """`group_size` episodes per task (row n·G + g is episode g of task n), every turn batched."""
    agent = cfg.rollout.agent
    return run_episodes(engine_sampler(engine), tokenizer, [(t, k) for t in tasks for k in range(group_size)],
                        params, turns=agent.turns, enable_thinking=True, max_context=agent.max_context,
                        prompt=agent.prompt)


def summary_completion(rollout: AgentRollout) -> Completion:
    """The episode as one `Completion` for the step's metrics: every policy token, the last turn's finish."""
    policy = [s for s in rollout.segments if s.policy]
    ids = tuple(t for s in policy for t in s.token_ids)
    forced = tuple(f for s in policy for f in (s.forced or (False,) * len(s.token_ids)))
    last = rollout.episode.turns[-1]
    return Completion(ids, tuple(p for s in policy for p in s.logprobs), last.finish_reason, last.text,
                      last.thinking, last.answer, forced, any(t.budget_hit for t in rollout.episode.turns))


def prediction_of(episode: Episode) -> Prediction:
    """The episode's prediction: its final file."""
    return Prediction(episode.task_id, code=episode.file)


def agent_columns(episodes: Sequence[Episode]) -> np.ndarray:
    """`[R, len(AGENT_COLUMNS)]` rows, one per episode (gathered over hosts before the means)."""
    rows = [[len(e.turns), e.ended_by == "submit", e.failed_edits, e.no_valid_call, e.ended_by == "context"]
            for e in episodes]
    return np.asarray(rows, np.float64).reshape(len(rows), len(AGENT_COLUMNS))


def agent_metrics(columns: np.ndarray) -> dict[str, float]:
    """`agent/<column>` means over every episode of the step."""
    return {f"agent/{name}": float(columns[:, i].mean()) for i, name in enumerate(AGENT_COLUMNS)}
