"""Validation during training through the evaluation code path (`jaxrl.eval.evaluate`).

The val split (buggy tasks: pass, precision, recall, f1, edited lines) and GT Debug
(clean tasks: no-op, damage) are evaluated in one `evaluate` call under the paper's
protocol, with the engine the trainer holds (the current policy) and the trainer's
reward pipeline as the scorer, so validation numbers are `precisecoder eval`'s.
On several hosts each host evaluates one contiguous block of each kind's tasks and the
samples and scores are gathered before the summary. Sampling is collective there (each
host passes its rows of one global batch, in process order), so every host samples the
same number of tasks of each kind: a host with fewer pads the end of its block with copies
of a task, whose results it drops. The blocks in process order are the tasks in order, so
the `jax` engine gives each task the samples it gets on one host.

With `rollout.agent` set validation runs the training's episodes: every task is the tool loop
of `jaxrl.agent` (`eval --agent`'s code path) with the run's turn budget and `max_context`,
each turn sampled with the validation's settings, the final file scored. Beside the scores
it logs the agent columns of each kind (`val/agent/*` over the val split's episodes,
`gt_debug/agent/*` over GT Debug's): turns used, share ended by submit, failed edits,
share with no valid call, share ended by the context limit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxrl import hosts
from jaxrl.agent.evaluate import AgentSettings, evaluate_agent
from jaxrl.agent.train import agent_columns, agent_metrics
from jaxrl.config import Config
from jaxrl.eval.evaluate import Sample, evaluate, metrics_of, summarize
from jaxrl.eval.protocol import EvalSettings
from jaxrl.rollout import Engine
from jaxrl.sampling import sampling_kwargs
from reward.schema import Task
from reward.score import Score


def eval_settings(cfg: Config, seed: int) -> EvalSettings:
    """The evaluation protocol of the run's validation."""
    v = cfg.validation
    return EvalSettings(**sampling_kwargs(v), prompt=cfg.data.prompt, samples=v.samples,
                        clean_thinking_budget=v.gt_debug_thinking_budget, seed=seed, lam=cfg.reward.lam,
                        epsilon=cfg.reward.epsilon, timeout_s=cfg.reward.timeout_s)


def _renamed(metrics: dict[str, float]) -> dict[str, float]:
    clean = {"noop", "damage", "clean/noop", "clean/damage"}
    out = {}
    for k, v in metrics.items():
        out[f"gt_debug/{k.split('/')[-1]}" if k in clean else f"val/{k}"] = float(v)
    return out


PAD = "#host-pad"


def host_share(tasks: Sequence[Task], index: int, count: int) -> list[Task]:
    """Host `index`'s tasks of `count`: its block of the buggy tasks, then its block of the clean ones, each
    kind padded to the same length on every host with copies of its first task (ids ending in `PAD`)."""
    share: list[Task] = []
    for clean in (False, True):
        kind = [t for t in tasks if t.is_clean == clean]
        need = -(-len(kind) // count)
        mine = kind[index * need:(index + 1) * need]
        share += mine + [dataclasses.replace(kind[0], task_id=f"{kind[0].task_id}{PAD}{k}")
                         for k in range(need - len(mine))]
    return share


def validate(engine: Engine, tokenizer: Any, scorer: Any, tasks: Sequence[Task], cfg: Config,
             seed: int) -> dict[str, float]:
    """`val/{pass,precision,recall,f1,lines,...}` and `gt_debug/{noop,damage}` of the engine's current policy
    (with `rollout.agent`, as episodes of the tool loop, and their `val/agent/*`, `gt_debug/agent/*`).

    Args:
        tasks: val tasks and GT Debug (clean) tasks together.
        scorer: scores (task, prediction) pairs in order (the trainer's `RewardPipeline`).
        seed: the evaluation's sampling seed.
    """
    if not tasks:
        return {}
    settings = eval_settings(cfg, seed)
    count = jax.process_count()
    mine = host_share(tasks, jax.process_index(), count)
    agent = cfg.rollout.agent
    if agent is None:
        result = evaluate(engine, tokenizer, mine, settings, None, scorer=scorer, batch_size=max(len(mine), 1))
    else:
        protocol = AgentSettings(turns=agent.turns, prompt=agent.prompt)
        result = evaluate_agent(engine, tokenizer, mine, settings, None, protocol,
                                scorer=scorer, batch_size=max(len(mine), 1), max_context=agent.max_context)
    kept = [i for i, s in enumerate(result.samples) if PAD not in s.task_id]
    if count == 1:
        metrics = _renamed(metrics_of(result.summary))
    else:
        gathered = hosts.gather_json([[result.samples[i].to_json() for i in kept],
                                      [result.scores[i].to_json() for i in kept]])
        samples = [Sample.from_json(d) for host_samples, _ in gathered for d in host_samples]
        scores = [Score(**{**d, "components": ()}) for _, host_scores in gathered for d in host_scores]
        order = [t for p in range(count) for t in host_share(tasks, p, count) if PAD not in t.task_id]
        metrics = _renamed(metrics_of(summarize(order, samples, scores, settings, {})))
    if agent is not None:
        metrics |= _agent_metrics(tasks, [result.episodes[i] for i in kept])
    return metrics


def _agent_metrics(tasks: Sequence[Task], episodes: Sequence[Any]) -> dict[str, float]:
    """`val/agent/*` over the buggy tasks' episodes and `gt_debug/agent/*` over the clean ones', of all hosts."""
    clean = {t.task_id for t in tasks if t.is_clean}
    out: dict[str, float] = {}
    for prefix, is_clean in (("val", False), ("gt_debug", True)):
        rows = agent_columns([e for e in episodes if (e.task_id in clean) == is_clean]).tolist()
        every = [r for host in hosts.gather_json(rows) for r in host]
        if every:
            out |= {f"{prefix}/{k}": v for k, v in agent_metrics(np.asarray(every, np.float64)).items()}
    return out
